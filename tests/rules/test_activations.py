"""Unary math and activation operators (rules in onnax.rules.activations).

onnxruntime 1.32 runs only some of these operators in double, and some only at a few opsets
(LeakyRelu and PRelu at 16..18; Softplus, HardSwish and Mish at 18; Celu takes double only from
opset 28). Cases list the dtypes onnxruntime can run; the others are tested in float only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import (
    Case,
    away_from_zero,
    case_id,
    parametrize,
    positive,
    run_case,
    run_vmap_case,
    unit,
)
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vjp

Fill = Callable[[np.random.Generator, tuple[int, ...], np.dtype], np.ndarray]

FLOAT = ("float",)  # onnxruntime 1.32 has no double kernel for the operator at these opsets
BOTH = ("float", "double")
V22 = (11, 13, 18, 21, 22)  # operators whose schema has a version 22 (new types only)


def avoiding(
    points: Sequence[float], lo: float = -4.0, hi: float = 4.0, margin: float = 0.15
) -> Fill:
    """Uniform values in [lo, hi] at least ``margin`` away from every breakpoint in ``points``."""

    def fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        n = int(np.prod(shape)) if shape else 1
        out = np.empty(0)
        while out.size < n:
            draw = rng.uniform(lo, hi, 4 * n + 8)
            keep = np.all(np.abs(draw[:, None] - np.asarray(points)[None, :]) > margin, axis=1)
            out = np.concatenate([out, draw[keep]])
        return out[:n].reshape(shape).astype(dtype)

    return fill


def above_one(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Values in (1.2, 3): inside the domain of acosh, away from its singularity at 1."""
    return rng.uniform(1.2, 3.0, shape).astype(dtype)


def unary(
    name: str,
    op: str,
    opsets: Sequence[int] = (11, 13, 18, 21),
    fill: Fill | None = None,
    dtypes: Sequence[str] = BOTH,
    attrs: str = "",
) -> Case:
    """A one-node case ``Y = op<attrs>(X)`` over ``[N, 3]``."""
    text = f"g ({{T}}[N, 3] X) => ({{T}}[N, 3] Y) {{ Y = {op}{attrs}(X) }}"
    return Case(name, text, opsets=opsets, fill={"X": fill} if fill else {}, dtypes=dtypes)


