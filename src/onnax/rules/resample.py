"""Relayouts and the determinant: DepthToSpace, SpaceToDepth, Det (Resize: rules/resize.py).

DepthToSpace and SpaceToDepth only move elements, so they are linear: the tangent is the same
operator applied to the tangent, and the transpose is the inverse relayout. DepthToSpace in mode
``m`` is inverted by SpaceToDepth in the same mode ``m`` (DCR by the default SpaceToDepth; CRD
SpaceToDepth exists only from opset 28, so below it the inverse is spelled as the explicit
Reshape/Transpose/Reshape). Batch rules fold the batch axis into N and unfold it afterwards.

Det's derivative is the cofactor expansion ``d det(A) = sum_ij cof(A)_ij dA_ij``, which is
linear in ``dA``. The cofactors come from the determinants of all minors at once: two Gathers
with constant index tables pick, for every (i, j), the rows without i and the columns without j,
and Det (which accepts ``[*, M, M]``) evaluates them all. That needs a static matrix size, kept
small (``_MAX_DET_SIZE``) because the minors grow as n^2 (n-1)^2 elements per matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import int_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

_MAX_DET_SIZE = 4
_BIG = 2**62


def _mode(node: ir.Node) -> str:
    attr = node.attributes.get("mode")
    return "DCR" if attr is None else str(attr.as_string())


def _dim(em: Emitter, shape: ir.Value, axis: int) -> ir.Value:
    """Element ``axis`` of a 1-D shape value, as a 1-D value of one element."""
    return em.slice(shape, [axis], [axis + 1], [0])


def _space_to_depth(
    em: Emitter, y: ir.Value, blocksize: int, mode: str, x_shape: ir.Value
) -> ir.Value:
    """SpaceToDepth of ``y`` (shape ``[N, C, H*b, W*b]``) into the shape ``x_shape``.

    Uses the operator when the opset has the mode, else the explicit relayout: ``y`` viewed as
    ``[N, C, H, b, W, b]``, the two block axes moved next to C (before it for DCR, after it for
    CRD), flattened into ``[N, C*b*b, H, W]``.
    """
    if mode == "DCR" or em.opset >= 28:
        attrs: dict[str, object] = {"blocksize": blocksize}
        if mode != "DCR":
            attrs["mode"] = mode
        return em.op("SpaceToDepth", [y], attrs)
    b = em.ints([blocksize])
    split = em.op(
        "Concat", [em.ints([0, -1]), _dim(em, x_shape, 2), b, _dim(em, x_shape, 3), b], {"axis": 0}
    )
    six = em.op("Reshape", [y, split])
    moved = em.transpose(six, [0, 1, 3, 5, 2, 4])
    return em.op("Reshape", [moved, x_shape])


# One rule pair serves every version: 11 added DepthToSpace's CRD mode and 28 SpaceToDepth's,
# which the rules read from the node (and the transposes from the opset).
depth_to_space = OpRules("DepthToSpace", since=1)
space_to_depth = OpRules("SpaceToDepth", since=1)


def _relayout_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    """The operator applied to the tangent (it only moves elements)."""
    return em.op(node.op_type, [t], attributes_of(node))


depth_to_space.defjvp(_relayout_tangent)
space_to_depth.defjvp(_relayout_tangent)


@depth_to_space.transpose
def _d2s_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """SpaceToDepth in the same mode and blocksize undoes DepthToSpace."""
    ct, x = cts[0], node.inputs[0]
    if ct is None or x is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    blocksize = int_attr(node, "blocksize", 0)
    return [_space_to_depth(em, ct, blocksize, _mode(node), em.shape(x))]


@space_to_depth.transpose
def _s2d_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """DepthToSpace in the same mode and blocksize undoes SpaceToDepth."""
    ct = cts[0]
    if ct is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent")
    attrs: dict[str, object] = {"blocksize": int_attr(node, "blocksize", 0)}
    if _mode(node) != "DCR":
        attrs["mode"] = _mode(node)
    return [em.op("DepthToSpace", [ct], attrs)]


@depth_to_space.batch
@space_to_depth.batch
def _relayout_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Folds the batch axis into N (``[B, N, C, H, W]`` to ``[B*N, C, H, W]``) and back."""
    x, original = args[0], node.inputs[0]
    if x is None or original is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    one = bx.unbatched_shape(x, True, original)
    folded = bx.op(
        "Reshape",
        [x, bx.op("Concat", [bx.ints([-1]), bx.slice(one, [1], [_BIG], [0])], {"axis": 0})],
    )
    out = bx.op(node.op_type, [folded], attributes_of(node))
    rest = bx.slice(bx.op("Shape", [out]), [1], [_BIG], [0])
    target = bx.op("Concat", [bx.batch_size, bx.ints([-1]), rest], {"axis": 0})
    return [bx.op("Reshape", [out, target])], [True]


