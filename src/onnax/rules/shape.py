"""Shape and layout operators, inference Dropout, and the sources Constant, ConstantOfShape, Range.

Covered: Reshape Flatten Transpose Squeeze Unsqueeze Concat Split Slice Pad Tile Expand Dropout.

Every operator here is linear in its data input, so the tangent is the operator applied to the
tangent and the transpose undoes the layout change:

* pure relayouts (Reshape, Flatten, Squeeze, Unsqueeze) reshape the cotangent back, or apply the
  inverse operator when its parameters are known, which needs no run-time shape;
* Concat and Split transpose into each other (Concat into Slices of the linear inputs only);
* Slice transposes into a constant Pad where every bound is static and the steps are ±1, and into
  a ScatterND of the cotangent into zeros otherwise. The scatter indices come from slicing a
  ``Range`` over each axis with the node's own starts/ends/steps, so ONNX's clamping rules are
  applied by the runtime exactly as in the primal instead of being re-implemented;
* Pad in constant mode is linear jointly in the data and the padding value; it transposes into
  a Pad by the negated pads (a crop) for the data, and the sum over the padded positions for the
  value. Edge/reflect/wrap are gathers along each axis whose source indices come from padding a
  ``Range`` with the node's own pads and mode; they transpose into a ScatterElements with
  ``reduction="add"`` per padded axis from opset 16, and into a contraction with a one-hot
  matrix of the sources before;
* Tile sums the repeats out of an interleaved reshape of the cotangent.

Parameters that are only known at run time (shapes, pads, slice bounds, axes) are handled with
shape arithmetic on primal values, so a dynamic dimension survives into the derivative model.

Batch rules (vmap) keep the batch axis first and rewrite each operator's parameters for one more
leading axis: axes are shifted past it (also at run time, for axes given as inputs), Transpose's
perm gains a leading 0, Pad a zero pad, Tile a repeat of 1, and the shape consumers (Reshape,
Expand, Flatten) get the batch size prepended to the shape of one example, which vmap keeps
unbatched (``Shape`` returns one example's shape). A shape-like input (target shape, axes, pads,
bounds, repeats, split sizes, Range's operands) that is itself batched could give each example a
different output shape: it is refused, naming the node and the input. Constant-mode Pad with a
batched padding value is a Where between the zero-padded data and each example's value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints, int_attr, ints_attr, ints_param
from onnax.core.batching import Batcher, refuse_batched, shift_axes
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import (
    BatchRule,
    JvpRule,
    TransposeRule,
    batch_rules,
    jvp_rules,
    transpose_rules,
)
from onnax.core.selection import FLOAT_TYPES
from onnax.core.shapes import unbroadcast
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, batch_data, original_input, register_zero

Tangents = Sequence[ir.Value | None]
Args = Sequence[ir.Value | None]
BatchResult = tuple[list[ir.Value | None], list[bool]]
Param = int | ir.Value
"""A per-axis integer: a Python int when static, else a 1-D int64 Value holding one element."""

_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_MIN = int(np.iinfo(np.int64).min)


def _register(
    op_type: str, versions: Iterable[int], jvp: JvpRule, transpose: TransposeRule | None
) -> None:
    for v in versions:
        jvp_rules.add(op_type, jvp, since_version=v)
        if transpose is not None:
            transpose_rules.add(op_type, transpose, since_version=v)


# ------------------------------------------------------------------------------ helpers
def _attrs(node: ir.Node) -> dict[str, object]:
    return {k: a.value for k, a in node.attributes.items()}


def _trim(inputs: Sequence[ir.Value | None]) -> list[ir.Value | None]:
    """Drops trailing omitted optional inputs."""
    out = list(inputs)
    while out and out[-1] is None:
        out.pop()
    return out


def _rank(node: ir.Node, value: ir.Value) -> int:
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"the rank of {value.name!r}, input of {op_label(node)} ({node_label(node)}), is unknown "
            "after shape inference, and the derivative of this operator needs it. Remedy: give "
            "the model's inputs shapes of known rank (symbolic dimensions are fine)."
        )
    return value.shape.rank()


def _norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _reshape_like(em: Emitter, ct: ir.Value, like: ir.Value) -> ir.Value:
    """Reshapes ``ct`` to the shape of ``like`` (literal zeros in that shape stay zeros)."""
    attrs = {"allowzero": 1} if em.opset >= 14 else None
    return em.op("Reshape", [ct, em.shape(like)], attrs)


def _zeros_like(em: Emitter, value: ir.Value) -> ir.Value:
    """``em.zeros_like`` with the known type and shape recorded on the result.

    Shape inference does not see through ``ConstantOfShape(Shape(x))``; the rules downstream
    (Concat's transpose needs the sizes of its inputs) rely on the recorded shape.
    """
    zeros = em.zeros_like(value)
    if zeros.type is None:
        zeros.type = value.type
        zeros.shape = value.shape.copy() if value.shape is not None else None
    return zeros


def _int64(em: Emitter, value: ir.Value) -> ir.Value:
    """Slice bounds may be int32; the index arithmetic here is int64."""
    if value.dtype == ir.DataType.INT64:
        return value
    return em.op("Cast", [value], {"to": ir.DataType.INT64})


def _as_vector(em: Emitter, p: Param) -> ir.Value:
    return em.ints([p]) if isinstance(p, int) else p


def _element(em: Emitter, vector: ir.Value, k: int) -> ir.Value:
    return em.slice(vector, [k], [k + 1], [0])


def _dim(em: Emitter, x: ir.Value, shape_x: Callable[[], ir.Value], axis: int) -> Param:
    """Dimension ``axis`` of ``x``: an int when static, else a 1-element vector."""
    d = x.shape.dims[axis] if x.shape is not None else None
    if isinstance(d, int):
        return d
    return _element(em, shape_x(), axis)


def _arange(em: Emitter, n: Param) -> ir.Value:
    """``[0, 1, ..., n-1]`` as int64."""
    if isinstance(n, int):
        return em.const(np.arange(n, dtype=np.int64))
    zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
    return em.op("Range", [zero, em.squeeze(n, [0]), one])


def _add(em: Emitter, a: Param, b: Param) -> Param:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int) and a == 0:
        return b
    return em.op("Add", [_as_vector(em, a), _as_vector(em, b)])


def _spread(
    em: Emitter,
    values: list[int] | ir.Value,
    axes: list[int] | ir.Value | None,
    rank: int,
    default: int,
) -> list[Param]:
    """Per-axis parameters from ``values`` given for ``axes`` (None: the leading axes).

    Axes that ``axes`` does not list get ``default``. Run-time axes are normalized and scattered
    into a full-rank vector at run time.
    """
    if axes is None:
        if isinstance(values, ir.Value):
            n = (
                values.shape.dims[0]
                if values.shape is not None and values.shape.rank() == 1
                else None
            )
            if not isinstance(n, int):
                # The length is only known at run time: the axes are Range(len(values)).
                length = em.op("Shape", [values])
                axes = _arange(em, length)
            else:
                axes = list(range(n))
        else:
            axes = list(range(len(values)))
    if not isinstance(axes, ir.Value):
        out: list[Param] = [default] * rank
        for k, a in enumerate(axes):
            out[_norm_axis(a, rank)] = (
                values[k] if isinstance(values, list) else _element(em, values, k)
            )
        return out
    axes = _int64(em, axes)
    rank_c = em.ints([rank])
    normalized = em.op(
        "Where", [em.op("Less", [axes, em.ints([0])]), em.op("Add", [axes, rank_c]), axes]
    )
    vector = values if isinstance(values, ir.Value) else em.ints(values)
    full = em.op("ScatterElements", [em.ints([default] * rank), normalized, vector], {"axis": 0})
    return [_element(em, full, j) for j in range(rank)]


def _move_last(em: Emitter, x: ir.Value, axis: int, rank: int) -> ir.Value:
    return em.transpose(x, [a for a in range(rank) if a != axis] + [axis])


def _move_back(em: Emitter, x: ir.Value, axis: int, rank: int) -> ir.Value:
    perm = [a for a in range(rank) if a != axis] + [axis]
    return em.transpose(x, [int(i) for i in np.argsort(perm)])


# ------------------------------------------------------------------------ batch helpers
def _register_batch(op_type: str, versions: Iterable[int], rule: BatchRule) -> None:
    for v in versions:
        batch_rules.add(op_type, rule, since_version=v)


def _ints_like(bx: Batcher, values: Sequence[int], like: ir.Value | None) -> ir.Value:
    """A 1-D integer constant in the element type of ``like`` (int32 or int64 indices)."""
    dtype = like.dtype if like is not None and like.dtype is not None else ir.DataType.INT64
    return bx.const(np.array(list(values), dtype=dtype.numpy()))


def _shift_runtime_axes(bx: Batcher, axes: ir.Value, rank: int | ir.Value) -> ir.Value:
    """Run-time axes normalised and shifted past the batch axis, in their own integer type.

    ``rank`` (an int, or a 1-element int64 vector) is what negative axes count back from.
    """
    dtype = axes.dtype if axes.dtype is not None else ir.DataType.INT64
    np_dtype = dtype.numpy()
    if isinstance(rank, int):
        rank_v = bx.const(np.array(rank, dtype=np_dtype))
    else:
        rank_v = rank if dtype == ir.DataType.INT64 else bx.op("Cast", [rank], {"to": dtype})
    zero, one = bx.const(np.array(0, np_dtype)), bx.const(np.array(1, np_dtype))
    negative = bx.op("Less", [axes, zero])
    normalized = bx.op("Where", [negative, bx.op("Add", [axes, rank_v]), axes])
    return bx.op("Add", [normalized, one])


def _vector_length(value: ir.Value | None) -> int | None:
    """The static length of a 1-D value, or None."""
    if value is None or value.shape is None or value.shape.rank() != 1:
        return None
    n = value.shape.dims[0]
    return n if isinstance(n, int) else None


# ------------------------------------------------------------------------------ Expand
def _expand_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    return [None if t is None else em.op("Expand", [t, node.inputs[1]])]


def _expand_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    return [unbroadcast(em, ct, x, node.outputs[0]), None]


_register("Expand", (8, 13), _expand_jvp, _expand_transpose)


def _expand_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Expand of batched data to ``[B, 1 ... 1, *shape]``, the data aligned to the result rank.

    Expand broadcasts right-aligned, so one example of rank ``r`` against a shape of length
    ``s`` gives rank ``R = max(r, s)``. The data gets size-1 axes after the batch axis up to
    ``1 + R`` dimensions and the target is the shape padded with leading ones to ``R``, so the
    batch axis meets the batch size and every other axis lines up as in one example.
    """
    refuse_batched(bx, node, args, batched, {1: "target shape"})
    x, shape = batch_data(args), args[1]
    assert shape is not None
    r = bx.rank(original_input(node))
    s = _vector_length(shape)
    if s is None:
        # The length of the shape is only known at run time; the rank of the result may be.
        y = node.outputs[0]
        if y.shape is None or y.shape.rank() < r:
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}): the length of "
                f"its shape input {shape.name!r} and the rank of its result are unknown after "
                "shape inference, and batching needs the rank to line the batch axis up. Remedy: "
                "give the shape input a static length (e.g. build it with Concat of 1-D pieces)."
            )
        rank_out = y.shape.rank()
        ones = bx.op(
            "Expand", [bx.ints([1]), bx.op("Sub", [bx.ints([rank_out]), bx.op("Shape", [shape])])]
        )
        target = bx.op("Concat", [bx.batch_size, ones, shape], {"axis": 0})
    else:
        rank_out = max(r, s)
        lead = [bx.batch_size] + ([bx.ints([1] * (rank_out - s))] if rank_out > s else [])
        target = bx.op("Concat", [*lead, shape], {"axis": 0})
    aligned = bx.align(x, True, original_input(node), rank_out)
    return [bx.op("Expand", [aligned, target])], [True]


