"""Helpers shared by the gather and scatter rules (:mod:`.gather`, :mod:`.scatter`).

Under vmap every batched value carries the batch axis at 0. The gathers and scatters address
elements of one example through their index tuples, so a batched formulation must keep example
b's indices pointing into example b's data: GatherND's ``batch_dims`` does that (opset 12 on),
and elsewhere the batch coordinate is prepended to every index tuple (a ``Range`` over the batch
broadcast along the tuples, :func:`prepend_batch_coordinates`), which turns the op into one over
the whole batch.
"""

from __future__ import annotations

import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args
from onnax.errors import UnsupportedOperatorError

__all__ = [
    "arange",
    "axis_of",
    "batch_rank",
    "dtype_of",
    "filled",
    "leading_shape",
    "operands",
    "prepend_batch_coordinates",
    "zeros_like",
]


def axis_of(node: ir.Node, rank: int) -> int:
    """The node's ``axis`` attribute (default 0), non-negative for ``rank``."""
    axis = node.attributes.get_int("axis", 0)
    return axis + rank if axis < 0 else axis


def dtype_of(value: ir.Value) -> ir.DataType:
    """The element type of ``value`` (an internal error when unknown)."""
    if value.dtype is None:
        raise InternalRuleError(f"indexing: value {value.name!r} has no dtype")
    return value.dtype


def filled(em: Emitter, shape: ir.Value, dtype: ir.DataType, fill: float) -> ir.Value:
    """A tensor of ``fill`` with run-time ``shape`` (never reads a linear value).

    ``Expand`` of a scalar rather than ``ConstantOfShape``: symbolic shape inference gives the
    former a shape when ``shape`` comes from ``Shape`` of a symbolic tensor, not the latter, and
    the transposes of later consumers (``Mul``, ``Add``) need it.
    """
    return em.op("Expand", [em.scalar(fill, dtype), shape])


def zeros_like(em: Emitter, value: ir.Value) -> ir.Value:
    """Zeros with the shape and element type of ``value`` (which may be linear)."""
    if value.shape is not None and value.shape.rank() == 0:
        return em.scalar(0.0, dtype_of(value))
    return filled(em, em.shape(value), dtype_of(value), 0.0)


def arange(em: Emitter, size: ir.Value) -> ir.Value:
    """``[0, 1, ..., size - 1]`` (int64) for a rank-0 int64 ``size``."""
    zero, one = em.scalar(0, ir.DataType.INT64), em.scalar(1, ir.DataType.INT64)
    return em.op("Range", [zero, size, one])


# ------------------------------------------------------------------------------------ vmap
def operands(node: ir.Node, args: Args) -> tuple[list[ir.Value], list[ir.Value]]:
    """The new and the original inputs of ``node`` (all present for these operators)."""
    new = [a for a in args if a is not None]
    old = [v for v in node.inputs if v is not None]
    if len(new) != len(args) or len(old) != len(node.inputs):
        raise InternalRuleError(f"{node.op_type}: a required input is missing")
    return new, old


def batch_rank(node: ir.Node, value: ir.Value | None, what: str) -> int:
    """The static unbatched rank of an input or output; a user-reachable error when unknown."""
    assert value is not None
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} ({node_label(node)}): batching it needs the rank of its "
            f"{what} {value.name!r}, which shape inference could not determine. Remedy: declare "
            "the shapes (symbolic dimensions are fine) of the graph inputs that feed this node; "
            "for GatherND/ScatterND also give the indices a fixed last dimension (the index "
            "depth), e.g. a known size or constant indices."
        )
    return value.shape.rank()


def prepend_batch_coordinates(
    bx: Batcher, tuples: ir.Value, lead: ir.Value, n_lead: int
) -> ir.Value:
    """Index tuples ``[B, *lead, k]`` (int64) -> ``[B, *lead, 1 + k]`` led by the batch index.

    ``lead`` is the 1-D shape of the ``n_lead`` axes between the batch axis and the tuple axis.
    """
    size = bx.squeeze(bx.batch_size, [0])
    coords = bx.unsqueeze(arange(bx, size), list(range(1, n_lead + 2)))  # [B, 1, ..., 1]
    shape = bx.op("Concat", [bx.batch_size, lead, bx.ints([1])], {"axis": 0})
    return bx.op("Concat", [bx.op("Expand", [coords, shape]), tuples], {"axis": -1})


def leading_shape(
    bx: Batcher, idx: ir.Value, batched: bool, original: ir.Value, q: int
) -> ir.Value:
    """The shape of one example of GatherND/ScatterND indices (rank ``q``) without the tuple axis."""
    return bx.slice(bx.unbatched_shape(idx, batched, original), [0], [q - 1], [0])
