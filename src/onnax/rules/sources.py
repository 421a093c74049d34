"""Sources: Constant, ConstantOfShape and Range.

Constant and ConstantOfShape have no tangent (their value does not depend on any input's value).
Range's result ``start + i * delta`` is linear in start and delta; its length is piecewise
constant in all three inputs, so limit has a zero derivative.

Under vmap a Constant stays shared. ConstantOfShape and Range with a batched input would give
each example its own shape or length, which one batched tensor cannot hold: they are refused,
naming the node and the input.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher, refuse_batched
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.selection import FLOAT_TYPES
from onnax.rules._shape_helpers import Param, arange

__all__: list[str] = []

# --------------------------------------------------------------------------- Constant
constant = OpRules("Constant")
constant.zero()


@constant.batch
def _constant_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Constant has no inputs, so vmap never batches it: it stays shared."""
    return list(node.outputs), [False] * len(node.outputs)


# -------------------------------------------------------------------- ConstantOfShape
constant_of_shape = OpRules("ConstantOfShape")
constant_of_shape.zero()


# The batch rule serves from opset 9, ConstantOfShape's first version; the jvp rule from 1.
@constant_of_shape.batch(since=9)
def _constant_of_shape_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Refused: the shape input is batched (the result would be ragged)."""
    refuse_batched(bx, node, args, batched, {0: "shape"})
    raise InternalRuleError("ConstantOfShape batch rule called without a batched input")


# ------------------------------------------------------------------------------ Range
range_ = OpRules("Range", since=11)


@range_.jvp
def _range_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # y_i = start + i * delta: linear in start and delta; the length is piecewise constant in
    # limit, so limit has a zero derivative.
    y = node.outputs[0]
    t_start, t_delta = tangents[0], tangents[2]
    if y.dtype not in FLOAT_TYPES or (t_start is None and t_delta is None):
        return [None]
    terms: list[ir.Value | None] = []
    if t_start is not None:
        terms.append(em.op("Expand", [t_start, em.shape(y)]))
    if t_delta is not None:
        n = y.shape.dims[0] if y.shape is not None and y.shape.rank() == 1 else None
        length: Param = n if isinstance(n, int) else em.shape(y)
        index = em.op("Cast", [arange(em, length)], {"to": y.dtype})
        terms.append(em.op("Mul", [index, t_delta]))
    return [em.add_all(terms)]


@range_.batch
def _range_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Refused: Range's length ``ceil((limit - start) / delta)`` depends on its batched input.

    Whichever of start, limit and delta is batched, each example computes its own length from
    it (a batched start with shared limit and delta too), and nothing in the graph proves the
    lengths equal: the batched result would be ragged.
    """
    why = (
        "the length of the result, ceil((limit - start) / delta), is computed from it, so each "
        "example could get a different length, which one batched tensor cannot hold"
    )
    refuse_batched(bx, node, args, batched, {0: "start", 1: "limit", 2: "delta"}, why)
    raise InternalRuleError("Range batch rule called without a batched input")
