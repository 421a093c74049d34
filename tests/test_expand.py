"""Expansion of operators without rules: lowerings and ONNX function bodies.

Operators that have no rule but a function body in their ONNX schema (or a context-dependent
one) are differentiated and batched through their expansion; the oracles know nothing of it
(finite differences and loops of single runs through onnxruntime, which runs its own kernels).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.core.functions import function_body, static_body_operators
from onnax.core.registry import Registry, batch_rules, jvp_rules
from onnax.passes.expand import expand
from onnax.passes.prepare import prepare
from onnax.rules import collect
from oracles import run, tolerances


@pytest.fixture(autouse=True)
def _shrink_by_its_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink has rules (from opset 9); these tests hide them so that the transforms see what
    they see for any operator without a rule: its function body (written for opset 18, with
    CastLike, which opset 14 lacks). Only this module's view of the registries changes."""
    collect()
    for registry in (jvp_rules, batch_rules):
        monkeypatch.delitem(registry._rules, ("", "Shrink"))


ATTENTION = "g ({T}[2,3,4,8] q, {T}[2,3,5,8] k, {T}[2,3,5,8] v) => ({T}[2,3,4,8] y) {{ y = Attention{attrs}(q, k, v) }}"

CASES = [
    Case("attention", ATTENTION.format(T="{T}", attrs=""), opsets=(23, 24)),
    Case(
        "attention_causal_scaled",
        ATTENTION.format(T="{T}", attrs="<is_causal=1, scale=0.5>"),
        opsets=(23,),
    ),
    Case(
        "attention_3d_gqa_mask",
        """g ({T}[2,4,8] q, {T}[2,5,4] k, {T}[2,5,4] v, {T}[4,5] m) => ({T}[2,4,8] y) {
            y = Attention<q_num_heads=2, kv_num_heads=1>(q, k, v, m)
        }""",
        opsets=(24,),
        inputs=("q", "k", "v"),
    ),
    # onnxruntime's RotaryEmbedding, LinearAttention and (at opset 22) Conv have no double kernel.
    Case(
        "rotary_embedding",
        """g ({T}[2,3,4,8] x, {T}[16,4] cos, {T}[16,4] sin, int64[2,4] pos) => ({T}[2,3,4,8] y) {
            y = RotaryEmbedding(x, cos, sin, pos)
        }""",
        opsets=(23,),
        fixed={"pos": np.array([[0, 1, 2, 3], [5, 6, 7, 8]])},
        dtypes=("float",),
    ),
    Case(
        "center_crop_pad",
        """g ({T}[4,5] x) => ({T}[3,7] y) {
            s = Constant<value_ints=[3, 7]>()
            y = CenterCropPad(x, s)
        }""",
        opsets=(18, 24),
    ),
    Case(
        "center_crop_pad_axes",
        """g ({T}[N,6,5] x) => ({T}[N,4,5] y) {
            s = Constant<value_ints=[4]>()
            y = CenterCropPad<axes=[1]>(x, s)
        }""",
        opsets=(18,),
    ),
    Case(
        "affine_grid_2d",
        """g ({T}[2,2,3] t) => ({T}[2,4,5,2] y) {
            s = Constant<value_ints=[2, 1, 4, 5]>()
            y = AffineGrid(t, s)
        }""",
        opsets=(20,),
    ),
    Case(
        "causal_conv_with_state",
        """g ({T}[2,3,5] x, {T}[3,1,2] w, {T}[3] b) => ({T}[2,3,5] y, {T}[2,3,1] s) {
            y, s = CausalConvWithState(x, w, b)
        }""",
        opsets=(27,),
        dtypes=("float",),
    ),
    # onnxruntime's double Shrink computes in single precision: float only.
    Case(
        "shrink",
        """g ({T}[N,4] x) => ({T}[N,4] y) { y = Shrink<lambd=0.3, bias=0.1>(x) }""",
        opsets=(15, 18, 22),
        dtypes=("float",),
    ),
    Case("swish", """g ({T}[N,4] x) => ({T}[N,4] y) { y = Swish<alpha=0.7>(x) }""", opsets=(24,)),
    Case(
        "dynamic_quantize_linear",
        """g ({T}[N,4] x) => (uint8[N,4] y, {T} s, uint8 z) { y, s, z = DynamicQuantizeLinear(x) }""",
        opsets=(20,),
        dtypes=("float",),  # the operator is float-only
    ),
]

LINEAR_ATTENTION = Case(
    "linear_attention",
    """g ({T}[2,3,8] q, {T}[2,3,8] k, {T}[2,3,8] v) => ({T}[2,3,8] y) {
        y, s = LinearAttention<q_num_heads=2, kv_num_heads=2, update_rule="linear">(q, k, v)
    }""",
    opsets=(27,),
    dtypes=("float",),
)


