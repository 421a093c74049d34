"""Scatters: ScatterElements ScatterND, and TensorScatter.

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

Batch rules (vmap): ScatterND, which has no ``batch_dims``, always scatters with index tuples
led by the batch coordinate (``Range`` over the batch, broadcast); ScatterElements, which
addresses every axis position by position, batches all operands along axis 0.

The deprecated ``Scatter`` (opsets 9-10) has no rule: models older than 11 are converted first.

Also here: **TensorScatter** (24), a KV-cache write, linear in ``past_cache`` and ``update``
jointly like the scatters above (transposed: the written window is gathered back for ``update``
with ``GatherElements``, and zeroed for ``past_cache``; vmap folds its axis into the operator's
batch axis).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._indexing import (
    axis_of,
    batch_rank,
    dtype_of,
    filled,
    leading_shape,
    operands,
    prepend_batch_coordinates,
    zeros_like,
)
from onnax.rules._patterns import attributes_of


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


# The two share their jvp and transpose rules; their batch rules differ.
scatter_elements = OpRules("ScatterElements", since=11)
scatter_nd = OpRules("ScatterND", since=11)


@scatter_elements.jvp
@scatter_nd.jvp
def _scatter_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (data, idx, u), (td, _, tu) = node.inputs, tangents
    assert data is not None and idx is not None and u is not None
    if td is None and tu is None:
        return [None]
    reduction = _reduction(node)
    if reduction in ("none", "add"):
        # Linear in (data, updates) jointly: scatter the tangents the same way.
        td = td if td is not None else zeros_like(em, data)
        tu = tu if tu is not None else zeros_like(em, u)
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
    y, dtype = node.outputs[0], dtype_of(data)
    shape = em.shape(data)
    zero, one = em.scalar(0.0, dtype), em.scalar(1.0, dtype)
    coef_d: ir.Value | None = None
    coef_u: ir.Value | None = None
    if reduction == "mul":
        # y_p = data_p * prod_{i -> p} u_i, so A_p = prod_{i -> p} u_i and
        # C_i = data_p * prod_{j -> p, j != i} u_j, computed without dividing by a zero u_i from
        # Q_p = product of the nonzero u_j and Z_p = number of zero u_j scattered to p.
        if tu is None:
            coef_d = _scatter(em, node, filled(em, shape, dtype, 1.0), idx, u, "mul")
        else:
            is_zero = em.op("Equal", [u, zero])
            safe = em.op("Where", [is_zero, one, u])
            q_all = _scatter(em, node, filled(em, shape, dtype, 1.0), idx, safe, "mul")
            zeros_d = filled(em, shape, dtype, 0.0)
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
        base = filled(em, shape, dtype, 0.0)
    return [_scatter(em, node, base, idx, em.op("Mul", [tu, coef_u]), "add")]


@scatter_elements.transpose
@scatter_nd.transpose
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
            ct if reduction == "add" else _scatter(em, node, ct, idx, zeros_like(em, u), "none")
        )
    if linear[2]:
        ct_u = _gather_for(em, node, ct, idx)
    return [ct_data, None, ct_u]


@scatter_elements.batch
def _scatter_elements_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """ScatterElements under vmap: all three operands batched (shared ones broadcast), axis + 1.

    Indices and updates address data position by position on every axis but ``axis``, so each
    example's updates land in its own slice.
    """
    (data, idx, u), (xd, xi, xu) = operands(node, args)
    a = axis_of(node, batch_rank(node, xd, "input 'data'"))
    data = bx.materialize(data, batched[0], xd)
    idx = bx.materialize(idx, batched[1], xi)
    u = bx.materialize(u, batched[2], xu)
    return [bx.op("ScatterElements", [data, idx, u], attributes_of(node) | {"axis": a + 1})], [True]


@scatter_nd.batch
def _scatter_nd_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """ScatterND under vmap: the batch coordinate is prepended to every index tuple.

    ScatterND has no ``batch_dims``; with full tuples ``(b, i...)`` one scatter into the batched
    data (shared operands broadcast along the batch) updates each example's own slice, and the
    order of the updates within an example (which matters for duplicates) is kept.
    """
    (data, idx, u), (xd, xi, xu) = operands(node, args)
    q = batch_rank(node, xi, "input 'indices'")
    lead = leading_shape(bx, idx, batched[1], xi, q)
    tuples = prepend_batch_coordinates(bx, bx.materialize(idx, batched[1], xi), lead, q - 1)
    data = bx.materialize(data, batched[0], xd)
    u = bx.materialize(u, batched[2], xu)
    return [bx.op("ScatterND", [data, tuples, u], attributes_of(node))], [True]


# ---------------------------------------------------------------------------- TensorScatter
tensor_scatter = OpRules("TensorScatter", since=24)


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


@tensor_scatter.jvp
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


@tensor_scatter.transpose
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


@tensor_scatter.batch
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
