"""GELU written out in primitives (onnax.rules._gelu, through the Mul rule).

The exporters' forms (torch's exact erf GELU, GPT-2's tanh approximation with Pow, onnxruntime's
FastGelu lowering with a Mul cube) are differentiated as one slope: checked against central
differences, the adjoint identity and vmap, in float and double, and in float16 against the
double derivative; structurally, the backward is one product and the chain's own derivatives
(Erf's bell, Tanh's 1 - t^2) are gone. Where the chain cannot be read as one function (a
constant is differentiated, an intermediate is also an output) the node rules still apply.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.core.static import constant_of
from oracles import run

HEAD = "g ({T}[N, 4] X) => ({T}[N, 4] Y) {\n"
C = {
    "half": " h = Constant<value = {T} {0.5}>()\n",
    "one": " one = Constant<value = {T} {1.0}>()\n",
    "sqrt2": " r = Constant<value = {T} {1.4142135}>()\n",
}

ERF_TORCH = Case(
    "erf_torch",
    HEAD + C["half"] + C["one"] + C["sqrt2"] + " u = Div(X, r)\n e = Erf(u)\n s = Add(e, one)\n"
    " p = Mul(X, s)\n Y = Mul(p, h) }",
    dtypes=("float",),  # onnxruntime has no double (nor float16) Erf kernel
)
ERF_HALF_FIRST = Case(
    "erf_half_first",
    HEAD + C["half"] + C["one"] + " m = Constant<value = {T} {0.70710678}>()\n"
    " u = Mul(m, X)\n e = Erf(u)\n s = Add(one, e)\n hx = Mul(X, h)\n Y = Mul(hx, s) }",
    dtypes=("float",),
)
ERF_NO_HALF = Case(
    "erf_no_half",
    HEAD + C["one"] + C["sqrt2"] + " u = Div(X, r)\n e = Erf(u)\n s = Add(e, one)\n"
    " Y = Mul(s, X) }",
    dtypes=("float",),
)
TANH_GPT2 = Case(
    "tanh_gpt2",
    HEAD + C["half"] + C["one"] + " three = Constant<value = {T} {3.0}>()\n"
    " a = Constant<value = {T} {0.044715}>()\n c = Constant<value = {T} {0.7978846}>()\n"
    " hx = Mul(X, h)\n p = Pow(X, three)\n m = Mul(p, a)\n i = Add(X, m)\n w = Mul(i, c)\n"
    " t = Tanh(w)\n s = Add(t, one)\n Y = Mul(hx, s) }",
)
TANH_FAST_GELU = Case(
    "tanh_fast_gelu",
    HEAD + C["half"] + C["one"] + " a = Constant<value = {T} {0.044715}>()\n"
    " c = Constant<value = {T} {0.7978846}>()\n"
    " x2 = Mul(X, X)\n p = Mul(x2, X)\n m = Mul(p, a)\n i = Add(X, m)\n w = Mul(i, c)\n"
    " t = Tanh(w)\n s = Add(one, t)\n hx = Mul(X, h)\n Y = Mul(hx, s) }",
)
CASES = [ERF_TORCH, ERF_HALF_FIRST, ERF_NO_HALF, TANH_GPT2, TANH_FAST_GELU]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("case", [ERF_TORCH, TANH_GPT2], ids=case_id)
def test_vmap_of_vjp(case: Case) -> None:
    """vmap of the vjp model against a loop of single runs (the slope's nodes batch)."""
    dtype = case.dtypes[-1]
    np_dtype = np.float32 if dtype == "float" else np.float64
    vm = onnax.vjp(case.model(dtype, 18))
    ct_name = vm.graph.inputs[1].name
    batched = onnax.vmap(vm, in_axes={"X": 0, ct_name: 0})
    rng = np.random.default_rng(3)
    xs = rng.standard_normal((2, 3, 4)).astype(np_dtype)
    cts = rng.standard_normal((2, 3, 4)).astype(np_dtype)
    out = run(batched, {"X": xs, ct_name: cts})[batched.graph.outputs[1].name]
    for i in range(2):
        one = run(vm, {"X": xs[i], ct_name: cts[i]})[vm.graph.outputs[1].name]
        np.testing.assert_allclose(out[i], one, rtol=1e-6, atol=1e-6)


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for n in model.graph]


