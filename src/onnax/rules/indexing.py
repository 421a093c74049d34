"""Gather and scatter: Gather GatherElements GatherND ScatterElements ScatterND.

The gathers are linear in ``data``: the tangent gathers the tangent, and the transpose
*scatter-adds* the cotangent into zeros shaped like ``data``. Indices may repeat, so the scatter
must add. From opset 16 that is ``ScatterND``/``ScatterElements`` with ``reduction="add"``;
before 16 no scatter can add, and the transposes contract the cotangent with a one-hot encoding
of the indices instead (``Equal`` against a ``Range``, then ``MatMul`` or ``Mul`` + ``ReduceSum``).
Negative indices are normalised (``Where(idx < 0, idx + dim, idx)``) before any scatter or
one-hot encoding.

The scatters are linear in ``data`` and ``updates`` jointly for ``reduction`` none and add:

* none: ``y = scatter(data, idx, updates)``; the tangent scatters the tangents. Transposed,
  ``data`` receives the cotangent with the overwritten positions zeroed and ``updates`` gathers
  it. ONNX leaves the result of duplicate indices under ``reduction="none"`` undefined, and so is
  the derivative: the transpose assumes unique indices (as the ONNX spec requires).
* add: ``y = data + scatter_add(updates)``; ``data`` receives the cotangent itself.
* mul (16), max and min (18) are not linear. Their tangents are
  ``t_data * A + scatter_add(zeros, idx, t_updates * C)`` with coefficients ``A``, ``C`` built from
  primal values: for mul, exact products of the *other* factors (zeros in ``updates`` handled by
  counting them, no division by zero); for max/min, the selection mask of the winning operand,
  shared equally among tied winners (as JAX does for ``max``). The mul coefficients switch
  branches where an update is exactly zero: the first derivative is exact there too, but
  differentiating it again (second order) is exact only where no update is exactly zero.

Batch rules (vmap) keep each example's indices pointing into its own data, without loops: a
shared index set applies along a shifted axis (Gather) or as one more batch dimension of GatherND;
batched indices with shared data just add leading index axes (Gather, GatherND); when both are
batched, GatherND's ``batch_dims`` (opset 12 on) or index tuples led by the batch coordinate
(``Range`` over the batch, broadcast) address the batch axis explicitly. ScatterND, which has
no ``batch_dims``, always scatters with such tuples; GatherElements and ScatterElements, which
address every axis position by position, batch all operands along axis 0.

The deprecated ``Scatter`` (opsets 9-10) has no rule: models older than 11 are converted first.

Also here: **TensorScatter** (24), a KV-cache write, linear in ``past_cache`` and ``update``
jointly like the scatters above (transposed: the written window is gathered back for ``update``
with ``GatherElements``, and zeroed for ``past_cache``; vmap folds its axis into the operator's
batch axis), and **ai.onnx.ml::ArrayFeatureExtractor**, a selection of columns of the last axis,
whose tangent is a MatMul with a 0/1 selection matrix.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import batch_rules, jvp_rules, transpose_rules
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

Tangents = Sequence[ir.Value | None]

# The first opset whose ScatterND/ScatterElements accept reduction="add".
_SCATTER_ADD_OPSET = 16


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


def _axis(node: ir.Node, rank: int) -> int:
    axis = node.attributes.get_int("axis", 0)
    return axis + rank if axis < 0 else axis


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


def _filled(em: Emitter, shape: ir.Value, dtype: ir.DataType, fill: float) -> ir.Value:
    """A tensor of ``fill`` with run-time ``shape`` (never reads a linear value).

    ``Expand`` of a scalar rather than ``ConstantOfShape``: symbolic shape inference gives the
    former a shape when ``shape`` comes from ``Shape`` of a symbolic tensor, not the latter, and
    the transposes of later consumers (``Mul``, ``Add``) need it.
    """
    return em.op("Expand", [em.scalar(fill, dtype), shape])


def _zeros_like(em: Emitter, value: ir.Value) -> ir.Value:
    """Zeros with the shape and element type of ``value`` (which may be linear)."""
    if value.shape is not None and value.shape.rank() == 0:
        return em.scalar(0.0, _dtype(value))
    return _filled(em, em.shape(value), _dtype(value), 0.0)


def _dtype(value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise InternalRuleError(f"indexing: value {value.name!r} has no dtype")
    return value.dtype


def _permuted_shape(em: Emitter, value: ir.Value, perm: Sequence[int]) -> ir.Value:
    """The shape of ``value`` with its entries permuted by ``perm``."""
    if list(perm) == list(range(len(perm))):
        return em.shape(value)
    dims = [_static_dim(value, i) for i in perm]
    if all(d is not None for d in dims):
        return em.ints([int(d) for d in dims if d is not None])
    return em.op("Gather", [em.shape(value), em.ints(perm)])


def _range(em: Emitter, size: ir.Value) -> ir.Value:
    """``[0, 1, ..., size - 1]`` (int64) for a rank-0 int64 ``size``."""
    zero, one = em.scalar(0, ir.DataType.INT64), em.scalar(1, ir.DataType.INT64)
    return em.op("Range", [zero, size, one])


def _one_hot(em: Emitter, idx: ir.Value, size: ir.Value, dtype: ir.DataType) -> ir.Value:
    """``onehot[..., k] = (idx[...] == k)`` in ``dtype``, shape ``idx.shape + [size]``.

    ``idx`` must be non-negative int64 of static rank (the caller unsqueezes its last axis).
    """
    eq = em.op("Equal", [idx, _range(em, size)])
    return em.op("Cast", [eq], {"to": dtype})


def _attrs(node: ir.Node) -> dict[str, object]:
    return {k: a.value for k, a in node.attributes.items()}


# --------------------------------------------------------------------------------- Gather
def _gather_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    if t is None:
        return [None]
    return [em.op(node.op_type, [t, *node.inputs[1:]], _attrs(node))]


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
    a = _axis(node, r)
    d_a = _dim(em, data, a)
    idx_n = _normalized(em, idx, d_a)
    # ct has shape D[:a] + I + D[a+1:], with I = indices.shape (q axes).
    if em.opset >= _SCATTER_ADD_OPSET:
        # Move the gathered axis of data first and the index axes of ct first, so that ScatterND
        # addresses whole slices: zeros [d_a, D[:a], D[a+1:]], updates [I, D[:a], D[a+1:]].
        ct_p = em.transpose(ct, [*range(a, a + q), *range(a), *range(a + q, r + q - 1)])
        zeros = _filled(
            em, _permuted_shape(em, data, [a, *range(a), *range(a + 1, r)]), _dtype(data), 0.0
        )
        summed = em.op("ScatterND", [zeros, em.unsqueeze(idx_n, [q]), ct_p], {"reduction": "add"})
        return [em.transpose(summed, [*range(1, a + 1), 0, *range(a + 1, r)]), None]
    # Before opset 16: ct_data[.., k, ..] = sum_n ct[.., n, ..] * (idx[n] == k), a MatMul of the
    # cotangent (index axes flattened last) with a one-hot [n, d_a] matrix.
    flat = idx_n if q == 1 else em.op("Reshape", [idx_n, em.ints([-1])])
    onehot = _one_hot(em, em.unsqueeze(flat, [1]), d_a, _dtype(data))
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
    zeros = _zeros_like(em, data)
    return em.op("ScatterND", [zeros, em.unsqueeze(idx_n, [-1]), ct], {"reduction": "add"})


for _v in (11, 13):
    jvp_rules.add("Gather", _gather_jvp, since_version=_v)
    transpose_rules.add("Gather", _gather_transpose, since_version=_v)


# ------------------------------------------------------------------------- GatherElements
def _gather_elements_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (data, idx) = cts[0], node.inputs
    assert data is not None and idx is not None
    if ct is None or not linear[0]:
        return [None, None]
    r = _rank(node, data, "input 'data'")
    a = _axis(node, r)
    d_a = _dim(em, data, a)
    idx_n = _normalized(em, idx, d_a)
    if em.opset >= _SCATTER_ADD_OPSET:
        zeros = _zeros_like(em, data)
        return [
            em.op("ScatterElements", [zeros, idx_n, ct], {"axis": a, "reduction": "add"}),
            None,
        ]
    # Before opset 16: a one-hot axis k next to the gathered axis,
    # ct_data[.., k, ..] = sum_j ct[.., j, ..] * (idx[.., j, ..] == k).
    positions = em.unsqueeze(_range(em, d_a), list(range(1, r - a)))  # [d_a, 1, ..., 1]
    eq = em.op("Equal", [em.unsqueeze(idx_n, [a + 1]), positions])
    onehot = em.op("Cast", [eq], {"to": _dtype(data)})
    spread = em.op("Mul", [em.unsqueeze(ct, [a + 1]), onehot])
    summed = em.reduce_sum(spread, [a], keepdims=False)  # idx.shape with axis a -> d_a
    if _dims_match(data, idx, a):
        return [summed, None]
    # GatherElements allows indices smaller than data on the other axes: pad with zeros.
    mask = em.ints([0 if i == a else 1 for i in range(r)])
    tail = em.op("Mul", [em.op("Sub", [em.shape(data), em.shape(idx)]), mask])
    pads = em.op("Concat", [em.ints([0] * r), tail], {"axis": 0})
    return [em.op("Pad", [summed, pads]), None]


for _v in (11, 13):
    jvp_rules.add("GatherElements", _gather_jvp, since_version=_v)
    transpose_rules.add("GatherElements", _gather_elements_transpose, since_version=_v)


# ------------------------------------------------------------------------------- GatherND
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
    dtype = _dtype(data)
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
                    _range(em, _dim(em, data, j)), [i for i in range(q) if i != j]
                )
                pieces.append(em.op("Expand", [coords, grid_shape]))
            idx_n = em.op("Concat", [*pieces, idx_n], {"axis": -1})
        zeros = _zeros_like(em, data)
        return [em.op("ScatterND", [zeros, idx_n, ct], {"reduction": "add"}), None]
    # Before opset 16: flatten each index tuple to a row-major offset into D[b:b+k] (size M) and
    # contract the cotangent with its one-hot encoding, batched over the batch axes B:
    #   ct [B, J, R] -> [B, R, 1, n] @ onehot [B, 1.., n, M] -> [B, R, 1, M] -> [B, 1, M, R] -> D.
    n_j, n_r = q - 1 - b, r - b - k
    if k == 0:
        lin = _filled(em, em.slice(em.shape(idx), [0], [q - 1], [0]), ir.DataType.INT64, 0)
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


for _v in (11, 12, 13):
    jvp_rules.add("GatherND", _gather_jvp, since_version=_v)
    transpose_rules.add("GatherND", _gather_nd_transpose, since_version=_v)


# ----------------------------------------------------------- ScatterElements / ScatterND
def _reduction(node: ir.Node) -> str:
    return node.attributes.get_string("reduction", "none")


def _scatter(
    em: Emitter, node: ir.Node, x: ir.Value, idx: ir.Value, u: ir.Value, reduction: str
) -> ir.Value:
    """The node's scatter (same operator and axis) with ``reduction``."""
    attrs: dict[str, object] = {"reduction": None if reduction == "none" else reduction}
    if node.op_type == "ScatterElements":
        attrs["axis"] = node.attributes.get_int("axis", 0)
    return em.op(node.op_type, [x, idx, u], attrs)


