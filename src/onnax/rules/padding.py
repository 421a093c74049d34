"""Pad, in every mode (constant, edge, reflect, wrap), with pads and axes static or run-time.

Pad in constant mode is linear jointly in the data and the padding value; it transposes into a
Pad by the negated pads (a crop) for the data, and the sum over the padded positions for the
value. Edge/reflect/wrap are gathers along each axis whose source indices come from padding a
``Range`` with the node's own pads and mode; they transpose into a ScatterElements with
``reduction="add"`` per padded axis from opset 16, and into a contraction with a one-hot matrix
of the sources before.

Pads and axes known only at run time are handled with shape arithmetic on primal values, so a
dynamic dimension survives into the derivative model.

The batch rule (vmap) gives the batch axis a zero pad (or shifts the axes past it); batched pads
or axes are refused, naming the node and the input. Constant-mode Pad with a batched padding
value is a Where between the zero-padded data and each example's value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints
from onnax.core.batching import Batcher, refuse_batched, shift_axes
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.rules._patterns import attributes_of, batch_data, original_input
from onnax.rules._shape_helpers import (
    INT64_MAX,
    Param,
    arange,
    as_int64,
    as_vector,
    dim_of,
    ints_like,
    node_attrs,
    rank_of,
    reshape_like,
    shift_runtime_axes,
    spread,
    trim,
    zeros_like,
)

__all__: list[str] = []

pad = OpRules("Pad", since=11)


def _pad_mode(node: ir.Node) -> str:
    return node.attributes.get_string("mode", "constant")


def _pad_input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


@pad.jvp
def _pad_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # Constant mode is linear jointly in the data and the padding value: the padded positions
    # carry the value's tangent. The other modes copy data elements and ignore the value.
    x, pads, axes = node.inputs[0], node.inputs[1], _pad_input(node, 3)
    assert x is not None
    t_data = tangents[0]
    t_value = tangents[2] if len(tangents) > 2 and _pad_mode(node) == "constant" else None
    if t_data is None and t_value is None:
        return [None]
    data = t_data if t_data is not None else zeros_like(em, x)
    return [em.op("Pad", trim([data, pads, t_value, axes]), node_attrs(node))]


@pad.transpose
def _pad_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    results: list[ir.Value | None] = [None] * len(node.inputs)
    if _pad_mode(node) != "constant":
        results[0] = _gather_pad_transpose(em, node, ct, x)
        return results
    pads, axes = node.inputs[1], _pad_input(node, 3)
    assert pads is not None
    static = const_ints(pads)
    negated = em.ints([-p for p in static]) if static is not None else em.op("Neg", [pads])
    # Padding by the negated pads crops what padding added and zero-fills what it cropped.
    data_part = em.op("Pad", trim([ct, negated, None, axes]))
    if linear[0]:
        results[0] = data_part
    value = _pad_input(node, 2)
    if len(linear) > 2 and linear[2] and value is not None:
        # The value fills every output position that does not come from the data.
        total = em.op(
            "Sub",
            [
                em.reduce_sum(ct, None, keepdims=False),
                em.reduce_sum(data_part, None, keepdims=False),
            ],
        )
        rank0 = value.shape is not None and value.shape.rank() == 0
        results[2] = total if rank0 else reshape_like(em, total, value)
    return results


def _per_axis_pads(em: Emitter, node: ir.Node, rank: int) -> tuple[list[Param], list[Param]]:
    """The (begin, end) pads of every axis, static where the node's parameters are."""
    pads_in, axes_in = node.inputs[1], _pad_input(node, 3)
    assert pads_in is not None
    pads_static = const_ints(pads_in)
    axes: list[int] | ir.Value | None = None
    if axes_in is not None:
        axes_static = const_ints(axes_in)
        axes = axes_static if axes_static is not None else as_int64(em, axes_in)
    if isinstance(axes, ir.Value):
        count: Param = em.op("Shape", [axes])
    else:
        count = len(axes) if axes is not None else rank
    begins: list[int] | ir.Value
    ends: list[int] | ir.Value
    if pads_static is not None and isinstance(count, int):
        begins, ends = pads_static[:count], pads_static[count:]
    else:
        pads = em.ints(pads_static) if pads_static is not None else as_int64(em, pads_in)
        begins = em.slice(pads, [0], as_vector(em, count), [0])
        ends = em.slice(pads, as_vector(em, count), [INT64_MAX], [0])
    if axes is None and not isinstance(count, int):
        raise InternalRuleError("Pad: pads of run-time length need axes")
    spread_axes = axes if axes is not None else list(range(rank))
    return spread(em, begins, spread_axes, rank, 0), spread(em, ends, spread_axes, rank, 0)