@pytest.mark.parametrize(
    ("case", "derivative_ops"),
    # erf: u*u, Sub, Exp, x*bell, Add (the slope), t*slope, k*(t*slope). tanh: 3m, Add, 1-t, Mul,
    # Mul, Add (the slope's factor), Mul by s, t*slope.
    [(ERF_TORCH, 7), (ERF_HALF_FIRST, 7), (ERF_NO_HALF, 6), (TANH_GPT2, 8), (TANH_FAST_GELU, 8)],
    ids=case_id,
)
def test_backward_is_one_product_of_a_slope(case: Case, derivative_ops: int) -> None:
    model = case.model("float", 18)
    primal = [op for op in _ops(model) if op != "Constant"]
    for transform in (onnax.vjp, onnax.jvp):
        ops = [op for op in _ops(transform(model)) if op != "Constant"]
        assert ops.count("Erf") == primal.count("Erf"), ops
        assert ops.count("Tanh") == primal.count("Tanh"), ops
        assert ops.count("Pow") == primal.count("Pow"), ops
        assert len(ops) - len(primal) == derivative_ops, (transform, ops)


def _half(model: ir.Model) -> ir.Model:
    """The float model in float16 (the text parser takes no float16 constants)."""
    for node in model.graph:
        if node.op_type == "Constant":
            value = node.attributes["value"].as_tensor().numpy().astype(np.float16)
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor(value))
        for v in node.outputs:
            v.dtype = ir.DataType.FLOAT16
    for v in model.graph.inputs:
        v.dtype = ir.DataType.FLOAT16
    return model


@pytest.mark.parametrize("case", [TANH_GPT2, TANH_FAST_GELU], ids=case_id)
def test_float16_agrees_with_double(case: Case) -> None:
    x = np.random.default_rng(1).standard_normal((3, 4)) * 2
    ct = np.random.default_rng(2).standard_normal((3, 4))
    got = {}
    for dtype, np_dtype in (("float16", np.float16), ("double", np.float64)):
        vm = onnax.vjp(
            _half(case.model("float", 18)) if dtype == "float16" else case.model(dtype, 18)
        )
        feeds = {"X": x.astype(np_dtype), vm.graph.inputs[1].name: ct.astype(np_dtype)}
        got[dtype] = run(vm, feeds)[vm.graph.outputs[1].name].astype(np.float64)
    np.testing.assert_allclose(got["float16"], got["double"], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("case", "k"), [(ERF_TORCH, 0.5), (ERF_NO_HALF, 1.0)], ids=case_id)
def test_erf_slope_against_numpy(case: Case, k: float) -> None:
    """The exact GELU's slope k (1 + erf(x/sqrt 2) + x sqrt(2/pi) exp(-x^2/2)), far out too."""
    x = np.concatenate([np.linspace(-9.0, 9.0, 9), [0.0, 1e-3, -1e-3]]).reshape(3, 4)
    erf = np.vectorize(math.erf)(x / math.sqrt(2.0))
    slope = k * (1 + erf + x * math.sqrt(2 / math.pi) * np.exp(-(x**2) / 2))
    vm = onnax.vjp(case.model("float", 18))
    feeds = {"X": x.astype(np.float32), vm.graph.inputs[1].name: np.ones((3, 4), np.float32)}
    got = run(vm, feeds)[vm.graph.outputs[1].name]
    np.testing.assert_allclose(got, slope, rtol=1e-5, atol=1e-6)


def test_scale_fed_at_run_time_is_differentiated() -> None:
    """With the 0.5 a graph input K, the chain ends at x * s (matched) and K gets its own
    derivative through the Mul rule."""
    text = (
        "g ({T}[N, 4] X, {T} K) => ({T}[N, 4] Y) {\n" + C["one"] + C["sqrt2"] + " u = Div(X, r)\n"
        " e = Erf(u)\n s = Add(e, one)\n p = Mul(X, s)\n Y = Mul(p, K) }"
    )
    run_case(Case("k", text), "float", 18)


def test_intermediate_output_still_gets_its_derivative() -> None:
    """``1 + erf`` is also an output: its cotangent flows through the node rules, Y's through
    the slope, and the sum is the derivative."""
    text = ERF_TORCH.text.replace("=> ({T}[N, 4] Y)", "=> ({T}[N, 4] Y, {T}[N, 4] s)")
    run_case(Case("shared", text), "float", 18)