def _has_rule(op: str, opset: int) -> bool:
    collect()
    return jvp_rules.lookup("", op, opset) is not None


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_jvp_vjp(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def test_the_cases_go_through_expansion() -> None:
    """The operators of the cases above leave the derived models (while they have no rules of
    their own: a rule added later takes precedence, and the case then tests the rule)."""
    checked = 0
    for case in CASES:
        model = case.model("float", case.opsets[0])
        op = next(n.op_type for n in model.graph if n.op_type != "Constant")
        if _has_rule(op, case.opsets[0]):
            continue
        for derived in (onnax.jvp(model, case.inputs), onnax.vmap(model)):
            assert op not in {n.op_type for n in derived.graph.all_nodes()}, op
        checked += 1
    assert checked >= len(CASES) // 2


def test_linear_attention_jvp_vjp_and_vmap() -> None:
    """Its body scans over time: every transform goes through the Scan rules."""
    from oracles import check_adjoint, check_jvp, check_vjp, check_vmap

    model = LINEAR_ATTENTION.model("float", 27)
    feeds = LINEAR_ATTENTION.feeds(model)
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_adjoint(model, feeds)
    check_vmap(model, feeds, in_axes=0)
    check_vmap(model, feeds, in_axes=(0, None, None))


IF_BODY = """g ({T}[N,4] x, bool c) => ({T}[N,4] y) {
    y = If(c) <then_branch = then_g () => ({T}[N,4] a) { a = Swish<alpha=0.7>(x) },
               else_branch = else_g () => ({T}[N,4] b) { b = Shrink<lambd=0.3>(x) }>
}"""

BRANCH_CASES = [
    Case(f"if_{flag}", IF_BODY, opsets=(24,), fixed={"c": np.array(flag)}, inputs=("x",))
    for flag in (True, False)
]


@pytest.mark.parametrize("case", BRANCH_CASES, ids=case_id)
def test_operators_inside_branches_are_expanded(case: Case) -> None:
    """Expansion reaches into the subgraphs of an active If (float: Shrink, see above)."""
    run_case(case, "float", 24)
    run_vmap_case(case, "float", 24)
    for derived in (onnax.jvp(case.model("float", 24), ["x"]), onnax.vmap(case.model("float", 24))):
        ops = {n.op_type for n in derived.graph.all_nodes()}
        assert not ops & {"Swish", "Shrink"}, ops


# ---------------------------------------------------------------- outside onnxruntime
SWIGLU = """<ir_version: 10, opset_import: ["" : 28]>
g (double[3,4] a, double[3,4] b) => (double[3,4] y) { y = SwiGLU<alpha=1.5>(a, b) }"""


def _reference(model: ir.Model, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ReferenceEvaluator(ir.to_proto(model)).run(None, feeds)[0]


def test_swiglu_against_the_reference_implementation() -> None:
    """onnxruntime cannot run SwiGLU (its body calls Swish, which it lacks); the derivative
    models contain neither, so they run, and the primal is evaluated by onnx.reference."""
    model = ir.from_onnx_text(SWIGLU)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal((3, 4))}
    tangents = {k: rng.standard_normal((3, 4)) for k in feeds}
    jm = onnax.jvp(model)
    got = run(jm, {**feeds, **{f"fwd_{k}": t for k, t in tangents.items()}})["fwd_y"]
    eps = 1e-6
    plus = _reference(model, {k: feeds[k] + eps * tangents[k] for k in feeds})
    minus = _reference(model, {k: feeds[k] - eps * tangents[k] for k in feeds})
    np.testing.assert_allclose(got, (plus - minus) / (2 * eps), **tolerances(np.dtype("float64")))

    vm = onnax.vmap(model, in_axes=(0, None))
    stacked = np.stack([feeds["a"], feeds["a"] * 0.5, -feeds["a"]])
    got = run(vm, {"a": stacked, "b": feeds["b"]})["y"]
    expected = np.stack([_reference(model, {"a": a, "b": feeds["b"]}) for a in stacked])
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


BODIES = {
    "affine_grid_2d": (
        20,
        "float[2,2,3] t",
        "float[2,4,5,2] y",
        "s = Constant<value_ints=[2, 1, 4, 5]>()\n y = AffineGrid<align_corners=1>(t, s)",
    ),
    "affine_grid_3d": (
        20,
        "float[2,3,4] t",
        "float[2,2,3,4,3] y",
        "s = Constant<value_ints=[2, 1, 2, 3, 4]>()\n y = AffineGrid(t, s)",
    ),
    "attention": (
        23,
        "float[2,3,4,8] q, float[2,3,5,8] k, float[2,3,5,8] v",
        "float[2,3,4,8] y",
        "y = Attention<is_causal=1>(q, k, v)",
    ),
    "layer_norm_17": (
        17,
        "float[N,3,4] x, float[4] s, float[4] b",
        "float[N,3,4] y",
        "y = LayerNormalization(x, s, b)",
    ),
    "layer_norm_18": (
        18,
        "float[N,3,4] x, float[3,4] s",
        "float[N,3,4] y",
        "y = LayerNormalization<axis=1>(x, s)",
    ),
    "softmax_13": (13, "float[N,3,4] x", "float[N,3,4] y", "y = Softmax<axis=1>(x)"),
    "gelu_tanh": (20, "float[N,4] x", "float[N,4] y", 'y = Gelu<approximate="tanh">(x)'),
    "rms_norm": (23, "float[N,3,4] x, float[4] s", "float[N,3,4] y", "y = RMSNormalization(x, s)"),
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_bodies_compute_the_operator(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every rule and lowering hidden, the expansion computes what onnxruntime's kernel
    computes: the function bodies (context-dependent ones too) and the folding are exact."""
    import onnax.passes.expand as expand_module

    monkeypatch.setattr(expand_module, "lowerings", Registry("lowering"))
    opset, inputs, outputs, body = BODIES[name]
    original = ir.from_onnx_text(
        f"""<ir_version: 10, opset_import: ["" : {opset}]>
        g ({inputs}) => ({outputs}) {{ {body} }}"""
    )
    model = prepare(original, "jvp")
    op = next(n.op_type for n in model.graph if n.op_type != "Constant")
    # Nothing has a rule here: operators inside the body that have bodies expand in turn.
    assert expand(model, list(model.graph.inputs), Registry("none"), "jvp") >= 1
    assert op not in {n.op_type for n in model.graph.all_nodes()}
    rng = np.random.default_rng(0)
    feeds = {
        v.name: rng.standard_normal([d if isinstance(d, int) else 2 for d in v.shape.dims]).astype(
            np.float32
        )
        for v in original.graph.inputs
    }
    np.testing.assert_allclose(
        run(model, feeds)["y"], run(original, feeds)["y"], rtol=1e-5, atol=1e-5
    )


# ------------------------------------------------------------------- opset conversion
def test_a_body_written_for_a_newer_opset_is_converted() -> None:
    """MeanVarianceNormalization's body is written for opset 18 (ReduceMean takes axes as an
    input); at 13 and 17 it is converted to the attribute form. Its rule is hidden here."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    for opset, axes_as_input in ((13, False), (17, False), (18, True), (22, True)):
        text = f"""<ir_version: 10, opset_import: ["" : {opset}]>
        g (float[N,3,4] x) => (float[N,3,4] y) {{ y = MeanVarianceNormalization<axes=[0, 2]>(x) }}"""
        original = ir.from_onnx_text(text)
        model = prepare(original, "jvp")
        assert expand(model, list(model.graph.inputs), Registry("none"), "jvp") == 1
        means = [n for n in model.graph if n.op_type == "ReduceMean"]
        assert means
        for n in means:
            assert (len(n.inputs) == 2) == axes_as_input, opset
            assert ("axes" in n.attributes) != axes_as_input, opset
        np.testing.assert_allclose(
            run(model, {"x": x})["y"], run(original, {"x": x})["y"], rtol=1e-5, atol=1e-5
        )


def test_function_body_reports_its_version_and_conversion() -> None:
    def body(opset: int):
        model = ir.from_onnx_text(
            f"""<ir_version: 10, opset_import: ["" : {opset}]>
            g (float[3] x) => (float[3] y) {{ y = Shrink(x) }}"""
        )
        return function_body(model.graph[0], model.opset_imports)

    relabelled, converted = body(17), body(22)
    assert relabelled is not None and converted is not None
    assert (relabelled.written_for, relabelled.converted) == (18, False)
    assert (converted.written_for, converted.converted) == (18, True)
    assert {o.domain: o.version for o in converted.model.opset_import}[""] == 22


@pytest.mark.parametrize("transform", ["jvp", "vmap"])
def test_a_body_that_cannot_be_converted_is_named_in_the_error(transform: str) -> None:
    """Shrink's body (opset 18) uses CastLike, which opset 14 does not have."""
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 14]>
        g (float[3] x) => (float[3] y) { y = Shrink <lambd=0.2> (x) }"""
    )
    model.graph[0].name = "shrink_me"
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.jvp(model) if transform == "jvp" else onnax.vmap(model)
    message = str(err.value)
    for part in (
        f"{transform}: no ",
        "ai.onnx::Shrink at opset 14",
        "'shrink_me'",
        "written for opset 18",
        "CastLike",
        "does not exist at opset 14",
        "onnx.version_converter",
        "Remedy",
    ):
        assert part in message, (part, message)


# --------------------------------------------------------- precedence, activity, folding
def test_an_operator_with_a_rule_is_not_expanded() -> None:
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (float[N,4] x, float[4] s, float[4] b) => (float[N,4] y) {
            y = LayerNormalization(x, s, b)
        }"""
    )
    assert static_body_operators("Relu", 18) is not None  # has a body, and a rule
    prepared = prepare(model, "jvp")
    assert expand(prepared, list(prepared.graph.inputs), jvp_rules, "jvp") == 0
    assert any(n.op_type == "LayerNormalization" for n in onnax.jvp(model).graph)
    assert any(n.op_type == "LayerNormalization" for n in onnax.vmap(model).graph)