def _move_last(em: Emitter, x: ir.Value, axis: int, rank: int) -> ir.Value:
    return em.transpose(x, [a for a in range(rank) if a != axis] + [axis])


def _move_back(em: Emitter, x: ir.Value, axis: int, rank: int) -> ir.Value:
    perm = [a for a in range(rank) if a != axis] + [axis]
    return em.transpose(x, [int(i) for i in np.argsort(perm)])


def _gather_pad_transpose(em: Emitter, node: ir.Node, ct: ir.Value, x: ir.Value) -> ir.Value:
    """Transpose of an edge/reflect/wrap Pad, a gather of input elements along each axis.

    The source index of each output position along axis j is ``Pad(Range(d_j), pads_j, mode)``.
    Sources repeat, so the transpose must add: from opset 16 a ScatterElements with
    ``reduction="add"`` per padded axis; before, a contraction of the cotangent's axis j with
    the one-hot matrix of the sources (dense in that axis, but valid at every opset).
    """
    rank = rank_of(node, x)
    begins, ends = _per_axis_pads(em, node, rank)
    assert x.dtype is not None
    memo: list[ir.Value] = []

    def shape_x() -> ir.Value:
        if not memo:
            memo.append(em.shape(x))
        return memo[0]

    mode = _pad_mode(node)
    y = node.outputs[0]
    x_dims = [dim_of(em, x, shape_x, j) for j in range(rank)]
    sources: dict[int, ir.Value] = {}
    for j in range(rank):
        if begins[j] == 0 and ends[j] == 0:
            continue
        if isinstance(begins[j], int) and isinstance(ends[j], int):
            pads_j = em.ints([begins[j], ends[j]])  # type: ignore[list-item]
        else:
            pads_j = em.op(
                "Concat", [as_vector(em, begins[j]), as_vector(em, ends[j])], {"axis": 0}
            )
        sources[j] = em.op("Pad", [arange(em, x_dims[j]), pads_j], {"mode": mode})
    if em.opset < 16:
        for j, src in sources.items():
            eq = em.op("Equal", [em.unsqueeze(src, [1]), em.unsqueeze(arange(em, x_dims[j]), [0])])
            one_hot = em.op("Cast", [eq], {"to": x.dtype})
            moved = _move_last(em, ct, j, rank)
            ct = _move_back(em, em.op("MatMul", [moved, one_hot]), j, rank)
        return ct
    # The cotangent's shape as the axes are transposed one by one: the output's sizes on the
    # axes still to do, the input's on those done.
    current: list[Param] = list(x_dims)
    current_sym: list[int | ir.SymbolicDim | None] = (
        list(x.shape.dims) if x.shape is not None else [None] * rank
    )
    for j, src in sources.items():
        out_j = y.shape.dims[j] if y.shape is not None else None
        current[j] = out_j if isinstance(out_j, int) else em.op("Shape", [src])
        current_sym[j] = out_j
    for j, src in sources.items():
        before = _shape_vector(em, current)
        current[j], current_sym[j] = x_dims[j], x.shape.dims[j] if x.shape is not None else None
        after = _shape_vector(em, current)
        shaped = em.op("Reshape", [src, em.ints([-1 if a == j else 1 for a in range(rank)])])
        indices = em.op("Expand", [shaped, before])
        zero = ir.tensor(np.zeros((1,), x.dtype.numpy()))
        zeros = em.op("ConstantOfShape", [after], {"value": zero})
        # Shape inference does not see through ConstantOfShape of computed shapes.
        zeros.dtype = x.dtype
        if all(d is not None for d in current_sym):
            zeros.shape = ir.Shape(current_sym)
        ct = em.op("ScatterElements", [zeros, indices, ct], {"axis": j, "reduction": "add"})
    return ct