def _gather_for(em: Emitter, node: ir.Node, x: ir.Value, idx: ir.Value) -> ir.Value:
    """The gather that reads, for every element of ``updates``, the position it is scattered to."""
    if node.op_type == "ScatterElements":
        return em.op("GatherElements", [x, idx], {"axis": node.attributes.get_int("axis", 0)})
    return em.op("GatherND", [x, idx])


def _scatter_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (data, idx, u), (td, _, tu) = node.inputs, tangents
    assert data is not None and idx is not None and u is not None
    if td is None and tu is None:
        return [None]
    reduction = _reduction(node)
    if reduction in ("none", "add"):
        # Linear in (data, updates) jointly: scatter the tangents the same way.
        td = td if td is not None else _zeros_like(em, data)
        tu = tu if tu is not None else _zeros_like(em, u)
        return [_scatter(em, node, td, idx, tu, reduction)]
    if reduction not in ("mul", "max", "min"):
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): no derivative rule for "
            f"reduction={reduction!r}; onnax differentiates reduction none, add, mul, max and "
            "min. Remedy: use one of those reductions, or leave the inputs that feed this node "
            "out of `inputs`."
        )
    # The tangent is t_data * A + scatter_add(t_updates * C) with primal coefficients A (shaped
    # like data) and C (shaped like updates), emitted as one scatter-add onto t_data * A.
    y, dtype = node.outputs[0], _dtype(data)
    shape = em.shape(data)
    zero, one = em.scalar(0.0, dtype), em.scalar(1.0, dtype)
    coef_d: ir.Value | None = None
    coef_u: ir.Value | None = None
    if reduction == "mul":
        # y_p = data_p * prod_{i -> p} u_i, so A_p = prod_{i -> p} u_i and
        # C_i = data_p * prod_{j -> p, j != i} u_j, computed without dividing by a zero u_i from
        # Q_p = product of the nonzero u_j and Z_p = number of zero u_j scattered to p.
        if tu is None:
            coef_d = _scatter(em, node, _filled(em, shape, dtype, 1.0), idx, u, "mul")
        else:
            is_zero = em.op("Equal", [u, zero])
            safe = em.op("Where", [is_zero, one, u])
            q_all = _scatter(em, node, _filled(em, shape, dtype, 1.0), idx, safe, "mul")
            zeros_d = _filled(em, shape, dtype, 0.0)
            n_zero = _scatter(
                em, node, zeros_d, idx, em.op("Cast", [is_zero], {"to": dtype}), "add"
            )
            if td is not None:
                coef_d = em.op("Where", [em.op("Equal", [n_zero, zero]), q_all, zero])
            q_at = _gather_for(em, node, em.op("Mul", [data, q_all]), idx)
            z_at = _gather_for(em, node, n_zero, idx)
            when_zero = em.op("Where", [em.op("Equal", [z_at, one]), q_at, zero])
            when_nonzero = em.op(
                "Where", [em.op("Equal", [z_at, zero]), em.op("Div", [q_at, safe]), zero]
            )
            coef_u = em.op("Where", [is_zero, when_zero, when_nonzero])
    else:
        # max/min: the winner of each position carries the derivative; tied winners share it
        # equally (count >= 1 everywhere: y is one of the candidates).
        y_at = _gather_for(em, node, y, idx)
        won_u = em.op("Cast", [em.op("Equal", [u, y_at])], {"to": dtype})
        won_d = em.op("Cast", [em.op("Equal", [data, y])], {"to": dtype})
        count = _scatter(em, node, won_d, idx, won_u, "add")
        if td is not None:
            coef_d = em.op("Div", [won_d, count])
        if tu is not None:
            coef_u = em.op("Div", [won_u, _gather_for(em, node, count, idx)])
    base = None if td is None or coef_d is None else em.op("Mul", [td, coef_d])
    if tu is None or coef_u is None:
        return [base]
    if base is None:
        base = _filled(em, shape, dtype, 0.0)
    return [_scatter(em, node, base, idx, em.op("Mul", [tu, coef_u]), "add")]