_register_batch("Expand", (8, 13), _expand_batch)


# ----------------------------------------------------------- same operator on the tangent
def _same_op_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """The operator applied to the tangent of its data input, other inputs and attributes kept."""
    t = tangents[0]
    if t is None:
        return [None] * len(node.outputs)
    outs = em.op_multi(
        node.op_type, [t, *node.inputs[1:]], _attrs(node), num_outputs=len(node.outputs)
    )
    return list(outs)


def _reshape_back_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Transpose of a relayout that keeps the element order (Reshape, Flatten, Squeeze...)."""
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    return [_reshape_like(em, ct, x), *[None] * (len(node.inputs) - 1)]


_register("Reshape", (5, 13, 14, 19, 21, 23, 24, 25), _same_op_jvp, _reshape_back_transpose)
_register("Flatten", (9, 11, 13, 21, 23, 24, 25), _same_op_jvp, _reshape_back_transpose)


def _reshape_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Reshape of batched data to ``Concat(batch size, shape)``.

    The shape input is the one of a single example (a constant, or Shape arithmetic, which vmap
    keeps unbatched). A 0 copies the input dimension at the same position (allowzero=0): with
    the batch axis prepended to both, position ``i`` becomes ``i + 1`` on both sides, so the
    copy still reads the right dimension; -1 still absorbs what remains of one example.
    """
    refuse_batched(bx, node, args, batched, {1: "target shape"})
    x, shape = batch_data(args), args[1]
    assert shape is not None
    target = bx.op("Concat", [bx.batch_size, shape], {"axis": 0})
    return [bx.op("Reshape", [x, target], attributes_of(node))], [True]


