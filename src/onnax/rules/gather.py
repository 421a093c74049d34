"""Gathers: Gather GatherElements GatherND, and ai.onnx.ml::ArrayFeatureExtractor.

The gathers are linear in ``data``: the tangent gathers the tangent, and the transpose
*scatter-adds* the cotangent into zeros shaped like ``data``. Indices may repeat, so the scatter
must add. From opset 16 that is ``ScatterND``/``ScatterElements`` with ``reduction="add"``;
before 16 no scatter can add, and the transposes contract the cotangent with a one-hot encoding
of the indices instead (``Equal`` against a ``Range``, then ``MatMul`` or ``Mul`` + ``ReduceSum``).
Negative indices are normalised (``Where(idx < 0, idx + dim, idx)``) before any scatter or
one-hot encoding.

Batch rules (vmap) keep each example's indices pointing into its own data, without loops: a
shared index set applies along a shifted axis (Gather) or as one more batch dimension of GatherND;
batched indices with shared data just add leading index axes (Gather, GatherND); when both are
batched, GatherND's ``batch_dims`` (opset 12 on) or index tuples led by the batch coordinate
(``Range`` over the batch, broadcast) address the batch axis explicitly. GatherElements, which
addresses every axis position by position, batches both operands along axis 0.

Also here: **ai.onnx.ml::ArrayFeatureExtractor**, a selection of columns of the last axis,
whose tangent is a MatMul with a 0/1 selection matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._indexing import (
    arange,
    axis_of,
    batch_rank,
    dtype_of,
    filled,
    leading_shape,
    operands,
    prepend_batch_coordinates,
    zeros_like,
)
from onnax.rules._patterns import linear_unary_jvp

# The first opset whose ScatterND/ScatterElements accept reduction="add".
_SCATTER_ADD_OPSET = 16
# The first opset whose GatherND has ``batch_dims``.
_BATCH_DIMS_OPSET = 12


# ------------------------------------------------------------------------------ helpers
def _rank(node: ir.Node, value: ir.Value, what: str) -> int:
    """The static rank of ``value``; a user-reachable error when shape inference left it unknown."""
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): differentiating it needs the rank of its "
            f"{what} {value.name!r}, which shape inference could not determine. Remedy: declare "
            "the shapes (at least the ranks) of the model's inputs, or run shape inference on the "
            "model first."
        )
    return value.shape.rank()


def _static_dim(value: ir.Value, axis: int) -> int | None:
    if value.shape is None:
        return None
    d = value.shape.dims[axis]
    return d if isinstance(d, int) else None


def _dim(em: Emitter, value: ir.Value, axis: int) -> ir.Value:
    """The size of ``value`` along ``axis`` as a rank-0 int64 (a constant when static)."""
    d = _static_dim(value, axis)
    if d is not None:
        return em.const(np.array(d, dtype=np.int64))
    return em.op("Gather", [em.shape(value), em.const(np.array(axis, dtype=np.int64))])


def _dims_vector(em: Emitter, value: ir.Value, start: int, stop: int) -> ir.Value:
    """The sizes of ``value`` along axes ``start:stop`` as a 1-D int64."""
    dims = [_static_dim(value, i) for i in range(start, stop)]
    if all(d is not None for d in dims):
        return em.ints([int(d) for d in dims if d is not None])
    return em.slice(em.shape(value), [start], [stop], [0])


def _dims_match(a: ir.Value, b: ir.Value, skip: int) -> bool:
    """True when ``a`` and ``b`` provably have equal sizes on every axis but ``skip``."""
    if a.shape is None or b.shape is None or a.shape.rank() != b.shape.rank():
        return False
    for i, (da, db) in enumerate(zip(a.shape.dims, b.shape.dims, strict=True)):
        if i == skip:
            continue
        if isinstance(da, int) or isinstance(db, int):
            if da != db:
                return False
        elif da.value is None or da.value != db.value:
            return False
    return True


def _as_int64(em: Emitter, idx: ir.Value) -> ir.Value:
    if idx.dtype == ir.DataType.INT64:
        return idx
    return em.op("Cast", [idx], {"to": ir.DataType.INT64})


def _normalized(em: Emitter, idx: ir.Value, size: ir.Value) -> ir.Value:
    """``idx`` as int64 with negative entries wrapped by ``size`` (broadcast against ``idx``).

    The one-hot encodings compare indices with a ``Range``, and the spec of a scatter need not
    match the gather it transposes in how it treats negative indices; wrapping first is exact.
    """
    idx64 = _as_int64(em, idx)
    static = const_ints(idx)
    if (static is not None and all(i >= 0 for i in static)) or idx.meta.get("onnax.nonnegative"):
        return idx64
    negative = em.op("Less", [idx64, em.scalar(0, ir.DataType.INT64)])
    return em.op("Where", [negative, em.op("Add", [idx64, size]), idx64])


def _permuted_shape(em: Emitter, value: ir.Value, perm: Sequence[int]) -> ir.Value:
    """The shape of ``value`` with its entries permuted by ``perm``."""
    if list(perm) == list(range(len(perm))):
        return em.shape(value)
    dims = [_static_dim(value, i) for i in perm]
    if all(d is not None for d in dims):
        return em.ints([int(d) for d in dims if d is not None])
    return em.op("Gather", [em.shape(value), em.ints(perm)])


def _one_hot(em: Emitter, idx: ir.Value, size: ir.Value, dtype: ir.DataType) -> ir.Value:
    """``onehot[..., k] = (idx[...] == k)`` in ``dtype``, shape ``idx.shape + [size]``.

    ``idx`` must be non-negative int64 of static rank (the caller unsqueezes its last axis).
    """
    eq = em.op("Equal", [idx, arange(em, size)])
    return em.op("Cast", [eq], {"to": dtype})


# --------------------------------------------------------------------------------- Gather
# The tangent gathers the tangent (the node applied to it, indices and attributes as they are).
gather = OpRules("Gather", since=11)
gather.jvp(linear_unary_jvp)


@gather.transpose
def _gather_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (data, idx) = cts[0], node.inputs
    assert data is not None and idx is not None
    if ct is None or not linear[0]:
        return [None, None]
    unknown_rank = data.shape is None or idx.shape is None
    if unknown_rank and em.opset >= _SCATTER_ADD_OPSET and node.attributes.get_int("axis", 0) == 0:
        return [_gather_axis0_transpose(em, ct, data, idx), None]
    r, q = _rank(node, data, "input 'data'"), _rank(node, idx, "input 'indices'")
    a = axis_of(node, r)
    d_a = _dim(em, data, a)
    idx_n = _normalized(em, idx, d_a)
    # ct has shape D[:a] + I + D[a+1:], with I = indices.shape (q axes).
    if em.opset >= _SCATTER_ADD_OPSET:
        # Move the gathered axis of data first and the index axes of ct first, so that ScatterND
        # addresses whole slices: zeros [d_a, D[:a], D[a+1:]], updates [I, D[:a], D[a+1:]].
        ct_p = em.transpose(ct, [*range(a, a + q), *range(a), *range(a + q, r + q - 1)])
        zeros = filled(
            em, _permuted_shape(em, data, [a, *range(a), *range(a + 1, r)]), dtype_of(data), 0.0
        )
        summed = em.op("ScatterND", [zeros, em.unsqueeze(idx_n, [q]), ct_p], {"reduction": "add"})
        return [em.transpose(summed, [*range(1, a + 1), 0, *range(a + 1, r)]), None]
    # Before opset 16: ct_data[.., k, ..] = sum_n ct[.., n, ..] * (idx[n] == k), a MatMul of the
    # cotangent (index axes flattened last) with a one-hot [n, d_a] matrix.
    flat = idx_n if q == 1 else em.op("Reshape", [idx_n, em.ints([-1])])
    onehot = _one_hot(em, em.unsqueeze(flat, [1]), d_a, dtype_of(data))
    ct_t = em.transpose(ct, [*range(a), *range(a + q, r + q - 1), *range(a, a + q)])
    if q != 1:
        ct_t = em.op("Reshape", [ct_t, em.ints([0] * (r - 1) + [-1])])
    summed = em.op("MatMul", [ct_t, onehot])  # D[:a] + D[a+1:] + [d_a]
    return [em.transpose(summed, [*range(a), r - 1, *range(a, r - 1)]), None]


def _gather_axis0_transpose(em: Emitter, ct: ir.Value, data: ir.Value, idx: ir.Value) -> ir.Value:
    """Gather's transpose along axis 0 without the ranks.

    (An embedding lookup whose indices come from run-time shape arithmetic, say.) ``ct`` is ``I + D[1:]``: ScatterND of it into zeros like ``data`` at ``idx[..., None]``
    adds whole rows in place, which needs neither ``len(I)`` nor ``len(D)``.
    """
    idx_n = _normalized(em, idx, _dim(em, data, 0))
    zeros = zeros_like(em, data)
    return em.op("ScatterND", [zeros, em.unsqueeze(idx_n, [-1]), ct], {"reduction": "add"})


@gather.batch
def _gather_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Gather under vmap.

    Batched data, shared indices: the same Gather one axis further. Shared data, batched indices:
    the Gather as it is, whose result has the batch axis where the index axes start (moved to
    0). Both batched: a GatherND over one-element tuples with the batch axis as a batch dimension
    (the gathered axis of data moved next to it), transposed back into Gather's layout.
    """
    (data, idx), (xd, xi) = operands(node, args)
    r, q = batch_rank(node, xd, "input 'data'"), batch_rank(node, xi, "input 'indices'")
    a = axis_of(node, r)
    if not batched[1]:
        return [bx.op("Gather", [data, idx], {"axis": a + 1})], [True]
    if not batched[0]:
        out = bx.op("Gather", [data, idx], {"axis": a})  # D[:a] + [B] + I + D[a+1:]
        return [bx.move_axis(out, a, 0, r + q)], [True]
    moved = bx.move_axis(data, a + 1, 1, r + 1)  # [B, d_a, D[:a], D[a+1:]]
    tuples = bx.unsqueeze(_as_int64(bx, idx), [q + 1])  # [B, I, 1]
    lead = bx.unbatched_shape(idx, True, xi) if bx.opset < _BATCH_DIMS_OPSET else None
    out = _gather_nd_both(bx, moved, tuples, lead, q, 0)  # [B, I, D[:a], D[a+1:]]
    perm = [0, *range(1 + q, 1 + q + a), *range(1, 1 + q), *range(1 + q + a, r + q)]
    return [bx.transpose(out, perm)], [True]