def test_stop_gradient_inside_the_chain_is_kept() -> None:
    """With ``1 + erf`` held constant the derivative is 0.5 (1 + erf(x/sqrt 2)) alone."""
    x = np.linspace(-3.0, 3.0, 12).reshape(3, 4)
    vm = onnax.vjp(ERF_TORCH.model("float", 18), stop_gradient=["s"])
    feeds = {"X": x.astype(np.float32), vm.graph.inputs[1].name: np.ones((3, 4), np.float32)}
    got = run(vm, feeds)[vm.graph.outputs[1].name]
    expected = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case", [ERF_TORCH, ERF_HALF_FIRST, TANH_GPT2, TANH_FAST_GELU], ids=case_id
)
def test_scale_meets_the_cotangent_first(case: Case) -> None:
    """Reverse mode scales the incoming cotangent by the 0.5 (which onnxruntime folds into the
    MatMul producing it) instead of spending a full-size pass on it inside the slope (erf's
    0.5 * (1 + erf), tanh's 0.5 + 0.5 c2 z)."""
    vm = onnax.vjp(case.model("float", 18))
    seed = vm.graph.inputs[1]
    (use,) = [u.node for u in seed.uses()]
    other = next(i for i in use.inputs if i is not seed)
    assert use.op_type == "Mul" and other is not None
    assert float(np.asarray(constant_of(other))) == 0.5


def _tanh_slope(x: np.ndarray, np_dtype: type) -> np.ndarray:
    """The derivative of the tanh cases' graph, with its own constants (as ``np_dtype`` holds
    them), in double."""
    c1, c2 = (np.float64(np_dtype(c)) for c in (0.044715, 0.7978846))
    t = np.tanh(c2 * (x + c1 * x**3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t**2) * c2 * (1 + 3 * c1 * x**2)


@pytest.mark.parametrize("case", [TANH_GPT2, TANH_FAST_GELU], ids=case_id)
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_tanh_slope_against_numpy(case: Case, dtype: str) -> None:
    """The vjp of a unit cotangent is the chain rule's slope, near zero and far out (where
    tanh saturates and the cube dominates) too."""
    np_dtype = np.float32 if dtype == "float" else np.float64
    x = np.concatenate([np.linspace(-9.0, 9.0, 9), [0.0, 1e-3, -1e-3]]).reshape(3, 4)
    vm = onnax.vjp(case.model(dtype, 18))
    feeds = {"X": x.astype(np_dtype), vm.graph.inputs[1].name: np.ones((3, 4), np_dtype)}
    got = run(vm, feeds)[vm.graph.outputs[1].name]
    # float: terms of order one cancel to the slope's minimum, about -0.17 (x near -1.5 is
    # not sampled, but -2.25 is): a few ulps of one absolute.
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float" else {"rtol": 1e-12, "atol": 1e-14}
    np.testing.assert_allclose(got, _tanh_slope(x, np_dtype), **tol)


_MLP_HEAD = (
    "g ({T}[N, 3] X, {T}[3, 4] W, {T}[4] B) => ({T}[N, 4] Y) {\n"
    " mm = MatMul(X, W)\n X1 = Add(mm, B)\n"
)
MLP_ERF = Case(
    "mlp_erf",
    _MLP_HEAD + ERF_TORCH.text.split("{\n", 1)[1].replace("X", "X1").replace("X11", "X1"),
    dtypes=("float",),
)
MLP_TANH = Case(
    "mlp_tanh",
    _MLP_HEAD + TANH_GPT2.text.split("{\n", 1)[1].replace("X", "X1").replace("X11", "X1"),
)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize([MLP_ERF, MLP_TANH]), ids=case_id)
def test_rule_behind_a_biased_product(case: Case, dtype: str, opset: int) -> None:
    """As the exports have it (MatMul -> Add bias -> GELU): jvp and vjp against central
    differences and the adjoint identity, w.r.t. the input, the weight and the bias."""
    run_case(case, dtype, opset)


def _hvp(model: ir.Model) -> ir.Model:
    """Forward over reverse: the tangent of the vjp's ``adj_X`` along ``fwd_X``."""
    return onnax.jvp(onnax.vjp(model), inputs="X")


# (case, k, du): y = k x (1 + erf(x du)).
ERF_SECOND = [(ERF_TORCH, 0.5, 1 / 1.4142135), (ERF_HALF_FIRST, 0.5, 0.70710678)]
ERF_SECOND += [(ERF_NO_HALF, 1.0, 1 / 1.4142135)]


def _rev_over_rev(model: ir.Model) -> ir.Model:
    """Reverse over reverse: the vjp of the vjp's ``adj_X``, its cotangent fed as ``fwd_X``."""
    second = onnax.vjp(onnax.vjp(model), inputs="X", outputs="adj_X")
    for v in second.graph.inputs:
        if v.name == "adj2_adj_X":
            v.name = "fwd_X"
    for v in second.graph.outputs:
        if v.name == "adj2_X":
            v.name = "fwd_adj_X"
    return second