def _scatter_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (data, idx, u) = cts[0], node.inputs
    assert data is not None and idx is not None and u is not None
    if ct is None:
        return [None, None, None]
    reduction = _reduction(node)
    if reduction not in ("none", "add"):
        raise InternalRuleError(f"{node.op_type} with reduction={reduction!r} is not linear")
    ct_data: ir.Value | None = None
    ct_u: ir.Value | None = None
    if linear[0]:
        # none: the overwritten positions do not depend on data (assumes unique indices).
        ct_data = (
            ct if reduction == "add" else _scatter(em, node, ct, idx, _zeros_like(em, u), "none")
        )
    if linear[2]:
        ct_u = _gather_for(em, node, ct, idx)
    return [ct_data, None, ct_u]


for _op in ("ScatterElements", "ScatterND"):
    for _v in (11, 13, 16, 18):
        jvp_rules.add(_op, _scatter_jvp, since_version=_v)
        transpose_rules.add(_op, _scatter_transpose, since_version=_v)


# ---------------------------------------------------------------------------- batch rules
# Under vmap every batched value carries the batch axis at 0. The gathers and scatters address
# elements of one example through their index tuples, so a batched formulation must keep example
# b's indices pointing into example b's data: GatherND's ``batch_dims`` does that (opset 12 on),
# and elsewhere the batch coordinate is prepended to every index tuple (a ``Range`` over the batch
# broadcast along the tuples), which turns the op into one over the whole batch.
Args = Sequence[ir.Value | None]
BatchResult = tuple[list[ir.Value | None], list[bool]]