# ------------------------------------------------------------------------- GatherElements
gather_elements = OpRules("GatherElements", since=11)
gather_elements.jvp(linear_unary_jvp)


@gather_elements.transpose
def _gather_elements_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (data, idx) = cts[0], node.inputs
    assert data is not None and idx is not None
    if ct is None or not linear[0]:
        return [None, None]
    r = _rank(node, data, "input 'data'")
    a = axis_of(node, r)
    d_a = _dim(em, data, a)
    idx_n = _normalized(em, idx, d_a)
    if em.opset >= _SCATTER_ADD_OPSET:
        zeros = zeros_like(em, data)
        return [
            em.op("ScatterElements", [zeros, idx_n, ct], {"axis": a, "reduction": "add"}),
            None,
        ]
    # Before opset 16: a one-hot axis k next to the gathered axis,
    # ct_data[.., k, ..] = sum_j ct[.., j, ..] * (idx[.., j, ..] == k).
    positions = em.unsqueeze(arange(em, d_a), list(range(1, r - a)))  # [d_a, 1, ..., 1]
    eq = em.op("Equal", [em.unsqueeze(idx_n, [a + 1]), positions])
    onehot = em.op("Cast", [eq], {"to": dtype_of(data)})
    spread = em.op("Mul", [em.unsqueeze(ct, [a + 1]), onehot])
    summed = em.reduce_sum(spread, [a], keepdims=False)  # idx.shape with axis a -> d_a
    if _dims_match(data, idx, a):
        return [summed, None]
    # GatherElements allows indices smaller than data on the other axes: pad with zeros.
    mask = em.ints([0 if i == a else 1 for i in range(r)])
    tail = em.op("Mul", [em.op("Sub", [em.shape(data), em.shape(idx)]), mask])
    pads = em.op("Concat", [em.ints([0] * r), tail], {"axis": 0})
    return [em.op("Pad", [summed, pads]), None]


