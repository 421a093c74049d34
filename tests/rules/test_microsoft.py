"""onnxruntime's fused com.microsoft operators (lowerings in onnax.rules.microsoft).

Each case's model holds the fused operator itself, so the oracles run onnxruntime's own kernel:
central differences of it, the primal outputs of the transformed model against it (check_jvp
compares them), the adjoint identity, and vmap against a loop of single runs. The derivative
models must be plain default-domain ONNX.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, positive, run_case, run_vmap_case, unit
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vjp, run

BOTH = ("float", "double")
FLOAT = ("float",)  # onnxruntime 1.32 has only a float kernel for the operator


@dataclasses.dataclass(frozen=True)
class MsCase(Case):
    """A case whose model imports the com.microsoft domain."""

    def model(self, dtype: str, opset: int) -> ir.Model:
        text = self.text.replace("{T}", dtype).replace("{opset}", str(opset))
        header = f'<ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>\n'
        return ir.from_onnx_text(header + text)


def unary(name: str, op: str, dtypes: tuple[str, ...], attrs: str = "") -> MsCase:
    return MsCase(
        name,
        f"g ({{T}}[N, 4] x) => ({{T}}[N, 4] y) {{ y = com.microsoft.{op}{attrs}(x) }}",
        opsets=(17, 18),
        dtypes=dtypes,
    )


CASES = [
    unary("gelu", "Gelu", FLOAT),  # onnxruntime has no double Erf for the lowering
    unary("fast_gelu", "FastGelu", FLOAT),
    MsCase(
        "fast_gelu_bias",
        "g (float[N, 4] x, float[4] b) => (float[N, 4] y) { y = com.microsoft.FastGelu(x, b) }",
        dtypes=("float",),
        opsets=(17,),
    ),
    MsCase(
        "bias_gelu",
        "g (float[N, 4] x, float[4] b) => (float[N, 4] y) { y = com.microsoft.BiasGelu(x, b) }",
        dtypes=("float",),
        opsets=(17,),
    ),
    # onnxruntime's double QuickGelu rounds like float (vmap's 1e-10 comparison shows it)
    unary("quick_gelu", "QuickGelu", FLOAT),
    unary("quick_gelu_alpha1", "QuickGelu", FLOAT, "<alpha = 1.0>"),
    MsCase(
        "fused_matmul",
        "g ({T}[2, N, 4] a, {T}[4, 5] b) => ({T}[2, N, 5] y)"
        " { y = com.microsoft.FusedMatMul<alpha = 0.25>(a, b) }",
        dtypes=BOTH,
        opsets=(17, 18),
    ),
    MsCase(
        "fused_matmul_trans",
        "g ({T}[2, 4, N] a, {T}[2, 5, 4] b) => ({T}[2, N, 5] y)"
        " { y = com.microsoft.FusedMatMul<alpha = 0.5, transA = 1, transB = 1>(a, b) }",
        dtypes=BOTH,
    ),
    MsCase(
        "fused_gemm_leaky",
        "g (float[N, 4] a, float[5, 4] b, float[5] c) => (float[N, 5] y)"
        " { y = com.microsoft.FusedGemm<transB = 1, alpha = 0.7, beta = 0.4,"
        ' activation = "LeakyRelu", activation_alpha = 0.1>(a, b, c) }',
        dtypes=("float",),
    ),
    MsCase(
        "fused_gemm_tanh",
        "g (float[4, N] a, float[4, 5] b, float[5] c) => (float[N, 5] y)"
        ' { y = com.microsoft.FusedGemm<transA = 1, activation = "Tanh">(a, b, c) }',
        dtypes=("float",),
    ),
    MsCase(
        "fused_conv_relu",
        "g (float[N, 2, 5, 5] x, float[3, 2, 3, 3] w, float[3] b) => (float[N, 3, 5, 5] y)"
        ' { y = com.microsoft.FusedConv<activation = "Relu", pads = [1, 1, 1, 1],'
        " kernel_shape = [3, 3]>(x, w, b) }",
        dtypes=("float",),
    ),
    MsCase(
        "fused_conv_sum_sigmoid",
        "g (float[N, 2, 5, 5] x, float[4, 1, 3, 3] w, float[4] b, float[N, 4, 2, 2] z)"
        " => (float[N, 4, 2, 2] y)"
        ' { y = com.microsoft.FusedConv<activation = "Sigmoid", group = 2,'
        " strides = [2, 2]>(x, w, b, z) }",
        dtypes=("float",),
    ),
    MsCase(
        "fused_conv_clip",
        "g (float[N, 2, 5, 5] x, float[3, 2, 3, 3] w) => (float[N, 3, 3, 3] y)"
        ' { y = com.microsoft.FusedConv<activation = "Clip",'
        " activation_params = [-0.5, 0.6]>(x, w) }",
        dtypes=("float",),
    ),
    MsCase(
        "fused_conv_hardsigmoid",
        "g (float[N, 2, 5, 5] x, float[3, 2, 3, 3] w) => (float[N, 3, 3, 3] y)"
        ' { y = com.microsoft.FusedConv<activation = "HardSigmoid",'
        " activation_params = [0.1, 0.5]>(x, w) }",
        dtypes=("float",),
        # small operands keep the pre-activation inside (-5, 5), away from the kinks
        fill={"x": unit, "w": unit},
    ),
    MsCase(
        "skip_layer_norm",
        "g ({T}[2, N, 6] x, {T}[2, N, 6] s, {T}[6] g, {T}[6] b, {T}[6] c)"
        " => ({T}[2, N, 6] y, {T}[2, N, 6] sum) {"
        " y, m, v, sum = com.microsoft.SkipLayerNormalization<epsilon = 1e-5>(x, s, g, b, c) }",
        dtypes=FLOAT,
        opsets=(17, 18),
    ),
    MsCase(
        "skip_layer_norm_no_bias",
        "g (float[2, N, 6] x, float[2, N, 6] s, float[6] g) => (float[2, N, 6] y) {"
        " y = com.microsoft.SkipLayerNormalization<epsilon = 1e-3>(x, s, g) }",
        dtypes=("float",),
    ),
    MsCase(
        "skip_simplified_layer_norm",
        "g ({T}[2, N, 6] x, {T}[2, N, 6] s, {T}[6] g, {T}[6] c)"
        " => ({T}[2, N, 6] y, {T}[2, N, 6] sum) {"
        " y, m, v, sum = com.microsoft.SkipSimplifiedLayerNormalization<epsilon = 1e-5>"
        "(x, s, g, c) }",
        dtypes=("float",),
    ),
]


ATTENTION_CASES = [
    MsCase(
        "attention",
        "g (float[2, 3, 8] x, float[8, 24] w, float[24] c) => (float[2, 3, 8] y)"
        " { y = com.microsoft.Attention<num_heads = 2>(x, w, c) }",
        dtypes=FLOAT,
    ),
    MsCase(
        "attention_mask_causal",
        "g (float[2, 4, 8] x, float[8, 24] w, float[24] c, int32[2, 4] m) => (float[2, 4, 8] y)"
        " { y = com.microsoft.Attention<num_heads = 4, unidirectional = 1>(x, w, c, m) }",
        dtypes=FLOAT,
        fixed={"m": np.array([[1, 1, 1, 0], [1, 1, 0, 0]])},
    ),
    MsCase(
        "attention_key_counts",  # 1-D mask_index: each example's number of keys
        "g (float[2, 4, 8] x, float[8, 24] w, float[24] c, int32[2] m) => (float[2, 4, 8] y)"
        " { y = com.microsoft.Attention<num_heads = 2>(x, w, c, m) }",
        dtypes=FLOAT,
        fixed={"m": np.array([3, 4])},
    ),
    MsCase(
        "attention_scale_bias",
        "g (float[2, 3, 8] x, float[8, 24] w, float[24] c, float[1, 2, 3, 3] b)"
        " => (float[2, 3, 8] y)"
        " { y = com.microsoft.Attention<num_heads = 2, scale = 0.3>(x, w, c, , , b) }",
        dtypes=FLOAT,
    ),
    MsCase(
        "multi_head_attention",
        "g (float[2, 3, 8] q, float[2, 5, 8] k, float[2, 5, 6] v, float[22] c, int32[2, 5] m)"
        " => (float[2, 3, 6] y)"
        " { y = com.microsoft.MultiHeadAttention<num_heads = 2>(q, k, v, c, m) }",
        dtypes=FLOAT,
        fixed={"m": np.array([[1, 1, 1, 1, 0], [1, 0, 1, 1, 1]])},
    ),
    MsCase(
        "multi_head_attention_bias",
        "g (float[2, 3, 8] q, float[2, 5, 8] k, float[2, 5, 8] v, float[2, 1, 3, 5] b)"
        " => (float[2, 3, 8] y)"
        " { y = com.microsoft.MultiHeadAttention<num_heads = 4, scale = 0.5>(q, k, v, , , b) }",
        dtypes=FLOAT,
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: MsCase, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: MsCase, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


# onnxruntime registers SimplifiedLayerNormalization in the default domain, where onnx.checker
# knows no such operator: prepare's check passes over default-domain nodes without a schema that
# onnax lowers (regression: it used to refuse the model before the lowering was reached).
DEFAULT_DOMAIN = [
    MsCase(
        "simplified_layer_norm",
        "g ({T}[2, N, 6] x, {T}[6] g) => ({T}[2, N, 6] y) {"
        " y = SimplifiedLayerNormalization<epsilon = 1e-5>(x, g) }",
        dtypes=BOTH,
        opsets=(17, 18),
    ),
    MsCase(
        "simplified_layer_norm_axis1",
        "g (float[2, N, 6] x, float[N, 6] g) => (float[2, N, 6] y, float[2, 1, 1] r) {"
        " y, r = SimplifiedLayerNormalization<axis = 1, epsilon = 1e-5>(x, g) }",
        dtypes=("float",),
        fill={"x": positive},
    ),
]


@pytest.mark.parametrize("case", DEFAULT_DOMAIN, ids=case_id)
def test_default_domain_contrib_operators(case: MsCase) -> None:
    for dtype in case.dtypes:
        run_case(case, dtype, case.opsets[0])
    run_vmap_case(case, case.dtypes[0], case.opsets[0])


def test_unknown_default_domain_operator_is_still_refused_by_the_checker() -> None:
    """Only operators onnax lowers are passed over: a made-up one still fails the check."""
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[3] x) => (float[3] y) { y = NoSuchOperator(x) }"
    )
    with pytest.raises(onnax.InvalidModelError, match=r"fails onnx.checker.*NoSuchOperator"):
        onnax.jvp(model)


def _domains(model: ir.Model) -> set[str]:
    return {n.domain for n in model.graph.all_nodes()}


@pytest.mark.parametrize("case", [*CASES, *ATTENTION_CASES], ids=case_id)
def test_derivative_is_default_domain(case: MsCase) -> None:
    model = case.model(case.dtypes[0], case.opsets[0])
    assert _domains(model) - {""}, "the case holds no contrib operator"
    feeds = case.feeds(model)
    forward = check_jvp(model, feeds)
    reverse = check_vjp(model, feeds)
    assert _domains(forward) <= {""}, _domains(forward)
    assert _domains(reverse) <= {""}, _domains(reverse)


def test_second_order_through_lowering() -> None:
    """jvp(grad) of a lowered operator: the lowering's primitives have rules of their own."""
    text = (
        '<ir_version: 10, opset_import: ["" : 18, "com.microsoft" : 1]>\n'
        "g (float[3] x, float[3] s) => (float l) {"
        " zero = Constant<value = int64[1] {0}>()"
        " g = Constant<value = float[3] {1.0, 2.0, 0.5}>()"
        " x2 = Unsqueeze(x, zero)"
        " y = com.microsoft.SkipLayerNormalization<epsilon = 1e-5>(x2, s, g)"
        " y0 = Mul(y, x2) y3 = Mul(y, y0) l = ReduceSum<keepdims = 0>(y3) }"
    )
    model = ir.from_onnx_text(text)
    feeds = {
        "x": np.array([0.3, -1.2, 0.8], np.float32),
        "s": np.array([0.1, 0.5, -0.4], np.float32),
    }
    grad = onnax.grad(model, ["x"], output="l")
    check_jvp(grad, feeds, ["x"], ["grad_x"])