# The first opset whose GatherND has ``batch_dims``.
_BATCH_DIMS_OPSET = 12


def _operands(node: ir.Node, args: Args) -> tuple[list[ir.Value], list[ir.Value]]:
    """The new and the original inputs of ``node`` (all present for these operators)."""
    new = [a for a in args if a is not None]
    old = [v for v in node.inputs if v is not None]
    if len(new) != len(args) or len(old) != len(node.inputs):
        raise InternalRuleError(f"{node.op_type}: a required input is missing")
    return new, old


def _batch_rank(node: ir.Node, value: ir.Value | None, what: str) -> int:
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


def _prepend_batch_coordinates(
    bx: Batcher, tuples: ir.Value, lead: ir.Value, n_lead: int
) -> ir.Value:
    """Index tuples ``[B, *lead, k]`` (int64) -> ``[B, *lead, 1 + k]`` led by the batch index.

    ``lead`` is the 1-D shape of the ``n_lead`` axes between the batch axis and the tuple axis.
    """
    size = bx.squeeze(bx.batch_size, [0])
    coords = bx.unsqueeze(_range(bx, size), list(range(1, n_lead + 2)))  # [B, 1, ..., 1]
    shape = bx.op("Concat", [bx.batch_size, lead, bx.ints([1])], {"axis": 0})
    return bx.op("Concat", [bx.op("Expand", [coords, shape]), tuples], {"axis": -1})