def _flatten_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Reshape to ``[B, prod(dims[:axis]), prod(dims[axis:])]``, one example's Flatten.

    The products are computed at run time when a dimension is symbolic.
    """
    x, original = batch_data(args), original_input(node)
    r = bx.rank(original)
    axis = _norm_axis(int_attr(node, "axis", 1), r)
    assert original.shape is not None
    dims = list(original.shape.dims)
    static = [d for d in dims if isinstance(d, int)]
    if len(static) == r:
        front = int(np.prod(static[:axis], dtype=np.int64))
        back = int(np.prod(static[axis:], dtype=np.int64))
        if front > 0 and back > 0:
            # Reshape's 0 copies the batch dimension: no run-time batch size needed.
            return [bx.op("Reshape", [x, bx.ints([0, front, back])])], [True]
    shape = bx.unbatched_shape(x, True, original)

    def product(start: int, end: int) -> ir.Value:
        if start == end:
            return bx.ints([1])
        part = bx.slice(shape, [start], [end], [0])
        return bx.reduce("ReduceProd", part, None, keepdims=True)

    target = bx.op("Concat", [bx.batch_size, product(0, axis), product(axis, r)], {"axis": 0})
    return [bx.op("Reshape", [x, target])], [True]


_register_batch("Reshape", (5, 13, 14, 19, 21, 23, 24, 25), _reshape_batch)
_register_batch("Flatten", (9, 11, 13, 21, 23, 24, 25), _flatten_batch)


# ------------------------------------------------------------------------------ Transpose
def _transpose_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    assert ct is not None
    perm = ints_attr(node, "perm")
    if perm is None:
        # The default reverses the axes, which is its own inverse.
        return [em.op("Transpose", [ct])]
    return [em.transpose(ct, [int(i) for i in np.argsort(perm)])]


_register("Transpose", (1, 13, 21, 23, 24, 25), _same_op_jvp, _transpose_transpose)


def _transpose_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """The batch axis stays first: ``perm' = [0] + [p + 1 for p in perm]``."""
    perm = ints_attr(node, "perm")
    if perm is None:
        r = bx.rank(original_input(node))
        perm = list(range(r - 1, -1, -1))
    # perm lists every axis, so its length is the rank (unknown after a Squeeze without axes).
    new_perm = [0, *shift_axes(perm, len(perm))]
    return [bx.op("Transpose", [batch_data(args)], {"perm": new_perm})], [True]