@gather_elements.batch
def _gather_elements_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """GatherElements under vmap: both operands batched (the shared one broadcast), axis + 1.

    Data and indices have equal ranks and indices address data position by position on every
    axis but ``axis``, so the indices need a batch axis of full size too.
    """
    (data, idx), (xd, xi) = operands(node, args)
    a = axis_of(node, batch_rank(node, xd, "input 'data'"))
    data = bx.materialize(data, batched[0], xd)
    idx = bx.materialize(idx, batched[1], xi)
    return [bx.op("GatherElements", [data, idx], {"axis": a + 1})], [True]


# ------------------------------------------------------------------------------- GatherND
gather_nd = OpRules("GatherND", since=11)
gather_nd.jvp(linear_unary_jvp)


def _index_depth(node: ir.Node, idx: ir.Value, q: int) -> int:
    k = _static_dim(idx, q - 1) if q else None
    if k is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): differentiating it needs a static last "
            f"dimension of 'indices' {idx.name!r} (the index depth), found shape "
            f"{idx.shape}. Remedy: give the indices a fixed last dimension, e.g. declare the "
            "input with a known size or feed them as a constant."
        )
    return k


@gather_nd.transpose
def _gather_nd_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (data, idx) = cts[0], node.inputs
    assert data is not None and idx is not None
    if ct is None or not linear[0]:
        return [None, None]
    r, q = _rank(node, data, "input 'data'"), _rank(node, idx, "input 'indices'")
    b = node.attributes.get_int("batch_dims", 0)
    k = _index_depth(node, idx, q)
    idx_n = _normalized(em, idx, _dims_vector(em, data, b, b + k))
    dtype = dtype_of(data)
    if em.opset >= _SCATTER_ADD_OPSET:
        if b:
            # ScatterND has no batch_dims: prepend the batch coordinates to every index tuple.
            grid_shape = em.op(
                "Concat",
                [em.slice(em.shape(idx), [0], [q - 1], [0]), em.ints([1])],
                {"axis": 0},
            )
            pieces = []
            for j in range(b):
                coords = em.unsqueeze(
                    arange(em, _dim(em, data, j)), [i for i in range(q) if i != j]
                )
                pieces.append(em.op("Expand", [coords, grid_shape]))
            idx_n = em.op("Concat", [*pieces, idx_n], {"axis": -1})
        zeros = zeros_like(em, data)
        return [em.op("ScatterND", [zeros, idx_n, ct], {"reduction": "add"}), None]
    # Before opset 16: flatten each index tuple to a row-major offset into D[b:b+k] (size M) and
    # contract the cotangent with its one-hot encoding, batched over the batch axes B:
    #   ct [B, J, R] -> [B, R, 1, n] @ onehot [B, 1.., n, M] -> [B, R, 1, M] -> [B, 1, M, R] -> D.
    n_j, n_r = q - 1 - b, r - b - k
    if k == 0:
        lin = filled(em, em.slice(em.shape(idx), [0], [q - 1], [0]), ir.DataType.INT64, 0)
    else:
        lin = em.op("Gather", [idx_n, em.const(np.array(0, dtype=np.int64))], {"axis": q - 1})
        for j in range(1, k):
            part = em.op("Gather", [idx_n, em.const(np.array(j, dtype=np.int64))], {"axis": q - 1})
            lin = em.op("Add", [em.op("Mul", [lin, _dim(em, data, b + j)]), part])
    sizes = [_static_dim(data, b + j) for j in range(k)]
    if all(s is not None for s in sizes):
        size = em.const(np.array(int(np.prod([s for s in sizes if s is not None])), dtype=np.int64))
    else:
        size = em.scalar(1, ir.DataType.INT64)
        for j in range(k):
            size = em.op("Mul", [size, _dim(em, data, b + j)])
    lin_f = em.op("Reshape", [lin, em.ints([0] * b + [-1])])  # [B, n]
    onehot = _one_hot(em, em.unsqueeze(lin_f, [b + 1]), size, dtype)  # [B, n, M]
    onehot = em.unsqueeze(onehot, list(range(b, b + n_r)))  # [B, 1 (n_r times), n, M]
    ct_t = em.transpose(ct, [*range(b), *range(b + n_j, b + n_j + n_r), *range(b, b + n_j)])
    ct_f = em.op("Reshape", [ct_t, em.ints([0] * (b + n_r) + [1, -1])])  # [B, R, 1, n]
    summed = em.op("MatMul", [ct_f, onehot])  # [B, R, 1, M]
    summed = em.transpose(summed, [*range(b), b + n_r, b + n_r + 1, *range(b, b + n_r)])
    return [em.op("Reshape", [summed, em.shape(data)]), None]