# ------------------------------------------------------------------------------------ Det
def _det_size(node: ir.Node) -> int:
    """The static matrix size of Det's input, or an error naming the node and the limit."""
    x = node.inputs[0]
    shape = x.shape if x is not None else None
    n: object = None
    if shape is not None and shape.rank() >= 2:
        n = shape[-1]
    if not isinstance(n, int) or n > _MAX_DET_SIZE:
        found = "unknown" if n is None else (str(n) if isinstance(n, int) else f"symbolic ({n})")
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the derivative of Det is built from the "
            f"cofactors of a matrix of static size at most {_MAX_DET_SIZE}x{_MAX_DET_SIZE}, but "
            f"the matrix size here is {found}. Remedy: give the input static trailing "
            f"dimensions of at most {_MAX_DET_SIZE}, or compute the determinant from an LU or "
            "Cholesky factorisation written with differentiable operators."
        )
    return n


def _cofactors(em: Emitter, a: ir.Value, n: int, rank: int) -> ir.Value:
    """The cofactor matrices ``[*, n, n]`` of ``a`` (``[*, n, n]``, rank ``rank``, n >= 2)."""
    # Row (and column) table: entry k lists the indices other than k.
    table = np.array([[i for i in range(n) if i != k] for k in range(n)], dtype=np.int64)
    index = em.const(table)
    rows = em.op("Gather", [a, index], {"axis": rank - 2})  # [*, i, r, n]
    both = em.op("Gather", [rows, index], {"axis": rank})  # [*, i, r, j, c]
    lead = list(range(rank - 2))
    s = rank - 2
    minors = em.transpose(both, [*lead, s, s + 2, s + 1, s + 3])  # [*, i, j, r, c]
    dets = em.op("Det", [minors])  # [*, i, j]
    signs = np.array([[(-1.0) ** (i + j) for j in range(n)] for i in range(n)])
    dtype = a.dtype
    if dtype is None:
        raise InternalRuleError("Det jvp: input has no dtype")
    return em.op("Mul", [dets, em.const(signs.astype(dtype.numpy()))])


# 22 added bfloat16; one rule pair serves both versions.
det = OpRules("Det", since=11)


def _det_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    """``d det(A) = sum_ij cof(A)_ij dA_ij`` over the last two axes."""
    a = node.inputs[0]
    if a is None or a.shape is None:
        raise InternalRuleError(f"{op_label(node)} jvp: input without a shape")
    n = _det_size(node)
    rank = a.shape.rank()
    if n == 1:
        # det of a 1x1 matrix is its only element.
        return em.squeeze(t, [rank - 2, rank - 1])
    cof = _cofactors(em, a, n, rank)
    return em.reduce_sum(em.op("Mul", [cof, t]), [rank - 2, rank - 1], keepdims=False)


det.defjvp(_det_tangent)


@det.batch
def _det_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Det already maps over the leading axes, the batch axis included."""
    x = args[0]
    if x is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    return [bx.op("Det", [x])], [True]