_register_batch("Transpose", (1, 13, 21, 23, 24, 25), _transpose_batch)


# --------------------------------------------------------------------- Squeeze / Unsqueeze
def _squeeze_like(em: Emitter, op_type: str, ct: ir.Value, axes: list[int] | ir.Value) -> ir.Value:
    if isinstance(axes, ir.Value):
        return em.op(op_type, [ct, axes])
    return em.squeeze(ct, axes) if op_type == "Squeeze" else em.unsqueeze(ct, axes)


def _squeeze_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    # Squeeze and Unsqueeze with the same axes are inverse (negative axes refer to the rank of
    # the larger tensor in both). Without axes Squeeze drops every size-1 dimension, which only
    # the input's shape tells: reshape back to it.
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    axes = ints_param(node, "axes", 1)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    if axes is None:
        return [_reshape_like(em, ct, x), *rest]
    inverse = "Unsqueeze" if node.op_type == "Squeeze" else "Squeeze"
    return [_squeeze_like(em, inverse, ct, axes), *rest]


for _op in ("Squeeze", "Unsqueeze"):
    _register(_op, (11, 13, 21, 23, 24, 25), _same_op_jvp, _squeeze_transpose)


def _squeeze_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Squeeze with its axes shifted past the batch axis.

    Negative axes count from the back of one example (its rank ``r``). Run-time axes are shifted
    at run time. Without axes every size-1 dimension of an example goes, never the batch axis
    (whose size may be 1): the axes are listed explicitly, from the static shape, or at run time
    as the positions where the example's shape is 1 (which needs axes as an input, opset 13).
    """
    refuse_batched(bx, node, args, batched, {1: "axes"})
    x, original = batch_data(args), original_input(node)
    r = bx.rank(original)
    axes = ints_param(node, "axes", 1)
    if isinstance(axes, ir.Value):
        return [bx.op("Squeeze", [x, _shift_runtime_axes(bx, axes, r)])], [True]
    if axes:
        return [bx.squeeze(x, shift_axes(axes, r))], [True]
    assert original.shape is not None
    dims = list(original.shape.dims)
    if all(isinstance(d, int) for d in dims):
        ones = [i + 1 for i, d in enumerate(dims) if d == 1]
        return [bx.squeeze(x, ones) if ones else bx.op("Identity", [x])], [True]
    if bx.opset < 13:
        unknown = [str(d) for d in dims if not isinstance(d, int)]
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) has no axes and "
            f"its input {original.name!r} has symbolic dimensions {unknown}: which of them are 1 "
            "is only known at run time, and before opset 13 Squeeze takes its axes as a static "
            "attribute (the batch axis, which may have size 1 too, must never be squeezed). "
            "Remedy: give the Squeeze explicit axes, or convert the model to opset 13 or newer."
        )
    shape = bx.unbatched_shape(x, True, original)
    where_one = bx.op("NonZero", [bx.op("Equal", [shape, bx.ints([1])])])
    positions = bx.op("Reshape", [where_one, bx.ints([-1])])
    return [bx.op("Squeeze", [x, bx.op("Add", [positions, bx.ints([1])])])], [True]


def _unsqueeze_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Unsqueeze with its axes shifted past the batch axis.

    Unsqueeze's axes refer to the *output* of one example, of rank ``r + len(axes)``, which is
    what negative axes are normalised against.
    """
    refuse_batched(bx, node, args, batched, {1: "axes"})
    x, original = batch_data(args), original_input(node)
    axes = ints_param(node, "axes", 1)
    if axes is None:
        raise InternalRuleError(f"{op_label(node)} ({node_label(node)}) has no axes")
    if not isinstance(axes, ir.Value) and all(a >= 0 for a in axes):
        # Non-negative axes shift without the rank (unknown after a Squeeze without axes).
        return [bx.unsqueeze(x, [a + 1 for a in axes])], [True]
    r = bx.rank(original)
    if not isinstance(axes, ir.Value):
        return [bx.unsqueeze(x, shift_axes(axes, r + len(axes)))], [True]
    n = _vector_length(axes)
    out_rank: int | ir.Value = (
        r + n if n is not None else bx.op("Add", [bx.ints([r]), bx.op("Shape", [axes])])
    )
    return [bx.op("Unsqueeze", [x, _shift_runtime_axes(bx, axes, out_rank)])], [True]


