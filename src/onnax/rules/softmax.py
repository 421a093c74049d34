"""Softmax and LogSoftmax: jvp and batch rules.

The tangent of Softmax is ``y * (t - sum(y * t))`` and that of LogSoftmax
``t - sum(softmax * t)`` with ``softmax = exp(y)``, the sums over the normalised axes (a
``ReduceSum`` with ``keepdims=1``); the linear part uses ``Mul``, ``Sub`` and ``ReduceSum`` only,
whose transposes serve reverse mode.

* **Opsets.** Before opset 13 they normalise over the flattened block ``axis..rank-1``; the
  tangent then sums over all of those axes, which is the same thing without reshaping. From 13
  on they normalise along ``axis`` alone.
* **Masked rows.** A row that is entirely -inf (attention with every key masked) has a NaN
  softmax that models discard with a Where; its coefficients are read as 0 there, so the zero
  cotangent coming back stays 0. That guard (IsNaN and Where, two full-size passes over the
  attention matrix) is emitted only where a -inf can reach the input: from a constant, a graph
  input or an operator that makes one (see ``_may_hold_minus_inf``), not through a product; nor
  where the -inf comes from a causal mask, which keeps a finite element in every row
  (``_causal_mask``).
* **Batch rules** (vmap) shift ``axis`` past the batch axis. Before opset 13 the input is coerced
  to ``[prod(dims[:axis]), prod(dims[axis:])]``; with the batch axis in front, ``axis + 1`` folds
  the batch into the rows and leaves the normalised block ``dims[axis:]`` unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import int_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, BatchRule, JvpRule, OpRules, Tangents
from onnax.core.static import constant_of
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of
from onnax.rules.reduce import shift_past_batch, unbatched_rank

__all__: list[str] = []


# ------------------------------------------------------------------------------ helpers
def _softmax_axes(node: ir.Node, opset: int, *, flatten: bool) -> list[int]:
    """The axes a (Log)Softmax normalises over: ``axis..rank-1`` before opset 13, else ``[axis]``."""
    x = node.inputs[0]
    assert x is not None
    axis = int_attr(node, "axis", 1 if flatten else -1)
    if not flatten:
        return [axis]
    if x.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} at opset {opset} ({node_label(node)}): before opset 13 it normalises over the "
            f"flattened axes {axis}..rank-1 of its input, but the rank of input {x.name!r} is "
            "unknown. Remedy: declare the shape (at least the rank) of that value in the model's "
            "value_info, or convert the model with onnx.version_converter.convert_version(model, 13), "
            "which rewrites the flattening softmax exactly (Flatten, Softmax, Reshape)."
        )
    rank = x.shape.rank()
    start = axis + rank if axis < 0 else axis
    return list(range(start, rank))


def _nan_to_zero(em: Emitter, p: ir.Value, like: ir.Value) -> ir.Value:
    """``p`` with NaN replaced by 0.

    The softmax of a row that is entirely -inf (an attention row whose keys are all masked) is
    NaN, and models then discard that row with a Where; a NaN coefficient would still turn the
    zero cotangent the Where gives back into NaN (0 * NaN).
    """
    return em.op("Where", [em.op("IsNaN", [p]), em.scalar(0.0, like=like), p])


# Operators whose outputs hold no -inf when their inputs hold none (short of an overflow, see
# _may_hold_minus_inf): what their data input holds does not decide whether a row can be masked.
_FINITE_OF_FINITE = frozenset(
    {
        "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "FusedMatMul",
        "LayerNormalization", "SkipLayerNormalization", "BatchNormalization",
        "Softmax", "Tanh", "Sigmoid", "Erf", "Relu", "Gelu", "FastGelu", "Abs", "Exp",
        "ReduceMean", "ReduceSum",
    }
)  # fmt: skip
# Operators that pass an operand's -inf through (or make one of a -inf operand).
_CARRIES_MINUS_INF = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Neg", "Where", "Max", "Min", "Sum", "Clip",
        "Reshape", "Transpose", "Expand", "Squeeze", "Unsqueeze", "Flatten", "Identity",
        "Cast", "CastLike", "Concat", "Slice", "Gather", "Tile", "Split",
    }
)  # fmt: skip
_WALK_BUDGET = 64


def _may_hold_minus_inf(x: ir.Value) -> bool:
    """Whether a softmax row of ``x`` can be entirely -inf: whether a -inf can reach ``x``.

    The walk goes up through the operators that carry a -inf and stops at the ones that make
    finite values of finite ones (products, normalisations, bounded activations). A -inf (or a
    NaN) in a constant, a graph input (which the caller may fill with -inf, an additive mask),
    any other operator (``Log`` of a 0/1 mask) or a walk too long to follow says yes. An
    overflow to -inf inside a product is not followed: a whole row of them makes the primal NaN
    too, which no model is built to discard.
    """
    seen: set[ir.Value] = set()
    stack = [x]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v.dtype is not None and not v.dtype.is_floating_point():
            continue  # a Where's condition, an index: no -inf of their own
        if len(seen) > _WALK_BUDGET or v.is_graph_input():
            return True
        data = constant_of(v)
        if data is not None:
            if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
                return True
            continue
        node = v.producer()
        if node is None:  # an initializer without data, or an outer-scope value
            return True
        if node.op_type in _FINITE_OF_FINITE:
            continue
        if node.op_type not in _CARRIES_MINUS_INF:
            return True
        stack.extend(i for i in node.inputs if i is not None)
    return False


def _all_nonzero(v: ir.Value | None) -> bool:
    """Whether ``v`` is a constant, or an Expand of one, with no zero element."""
    node = v.producer() if v is not None else None
    if node is not None and node.op_type == "Expand" and node.domain == "":
        v = node.inputs[0]
    data = constant_of(v) if v is not None else None
    return data is not None and data.size > 0 and bool(np.all(data != 0))


def _is_zero(v: ir.Value | None) -> bool:
    data = constant_of(v) if v is not None else None
    return data is not None and data.size > 0 and bool(np.all(data == 0))


def _causal_mask(m: ir.Value) -> bool:
    """Whether every row (along the last axis) of ``m`` holds a finite element.

    Recognised: the causal mask of decoder attention, ``Where(Trilu(D) == 0, -inf, B)`` (or an
    Expand of it) with ``D`` nonzero everywhere, ``Trilu`` lower with ``k >= 0`` and ``B`` free of
    -inf: row ``i`` keeps column 0 (``0 <= i + k``), where the Where takes ``B``.
    """
    node = m.producer()
    if node is not None and node.op_type == "Expand" and node.domain == "":
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None or node.op_type != "Where" or node.domain != "" or len(node.inputs) != 3:
        return False
    cond, _, kept = node.inputs
    if kept is None or _may_hold_minus_inf(kept):
        return False
    equal = cond.producer() if cond is not None else None
    if equal is None or equal.op_type != "Equal" or equal.domain != "":
        return False
    for t, zero in (equal.inputs, equal.inputs[::-1]):
        trilu = t.producer() if t is not None else None
        if trilu is None or trilu.op_type != "Trilu" or trilu.domain != "" or not _is_zero(zero):
            continue
        if int_attr(trilu, "upper", 1) != 0 or not _all_nonzero(trilu.inputs[0]):
            continue
        k = constant_of(trilu.inputs[1]) if len(trilu.inputs) > 1 and trilu.inputs[1] else None
        if len(trilu.inputs) > 1 and trilu.inputs[1] is not None and (k is None or k.size != 1):
            continue
        if k is None or int(k.reshape(())) >= 0:
            return True
    return False


def _rows_keep_a_finite(x: ir.Value) -> bool:
    """Whether every row of ``x`` along its last axis holds a finite element.

    True when no -inf reaches ``x``, or ``x`` adds a :func:`_causal_mask` to scores that hold
    none (the mask's last axis is ``x``'s, broadcasting aligns trailing axes).
    """
    if not _may_hold_minus_inf(x):
        return True
    node = x.producer()
    if node is None or node.op_type != "Add" or node.domain != "" or len(node.inputs) != 2:
        return False
    a, b = node.inputs
    if a is None or b is None:
        return False
    return any(
        not _may_hold_minus_inf(scores) and _causal_mask(mask) for scores, mask in ((a, b), (b, a))
    )


def _normalises_last_axis(node: ir.Node, axes: Sequence[int]) -> bool:
    x = node.inputs[0]
    if x is None or x.shape is None:
        return False
    rank = x.shape.rank()
    return rank - 1 in [a + rank if a < 0 else a for a in axes]


def _guarded(
    em: Emitter, node: ir.Node, p: ir.Value, like: ir.Value, axes: Sequence[int]
) -> ir.Value:
    """``p`` with NaN replaced by 0 where a masked (all -inf) row can arise, else ``p``."""
    x = node.inputs[0]
    if x is not None and not _may_hold_minus_inf(x):
        return p
    if x is not None and _normalises_last_axis(node, axes) and _rows_keep_a_finite(x):
        return p  # each normalised block holds a whole last-axis row, and so a finite element
    return _nan_to_zero(em, p, like)


def _softmax_jvp(flatten: bool) -> JvpRule:
    def rule(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
        """The tangent is y * (t - sum(y * t)) over the normalised axes."""
        t = tangents[0]
        if t is None:
            return [None]
        y = node.outputs[0]
        axes = _softmax_axes(node, em.opset, flatten=flatten)
        y = _guarded(em, node, y, y, axes)
        expected_t = em.reduce_sum(em.op("Mul", [t, y]), axes, keepdims=True)
        return [em.op("Mul", [em.op("Sub", [t, expected_t]), y])]

    return rule


def _log_softmax_jvp(flatten: bool) -> JvpRule:
    def rule(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
        """The tangent is t - sum(softmax * t) over the normalised axes, softmax = exp(y)."""
        t = tangents[0]
        if t is None:
            return [None]
        y = node.outputs[0]
        axes = _softmax_axes(node, em.opset, flatten=flatten)
        softmax = _guarded(em, node, em.op("Exp", [y]), y, axes)
        expected_t = em.reduce_sum(em.op("Mul", [t, softmax]), axes, keepdims=True)
        return [em.op("Sub", [t, expected_t])]

    return rule


def _softmax_batch(default_axis: int) -> BatchRule:
    def rule(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
        """The operator along the shifted axis (see the module doc for the flattening forms)."""
        x = args[0]
        assert x is not None
        axis = int_attr(node, "axis", default_axis)
        shifted = shift_past_batch([axis], unbatched_rank(node.inputs[0]))[0]
        return [bx.op(node.op_type, [x], attributes_of(node, axis=shifted))], [True]

    return rule


# ------------------------------------------------------------------------------- Softmax
# Opset 13 changed the normalised axes from the flattened block axis..rank-1 (with default
# axis 1) to axis alone (default -1); no other version changed what the rules depend on.
softmax = OpRules("Softmax", since=(1, 13))
softmax.jvp(_softmax_jvp(flatten=True), since=1)
softmax.jvp(_softmax_jvp(flatten=False), since=13)
softmax.batch(_softmax_batch(default_axis=1), since=1)
softmax.batch(_softmax_batch(default_axis=-1), since=13)

# ---------------------------------------------------------------------------- LogSoftmax
log_softmax = OpRules("LogSoftmax", since=(1, 13))
log_softmax.jvp(_log_softmax_jvp(flatten=True), since=1)
log_softmax.jvp(_log_softmax_jvp(flatten=False), since=13)
log_softmax.batch(_softmax_batch(default_axis=1), since=1)
log_softmax.batch(_softmax_batch(default_axis=-1), since=13)