def _shape_vector(em: Emitter, dims: Sequence[Param]) -> ir.Value:
    if all(isinstance(d, int) for d in dims):
        return em.ints([d for d in dims if isinstance(d, int)])
    return em.op("Concat", [as_vector(em, d) for d in dims], {"axis": 0})


@pad.batch
def _pad_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Pad with no padding on the batch axis.

    Without the axes input the pads are ``[x1_begin, ..., xr_begin, x1_end, ..., xr_end]`` for
    one example of rank ``r``: a 0 is inserted in front of both halves. With axes (opset 18)
    only the axes are shifted. A batched padding value (constant mode) cannot be an input of one
    Pad: the data is padded with zeros and the padded positions, given by padding a tensor of
    ones, take each example's value through a Where.
    """
    refuse_batched(bx, node, args, batched, {1: "pads", 3: "axes"})
    x, original = batch_data(args), original_input(node)
    r = bx.rank(original)
    inputs = list(args) + [None] * (4 - len(args))
    pads, value, axes = inputs[1], inputs[2], inputs[3]
    assert pads is not None
    value_batched = len(batched) > 2 and batched[2] and value is not None
    if value_batched and _pad_mode(node) != "constant":
        # Only constant mode reads the padding value.
        value, value_batched = None, False
    if value_batched:
        assert value is not None
        return [_pad_batched_value(bx, node, x, batched[0], value)], [True]
    x = bx.materialize(x, batched[0], original)
    new_axes: ir.Value | None = None
    if axes is not None:
        static_axes = const_ints(axes)
        new_axes = (
            ints_like(bx, shift_axes(static_axes, r), axes)
            if static_axes is not None
            else shift_runtime_axes(bx, axes, r)
        )
        new_pads = pads
    elif (static := const_ints(pads)) is not None:
        new_pads = bx.ints([0, *static[:r], 0, *static[r:]])
    else:
        zero = bx.ints([0])
        begins = bx.slice(pads, [0], [r], [0])
        ends = bx.slice(pads, [r], [2 * r], [0])
        new_pads = bx.op("Concat", [zero, begins, zero, ends], {"axis": 0})
    return [bx.op("Pad", trim([x, new_pads, value, new_axes]), attributes_of(node))], [True]


def _pad_batched_value(
    bx: Batcher, node: ir.Node, x: ir.Value, x_batched: bool, value: ir.Value
) -> ir.Value:
    """Constant-mode Pad with a batched padding value: ``Where(from data, padded, value)``.

    The pads are one example's and padding is the same for every example, so the data (batched
    or not) and the mask are padded with the node's own pads, unbatched, where possible: the
    broadcasting Where puts the batch axis back.
    """
    original = original_input(node)
    r = bx.rank(original)
    pads, axes = node.inputs[1], _pad_input(node, 3)
    assert x.dtype is not None or original.dtype is not None
    dtype = original.dtype if original.dtype is not None else x.dtype
    assert dtype is not None
    if x_batched:
        # Pad each example by its own pads: reuse this rule with the default (zero) value.
        padded = _pad_batch(bx, node, [x, pads, None, axes], [True, False, False, False])[0][0]
    else:
        padded = bx.op("Pad", trim([x, pads, None, axes]))
    assert padded is not None
    one = bx.scalar(1.0, dtype)
    ones = bx.op("Expand", [one, bx.unbatched_shape(x, x_batched, original)])
    from_data = bx.op(
        "Cast", [bx.op("Pad", trim([ones, pads, None, axes]))], {"to": ir.DataType.BOOL}
    )
    per_example = bx.op(
        "Reshape", [value, bx.op("Concat", [bx.batch_size, bx.ints([1] * r)], {"axis": 0})]
    )
    return bx.op("Where", [from_data, padded, per_example])