_register_batch("Squeeze", (11, 13, 21, 23, 24, 25), _squeeze_batch)
_register_batch("Unsqueeze", (11, 13, 21, 23, 24, 25), _unsqueeze_batch)


# ------------------------------------------------------------------------------ Concat
def _concat_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    if all(t is None for t in tangents):
        return [None]
    parts: list[ir.Value | None] = []
    for x, t in zip(node.inputs, tangents, strict=True):
        assert x is not None
        parts.append(t if t is not None else _zeros_like(em, x))
    return [em.op("Concat", parts, _attrs(node))]


def _concat_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    assert ct is not None
    axis = int_attr(node, "axis", 0)
    if axis < 0:
        # A non-negative axis needs no rank (unknown after a Squeeze without axes, say).
        known = [
            v for v in (node.outputs[0], *node.inputs) if v is not None and v.shape is not None
        ]
        axis = _norm_axis(axis, _rank(node, known[0] if known else node.outputs[0]))
    results: list[ir.Value | None] = []
    offset: Param = 0
    for x, is_linear in zip(node.inputs, linear, strict=True):
        assert x is not None
        size = _dim(em, x, functools.partial(em.shape, x), axis)
        end = _add(em, offset, size)
        if is_linear:
            results.append(em.slice(ct, _as_vector(em, offset), _as_vector(em, end), [axis]))
        else:
            results.append(None)
        offset = end
    return results


_register("Concat", (4, 11, 13), _concat_jvp, _concat_transpose)


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


_register_batch("Concat", (4, 11, 13), _concat_batch)


# ------------------------------------------------------------------------------- Split
def _split_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    # Outputs without a cotangent contribute zeros shaped like them.
    parts: list[ir.Value | None] = [
        ct if ct is not None else _zeros_like(em, out)
        for ct, out in zip(cts, node.outputs, strict=True)
    ]
    result = (
        parts[0] if len(parts) == 1 else em.op("Concat", parts, {"axis": int_attr(node, "axis", 0)})
    )
    return [result, *[None] * (len(node.inputs) - 1)]


_register("Split", (2, 11, 13, 18), _same_op_jvp, _split_transpose)


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


_register_batch("Split", (2, 11, 13, 18), _split_batch)


