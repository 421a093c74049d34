"""Reductions.

Covered: ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceSumSquare ReduceL1 ReduceL2
ReduceLogSum ReduceLogSumExp (Softmax and LogSoftmax are in :mod:`onnax.rules.softmax`).

Each operator has one registration from its first version: the axes attribute became an input
at 13 (ReduceSum) or 18 (the rest), and the rules read either form (``ints_param``); the other
schema changes added element types only.

Every reduction's tangent is a ``ReduceSum`` (``ReduceMean`` for ReduceMean) of the input tangent
times an elementwise coefficient ``dy/dx_i`` built from primal values, over the node's own axes
with its own ``keepdims``. The coefficient broadcasts against ``x`` because it is computed from
the reduced values *with* kept dimensions (an ``Unsqueeze`` of the output when the axes are
static, a recomputed reduction with ``keepdims=1`` when they are only known at run time). So the
linear part uses ``Mul``, ``Div``, ``Sub`` and ``ReduceSum``/``ReduceMean`` only; reverse mode needs
just the two transpose rules of this module (``ReduceSum``, ``ReduceMean``), which unsqueeze the
cotangent back to the kept-dimensions shape and ``Expand`` it to the input's run-time shape.

Choices and limitations:

* **Axes.** Static axes (an attribute, an initializer or a ``Constant``) are used as given:
  negative axes mean the same thing to ``ReduceSum``, ``Unsqueeze`` and ``Gather`` as to the
  primal reduction, so the input rank is rarely needed. Run-time axes (an input from opset 13 for
  ReduceSum, 18 for the others) are supported too: the emitted reductions take the same axes input
  and ``noop_with_empty_axes``, and the transpose rebuilds the kept-dimensions shape at run time
  with ``ScatterElements`` of ones into the input's shape.
* **Empty axes.** Absent or empty axes reduce everything, unless ``noop_with_empty_axes=1``, in
  which case the reduction is the identity for ReduceSum/Mean/Max/Min/Prod/LogSumExp and the
  elementwise map for the others (``x**2``, ``|x|``, ``|x|``, ``log x``); the generic coefficient
  formulas give the right derivative of each (checked against onnxruntime's behaviour).
* **ReduceMax/ReduceMin ties.** The tangent flows through the arg-extremes; when several elements
  tie for the extreme, it is split equally between them (``mask = x == y``;
  ``dy = ReduceSum(mask * t) / ReduceSum(mask)``), the convention of JAX and PyTorch's ``amax``.
  Any convex combination is a valid subgradient; this one is symmetric and keeps jvp and vjp
  mutual adjoints.
* **ReduceProd** is exact also where ``x`` has zeros (no ``y / x``): ``dy/dx_i``, the product of
  the other elements, is built as (product of the non-zero others) x (product of the zero
  others), the latter 1, the lone zero's value, or 0; first and second derivatives are exact
  there (third and higher ones at two or more zeros in a slice are not).
* **ReduceL2** has derivative ``x / y``; where ``y == 0`` (the whole slice is zero, a kink) the
  tangent is 0.
* **Empty inputs**: a reduction of a tensor with a static zero dimension is a constant (0, -inf
  ...), and its tangent is a symbolic zero (no 0 * inf through a following Sqrt).

Batch rules (vmap) apply the operator itself to the batched input (batch axis 0) with shifted
axes:

* **Static axes** are normalised with the unbatched rank and shifted by one; absent axes (reduce
  everything) become the explicit list ``1..rank``, so the batch axis is never reduced. With
  ``noop_with_empty_axes=1`` and no axes the operator is elementwise and is applied as it is. A
  rank-0 input (one element per example) is reduced along an inserted size-1 axis. When the rank
  is unknown (after a reduction over run-time axes without keepdims), negative axes are kept as
  they are (the batch axis in front does not change what they count from the end), and "every
  axis" flattens each example (``Reshape`` to ``[B, -1]``), reduces it, and restores kept
  dimensions with a ``Reshape`` to ``[B, 1, ..., 1]`` built at run time.
* **Run-time axes** shared by all examples are shifted at run time, ``Where(a < 0, a, a + 1)``
  (the same as normalising with the rank and adding 1, without needing the rank). The batched
  reduction always gets ``noop_with_empty_axes=1``: when the node's own flag is 0, ``1..rank`` is
  appended to the axes exactly when they are empty (a ``Range`` whose limit is ``rank + 1`` or
  1), so empty axes still mean every axis of an example, never the batch axis. Axes that are
  *batched* (computed from batched data) are refused: each example could reduce different
  axes, and the results would be ragged.

Kept-dimensions reductions over run-time axes emitted by the jvp rules are annotated with their
rank (shape inference cannot follow run-time axes), so that batching the jvp model can align
broadcasting operands.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import int_attr, ints_param
from onnax.core.batching import Batcher, shift_axes
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, JvpRule, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

__all__ = ["shift_past_batch", "unbatched_rank"]


# ------------------------------------------------------------------------- reading a node
@dataclasses.dataclass(frozen=True)
class _Reduction:
    """The axes and flags of a reduction node.

    Attributes:
        axes: The reduced axes as given (possibly negative) when static; ``None`` to reduce every
            axis; ``[]`` when the node is the identity (``noop_with_empty_axes=1`` with no axes);
            the axes input itself when it is only known at run time.
        keepdims: Whether reduced axes are kept with size 1.
        noop: ``noop_with_empty_axes`` (only matters for run-time axes, which may be empty).
        like: The node's input (for the type of kept-dimensions reductions over run-time axes).
    """

    axes: list[int] | ir.Value | None
    keepdims: bool
    noop: bool
    like: ir.Value | None = None

    @property
    def identity(self) -> bool:
        return isinstance(self.axes, list) and not self.axes


def _reduction(node: ir.Node) -> _Reduction:
    keepdims = bool(int_attr(node, "keepdims", 1))
    noop = bool(int_attr(node, "noop_with_empty_axes", 0))
    param = ints_param(node, "axes", 1)
    if isinstance(param, ir.Value):
        return _Reduction(param, keepdims, noop, node.inputs[0])
    if not param:  # absent or empty: everything, or nothing with noop_with_empty_axes
        return _Reduction([] if noop else None, keepdims, noop)
    return _Reduction(list(param), keepdims, noop)


def _reduce_like(
    em: Emitter, op_type: str, x: ir.Value, red: _Reduction, *, keepdims: bool
) -> ir.Value:
    """``op_type`` over the axes of ``red`` (same axes input, same ``noop_with_empty_axes``)."""
    if isinstance(red.axes, ir.Value):
        # Run-time axes exist only at opsets where every reduction we emit takes axes as input.
        attrs = {"keepdims": int(keepdims), "noop_with_empty_axes": int(red.noop) or None}
        out = em.op(op_type, [x, red.axes], attrs)
        like = red.like
        if keepdims and like is not None and like.shape is not None and like.dtype is not None:
            # Shape inference cannot follow run-time axes, but kept dimensions keep the rank
            # (of the node's input: every reduction here is of a value shaped and typed like
            # it), which batching (vmap of the jvp model) needs to align broadcasting operands.
            out.shape, out.dtype = ir.Shape([None] * like.shape.rank()), like.dtype
        return out
    return em.reduce(op_type, x, red.axes, keepdims=keepdims)


def _kept(em: Emitter, op_type: str, x: ir.Value, y: ir.Value, red: _Reduction) -> ir.Value:
    """The output ``y`` of ``op_type(x)`` with the reduced axes kept, broadcastable against ``x``."""
    if red.keepdims or red.identity or red.axes is None:
        return y  # a full reduction without keepdims is a scalar, which broadcasts as it is
    if isinstance(red.axes, ir.Value):
        # The kept shape would need run-time shape arithmetic; recomputing is simpler and exact.
        return _reduce_like(em, op_type, x, red, keepdims=True)
    return em.unsqueeze(y, red.axes)


def _dtype(value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise InternalRuleError(f"value {value.name!r} has no dtype")
    return value.dtype


def _io(node: ir.Node) -> tuple[ir.Value, ir.Value]:
    x = node.inputs[0]
    assert x is not None
    return x, node.outputs[0]


def _rank_only(shape: ir.Shape) -> bool:
    """Whether ``shape`` knows nothing but its (non-zero) rank, as ``_reduce_like`` writes it."""
    return shape.rank() > 0 and all(shape.is_unknown_dim(i) for i in range(shape.rank()))


def _annotate(value: ir.Value, like: ir.Value) -> ir.Value:
    """Gives ``value`` the (known) shape and dtype of ``like``; returns ``value``.

    Shape inference cannot follow reductions over run-time axes, yet the transposes of ``Mul``
    and ``Div`` need the shapes of their operands and the reverse sweep needs a shape witness for
    every linear value. The rules know those shapes (a coefficient is shaped like the input, a
    tangent like its primal), so they write them down.
    """
    if like.shape is not None and (value.shape is None or _rank_only(value.shape)):
        value.shape = like.shape.copy()
    if value.dtype is None and like.dtype is not None:
        value.dtype = like.dtype
    return value


def _linear_reduce(em: Emitter, node: ir.Node, t: ir.Value, coef: ir.Value | None) -> ir.Value:
    """``ReduceSum(t * coef)`` over the node's axes, shaped like the node's output.

    ``coef`` is shaped like the node's input (a product of the input with kept-dims values).
    """
    (x, y), red = _io(node), _reduction(node)
    weighted = t if coef is None else _annotate(em.op("Mul", [t, _annotate(coef, x)]), x)
    return _annotate(_reduce_like(em, "ReduceSum", weighted, red, keepdims=red.keepdims), y)


def _statically_empty(value: ir.Value) -> bool:
    """Whether ``value`` has a dimension statically known to be 0 (it holds no element)."""
    return value.shape is not None and any(d == 0 for d in value.shape.dims if isinstance(d, int))


def _unless_empty(rule: JvpRule) -> JvpRule:
    """The rule, except that a reduction of an empty input has a zero tangent (symbolic).

    The reduction of an empty set is a constant (0 for a sum, -inf for a max...), so its
    tangent is exactly zero; emitting the generic formula instead would feed a zero tangent into
    coefficients that are infinite there (Sqrt after ReduceSumSquare of nothing: 0 * inf = NaN).
    """

    def guarded(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
        if _statically_empty(_io(node)[0]):
            return [None]
        return list(rule(em, node, tangents))

    guarded.__doc__ = rule.__doc__
    return guarded


# ------------------------------------------------------------------------- transposing a reduction
def _runtime_kept_shape(em: Emitter, shape: ir.Value, red: _Reduction) -> ir.Value:
    """The kept-dimensions output shape for run-time axes: ``shape`` with 1 at every reduced axis."""
    axes = red.axes
    assert isinstance(axes, ir.Value)
    ones_like_axes = em.op(
        "ConstantOfShape", [em.op("Shape", [axes])], {"value": ir.tensor(np.ones((1,), np.int64))}
    )
    # ScatterElements accepts negative indices, with the same meaning as the reduction's axes.
    kept = em.op("ScatterElements", [shape, axes, ones_like_axes], {"axis": 0})
    if red.noop:
        return kept  # empty axes: no reduction, the shape is unchanged
    all_ones = em.op(
        "ConstantOfShape", [em.op("Shape", [shape])], {"value": ir.tensor(np.ones((1,), np.int64))}
    )
    empty = em.op("Equal", [em.op("Size", [axes]), em.const(np.array(0, np.int64))])
    return em.op("Where", [empty, all_ones, kept])


def _spread(em: Emitter, ct: ir.Value, x: ir.Value, red: _Reduction) -> ir.Value:
    """The transpose of ``ReduceSum`` over ``red``: ``ct`` broadcast back to the shape of ``x``."""
    if red.identity:
        return ct
    shape = em.shape(x)
    if not red.keepdims:
        if isinstance(red.axes, ir.Value):
            ct = em.op("Reshape", [ct, _runtime_kept_shape(em, shape, red)])
        elif red.axes is not None:  # a full reduction gives a scalar, which Expand broadcasts
            ct = em.unsqueeze(ct, red.axes)
    return em.op("Expand", [ct, shape])


def _reduced_count(em: Emitter, x: ir.Value, red: _Reduction, dtype: ir.DataType) -> ir.Value:
    """The number of elements each output of a mean averages, as a scalar of ``dtype``."""
    dims = x.shape.dims if x.shape is not None else None
    if not isinstance(red.axes, ir.Value) and dims is not None:
        picked = list(dims) if red.axes is None else [dims[a] for a in red.axes]
        sizes = [d for d in picked if isinstance(d, int)]
        if len(sizes) == len(picked):
            return em.scalar(float(math.prod(sizes)), dtype)
    shape = em.shape(x)
    to = {"to": int(dtype)}
    if isinstance(red.axes, ir.Value):
        # Both products are computed in floating point: an empty input makes the count 0/0, but
        # then the cotangent it divides is empty as well.
        whole = em.reduce("ReduceProd", em.op("Cast", [shape], to), None, keepdims=False)
        kept = em.reduce(
            "ReduceProd",
            em.op("Cast", [_runtime_kept_shape(em, shape, red)], to),
            None,
            keepdims=False,
        )
        return em.op("Div", [whole, kept])
    picked_dims = (
        shape if red.axes is None else em.op("Gather", [shape, em.ints(red.axes)], {"axis": 0})
    )
    return em.reduce("ReduceProd", em.op("Cast", [picked_dims], to), None, keepdims=False)


# ------------------------------------------------------------------------- batching a reduction
def _user_name(original: ir.Value | None, arg: ir.Value | None) -> str | None:
    """The name the user knows a (batched) input by.

    VmapPass gives the name of a batched graph input to its new, batched value (and moves the
    batch axis to 0 with a Transpose when ``in_axes`` is not 0), so the original may be unnamed.
    """
    if original is not None and original.name:
        return original.name
    producer = arg.producer() if arg is not None else None
    if producer is not None and producer.op_type == "Transpose" and producer.inputs:
        source = producer.inputs[0]
        if source is not None and source.is_graph_input():
            return source.name
    return arg.name if arg is not None else None


def _refuse_batched_axes(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> None:
    if len(batched) > 1 and batched[1]:
        name = _user_name(node.inputs[1], args[1])
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) takes its axes from "
            f"input 1 {name!r}, which depends on a batched input: each example could reduce "
            "different axes, and the results would have different shapes. Remedy: make the axes "
            "a constant, or give the inputs they are computed from in_axes None (shared)."
        )


def unbatched_rank(value: ir.Value | None) -> int | None:
    """The unbatched rank of an original value, or None when inference could not tell."""
    return value.shape.rank() if value is not None and value.shape is not None else None


def shift_past_batch(axes: Sequence[int], rank: int | None) -> list[int]:
    """Static axes past the batch axis; a negative axis keeps its meaning when the rank is unknown."""
    if rank is not None:
        return shift_axes(axes, rank)
    return [a if a < 0 else a + 1 for a in axes]


def _every_axis(bx: Batcher, x: ir.Value, rank: int | None, when: ir.Value | None) -> ir.Value:
    """The axes ``1..rank`` of the batched ``x`` (only where ``when`` holds, else none).

    An unknown rank is read from ``x`` at run time; an empty result (rank 0, or ``when`` false)
    must be consumed with ``noop_with_empty_axes=1``. Only for run-time axes (opset 13 and on).
    """
    one = bx.const(np.array(1, np.int64))
    limit = (
        bx.const(np.array(rank + 1, np.int64))
        if rank is not None
        else bx.op("Size", [bx.op("Shape", [x])])
    )
    if when is not None:
        limit = bx.op("Where", [when, limit, one])
    return bx.op("Range", [one, limit, one])


def _shifted_runtime_axes(
    bx: Batcher, x: ir.Value, axes: ir.Value, rank: int | None, noop: bool
) -> ir.Value:
    """Shared run-time axes of one example, shifted past the batch axis of ``x``.

    To be consumed with ``noop_with_empty_axes=1``: empty axes are replaced by every axis of an
    example (but the batch one) unless the node's own ``noop`` says they mean no reduction.
    Negative axes count from the end, which the batch axis in front does not change.
    """
    zero, one = bx.const(np.array(0, np.int64)), bx.const(np.array(1, np.int64))
    shifted = bx.op("Where", [bx.op("Less", [axes, zero]), axes, bx.op("Add", [axes, one])])
    if noop:
        return shifted
    empty = bx.op("Equal", [bx.op("Size", [axes]), zero])
    return bx.op("Concat", [shifted, _every_axis(bx, x, rank, empty)], {"axis": 0})


def _reduction_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    _refuse_batched_axes(bx, node, args, batched)
    x, op = args[0], node.op_type
    assert x is not None and batched[0]
    rank, red = unbatched_rank(node.inputs[0]), _reduction(node)
    y = node.outputs[0]
    if red.keepdims and rank is not None and y.shape is None:
        # Inference cannot follow run-time axes, but kept dimensions keep the rank; the batch
        # rules of the consumers (a broadcasting Add after an expanded RMSNormalization's
        # ReduceMean) need the unbatched rank of this value to align their operands.
        y.shape = ir.Shape([None] * rank)
    # The rank is unknown after a reduction over run-time axes without keepdims.
    if red.identity:
        # noop_with_empty_axes without axes: elementwise (x, x**2, |x|, log x...), batch or not.
        return [bx.op(op, [x], attributes_of(node))], [True]
    if rank == 0:
        # One element per example: every valid reduction of it is over that element alone.
        return [bx.reduce(op, bx.unsqueeze(x, [1]), [1], keepdims=False)], [True]
    runtime_attrs = {"keepdims": int(red.keepdims), "noop_with_empty_axes": 1}
    if isinstance(red.axes, ir.Value):
        assert args[1] is not None
        axes = _shifted_runtime_axes(bx, x, args[1], rank, red.noop)
        return [bx.op(op, [x, axes], runtime_attrs)], [True]
    if red.axes is not None:
        return [bx.reduce(op, x, shift_past_batch(red.axes, rank), keepdims=red.keepdims)], [True]
    if rank is not None:
        return [bx.reduce(op, x, list(range(1, rank + 1)), keepdims=red.keepdims)], [True]
    return [_reduce_all_unknown_rank(bx, op, x, red.keepdims)], [True]


def _reduce_all_unknown_rank(bx: Batcher, op: str, x: ir.Value, keepdims: bool) -> ir.Value:
    """Reduces every axis but the batch one of ``x``, whose rank is only known at run time.

    Every reduction here is invariant under reordering its elements, so each example is
    flattened to one axis (``[B, -1]``), which is reduced; kept dimensions are restored with a
    ``Reshape`` to ``[B, 1, ..., 1]`` (as many ones as the example's rank, read at run time).
    """
    flat = bx.op("Reshape", [x, bx.ints([0, -1])])
    out = bx.reduce(op, flat, [1], keepdims=False)
    if not keepdims:
        return out
    one = bx.const(np.array(1, np.int64))
    rank = bx.op("Sub", [bx.op("Size", [bx.op("Shape", [x])]), one])
    ones = bx.op(
        "ConstantOfShape",
        [bx.unsqueeze(rank, [0])],
        {"value": ir.tensor(np.ones((1,), np.int64))},
    )
    return bx.op("Reshape", [out, bx.op("Concat", [bx.ints([0]), ones], {"axis": 0})])


# ------------------------------------------------------------------------------ ReduceSum
reduce_sum = OpRules("ReduceSum")
reduce_sum.batch(_reduction_batch)


@reduce_sum.jvp
@_unless_empty
def _reduce_sum_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    return [None if t is None else _linear_reduce(em, node, t, None)]


@reduce_sum.transpose
def _reduce_sum_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (x, _) = cts[0], _io(node)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    if ct is None:
        return [None, *rest]
    return [_spread(em, ct, x, _reduction(node)), *rest]


# ----------------------------------------------------------------------------- ReduceMean
reduce_mean = OpRules("ReduceMean")
reduce_mean.batch(_reduction_batch)


@reduce_mean.jvp
@_unless_empty
def _reduce_mean_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    if t is None:
        return [None]
    red = _reduction(node)
    return [
        _annotate(_reduce_like(em, "ReduceMean", t, red, keepdims=red.keepdims), node.outputs[0])
    ]


@reduce_mean.transpose
def _reduce_expected_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, (x, y) = cts[0], _io(node)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    if ct is None:
        return [None, *rest]
    red = _reduction(node)
    if red.identity:
        return [ct, *rest]
    # Dividing before spreading touches the (smaller) output-shaped cotangent only.
    scaled = em.op("Div", [ct, _reduced_count(em, x, red, _dtype(y))])
    return [_spread(em, scaled, x, red), *rest]


# ---------------------------------------------------------------------- ReduceMax, ReduceMin
reduce_extreme = OpRules(("ReduceMax", "ReduceMin"))
reduce_extreme.batch(_reduction_batch)


@reduce_extreme.jvp
@_unless_empty
def _reduce_extreme_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """ReduceMax/ReduceMin: the tangent of the extreme, averaged over ties (see module doc)."""
    t = tangents[0]
    if t is None:
        return [None]
    (x, y), red = _io(node), _reduction(node)
    is_extreme = em.op("Equal", [x, _kept(em, node.op_type, x, y, red)])
    mask = em.op("Cast", [is_extreme], {"to": int(_dtype(x))})
    ties = _reduce_like(em, "ReduceSum", mask, red, keepdims=True)
    return [_linear_reduce(em, node, t, em.op("Div", [mask, ties]))]


# ----------------------------------------------------------------------------------- ReduceProd
reduce_prod = OpRules("ReduceProd")
reduce_prod.batch(_reduction_batch)


@reduce_prod.jvp
@_unless_empty
def _reduce_prod_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """ReduceProd, exact at zeros: dy/dx_i is the product of the other elements.

    The product of the others is split into ``p / x_i`` (``p``: the product of the slice's
    non-zero elements, with ``x_i`` read as 1 where it is zero) times ``q``, the product of the
    *other zero* elements: 1 when there is none, their value (0, but carrying its derivative)
    when there is one, and 0 when there are more. Written so, the coefficient is exact and so is
    its own derivative (second order, e.g. Hessians through ReduceProd at zeros).
    """
    t = tangents[0]
    if t is None:
        return [None]
    (x, _), red = _io(node), _reduction(node)
    zero, one = em.scalar(0.0, x), em.scalar(1.0, x)
    is_zero = em.op("Equal", [x, zero])
    x_safe = em.op("Where", [is_zero, one, x])
    nonzero_prod = _reduce_like(em, "ReduceProd", x_safe, red, keepdims=True)
    zero_count = em.op("Cast", [is_zero], {"to": int(_dtype(x))})
    other_zeros = em.op(
        "Sub", [_reduce_like(em, "ReduceSum", zero_count, red, keepdims=True), zero_count]
    )
    zero_part = em.op("Where", [is_zero, x, zero])
    other_zero_sum = em.op(
        "Sub", [_reduce_like(em, "ReduceSum", zero_part, red, keepdims=True), zero_part]
    )
    lone_zero = em.op("Where", [em.op("Equal", [other_zeros, one]), other_zero_sum, zero])
    q = em.op("Where", [em.op("Equal", [other_zeros, zero]), one, lone_zero])
    coef = em.op("Mul", [em.op("Div", [nonzero_prod, x_safe]), q])
    return [_linear_reduce(em, node, t, coef)]


# ------------------------------------------------------------------------------ ReduceSumSquare
reduce_sum_square = OpRules("ReduceSumSquare")
reduce_sum_square.batch(_reduction_batch)


@reduce_sum_square.jvp
@_unless_empty
def _reduce_sum_square_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    if t is None:
        return [None]
    x, _ = _io(node)
    return [_linear_reduce(em, node, t, em.op("Add", [x, x]))]


# ------------------------------------------------------------------------------------- ReduceL1
reduce_l1 = OpRules("ReduceL1")
reduce_l1.batch(_reduction_batch)


@reduce_l1.jvp
@_unless_empty
def _reduce_l1_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    if t is None:
        return [None]
    x, _ = _io(node)
    return [_linear_reduce(em, node, t, em.op("Sign", [x]))]


# ------------------------------------------------------------------------------------- ReduceL2
reduce_l2 = OpRules("ReduceL2")
reduce_l2.batch(_reduction_batch)


@reduce_l2.jvp
@_unless_empty
def _reduce_l2_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """d||x|| = <x, t> / ||x||, and 0 where the norm is 0 (then x is 0 on the whole slice)."""
    t = tangents[0]
    if t is None:
        return [None]
    x, y = _io(node)
    one = em.scalar(1.0, y)
    safe_norm = _annotate(em.op("Where", [em.op("Equal", [y, em.scalar(0.0, y)]), one, y]), y)
    return [_annotate(em.op("Div", [_linear_reduce(em, node, t, x), safe_norm]), y)]


# --------------------------------------------------------------------------------- ReduceLogSum
reduce_log_sum = OpRules("ReduceLogSum")
reduce_log_sum.batch(_reduction_batch)


@reduce_log_sum.jvp
@_unless_empty
def _reduce_log_sum_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """The tangent of log(sum x) is sum(t) / sum(x); the sum is recomputed, not read as exp(y)."""
    t = tangents[0]
    if t is None:
        return [None]
    (x, y), red = _io(node), _reduction(node)
    total = _annotate(_reduce_like(em, "ReduceSum", x, red, keepdims=red.keepdims), y)
    return [_annotate(em.op("Div", [_linear_reduce(em, node, t, None), total]), y)]


# ------------------------------------------------------------------------------ ReduceLogSumExp
reduce_log_sum_exp = OpRules("ReduceLogSumExp")
reduce_log_sum_exp.batch(_reduction_batch)


@reduce_log_sum_exp.jvp
@_unless_empty
def _reduce_log_sum_exp_jvp(
    em: Emitter, node: ir.Node, tangents: Tangents
) -> list[ir.Value | None]:
    """The softmax weights exp(x - y) of the slice."""
    t = tangents[0]
    if t is None:
        return [None]
    (x, y), red = _io(node), _reduction(node)
    weights = em.op("Exp", [em.op("Sub", [x, _kept(em, node.op_type, x, y, red)])])
    return [_linear_reduce(em, node, t, weights)]