@pytest.mark.parametrize("mode", [_hvp, _rev_over_rev], ids=["fwd_over_rev", "rev_over_rev"])
@pytest.mark.parametrize(("case", "k", "du"), ERF_SECOND, ids=lambda c: getattr(c, "name", ""))
def test_erf_second_derivative_against_numpy(
    case: Case, k: float, du: float, mode: Callable[[ir.Model], ir.Model]
) -> None:
    """A Hessian-vector product of the exact GELU is ``ct k 2 K exp(-u^2) (1 - u^2) v`` with
    ``u = x du`` and ``K = 2 du / sqrt(pi)`` (torch's: ``phi(x) (2 - x^2)``), far out too, in
    forward over reverse and (the slope's tangent transposed) reverse over reverse."""
    x = np.concatenate([np.linspace(-9.0, 9.0, 9), [0.0, 1e-3, -1.5]]).reshape(3, 4)
    ct = np.random.default_rng(4).standard_normal((3, 4))
    v = np.random.default_rng(5).standard_normal((3, 4))
    u = x * np.float64(np.float32(du))
    big_k = 2 * np.float64(np.float32(du)) / math.sqrt(math.pi)
    expected = ct * k * 2 * big_k * np.exp(-(u**2)) * (1 - u**2) * v
    feeds = {k_: a.astype(np.float32) for k_, a in (("X", x), ("adj_Y", ct), ("fwd_X", v))}
    got = run(mode(case.model("float", 18)), feeds)["fwd_adj_X"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("case", "added"),
    # Over the vjp's nodes: t_x * slope (and its 0.5), the curve (erf four, tanh ten, with
    # x * x shared by CSE where the graph has it), the products of the cotangent with the
    # slope's tangent and of its tangent with the slope. Node by node: 13 (erf), 19 and 21.
    [(ERF_TORCH, 9), (ERF_HALF_FIRST, 9), (ERF_NO_HALF, 9), (TANH_GPT2, 12), (TANH_FAST_GELU, 12)],
    ids=case_id,
)
def test_slope_tangent_is_one_curve(case: Case, added: int) -> None:
    """The slope's tangent is one curve times ``t_x``: erf's ``2 bell (1 - u^2)`` (the bell
    the gradient holds its only Exp), tanh's ``s w (u' (3 + zp - near s) - 2 c2)``; the
    node-by-node tangents of the chain (with their Neg) are gone."""
    model = case.model("float", 18)
    ops = [op for op in _ops(_hvp(model)) if op != "Constant"]
    grad = [op for op in _ops(onnax.vjp(model)) if op != "Constant"]
    assert ops.count("Exp") == grad.count("Exp"), ops
    assert ops.count("Tanh") == grad.count("Tanh"), ops
    assert ops.count("Neg") == 0, ops
    assert len(ops) - len(grad) <= added, ops


@pytest.mark.parametrize("mode", [_hvp, _rev_over_rev], ids=["fwd_over_rev", "rev_over_rev"])
@pytest.mark.parametrize("case", [TANH_GPT2, TANH_FAST_GELU], ids=case_id)
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_tanh_second_derivative_against_numpy(
    case: Case, dtype: str, mode: Callable[[ir.Model], ir.Model]
) -> None:
    """A Hessian-vector product of the tanh GELU against float64 central differences of the
    graph's own slope (``_tanh_slope``, exact in double), far out too."""
    np_dtype = np.float32 if dtype == "float" else np.float64
    x = np.concatenate([np.linspace(-9.0, 9.0, 9), [0.0, 1e-3, -1.5]]).reshape(3, 4)
    ct = np.random.default_rng(4).standard_normal((3, 4))
    v = np.random.default_rng(5).standard_normal((3, 4))
    h = 1e-5
    curve = (_tanh_slope(x + h, np_dtype) - _tanh_slope(x - h, np_dtype)) / (2 * h)
    feeds = {k: a.astype(np_dtype) for k, a in (("X", x), ("adj_Y", ct), ("fwd_X", v))}
    got = run(mode(case.model(dtype, 18)), feeds)["fwd_adj_X"]
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float" else {"rtol": 1e-8, "atol": 1e-9}
    np.testing.assert_allclose(got, ct * curve * v, **tol)