# ------------------------------------------------------------------------------- Slice
def _clamp(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
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
        _norm_axis(a, rank): (s, e, st)
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
        s, e = _clamp(start, end, step, dim)
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
        ct = em.slice(ct, [-1] * k, [_INT64_MIN] * k, reversed_axes, [-1] * k)
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
        return static if static is not None else _int64(em, value)

    starts, ends = param(starts_in), param(ends_in)
    axes = param(axes_in) if axes_in is not None else None
    per_start = _spread(em, starts, axes, rank, 0)
    per_end = _spread(em, ends, axes, rank, _INT64_MAX)
    per_step: list[Param] = [1] * rank
    if steps_in is not None:
        per_step = _spread(em, param(steps_in), axes, rank, 1)
    shape_memo: list[ir.Value] = []

    def shape_x() -> ir.Value:
        if not shape_memo:
            shape_memo.append(em.shape(x))
        return shape_memo[0]

    pieces: list[ir.Value] = []
    lengths: list[ir.Value] = []
    for j in range(rank):
        positions = _arange(em, _dim(em, x, shape_x, j))
        s, e, st = per_start[j], per_end[j], per_step[j]
        if not (s == 0 and e == _INT64_MAX and st == 1):
            positions = em.slice(
                positions, _as_vector(em, s), _as_vector(em, e), [0], _as_vector(em, st)
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
        count = len(static_starts) if static_starts is not None else _vector_length(starts_in)
        axes = list(range(count)) if count is not None else None
    if axes is None:
        return None
    # em.shape: x is a linear value here, read through its shape witness.
    dims = em.op("Gather", [em.shape(x), em.ints(axes)], {"axis": 0})
    zero = em.const(np.array(0, np.int64))

    def clamped(bound: ir.Value) -> ir.Value:
        # Into [-dim, dim] first, so that adding dim cannot overflow (ends are often INT64_MAX).
        bound = _int64(em, bound)
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
    rank = _rank(node, x)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    params = _static_slice(node, rank)
    assert x.shape is not None
    if params is not None and all(
        isinstance(x.shape.dims[a], int) and step in (1, -1) for a, (_, _, step) in params.items()
    ):
        return [_slice_pad_transpose(em, ct, x, rank, params), *rest]
    return [_slice_scatter_transpose(em, node, ct, x, rank), *rest]


_register("Slice", (10, 11, 13), _same_op_jvp, _slice_transpose)


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
            _ints_like(bx, shift_axes(static, r), starts)
            if static is not None
            else _shift_runtime_axes(bx, axes_in, r)
        )
    else:
        n = _vector_length(starts)
        if n is None:
            n = len(static_starts) if (static_starts := const_ints(starts)) is not None else None
        if n is not None:
            axes = _ints_like(bx, range(1, n + 1), starts)
        else:
            # The number of sliced axes is only known at run time: 1, 2, ..., len(starts).
            one = bx.const(np.array(1, np.int64))
            count = bx.squeeze(bx.op("Shape", [starts]), [0])
            axes = bx.op("Range", [one, bx.op("Add", [count, one]), one])
            if starts.dtype not in (None, ir.DataType.INT64):
                axes = bx.op("Cast", [axes], {"to": starts.dtype})
    return [bx.op("Slice", _trim([x, starts, ends, axes, steps]))], [True]


_register_batch("Slice", (10, 11, 13), _slice_batch)


# ---------------------------------------------------------------------------------- Pad
def _pad_mode(node: ir.Node) -> str:
    return node.attributes.get_string("mode", "constant")


def _pad_input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


def _pad_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # Constant mode is linear jointly in the data and the padding value: the padded positions
    # carry the value's tangent. The other modes copy data elements and ignore the value.
    x, pads, axes = node.inputs[0], node.inputs[1], _pad_input(node, 3)
    assert x is not None
    t_data = tangents[0]
    t_value = tangents[2] if len(tangents) > 2 and _pad_mode(node) == "constant" else None
    if t_data is None and t_value is None:
        return [None]
    data = t_data if t_data is not None else _zeros_like(em, x)
    return [em.op("Pad", _trim([data, pads, t_value, axes]), _attrs(node))]


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
    data_part = em.op("Pad", _trim([ct, negated, None, axes]))
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
        results[2] = total if rank0 else _reshape_like(em, total, value)
    return results


def _per_axis_pads(em: Emitter, node: ir.Node, rank: int) -> tuple[list[Param], list[Param]]:
    """The (begin, end) pads of every axis, static where the node's parameters are."""
    pads_in, axes_in = node.inputs[1], _pad_input(node, 3)
    assert pads_in is not None
    pads_static = const_ints(pads_in)
    axes: list[int] | ir.Value | None = None
    if axes_in is not None:
        axes_static = const_ints(axes_in)
        axes = axes_static if axes_static is not None else _int64(em, axes_in)
    if isinstance(axes, ir.Value):
        count: Param = em.op("Shape", [axes])
    else:
        count = len(axes) if axes is not None else rank
    begins: list[int] | ir.Value
    ends: list[int] | ir.Value
    if pads_static is not None and isinstance(count, int):
        begins, ends = pads_static[:count], pads_static[count:]
    else:
        pads = em.ints(pads_static) if pads_static is not None else _int64(em, pads_in)
        begins = em.slice(pads, [0], _as_vector(em, count), [0])
        ends = em.slice(pads, _as_vector(em, count), [_INT64_MAX], [0])
    if axes is None and not isinstance(count, int):
        raise InternalRuleError("Pad: pads of run-time length need axes")
    spread_axes = axes if axes is not None else list(range(rank))
    return _spread(em, begins, spread_axes, rank, 0), _spread(em, ends, spread_axes, rank, 0)


def _gather_pad_transpose(em: Emitter, node: ir.Node, ct: ir.Value, x: ir.Value) -> ir.Value:
    """Transpose of an edge/reflect/wrap Pad, a gather of input elements along each axis.

    The source index of each output position along axis j is ``Pad(Range(d_j), pads_j, mode)``.
    Sources repeat, so the transpose must add: from opset 16 a ScatterElements with
    ``reduction="add"`` per padded axis; before, a contraction of the cotangent's axis j with
    the one-hot matrix of the sources (dense in that axis, but valid at every opset).
    """
    rank = _rank(node, x)
    begins, ends = _per_axis_pads(em, node, rank)
    assert x.dtype is not None
    memo: list[ir.Value] = []

    def shape_x() -> ir.Value:
        if not memo:
            memo.append(em.shape(x))
        return memo[0]

    mode = _pad_mode(node)
    y = node.outputs[0]
    x_dims = [_dim(em, x, shape_x, j) for j in range(rank)]
    sources: dict[int, ir.Value] = {}
    for j in range(rank):
        if begins[j] == 0 and ends[j] == 0:
            continue
        if isinstance(begins[j], int) and isinstance(ends[j], int):
            pads_j = em.ints([begins[j], ends[j]])  # type: ignore[list-item]
        else:
            pads_j = em.op(
                "Concat", [_as_vector(em, begins[j]), _as_vector(em, ends[j])], {"axis": 0}
            )
        sources[j] = em.op("Pad", [_arange(em, x_dims[j]), pads_j], {"mode": mode})
    if em.opset < 16:
        for j, src in sources.items():
            eq = em.op("Equal", [em.unsqueeze(src, [1]), em.unsqueeze(_arange(em, x_dims[j]), [0])])
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
    return em.op("Concat", [_as_vector(em, d) for d in dims], {"axis": 0})


_register("Pad", (11, 13, 18, 19, 21, 23, 24, 25), _pad_jvp, _pad_transpose)


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
            _ints_like(bx, shift_axes(static_axes, r), axes)
            if static_axes is not None
            else _shift_runtime_axes(bx, axes, r)
        )
        new_pads = pads
    elif (static := const_ints(pads)) is not None:
        new_pads = bx.ints([0, *static[:r], 0, *static[r:]])
    else:
        zero = bx.ints([0])
        begins = bx.slice(pads, [0], [r], [0])
        ends = bx.slice(pads, [r], [2 * r], [0])
        new_pads = bx.op("Concat", [zero, begins, zero, ends], {"axis": 0})
    return [bx.op("Pad", _trim([x, new_pads, value, new_axes]), attributes_of(node))], [True]


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
        padded = bx.op("Pad", _trim([x, pads, None, axes]))
    assert padded is not None
    one = bx.scalar(1.0, dtype)
    ones = bx.op("Expand", [one, bx.unbatched_shape(x, x_batched, original)])
    from_data = bx.op(
        "Cast", [bx.op("Pad", _trim([ones, pads, None, axes]))], {"to": ir.DataType.BOOL}
    )
    per_example = bx.op(
        "Reshape", [value, bx.op("Concat", [bx.batch_size, bx.ints([1] * r)], {"axis": 0})]
    )
    return bx.op("Where", [from_data, padded, per_example])