def _leading_shape(
    bx: Batcher, idx: ir.Value, batched: bool, original: ir.Value, q: int
) -> ir.Value:
    """The shape of one example of GatherND/ScatterND indices (rank ``q``) without the tuple axis."""
    return bx.slice(bx.unbatched_shape(idx, batched, original), [0], [q - 1], [0])


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
    return bx.op("GatherND", [data, _prepend_batch_coordinates(bx, idx, lead, n_lead)])


def _gather_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Gather under vmap.

    Batched data, shared indices: the same Gather one axis further. Shared data, batched indices:
    the Gather as it is, whose result has the batch axis where the index axes start (moved to
    0). Both batched: a GatherND over one-element tuples with the batch axis as a batch dimension
    (the gathered axis of data moved next to it), transposed back into Gather's layout.
    """
    (data, idx), (xd, xi) = _operands(node, args)
    r, q = _batch_rank(node, xd, "input 'data'"), _batch_rank(node, xi, "input 'indices'")
    a = _axis(node, r)
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


def _gather_elements_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """GatherElements under vmap: both operands batched (the shared one broadcast), axis + 1.

    Data and indices have equal ranks and indices address data position by position on every
    axis but ``axis``, so the indices need a batch axis of full size too.
    """
    (data, idx), (xd, xi) = _operands(node, args)
    a = _axis(node, _batch_rank(node, xd, "input 'data'"))
    data = bx.materialize(data, batched[0], xd)
    idx = bx.materialize(idx, batched[1], xi)
    return [bx.op("GatherElements", [data, idx], {"axis": a + 1})], [True]


def _gather_nd_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """GatherND under vmap.

    Shared data, batched indices: the index batch axis is one more leading axis of the indices
    (moved behind the node's ``batch_dims`` ones, and moved back to 0 in the result). Batched
    data: indices broadcast along the batch and one more batch dimension (or, before opset 12,
    the batch coordinate prepended to every tuple).
    """
    (data, idx), (_, xi) = _operands(node, args)
    b = node.attributes.get_int("batch_dims", 0)
    q = _batch_rank(node, xi, "input 'indices'")
    if not batched[0]:
        if b == 0:
            return [bx.op("GatherND", [data, idx])], [True]
        moved = bx.move_axis(idx, 0, b, q + 1)  # [D[:b], B, J, k]
        out = bx.op("GatherND", [data, moved], {"batch_dims": b})  # [D[:b], B, J, rest]
        return [bx.move_axis(out, b, 0, _batch_rank(node, node.outputs[0], "output") + 1)], [True]
    lead = _leading_shape(bx, idx, batched[1], xi, q) if bx.opset < _BATCH_DIMS_OPSET else None
    idx = bx.materialize(idx, batched[1], xi)
    return [_gather_nd_both(bx, data, idx, lead, q - 1, b)], [True]


def _scatter_elements_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """ScatterElements under vmap: all three operands batched (shared ones broadcast), axis + 1.

    Indices and updates address data position by position on every axis but ``axis``, so each
    example's updates land in its own slice.
    """
    (data, idx, u), (xd, xi, xu) = _operands(node, args)
    a = _axis(node, _batch_rank(node, xd, "input 'data'"))
    data = bx.materialize(data, batched[0], xd)
    idx = bx.materialize(idx, batched[1], xi)
    u = bx.materialize(u, batched[2], xu)
    return [bx.op("ScatterElements", [data, idx, u], _attrs(node) | {"axis": a + 1})], [True]


def _scatter_nd_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """ScatterND under vmap: the batch coordinate is prepended to every index tuple.

    ScatterND has no ``batch_dims``; with full tuples ``(b, i...)`` one scatter into the batched
    data (shared operands broadcast along the batch) updates each example's own slice, and the
    order of the updates within an example (which matters for duplicates) is kept.
    """
    (data, idx, u), (xd, xi, xu) = _operands(node, args)
    q = _batch_rank(node, xi, "input 'indices'")
    lead = _leading_shape(bx, idx, batched[1], xi, q)
    tuples = _prepend_batch_coordinates(bx, bx.materialize(idx, batched[1], xi), lead, q - 1)
    data = bx.materialize(data, batched[0], xd)
    u = bx.materialize(u, batched[2], xu)
    return [bx.op("ScatterND", [data, tuples, u], _attrs(node))], [True]


for _v in (11, 13):
    batch_rules.add("Gather", _gather_batch, since_version=_v)
    batch_rules.add("GatherElements", _gather_elements_batch, since_version=_v)
for _v in (11, 12, 13):
    batch_rules.add("GatherND", _gather_nd_batch, since_version=_v)
for _v in (11, 13, 16, 18):
    batch_rules.add("ScatterElements", _scatter_elements_batch, since_version=_v)
    batch_rules.add("ScatterND", _scatter_nd_batch, since_version=_v)


# ------------------------------------------------------------------ ArrayFeatureExtractor (ml)
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


jvp_rules.add("ArrayFeatureExtractor", _afe_jvp, domain="ai.onnx.ml", since_version=1)
batch_rules.add("ArrayFeatureExtractor", _afe_batch, domain="ai.onnx.ml", since_version=1)


# ---------------------------------------------------------------------------- TensorScatter
def _tensor_scatter_axis(node: ir.Node) -> tuple[int, int]:
    """(rank, non-negative sequence axis) of a TensorScatter node."""
    past = node.inputs[0]
    if past is None or past.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the rank of input 0 is unknown, and the "
            "derivative needs it to place the sequence axis. Remedy: declare the shape (at "
            "least the rank) of that value in the model's value_info."
        )
    rank = past.shape.rank()
    axis = node.attributes.get_int("axis", -2)
    return rank, axis + rank if axis < 0 else axis


def _tensor_scatter_jvp(
    em: Emitter, node: ir.Node, tangents: Sequence[ir.Value | None]
) -> list[ir.Value | None]:
    """TensorScatter is linear in (past_cache, update) jointly.

    The tangent is the same scatter of the tangents (a zero stands in for a missing one), at
    the same write indices.
    """
    t_past, t_update = tangents[0], tangents[1] if len(tangents) > 1 else None
    if t_past is None and t_update is None:
        return [None]
    past, update = node.inputs[0], node.inputs[1]
    assert past is not None and update is not None
    inputs: list[ir.Value | None] = [
        t_past if t_past is not None else em.zeros_like(past),
        t_update if t_update is not None else em.zeros_like(update),
        *node.inputs[2:],
    ]
    return [em.op("TensorScatter", inputs, attributes_of(node))]


def _tensor_scatter_transpose(
    em: Emitter, node: ir.Node, cts: Sequence[ir.Value | None], linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Transpose of TensorScatter.

    The written positions' cotangent goes to ``update`` (gathered back), the rest to
    ``past_cache`` (the written positions zeroed: they were overwritten).
    """
    ct = cts[0]
    out: list[ir.Value | None] = [None] * len(node.inputs)
    if ct is None:
        return out
    past, update = node.inputs[0], node.inputs[1]
    assert past is not None and update is not None
    indices = node.inputs[2] if len(node.inputs) > 2 else None
    if linear[0]:
        zeros = em.zeros_like(update)
        out[0] = em.op("TensorScatter", [ct, zeros, *node.inputs[2:]], attributes_of(node))
    if linear[1]:
        rank, axis = _tensor_scatter_axis(node)
        up_shape = em.shape(update)
        seq_len = em.slice(up_shape, [axis], [axis + 1], [0])
        zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
        steps = em.op("Range", [zero, em.squeeze(seq_len, [0]), one])
        place = [1] * rank
        place[axis] = -1
        position = em.op("Reshape", [steps, em.ints(place)])
        if indices is not None:
            first = [-1] + [1] * (rank - 1)
            position = em.op("Add", [position, em.op("Reshape", [indices, em.ints(first)])])
        if node.attributes.get_string("mode", "linear") == "circular":
            max_len = em.slice(em.shape(past), [axis], [axis + 1], [0])
            position = em.op("Mod", [position, max_len])
        position = em.op("Expand", [position, up_shape])
        out[1] = em.op("GatherElements", [ct, position], {"axis": axis})
    return out


def _tensor_scatter_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> tuple[list[ir.Value | None], list[bool]]:
    """TensorScatter with the vmap axis folded into the operator's batch axis.

    The operator's batch axis is axis 0, the one write_indices indexes: ``[B, b, ...] ->
    [B * b, ...]``, write indices tiled (shared) or flattened (batched), the result unfolded.
    """
    past_o, update_o = node.inputs[0], node.inputs[1]
    assert past_o is not None and update_o is not None
    past = bx.materialize(args[0], batched[0], past_o)  # type: ignore[arg-type]
    update = bx.materialize(args[1], batched[1], update_o)  # type: ignore[arg-type]
    rest: list[ir.Value | None] = []
    if len(args) > 2 and args[2] is not None:
        indices = args[2]
        if batched[2]:
            rest = [bx.op("Reshape", [indices, bx.ints([-1])])]
        else:
            rest = [bx.op("Tile", [indices, bx.batch_size])]

    def fold(v: ir.Value) -> ir.Value:
        tail = bx.slice(bx.op("Shape", [v]), [2], [2**62], [0])
        return bx.op("Reshape", [v, bx.op("Concat", [bx.ints([-1]), tail], {"axis": 0})])

    out = bx.op("TensorScatter", [fold(past), fold(update), *rest], attributes_of(node))
    return [bx.op("Reshape", [out, bx.op("Shape", [past])])], [True]


jvp_rules.add("TensorScatter", _tensor_scatter_jvp, since_version=24)
transpose_rules.add("TensorScatter", _tensor_scatter_transpose, since_version=24)
batch_rules.add("TensorScatter", _tensor_scatter_batch, since_version=24)