def test_fused_matmul_trans_batch_is_refused() -> None:
    model = MsCase(
        "tb",
        "g (float[2, 3, 4] a, float[4, 5] b) => (float[3, 2, 5] y)"
        " { y = com.microsoft.FusedMatMul<transBatchA = 1>(a, b) }",
    ).model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model, ["a"])
    message = str(err.value)
    assert "com.microsoft::FusedMatMul" in message
    assert "transBatchA=1" in message
    assert "Remedy: re-save the model at ORT_ENABLE_BASIC" in message


def test_unknown_fused_activation_is_refused() -> None:
    model = MsCase(
        "act",
        "g (float[1, 2, 5, 5] x, float[3, 2, 3, 3] w) => (float[1, 3, 3, 3] y)"
        ' { y = com.microsoft.FusedConv<activation = "Softsign">(x, w) }',
    ).model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vjp(model, ["w"])
    message = str(err.value)
    assert "com.microsoft::FusedConv" in message
    assert (
        "'Softsign'" in message and "Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid" in message
    )
    assert "ORT_ENABLE_BASIC" in message


def test_bias_add_against_numpy() -> None:
    """BiasAdd has no CPU kernel in onnxruntime: its lowering is checked against numpy."""
    case = MsCase(
        "bias_add",
        "g (float[2, N, 4] x, float[4] b, float[2, N, 4] s) => (float[2, N, 4] y)"
        " { y = com.microsoft.BiasAdd(x, b, s) }",
    )
    model = case.model("float", 18)
    feeds = case.feeds(model)
    rng = np.random.default_rng(1)
    tangents = {
        f"fwd_{k}": rng.standard_normal(v.shape).astype(np.float32) for k, v in feeds.items()
    }
    forward = onnax.jvp(model, ["x", "b", "s"])
    assert _domains(forward) <= {""}
    y, fwd_y = run(forward, {**feeds, **tangents}).values()
    np.testing.assert_allclose(y, feeds["x"] + feeds["b"] + feeds["s"], rtol=1e-6)
    want = tangents["fwd_x"] + tangents["fwd_b"] + tangents["fwd_s"]
    np.testing.assert_allclose(fwd_y, want, rtol=1e-6)
    reverse = onnax.vjp(model, ["x", "b", "s"])
    u = rng.standard_normal(y.shape).astype(np.float32)
    _, ct_x, ct_b, ct_s = run(reverse, {**feeds, "adj_y": u}).values()
    np.testing.assert_allclose(ct_x, u, rtol=1e-6)
    np.testing.assert_allclose(ct_s, u, rtol=1e-6)
    np.testing.assert_allclose(ct_b, u.sum(axis=(0, 1)), rtol=1e-5)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(ATTENTION_CASES), ids=case_id)