_register_batch("Pad", (11, 13, 18, 19, 21, 23, 24, 25), _pad_batch)


# ---------------------------------------------------------------------------------- Tile
def _tile_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    # Tile's output along axis i is [reps_i, d_i] flattened: split every axis that way and sum
    # over the repeats.
    ct, x, repeats = cts[0], node.inputs[0], node.inputs[1]
    assert ct is not None and x is not None and repeats is not None
    rank = _rank(node, x)
    reps = const_ints(repeats)
    dims = [d for d in x.shape.dims if isinstance(d, int)] if x.shape is not None else []
    if reps is not None and len(dims) == rank:
        split_shape = em.ints([v for pair in zip(reps, dims, strict=True) for v in pair])
    else:
        reps_v = em.ints(reps) if reps is not None else repeats
        pairs = em.op(
            "Concat", [em.unsqueeze(reps_v, [1]), em.unsqueeze(em.shape(x), [1])], {"axis": 1}
        )
        split_shape = em.op("Reshape", [pairs, em.ints([-1])])
    split = em.op("Reshape", [ct, split_shape])
    return [em.reduce_sum(split, list(range(0, 2 * rank, 2)), keepdims=False), None]


_register("Tile", (6, 13), _same_op_jvp, _tile_transpose)


def _tile_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Tile with one repeat for the batch axis: ``repeats' = [1, *repeats]``."""
    refuse_batched(bx, node, args, batched, {1: "repeats"})
    x, repeats = batch_data(args), args[1]
    assert repeats is not None
    static = const_ints(repeats)
    new = (
        bx.ints([1, *static])
        if static is not None
        else bx.op("Concat", [bx.ints([1]), repeats], {"axis": 0})
    )
    return [bx.op("Tile", [x, new])], [True]


_register_batch("Tile", (6, 13), _tile_batch)