def _gather_nd_both(
    bx: Batcher, data: ir.Value, idx: ir.Value, lead: ir.Value | None, n_lead: int, b: int
) -> ir.Value:
    """GatherND of batched ``data`` with batched int64 ``idx`` (node ``batch_dims`` ``b``).

    ``lead`` (the shape of ``idx``'s tuple-leading axes of one example, ``n_lead`` of them) is
    needed only before opset 12, where the batch coordinate is prepended to each tuple.
    """
    if bx.opset >= _BATCH_DIMS_OPSET:
        return bx.op("GatherND", [data, idx], {"batch_dims": b + 1})
    assert b == 0 and lead is not None  # no batch_dims attribute before opset 12
    return bx.op("GatherND", [data, prepend_batch_coordinates(bx, idx, lead, n_lead)])


@gather_nd.batch
def _gather_nd_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """GatherND under vmap.

    Shared data, batched indices: the index batch axis is one more leading axis of the indices
    (moved behind the node's ``batch_dims`` ones, and moved back to 0 in the result). Batched
    data: indices broadcast along the batch and one more batch dimension (or, before opset 12,
    the batch coordinate prepended to every tuple).
    """
    (data, idx), (_, xi) = operands(node, args)
    b = node.attributes.get_int("batch_dims", 0)
    q = batch_rank(node, xi, "input 'indices'")
    if not batched[0]:
        if b == 0:
            return [bx.op("GatherND", [data, idx])], [True]
        moved = bx.move_axis(idx, 0, b, q + 1)  # [D[:b], B, J, k]
        out = bx.op("GatherND", [data, moved], {"batch_dims": b})  # [D[:b], B, J, rest]
        return [bx.move_axis(out, b, 0, batch_rank(node, node.outputs[0], "output") + 1)], [True]
    lead = leading_shape(bx, idx, batched[1], xi, q) if bx.opset < _BATCH_DIMS_OPSET else None
    idx = bx.materialize(idx, batched[1], xi)
    return [_gather_nd_both(bx, data, idx, lead, q - 1, b)], [True]