def test_attention(case: MsCase, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(ATTENTION_CASES), ids=case_id)
def test_attention_vmap(case: MsCase, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset, shared=("m",))


def test_attention_with_past_is_refused() -> None:
    model = MsCase(
        "past",
        "g (float[2, 3, 8] x, float[8, 24] w, float[24] c, float[2, 2, 2, 1, 4] p)"
        " => (float[2, 3, 8] y) { y = com.microsoft.Attention<num_heads = 2>(x, w, c, , p) }",
    ).model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model, ["x"])
    message = str(err.value)
    assert "com.microsoft::Attention" in message and "input 4 (past) is given" in message


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_norm_default_epsilon(op: str) -> None:
    """Without the attribute the kernels use 1e-12: a variance of ~1e-9 shows any other."""
    model = MsCase(
        op,
        "g (float[1, 2, 4] x, float[1, 2, 4] s, float[4] g) => (float[1, 2, 4] y)"
        f" {{ y = com.microsoft.{op}(x, s, g) }}",
    ).model("float", 18)
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 4) * 1e-4
    feeds = {"x": x, "s": np.zeros_like(x), "g": np.ones(4, np.float32)}
    want = run(model, feeds)["y"]
    got = run(onnax.jvp(model, ["x"]), {**feeds, "fwd_x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