CASES = [
    # smooth math functions
    unary("exp", "Exp"),
    unary("log", "Log", fill=positive),
    unary("sqrt", "Sqrt", fill=positive),
    unary("reciprocal", "Reciprocal", fill=positive),
    unary("sin", "Sin", opsets=V22),
    unary("cos", "Cos", opsets=V22),
    unary("tan", "Tan", opsets=V22, fill=unit, dtypes=FLOAT),
    unary("asin", "Asin", opsets=V22, fill=unit, dtypes=FLOAT),
    unary("acos", "Acos", opsets=V22, fill=unit, dtypes=FLOAT),
    unary("atan", "Atan", opsets=V22, dtypes=FLOAT),
    unary("sinh", "Sinh", opsets=V22, dtypes=FLOAT),
    unary("cosh", "Cosh", opsets=V22, dtypes=FLOAT),
    unary("asinh", "Asinh", opsets=V22, dtypes=FLOAT),
    unary("acosh", "Acosh", opsets=V22, fill=above_one, dtypes=FLOAT),
    unary("atanh", "Atanh", opsets=V22, fill=unit, dtypes=FLOAT),
    unary("erf", "Erf", dtypes=FLOAT),
    unary("tanh", "Tanh"),
    unary("sigmoid", "Sigmoid"),
    unary("softplus", "Softplus", opsets=V22, dtypes=FLOAT),
    unary("softplus_double", "Softplus", opsets=(18,)),
    unary("softsign", "Softsign", opsets=V22, dtypes=FLOAT),
    unary("mish", "Mish", opsets=(18, 21, 22), dtypes=FLOAT),
    unary("mish_double", "Mish", opsets=(18,)),
    unary("gelu", "Gelu", opsets=(20, 21), dtypes=FLOAT),
    unary("gelu_tanh", "Gelu", opsets=(20, 21), dtypes=FLOAT, attrs='<approximate="tanh">'),
    # piecewise functions: fills keep finite differences off the breakpoints
    unary("abs", "Abs", fill=away_from_zero),
    unary("relu", "Relu", fill=away_from_zero),
    unary("leaky_relu", "LeakyRelu", fill=away_from_zero, dtypes=FLOAT),
    unary(
        "leaky_relu_alpha",
        "LeakyRelu",
        opsets=(13, 18),
        fill=away_from_zero,
        dtypes=FLOAT,
        attrs="<alpha=0.3>",
    ),
    unary(
        "leaky_relu_double", "LeakyRelu", opsets=(16, 18), fill=away_from_zero, attrs="<alpha=0.3>"
    ),
    unary("elu", "Elu", opsets=V22, fill=away_from_zero, dtypes=FLOAT),
    unary(
        "elu_alpha", "Elu", opsets=(13, 21), fill=away_from_zero, dtypes=FLOAT, attrs="<alpha=0.7>"
    ),
    unary("selu", "Selu", opsets=V22, fill=away_from_zero, dtypes=FLOAT),
    unary(
        "selu_attrs",
        "Selu",
        opsets=(18,),
        fill=away_from_zero,
        dtypes=FLOAT,
        attrs="<alpha=1.5, gamma=1.2>",
    ),
    # Celu exists from opset 12 and takes double only from opset 28
    unary("celu", "Celu", opsets=(13, 18, 21), fill=away_from_zero, dtypes=FLOAT),
    unary("celu_28", "Celu", opsets=(28,), fill=away_from_zero),
    unary(
        "celu_alpha", "Celu", opsets=(18,), fill=away_from_zero, dtypes=FLOAT, attrs="<alpha=0.8>"
    ),
    unary("thresholded_relu", "ThresholdedRelu", opsets=V22, fill=avoiding([1.0]), dtypes=FLOAT),
    unary(
        "thresholded_relu_alpha",
        "ThresholdedRelu",
        opsets=(18,),
        fill=avoiding([0.5]),
        dtypes=FLOAT,
        attrs="<alpha=0.5>",
    ),
    # Shrink has rules from opset 9 (its function body only exists from 15). onnxruntime's
    # double kernel rounds its result to float, too coarse for float64 finite differences.
    unary("shrink", "Shrink", opsets=(11, 13, 18, 21), fill=avoiding([-0.5, 0.5]), dtypes=FLOAT),
    unary(
        "shrink_attrs",
        "Shrink",
        opsets=(11, 18),
        fill=avoiding([-1.0, 1.0]),
        dtypes=FLOAT,
        attrs="<lambd=1.0, bias=0.3>",
    ),
    unary(
        "hard_sigmoid",
        "HardSigmoid",
        opsets=V22,
        fill=avoiding([-2.5, 2.5], lo=-4.0, hi=4.0),
        dtypes=FLOAT,
    ),
    unary(
        "hard_sigmoid_attrs",
        "HardSigmoid",
        opsets=(13, 18),
        fill=avoiding([-1.2, 0.8], lo=-2.5, hi=2.5),
        dtypes=FLOAT,
        attrs="<alpha=0.5, beta=0.6>",
    ),
    unary(
        "hard_swish",
        "HardSwish",
        opsets=(18, 21),
        fill=avoiding([-3.0, 3.0], lo=-5.0, hi=5.0),
        dtypes=FLOAT,
    ),
    unary(
        "hard_swish_double", "HardSwish", opsets=(18,), fill=avoiding([-3.0, 3.0], lo=-5.0, hi=5.0)
    ),
    # PRelu: the slope broadcasts unidirectionally to X
    Case(
        "prelu_channel",
        "g ({T}[N, 2, 3] X, {T}[2, 1] S) => ({T}[N, 2, 3] Y) { Y = PRelu(X, S) }",
        opsets=(11, 13, 18, 21),
        fill={"X": away_from_zero},
        dtypes=FLOAT,
    ),
    Case(
        "prelu_scalar_slope",
        "g ({T}[N, 3] X, {T}[1] S) => ({T}[N, 3] Y) { Y = PRelu(X, S) }",
        opsets=(13, 18),
        fill={"X": away_from_zero},
        dtypes=FLOAT,
    ),
    Case(
        "prelu_double",
        "g ({T}[N, 3] X, {T}[3] S) => ({T}[N, 3] Y) { Y = PRelu(X, S) }",
        opsets=(16, 18),
        fill={"X": away_from_zero},
    ),
    Case(
        "prelu_slope_only",
        "g ({T}[N, 3] X, {T}[3] S) => ({T}[N, 3] Y) { Y = PRelu(X, S) }",
        opsets=(18,),
        fill={"X": away_from_zero},
        inputs=["S"],
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


# A chain of smooth and piecewise operators, differentiated twice. The fills keep every
# intermediate away from the breakpoints: X is away from 0 and Tanh, Elu, Abs keep it so.
CHAINS = [
    Case(
        "chain_double",
        """g ({T}[N, 3] X) => ({T}[N, 3] Y) {
            A = Tanh(X)
            B = LeakyRelu<alpha=0.3>(A)
            C = Sigmoid(B)
            D = Softplus(C)
            E = Mish(D)
            F = Abs(X)
            G = Sqrt(F)
            H = Mul(E, G)
            I = Sin(H)
            Y = Relu(I)
        }""",
        opsets=(18,),
        fill={"X": away_from_zero},
    ),
    Case(
        "chain_float",
        """g ({T}[N, 3] X) => ({T}[N, 3] Y) {
            A = Elu<alpha=0.7>(X)
            B = Selu(A)
            C = Gelu(B)
            D = Softsign(C)
            E = HardSigmoid<alpha=0.5, beta=0.6>(D)
            F = Atan(E)
            G = Gelu<approximate="tanh">(F)
            H = Erf(G)
            I = Celu<alpha=0.8>(X)
            J = Asinh(I)
            K = Add(H, J)
            L = Cosh(K)
            Y = Sinh(L)
        }""",
        opsets=(21,),
        fill={"X": away_from_zero},
        dtypes=FLOAT,
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CHAINS), ids=case_id)
def test_second_order(case: Case, dtype: str, opset: int) -> None:
    """jvp(jvp(m)) and vjp(jvp(m)): every coefficient operator has rules itself (closure)."""
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    jm = check_jvp(model, feeds)
    tangent = next(v for v in jm.graph.inputs if v.name.startswith("fwd"))
    rng = np.random.default_rng(7)
    feeds2 = {**feeds, tangent.name: rng.standard_normal(feeds["X"].shape).astype(feeds["X"].dtype)}
    check_jvp(jm, feeds2)
    check_vjp(jm, feeds2)


def test_gelu_unknown_approximation() -> None:
    text = '<ir_version: 10, opset_import: ["" : 20]>\ng (float[N, 3] X) => (float[N, 3] Y) { Y = Gelu<approximate="erf">(X) }'
    model = ir.from_onnx_text(text)
    with pytest.raises(UnsupportedOperatorError) as info:
        onnax.jvp(model)
    message = str(info.value)
    assert "ai.onnx::Gelu" in message
    assert "'Y'" in message
    assert "approximate='erf'" in message
    assert "'none'" in message and "'tanh'" in message


def test_erf_derivative_is_one_exp_of_a_difference() -> None:
    """d erf(x) = exp(log(2/sqrt(pi)) - x^2): Mul, Sub and Exp over the data, no Neg and no
    separate scaling (checked against differences with the other Erf cases)."""
    text = (
        '<ir_version: 10, opset_import: ["" : 17]>\n'
        "g (float[N, 4] X) => (float Y) { E = Erf(X)\n Y = ReduceSum<keepdims=0>(E) }"
    )
    gm = onnax.grad(ir.from_onnx_text(text), ["X"], output="Y")
    ops = [n.op_type for n in gm.graph]
    assert "Neg" not in ops and ops.count("Exp") == 1 and ops.count("Sub") == 1, ops
    x = np.linspace(-2.0, 2.0, 8, dtype=np.float32).reshape(2, 4)
    check_vjp(ir.from_onnx_text(text), {"X": x})