def test_inactive_nodes_are_not_expanded() -> None:
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (float[N,4] x, float[N,4] z) => (float[N,4] y, float[N,4] w) {
            y = Shrink<lambd=0.3>(z)
            w = Softplus(x)
        }"""
    )
    for derived in (onnax.jvp(model, ["x"]), onnax.vmap(model, in_axes=(0, None))):
        assert [n.op_type for n in derived.graph].count("Shrink") == 1
    expanded = onnax.jvp(model, ["z"])
    assert all(n.op_type != "Shrink" for n in expanded.graph)


def test_a_lowering_wins_over_the_function_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registered lowering is used instead of the schema's body (its operators tell which
    one was used)."""
    import onnax.passes.expand as expand_module

    def shrink_lowering(em, node):
        # Shrink with bias 0 keeps x where |x| > lambd: x * (|x| > lambd).
        x = node.inputs[0]
        lambd = node.attributes.get_float("lambd", 0.5)
        keep = em.op("Greater", [em.op("Abs", [x]), em.scalar(lambd, x)])
        return [em.op("Mul", [x, em.op("Cast", [keep], {"to": x.dtype})])]

    registry: Registry = Registry("lowering")
    registry.add("Shrink", shrink_lowering, since_version=9)
    monkeypatch.setattr(expand_module, "lowerings", registry)
    case = Case("shrink_lowered", "g ({T}[N,4] x) => ({T}[N,4] y) { y = Shrink<lambd=0.3>(x) }")
    run_case(case, "float", 18)
    ops = {n.op_type for n in onnax.jvp(case.model("float", 18)).graph}
    assert {"Abs", "Greater"} <= ops and "Where" not in ops