# ------------------------------------------------------------------ ArrayFeatureExtractor (ml)
array_feature_extractor = OpRules("ArrayFeatureExtractor", since=1, domain="ai.onnx.ml")


def _afe_selection(em: Emitter, x: ir.Value, indices: ir.Value) -> ir.Value:
    """The ``[C, k]`` 0/1 matrix picking the columns ``indices`` of the last axis (size ``C``).

    Built with Equal rather than OneHot, which onnxruntime lacks for double values.
    """
    assert x.dtype is not None
    depth = em.squeeze(em.slice(em.shape(x), [-1], [2**62], [0]), [0])
    zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
    rows = em.unsqueeze(em.op("Range", [zero, depth, one]), [1])
    flat = em.op(
        "Cast", [em.op("Reshape", [indices, em.ints([1, -1])])], {"to": int(ir.DataType.INT64)}
    )
    return em.op("Cast", [em.op("Equal", [rows, flat])], {"to": int(x.dtype)})


@array_feature_extractor.jvp
def _afe_jvp(
    em: Emitter, node: ir.Node, tangents: Sequence[ir.Value | None]
) -> list[ir.Value | None]:
    """ai.onnx.ml::ArrayFeatureExtractor selects columns of the last axis: linear in ``X``.

    The tangent is ``t @ S`` with ``S`` the ``[C, k]`` selection matrix (a MatMul with a primal
    matrix, whose transpose onnax already has); a 1-D ``X`` gives a ``[1, k]`` result.
    """
    t = tangents[0]
    if t is None:
        return [None]
    x, indices = node.inputs[0], node.inputs[1]
    assert x is not None and indices is not None
    out = em.op("MatMul", [t, _afe_selection(em, x, indices)])
    if x.shape is not None and x.shape.rank() == 1:
        out = em.unsqueeze(out, [0])
    return [out]


@array_feature_extractor.batch
def _afe_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> tuple[list[ir.Value | None], list[bool]]:
    """ArrayFeatureExtractor of a batched ``X``: the last axis is still the one selected from.

    A 1-D example's ``[1, k]`` result gets its leading 1 after the batch axis. Batched indices
    are refused.
    """
    x, original = args[0], node.inputs[0]
    assert x is not None and original is not None
    if batched[1]:
        name = node.inputs[1].name if node.inputs[1] is not None else "#1"
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets batched "
            f"indices (input 1 {name!r}): each example would select other columns, which one "
            "ArrayFeatureExtractor cannot express. Remedy: give the inputs the indices are "
            "computed from in_axes None (shared), or use GatherElements."
        )
    out = bx.op("ArrayFeatureExtractor", [x, args[1]], domain="ai.onnx.ml")
    if bx.rank(original) == 1:
        out = bx.unsqueeze(out, [1])
    return [out], [True]
