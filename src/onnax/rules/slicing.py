"""Slicing and joining: Concat Split Slice.

Every operator here is linear in its data inputs, so the tangent is the operator applied to the
tangents, and the transpose puts the cotangent back where the data came from:

* Concat and Split transpose into each other (Concat into Slices of the linear inputs only; a
  Split output without a cotangent contributes zeros);
* Slice transposes into a constant Pad where every bound is static and the steps are ±1, and into
  a ScatterND of the cotangent into zeros otherwise. The scatter indices come from slicing a
  ``Range`` over each axis with the node's own starts/ends/steps, so ONNX's clamping rules are
  applied by the runtime exactly as in the primal instead of being re-implemented. A unit-step
  Slice of a value of unknown rank transposes into a Pad with axes (opset 18).

Parameters that are only known at run time (sizes, slice bounds, axes) are handled with shape
arithmetic on primal values, so a dynamic dimension survives into the derivative model.

Batch rules (vmap) keep the batch axis first and shift the axis (or axes) past it, also at run
time for axes given as inputs; shared Concat inputs are broadcast along the batch axis first. A
shape-like input (split sizes, bounds, axes, steps) that is itself batched could give each
example a different output shape: it is refused, naming the node and the input.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints, int_attr
from onnax.core.batching import Batcher, refuse_batched, shift_axes
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.rules._patterns import attributes_of, batch_data, original_input
from onnax.rules._shape_helpers import (
    INT64_MAX,
    INT64_MIN,
    Param,
    add_param,
    arange,
    as_int64,
    as_vector,
    dim_of,
    ints_like,
    node_attrs,
    norm_axis,
    rank_of,
    same_op_jvp,
    shift_runtime_axes,
    spread,
    trim,
    vector_length,
    zeros_like,
)

__all__ = ["clamp"]


# ------------------------------------------------------------------------------ Concat
concat = OpRules("Concat", since=4)


@concat.jvp
def _concat_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    if all(t is None for t in tangents):
        return [None]
    parts: list[ir.Value | None] = []
    for x, t in zip(node.inputs, tangents, strict=True):
        assert x is not None
        parts.append(t if t is not None else zeros_like(em, x))
    return [em.op("Concat", parts, node_attrs(node))]


@concat.transpose
def _concat_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    assert ct is not None
    if len(node.inputs) == 1:
        # A one-input Concat is a copy: its cotangent passes through (a Slice would copy it).
        return [ct if linear[0] else None]
    axis = int_attr(node, "axis", 0)
    if axis < 0:
        # A non-negative axis needs no rank (unknown after a Squeeze without axes, say).
        known = [
            v for v in (node.outputs[0], *node.inputs) if v is not None and v.shape is not None
        ]
        axis = norm_axis(axis, rank_of(node, known[0] if known else node.outputs[0]))
    results: list[ir.Value | None] = []
    offset: Param = 0
    for x, is_linear in zip(node.inputs, linear, strict=True):
        assert x is not None
        size = dim_of(em, x, functools.partial(em.shape, x), axis)
        end = add_param(em, offset, size)
        if is_linear:
            results.append(em.slice(ct, as_vector(em, offset), as_vector(em, end), [axis]))
        else:
            results.append(None)
        offset = end
    return results


@concat.batch
def _concat_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Concat along the shifted axis; shared inputs are broadcast along the batch axis first."""
    axis = int_attr(node, "axis", 0)
    if axis >= 0:
        # A non-negative axis shifts without the rank (unknown after a Squeeze without axes).
        axis += 1
    else:
        known = [
            v for v in (*node.inputs, node.outputs[0]) if v is not None and v.shape is not None
        ]
        axis = shift_axes([axis], bx.rank(known[0] if known else node.outputs[0]))[0]
    parts = [
        bx.materialize(a, b, v)
        for a, b, v in zip(args, batched, node.inputs, strict=True)
        if a is not None and v is not None
    ]
    return [bx.op("Concat", parts, attributes_of(node, axis=axis))], [True]


# ------------------------------------------------------------------------------- Split
split = OpRules("Split", since=2)
split.jvp(same_op_jvp)


@split.transpose
def _split_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    # Outputs without a cotangent contribute zeros shaped like them.
    parts: list[ir.Value | None] = [
        ct if ct is not None else zeros_like(em, out)
        for ct, out in zip(cts, node.outputs, strict=True)
    ]
    result = (
        parts[0] if len(parts) == 1 else em.op("Concat", parts, {"axis": int_attr(node, "axis", 0)})
    )
    return [result, *[None] * (len(node.inputs) - 1)]


