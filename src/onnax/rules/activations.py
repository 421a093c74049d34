"""Unary math and activation functions.

Exp Log Sqrt Reciprocal Abs, the trigonometric and hyperbolic functions and their inverses, Erf,
Tanh, Sigmoid, the ReLU family (Relu LeakyRelu PRelu Elu Selu Celu ThresholdedRelu), Shrink, Softplus
Softsign HardSigmoid HardSwish Mish and Gelu.

Every operator here except ``PRelu`` is elementwise with one input, so its tangent is
``fwd_y = coef(x, y) * fwd_x`` (:func:`onnax.rules._patterns.elementwise_unary`); its reverse mode is the
transpose of that ``Mul``. The coefficient is computed from primal values only and reuses the
primal output ``y`` where that is exact (``Exp``: ``y``; ``Tanh``: ``1 - y*y``), which saves
recomputing a transcendental function.

Piecewise operators build their coefficient with ``Where`` over a comparison of the primal
(``Greater``/``Less``); at a breakpoint they take the one-sided derivative of the branch that the
ONNX formula selects there, or 0 where the function's graph has a corner at 0 (as JAX does for
``relu`` and ``abs``).

Coefficients only use operators that have jvp rules themselves (``Mul Add Sub Div Neg Where
Less Greater Sign Exp Sqrt Reciprocal Abs Sin Cos Sinh Cosh Tanh Sigmoid Erf``), so the derivative
models can be differentiated again. Where there is a choice they use operators that
onnxruntime implements for double as well (``Mish`` goes through ``Sigmoid`` rather than
``Softplus``), so a derivative model runs wherever its primal model does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import float_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import Coefficient, elementwise_unary, note_ranks, vectorized_batch

__all__: list[str] = []


def _f32(number: float) -> float:
    """The float32 value of an attribute default: ONNX float attributes are float32."""
    return float(np.float32(number))


# ------------------------------------------------------------------------------ small helpers
def _c(em: Emitter, number: float, x: ir.Value) -> ir.Value:
    """A rank-0 constant with the element type of ``x``."""
    return em.scalar(number, like=x)


def _mul(em: Emitter, a: ir.Value, b: ir.Value) -> ir.Value:
    return em.op("Mul", [a, b])


def _add(em: Emitter, a: ir.Value, b: ir.Value) -> ir.Value:
    return em.op("Add", [a, b])


def _sub(em: Emitter, a: ir.Value, b: ir.Value) -> ir.Value:
    return em.op("Sub", [a, b])


def _square(em: Emitter, a: ir.Value) -> ir.Value:
    return em.op("Mul", [a, a])


def _where(em: Emitter, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    return em.op("Where", [cond, a, b])


def _greater(em: Emitter, a: ir.Value, b: ir.Value) -> ir.Value:
    return em.op("Greater", [a, b])


def _less(em: Emitter, a: ir.Value, b: ir.Value) -> ir.Value:
    return em.op("Less", [a, b])


# ------------------------------------------------------------------------ smooth functions
def _exp(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return y


def _log(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Reciprocal", [x])


def _sqrt(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # d sqrt(x) = 1 / (2 sqrt(x)) = 0.5 / y
    return em.op("Div", [_c(em, 0.5, x), y])


def _reciprocal(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # d (1/x) = -1/x^2 = -y^2
    return em.op("Neg", [_square(em, y)])


def _sin(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Cos", [x])


def _cos(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Neg", [em.op("Sin", [x])])


def _tan(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # d tan(x) = 1 + tan(x)^2
    return _add(em, _c(em, 1.0, x), _square(em, y))


def _inv_sqrt_one_minus_sq(em: Emitter, x: ir.Value) -> ir.Value:
    """``1 / sqrt(1 - x^2)``."""
    return em.op("Reciprocal", [em.op("Sqrt", [_sub(em, _c(em, 1.0, x), _square(em, x))])])


def _asin(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return _inv_sqrt_one_minus_sq(em, x)


def _acos(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Neg", [_inv_sqrt_one_minus_sq(em, x)])


def _atan(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Reciprocal", [_add(em, _c(em, 1.0, x), _square(em, x))])


def _sinh(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Cosh", [x])


def _cosh(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Sinh", [x])


def _asinh(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Reciprocal", [em.op("Sqrt", [_add(em, _square(em, x), _c(em, 1.0, x))])])


def _acosh(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Reciprocal", [em.op("Sqrt", [_sub(em, _square(em, x), _c(em, 1.0, x))])])


def _atanh(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Reciprocal", [_sub(em, _c(em, 1.0, x), _square(em, x))])


def _erf(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # d erf(x) = 2/sqrt(pi) exp(-x^2) = exp(log(2/sqrt(pi)) - x^2): the factor and the negation
    # in one Sub, three nodes over the data instead of four.
    log_factor = _c(em, math.log(2.0 / math.sqrt(math.pi)), x)
    return em.op("Exp", [_sub(em, log_factor, _square(em, x))])


def _tanh(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return _sub(em, _c(em, 1.0, x), _square(em, y))


def _sigmoid(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return _mul(em, y, _sub(em, _c(em, 1.0, x), y))


def _softplus(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    return em.op("Sigmoid", [x])


def _softsign(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # y = x / (1 + |x|), dy = 1 / (1 + |x|)^2 and 1 - |y| = 1 / (1 + |x|)
    return _square(em, _sub(em, _c(em, 1.0, x), em.op("Abs", [y])))


def _mish(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # y = x tanh(sp(x)) with sp = softplus; dy = tanh(sp) + x (1 - tanh(sp)^2) sigmoid(x).
    # With q = sigmoid(-x): exp(sp) = 1 + exp(x) = 1/q, so tanh(sp) = (1 - q^2) / (1 + q^2),
    # stable for every x and built from Sigmoid (which onnxruntime has for double; Softplus not).
    one = _c(em, 1.0, x)
    q = em.op("Sigmoid", [em.op("Neg", [x])])
    q2 = _square(em, q)
    tsp = em.op("Div", [_sub(em, one, q2), _add(em, one, q2)])
    slope = _mul(em, _mul(em, x, _sub(em, one, _square(em, tsp))), _sub(em, one, q))
    return _add(em, tsp, slope)


def _gelu(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # The slopes are spelled as onnax.rules._gelu spells those of the exporters' primitive
    # GELUs, so that forward over reverse reads them back as one function of x
    # (gelu_slope_tangent): a Hessian-vector product then spends four (erf) or ten (tanh)
    # elementwise passes on the slope's tangent instead of its nodes' tangents.
    approximate = node.attributes.get_string("approximate", "none")
    half, one = _c(em, 0.5, x), _c(em, 1.0, x)
    if approximate == "none":
        # y = x Phi(x), Phi(x) = (1 + erf(u)) / 2 with u = x / sqrt 2: dy = (s + x bell) / 2 with
        # s = 1 + erf(u) and bell = 2 phi(x) = exp(ln sqrt(2 / pi) - u^2).
        du = 1 / math.sqrt(2.0)
        u = _mul(em, x, _c(em, du, x))
        s = _add(em, em.op("Erf", [u]), one)
        bell = em.op(
            "Exp", [_sub(em, _c(em, math.log(du * 2 / math.sqrt(math.pi)), x), _square(em, u))]
        )
        return _mul(em, _add(em, s, _mul(em, x, bell)), half)
    if approximate == "tanh":
        # y = x (1 + t) / 2, t = tanh(u), u = c (x + m), m = k x^3: dy = (z + 1) s / 2 with
        # s = 1 + t and z = (u + 2 c m) (1 - t) (x du/dx = c (x + 3 m), 1 - t^2 = (1 - t) s).
        c, k = math.sqrt(2 / math.pi), 0.044715
        m = _mul(em, _mul(em, _square(em, x), x), _c(em, k, x))
        u = _mul(em, _add(em, x, m), _c(em, c, x))
        th = em.op("Tanh", [u])
        s = _add(em, th, one)
        near = _add(em, u, _mul(em, m, _c(em, 2 * c, x)))
        z = _mul(em, near, _sub(em, one, th))
        return _mul(em, _mul(em, _add(em, z, one), s), half)
    raise UnsupportedOperatorError(
        f"{op_label(node)}: {node_label(node)} has approximate={approximate!r}; the ONNX Gelu "
        "operator defines only 'none' and 'tanh'. Remedy: set approximate to 'none' (exact, "
        "with erf) or 'tanh' (the tanh approximation)."
    )


# ------------------------------------------------------------------------- piecewise functions
def _abs(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # sign(x): 0 at 0, a subgradient (as in JAX)
    return em.op("Sign", [x])


relu = OpRules("Relu")
# Elementwise: the output keeps the input's rank, which vmap may need downstream.
relu.batch(note_ranks(vectorized_batch))


@relu.jvp(since=6)
def _relu_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # The coefficient is exactly 1 where y > 0 and 0 where y = 0. Reading the output rather than
    # the input matters: a second reader of the pre-activation would keep onnxruntime from
    # fusing Relu into the MatMul/Gemm/Conv before it. As y >= 0, y > 0 is y != 0: a Cast to
    # bool and back, measured 5x faster than Sign in onnxruntime (a scalar loop) and faster
    # than Cast(Greater); a Where is slower still.
    t, y = tangents[0], node.outputs[0]
    if t is None:
        return [None]
    dtype = y.dtype or t.dtype
    if dtype is None:
        return [em.op("Mul", [t, em.op("Sign", [y])])]
    nonzero = em.op("Cast", [y], {"to": ir.DataType.BOOL})
    return [em.op("Mul", [t, em.op("Cast", [nonzero], {"to": dtype})])]


def _leaky_relu(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # ONNX: y = x for x >= 0, alpha x otherwise
    alpha = float_attr(node, "alpha", _f32(0.01))
    return _where(em, _less(em, x, _c(em, 0.0, x)), _c(em, alpha, x), _c(em, 1.0, x))


def _elu(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # ONNX: y = x for x >= 0, alpha (exp(x) - 1) otherwise, whose derivative is y + alpha
    alpha = float_attr(node, "alpha", 1.0)
    return _where(em, _less(em, x, _c(em, 0.0, x)), _add(em, y, _c(em, alpha, x)), _c(em, 1.0, x))


def _selu(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # ONNX: y = gamma x for x > 0, gamma alpha (exp(x) - 1) otherwise (derivative y + gamma alpha)
    alpha = float_attr(node, "alpha", _f32(1.67326319217681884765625))
    gamma = float_attr(node, "gamma", _f32(1.05070102214813232421875))
    negative = _add(em, y, _c(em, gamma * alpha, x))
    return _where(em, _greater(em, x, _c(em, 0.0, x)), _c(em, gamma, x), negative)


def _celu(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # ONNX: y = max(0, x) + min(0, alpha (exp(x/alpha) - 1)); for x <= 0 the derivative is
    # exp(x/alpha) = y/alpha + 1
    alpha = float_attr(node, "alpha", 1.0)
    one = _c(em, 1.0, x)
    negative = _add(em, em.op("Div", [y, _c(em, alpha, x)]), one)
    return _where(em, _greater(em, x, _c(em, 0.0, x)), one, negative)


def _thresholded_relu(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # ONNX: y = x for x > alpha, 0 otherwise
    alpha = float_attr(node, "alpha", 1.0)
    return _where(em, _greater(em, x, _c(em, alpha, x)), _c(em, 1.0, x), _c(em, 0.0, x))


def _shrink(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # ONNX: y = x + bias for x < -lambd, x - bias for x > lambd, 0 otherwise; the slope is 1
    # outside [-lambd, lambd] and 0 inside, the formula's zero branch at the bounds themselves.
    lambd = float_attr(node, "lambd", 0.5)
    outside = _greater(em, em.op("Abs", [x]), _c(em, lambd, x))
    return _where(em, outside, _c(em, 1.0, x), _c(em, 0.0, x))


def _hard_sigmoid(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # y = max(0, min(1, alpha x + beta)): alpha where 0 < y < 1 (the clip is inactive), else 0.
    # Testing y rather than x needs no division by alpha (which may be 0 or negative).
    alpha = float_attr(node, "alpha", _f32(0.2))
    zero = _c(em, 0.0, x)
    inside = _where(em, _less(em, y, _c(em, 1.0, x)), _c(em, alpha, x), zero)
    return _where(em, _greater(em, y, zero), inside, zero)


def _hard_swish(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
    # y = x max(0, min(1, x/6 + 1/2)): 0 below -3, 1 above 3, x/3 + 1/2 in between
    one, zero = _c(em, 1.0, x), _c(em, 0.0, x)
    middle = _add(em, _mul(em, x, _c(em, 1.0 / 3.0, x)), _c(em, 0.5, x))
    upper = _where(em, _greater(em, x, _c(em, 3.0, x)), one, middle)
    return _where(em, _less(em, x, _c(em, -3.0, x)), zero, upper)


# ----------------------------------------------------------------------------------- PRelu
prelu = OpRules("PRelu", since=7)


@prelu.jvp
def _prelu_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """``y = x`` for ``x >= 0``, ``slope * x`` otherwise; ``slope`` broadcasts to ``x``.

    Both terms come out shaped like ``x`` (the slope broadcasts unidirectionally), and the
    transpose of ``Mul`` sums the slope's cotangent back to its shape.
    """
    (x, slope), (tx, ts) = node.inputs, tangents
    assert x is not None and slope is not None
    negative = _less(em, x, _c(em, 0.0, x))
    terms = []
    if tx is not None:
        terms.append(_mul(em, tx, _where(em, negative, slope, _c(em, 1.0, x))))
    if ts is not None:
        terms.append(_mul(em, ts, _where(em, negative, x, _c(em, 0.0, x))))
    return [em.add_all(terms)]


# ------------------------------------------------------------------------------ registration
# Each operator's first since_version in onnx.defs: no later version changed attributes or
# semantics, only element types, so the first one serves them all.
_UNARY: dict[str, tuple[int, Coefficient]] = {
    "Exp": (6, _exp),
    "Log": (6, _log),
    "Sqrt": (6, _sqrt),
    "Reciprocal": (6, _reciprocal),
    "Abs": (6, _abs),
    "Sin": (7, _sin),
    "Cos": (7, _cos),
    "Tan": (7, _tan),
    "Asin": (7, _asin),
    "Acos": (7, _acos),
    "Atan": (7, _atan),
    "Sinh": (9, _sinh),
    "Cosh": (9, _cosh),
    "Asinh": (9, _asinh),
    "Acosh": (9, _acosh),
    "Atanh": (9, _atanh),
    "Erf": (9, _erf),
    "Tanh": (6, _tanh),
    "Sigmoid": (6, _sigmoid),
    "LeakyRelu": (6, _leaky_relu),
    "Elu": (6, _elu),
    "Selu": (6, _selu),
    "Celu": (12, _celu),
    "ThresholdedRelu": (10, _thresholded_relu),
    "Shrink": (9, _shrink),
    "Softplus": (1, _softplus),
    "Softsign": (1, _softsign),
    "HardSigmoid": (6, _hard_sigmoid),
    "HardSwish": (14, _hard_swish),
    "Mish": (18, _mish),
    "Gelu": (20, _gelu),
}

for _op, (_since, _coef) in _UNARY.items():
    _unary = OpRules(_op)
    _unary.jvp(elementwise_unary(_coef), since=_since)
    # Each acts on each element alone: the batched computation is the operator applied to the
    # batched input (whatever its version), and the output keeps the input's rank, which vmap
    # may need downstream.
    _unary.batch(note_ranks(vectorized_batch))


@prelu.batch
def _prelu_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    # The slope broadcasts to X in one direction only, so X must carry the batch axis whenever
    # the slope does, and a batched slope needs size-1 axes to line up with X's own axes.
    x, slope = node.inputs[0], node.inputs[1]
    assert x is not None and slope is not None and args[0] is not None and args[1] is not None
    x_b = bx.materialize(args[0], batched[0], x)
    s = bx.align(args[1], batched[1], slope, bx.rank(x))
    return [bx.op("PRelu", [x_b, s])], [True]