def test_slope_with_another_constant_keeps_the_node_rules() -> None:
    """``s + x exp(c - u^2)`` with ``c`` not the slope's own ``ln K`` is not GELU's slope: the
    node rules differentiate it, as checked against central differences."""
    text = (
        HEAD + C["one"] + C["sqrt2"] + " c = Constant<value = {T} {0.1}>()\n u = Div(X, r)\n"
        " e = Erf(u)\n s = Add(e, one)\n u2 = Mul(u, u)\n a = Sub(c, u2)\n b = Exp(a)\n"
        " xb = Mul(X, b)\n Y = Add(s, xb) }"
    )
    run_case(Case("other_constant", text, dtypes=("float",)), "float", 18)
    ops = [n.op_type for n in onnax.jvp(Case("c", text).model("float", 18)).graph]
    assert ops.count("Exp") == 1 + 1, ops  # the primal's and erf's own derivative


def test_hvp_with_the_bell_held_keeps_the_node_rules() -> None:
    """With the gradient's bell held constant, the slope's tangent is ``ds + t_x bell``, that is
    ``2 bell t_x`` (``ds/dx`` is the bell), not the whole curve."""
    x = np.linspace(-3.0, 3.0, 12).reshape(3, 4)
    ct = np.random.default_rng(4).standard_normal((3, 4))
    v = np.random.default_rng(5).standard_normal((3, 4))
    vm = onnax.vjp(ERF_TORCH.model("float", 18))
    (bell,) = [n.outputs[0].name for n in vm.graph if n.op_type == "Exp"]
    hvp = onnax.jvp(vm, inputs="X", stop_gradient=[bell])
    feeds = {k: a.astype(np.float32) for k, a in (("X", x), ("adj_Y", ct), ("fwd_X", v))}
    got = run(hvp, feeds)["fwd_adj_X"]
    du = np.float64(np.float32(1 / 1.4142135))
    expected = ct * 0.5 * 2 * (2 * du / math.sqrt(math.pi)) * np.exp(-((x * du) ** 2)) * v
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _gelu_op(approximate: str) -> ir.Model:
    attr = "" if approximate == "none" else '<approximate="tanh">'
    return ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 20]>\n'
        f"g (float[N, 4] X) => (float[N, 4] Y) {{ Y = Gelu{attr}(X) }}"
    )


def _gelu_op_second(x: np.ndarray, approximate: str) -> np.ndarray:
    """The second derivative of ONNX's Gelu in double: ``phi(x) (2 - x^2)`` (erf), central
    differences of the tanh form's exact slope (tanh)."""
    if approximate == "none":
        return np.exp(-(x**2) / 2) / math.sqrt(2 * math.pi) * (2 - x**2)
    c, k = math.sqrt(2 / math.pi), 0.044715

    def slope(v: np.ndarray) -> np.ndarray:
        t = np.tanh(c * (v + k * v**3))
        return 0.5 * (1 + t) + 0.5 * v * (1 - t**2) * c * (1 + 3 * k * v**2)

    return (slope(x + 1e-5) - slope(x - 1e-5)) / 2e-5


@pytest.mark.parametrize("mode", [_hvp, _rev_over_rev], ids=["fwd_over_rev", "rev_over_rev"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_operator_second_derivative(
    approximate: str, mode: Callable[[ir.Model], ir.Model]
) -> None:
    """The Gelu operator's slope is spelled as the primitive chains' are, so its Hessian-vector
    product takes the one-curve tangent too: against numpy, far out as well."""
    x = np.concatenate([np.linspace(-9.0, 9.0, 9), [0.0, 1e-3, -1.5]]).reshape(3, 4)
    ct = np.random.default_rng(4).standard_normal((3, 4))
    v = np.random.default_rng(5).standard_normal((3, 4))
    feeds = {k: a.astype(np.float32) for k, a in (("X", x), ("adj_Y", ct), ("fwd_X", v))}
    got = run(mode(_gelu_op(approximate)), feeds)["fwd_adj_X"]
    expected = ct * _gelu_op_second(x, approximate) * v
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("approximate", "nodes"), [("none", 17), ("tanh", 28)])
def test_gelu_operator_hvp_is_one_curve(approximate: str, nodes: int) -> None:
    """One Erf and one Exp (erf) or one Tanh, no Neg: 28 and 39 nodes node by node."""
    ops = [n.op_type for n in _hvp(_gelu_op(approximate)).graph if n.op_type != "Constant"]
    assert ops.count("Erf") + ops.count("Tanh") == 1 and ops.count("Exp") <= 1, ops
    assert "Neg" not in ops and len(ops) <= nodes, ops