# ------------------------------------------------------------------------------- Dropout
def _dropout_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """Inference Dropout copies its input; the mask is boolean and has no tangent.

    Training mode is refused: the derivative would be that of the mask drawn in the same run,
    and a transformed model draws its own mask. onnxruntime's seeded Dropout advances its
    generator on every run (measured with onnxruntime 1.32: consecutive runs of one session
    drop different elements), so neither the primal nor its derivative is reproducible, and
    finite differences, which compare runs, could not check one.
    """
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None:
        flag = ir.convenience.get_const_tensor(training)
        if flag is None or bool(flag.numpy().reshape(-1)[0]):
            found = "computed at run time" if flag is None else "the constant true"
            raise UnsupportedOperatorError(
                f"jvp: no derivative rule for {op_label(node)} in training mode at opset "
                f"{em.opset} ({node_label(node)}): its training_mode input {training.name!r} is "
                f"{found}, expected absent or a constant false. Training-mode dropout draws a "
                "random mask, which a transformed model cannot reproduce. Remedy: export the "
                "model for inference (drop training_mode or make it a constant false), or feed "
                "the mask as a model input and multiply by it explicitly."
            )
    return [tangents[0], *[None] * (len(node.outputs) - 1)]


for _v in (7, 10, 12, 13, 22):
    jvp_rules.add("Dropout", _dropout_jvp, since_version=_v)


def _dropout_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Dropout under vmap.

    In inference (no training_mode, or a constant false) Dropout copies its data and its mask
    is all true, elementwise: it applies to the batched data as it is, without the ratio and
    training inputs, which then do not matter (even batched). In training mode it draws a random
    mask, which follows vmap's randomness policy: "different" draws independent masks (Dropout
    of the batched data), "same" draws one mask for one example and applies it to all.
    """
    training = node.inputs[2] if len(node.inputs) > 2 else None
    flag = ir.convenience.get_const_tensor(training) if training is not None else None
    inference = training is None or (flag is not None and not bool(flag.numpy().reshape(-1)[0]))
    original = original_input(node)
    x = bx.materialize(batch_data(args), batched[0], original)
    n = len(node.outputs)
    if inference:
        outs = bx.op_multi("Dropout", [x], attributes_of(node), num_outputs=n)
        return list(outs), [True] * n
    assert training is not None
    if bx.randomness == "error":
        found = "computed at run time" if flag is None else "the constant true"
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) may draw a random "
            f"mask inside the mapped function: its training_mode input {training.name!r} is "
            f"{found}. Remedy: choose how, vmap(..., randomness='different') for an independent "
            "mask per example, or randomness='same' for one mask shared by all examples; or "
            "export the model for inference (training_mode absent or a constant false)."
        )
    why = "a training-mode Dropout needs one ratio and one training flag for the whole batch"
    refuse_batched(bx, node, args, batched, {1: "ratio", 2: "training_mode"}, why)
    rest = list(args[1:])
    if bx.randomness == "different":
        outs = bx.op_multi("Dropout", [x, *rest], attributes_of(node), num_outputs=n)
        return list(outs), [True] * n
    # "same": Dropout of ones shaped like one example is the mask scaled by 1 / (1 - ratio).
    assert original.dtype is not None
    shape = bx.unbatched_shape(x, True, original)
    ones = bx.op("Expand", [bx.scalar(1.0, original.dtype), shape])
    scale, mask = bx.op_multi("Dropout", [ones, *rest], attributes_of(node), num_outputs=2)
    out: list[ir.Value | None] = [bx.op("Mul", [x, scale])]
    if n > 1:
        out.append(bx.materialize(mask, False, node.outputs[1]))
    return out, [True] * len(out)


_register_batch("Dropout", (7, 10, 12, 13, 22), _dropout_batch)


# ------------------------------------------------------------------- sources: no tangent
register_zero(("Constant", "ConstantOfShape"))


def _constant_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Constant has no inputs, so vmap never batches it: it stays shared."""
    return list(node.outputs), [False] * len(node.outputs)


def _constant_of_shape_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Refused: the shape input is batched (the result would be ragged)."""
    refuse_batched(bx, node, args, batched, {0: "shape"})
    raise InternalRuleError("ConstantOfShape batch rule called without a batched input")


_register_batch("Constant", (1, 9, 11, 12, 13, 19, 21, 23, 24, 25), _constant_batch)
_register_batch("ConstantOfShape", (9, 20, 21, 23, 24, 25), _constant_of_shape_batch)


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
        index = em.op("Cast", [_arange(em, length)], {"to": y.dtype})
        terms.append(em.op("Mul", [index, t_delta]))
    return [em.add_all(terms)]


for _v in (11, 27):
    jvp_rules.add("Range", _range_jvp, since_version=_v)


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


_register_batch("Range", (11, 27), _range_batch)