def test_shape_arithmetic_is_folded() -> None:
    """Static shapes leave no Shape node (Attention's body computes its shapes at run time)."""
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 23]>
        g (float[2,3,4,8] q, float[2,3,5,8] k, float[2,3,5,8] v) => (float[2,3,4,8] y) {
            y = Attention(q, k, v)
        }"""
    )
    for derived in (onnax.jvp(model), onnax.vjp(model), onnax.vmap(model, axis_size=3)):
        ops = [n.op_type for n in derived.graph]
        assert "Attention" not in ops
        assert "Shape" not in ops, ops


def test_symbolic_shapes_survive_expansion() -> None:
    """With a symbolic batch, the shape arithmetic stays computed and still runs."""
    case = Case(
        "attention_symbolic",
        ATTENTION.format(T="{T}", attrs="")
        .replace("[2,3,4,8] q", "[N,3,4,8] q")
        .replace("[2,3,5,8] k", "[N,3,5,8] k")
        .replace("[2,3,5,8] v", "[N,3,5,8] v")
        .replace("[2,3,4,8] y", "[N,3,4,8] y"),
        opsets=(23,),
    )
    run_case(case, "float", 23)


def test_static_bodies_of_operators_without_rules_use_covered_operators() -> None:
    """Closure through expansion: where a static function body serves an operator without a
    rule, every operator of the body has a jvp and a batch rule (or expands in turn)."""
    from onnax.rules.catalog import function_body_opsets

    collect()
    missing = {}
    for op, opsets in function_body_opsets().items():
        for opset in opsets:
            if jvp_rules.lookup("", op, opset) is not None:
                continue
            found = static_body_operators(op, opset)
            if found is None:
                continue
            bad = {
                inner
                for inner in found[1]
                if inner != "Constant"
                and static_body_operators(inner, opset) is None
                and (
                    jvp_rules.lookup("", inner, opset) is None
                    or batch_rules.lookup("", inner, opset) is None
                )
            }
            if bad:
                missing[f"{op}@{opset}"] = sorted(bad)
    assert not missing, f"function bodies using operators without rules: {missing}"