@split.batch
def _split_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Split along the shifted axis; the split sizes (attribute or input) are one example's."""
    refuse_batched(bx, node, args, batched, {1: "split sizes"})
    axis = int_attr(node, "axis", 0)
    # A non-negative axis shifts without the rank (unknown after a Squeeze without axes).
    axis = axis + 1 if axis >= 0 else shift_axes([axis], bx.rank(original_input(node)))[0]
    outs = bx.op_multi(
        "Split",
        [batch_data(args), *args[1:]],
        attributes_of(node, axis=axis),
        num_outputs=len(node.outputs),
    )
    return list(outs), [True] * len(outs)


# ------------------------------------------------------------------------------- Slice
def clamp(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice's effective ``start`` and ``end`` on a dimension of size ``dim``."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


def _static_slice(node: ir.Node, rank: int) -> dict[int, tuple[int, int, int]] | None:
    """``{axis: (start, end, step)}`` when every slice parameter is a constant, else None."""
    starts, ends = const_ints(node.inputs[1]), const_ints(node.inputs[2])
    axes_in = node.inputs[3] if len(node.inputs) > 3 else None
    steps_in = node.inputs[4] if len(node.inputs) > 4 else None
    axes = const_ints(axes_in) if axes_in is not None else None
    steps = const_ints(steps_in) if steps_in is not None else None
    if (
        starts is None
        or ends is None
        or (axes_in is not None and axes is None)
        or (steps_in is not None and steps is None)
    ):
        return None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    return {
        norm_axis(a, rank): (s, e, st)
        for a, s, e, st in zip(axes, starts, ends, steps, strict=True)
    }


def _slice_pad_transpose(
    em: Emitter, ct: ir.Value, x: ir.Value, rank: int, params: dict[int, tuple[int, int, int]]
) -> ir.Value:
    """Transpose of a static slice with steps ±1: reverse where the step is -1, then zero-pad."""
    assert x.shape is not None
    begins, ends = [0] * rank, [0] * rank
    reversed_axes: list[int] = []
    for axis, (start, end, step) in params.items():
        dim = x.shape.dims[axis]
        assert isinstance(dim, int)
        s, e = clamp(start, end, step, dim)
        if step == 1:
            n = max(0, e - s)
            begins[axis], ends[axis] = s, dim - s - n
        else:
            # Positions s, s-1, ..., s-n+1; reversed they are the block s-n+1 .. s.
            n = max(0, s - e)
            begins[axis], ends[axis] = s - n + 1, dim - 1 - s
            reversed_axes.append(axis)
    if reversed_axes:
        k = len(reversed_axes)
        ct = em.slice(ct, [-1] * k, [INT64_MIN] * k, reversed_axes, [-1] * k)
    if any(begins) or any(ends):
        ct = em.op("Pad", [ct, em.ints(begins + ends)])
    return ct


def _slice_scatter_transpose(
    em: Emitter, node: ir.Node, ct: ir.Value, x: ir.Value, rank: int
) -> ir.Value:
    """Transpose of any slice: ScatterND of the cotangent into zeros shaped like the input.

    The positions kept along each axis are ``Slice(Range(dim), start, end, step)``: the node's
    own parameters, so the runtime applies ONNX's clamping exactly as in the primal.
    """
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts_in, ends_in, axes_in, steps_in = inputs[1], inputs[2], inputs[3], inputs[4]
    assert starts_in is not None and ends_in is not None

    def param(value: ir.Value) -> list[int] | ir.Value:
        static = const_ints(value)
        return static if static is not None else as_int64(em, value)

    starts, ends = param(starts_in), param(ends_in)
    axes = param(axes_in) if axes_in is not None else None
    per_start = spread(em, starts, axes, rank, 0)
    per_end = spread(em, ends, axes, rank, INT64_MAX)
    per_step: list[Param] = [1] * rank
    if steps_in is not None:
        per_step = spread(em, param(steps_in), axes, rank, 1)
    shape_memo: list[ir.Value] = []

    def shape_x() -> ir.Value:
        if not shape_memo:
            shape_memo.append(em.shape(x))
        return shape_memo[0]

    pieces: list[ir.Value] = []
    lengths: list[ir.Value] = []
    for j in range(rank):
        positions = arange(em, dim_of(em, x, shape_x, j))
        s, e, st = per_start[j], per_end[j], per_step[j]
        if not (s == 0 and e == INT64_MAX and st == 1):
            positions = em.slice(
                positions, as_vector(em, s), as_vector(em, e), [0], as_vector(em, st)
            )
        lengths.append(em.op("Shape", [positions]))
        # Along axis j only, with a trailing axis for the index component.
        pieces.append(em.unsqueeze(positions, [a for a in range(rank + 1) if a != j]))
    out_shape = em.op("Concat", [*lengths, em.ints([1])], {"axis": 0})
    grid = em.op("Concat", [em.op("Expand", [p, out_shape]) for p in pieces], {"axis": -1})
    assert x.dtype is not None
    zero = ir.tensor(np.zeros((1,), dtype=x.dtype.numpy()))
    zeros = em.op("ConstantOfShape", [shape_x()], {"value": zero})
    # Shape inference does not see through ConstantOfShape(Shape(x)): record what is known.
    zeros.type, zeros.shape = x.type, x.shape.copy() if x.shape is not None else None
    return em.op("ScatterND", [zeros, grid, ct])


def _slice_rank_free_transpose(em: Emitter, node: ir.Node, ct: ir.Value) -> ir.Value | None:
    """Transpose of a unit-step slice of a value of unknown rank, or None when not applicable.

    From opset 18 ``Pad`` takes the axes it pads, so no rank is needed: the pads are computed
    at run time from the sliced dimensions (``Gather`` of the input's shape, which reads
    negative axes from the back as Slice does), with Slice's clamping. Needs constant axes
    (or a static number of starts) and steps that are absent or all 1.
    """
    x = node.inputs[0]
    assert x is not None
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts_in, ends_in, axes_in, steps_in = inputs[1], inputs[2], inputs[3], inputs[4]
    assert starts_in is not None and ends_in is not None
    if em.opset < 18:
        return None
    if steps_in is not None:
        steps = const_ints(steps_in)
        if steps is None or any(st != 1 for st in steps):
            return None
    if axes_in is not None:
        axes = const_ints(axes_in)
    else:
        static_starts = const_ints(starts_in)
        count = len(static_starts) if static_starts is not None else vector_length(starts_in)
        axes = list(range(count)) if count is not None else None
    if axes is None:
        return None
    # em.shape: x is a linear value here, read through its shape witness.
    dims = em.op("Gather", [em.shape(x), em.ints(axes)], {"axis": 0})
    zero = em.const(np.array(0, np.int64))

    def clamped(bound: ir.Value) -> ir.Value:
        # Into [-dim, dim] first, so that adding dim cannot overflow (ends are often INT64_MAX).
        bound = as_int64(em, bound)
        bound = em.op("Max", [em.op("Min", [bound, dims]), em.op("Neg", [dims])])
        return em.op("Where", [em.op("Less", [bound, zero]), em.op("Add", [bound, dims]), bound])

    begin, end = clamped(starts_in), clamped(ends_in)
    kept = em.op("Max", [em.op("Sub", [end, begin]), zero])
    after = em.op("Sub", [em.op("Sub", [dims, begin]), kept])
    pads = em.op("Concat", [begin, after], {"axis": 0})
    return em.op("Pad", [ct, pads, None, em.ints(axes)])


def _slice_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    if x.shape is None:
        padded = _slice_rank_free_transpose(em, node, ct)
        if padded is not None:
            return [padded, *[None] * (len(node.inputs) - 1)]
    rank = rank_of(node, x)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    params = _static_slice(node, rank)
    assert x.shape is not None
    if params is not None and all(
        isinstance(x.shape.dims[a], int) and step in (1, -1) for a, (_, _, step) in params.items()
    ):
        return [_slice_pad_transpose(em, ct, x, rank, params), *rest]
    return [_slice_scatter_transpose(em, node, ct, x, rank), *rest]


slice_ = OpRules("Slice", since=10)
slice_.jvp(same_op_jvp)
slice_.transpose(_slice_transpose)


@slice_.batch
def _slice_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Slice with its axes shifted past the batch axis; the bounds are one example's.

    Omitted axes mean ``range(len(starts))``; they are made explicit (shifted). Index constants
    take the element type of ``starts``, as Slice requires one integer type for all of them.
    """
    roles = {1: "starts", 2: "ends", 3: "axes", 4: "steps"}
    refuse_batched(bx, node, args, batched, roles)
    x, original = batch_data(args), original_input(node)
    r = bx.rank(original)
    inputs = list(args) + [None] * (5 - len(args))
    starts, ends, axes_in, steps = inputs[1], inputs[2], inputs[3], inputs[4]
    assert starts is not None and ends is not None
    axes: ir.Value
    if axes_in is not None:
        static = const_ints(axes_in)
        axes = (
            ints_like(bx, shift_axes(static, r), starts)
            if static is not None
            else shift_runtime_axes(bx, axes_in, r)
        )
    else:
        n = vector_length(starts)
        if n is None:
            n = len(static_starts) if (static_starts := const_ints(starts)) is not None else None
        if n is not None:
            axes = ints_like(bx, range(1, n + 1), starts)
        else:
            # The number of sliced axes is only known at run time: 1, 2, ..., len(starts).
            one = bx.const(np.array(1, np.int64))
            count = bx.squeeze(bx.op("Shape", [starts]), [0])
            axes = bx.op("Range", [one, bx.op("Add", [count, one]), one])
            if starts.dtype not in (None, ir.DataType.INT64):
                axes = bx.op("Cast", [axes], {"to": starts.dtype})
    return [bx.op("Slice", trim([x, starts, ends, axes, steps]))], [True]
