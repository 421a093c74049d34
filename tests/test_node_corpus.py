"""ONNX backend node test cases through onnax.jvp, onnax.vjp and onnax.vmap: a fast sample.

Runs a fixed, deterministic sample of ``onnx.backend.test.case.node`` cases across the operator
families (arithmetic, elementwise math and activations, MatMul/Gemm, reductions, Softmax and
LogSoftmax, normalisations, shape and indexing ops, scans, ai.onnx.ml, piecewise-constant and
integer-valued operators), checked by the coverage driver's :func:`check_case`
(``tests/benchmarks/coverage.py``, the same code the full run uses): jvp against central finite
differences of the primal through onnxruntime (float64 when the model converts to double), vjp
by the adjoint identity against the jvp model and the same differences, vmap (every input
batched, and only the first float input batched) against a loop of single-example runs, all
generated models through ``onnx.checker`` (full check) and onnxruntime. No case may be
``failed`` or ``crashed``; ``refused`` is allowed only with a proper diagnostic (naming the
operator as ``domain::Op``, a reason and a remedy), so that a missing rule is visible but not an
error. The oracles themselves are tested by breaking rules on purpose (a scaled jvp, transpose or
batch rule, a broadcasting batch rule that forgets to align its operands). The full corpus runs
with ``uv run python tests/benchmarks/coverage.py --jobs 2`` (minutes).
"""

import importlib.util
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest


def _driver() -> ModuleType:
    """``tests/benchmarks/coverage.py``, loaded by path: ``coverage`` is also a common package."""
    name = "onnax_node_coverage"
    if name not in sys.modules:
        path = Path(__file__).parent / "benchmarks" / "coverage.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


driver = _driver()
TRANSFORMS, SCOPE, check_case = driver.TRANSFORMS, driver.SCOPE, driver.check_case

CASES = [
    # arithmetic, broadcasting
    "test_add",
    "test_add_bcast",
    "test_sub_bcast",
    "test_mul_bcast",
    "test_div_bcast",
    "test_neg",
    "test_pow_bcast_array",
    "test_pow_types_float32_int64",
    "test_max_two_inputs",
    "test_min_float64",
    # elementwise math and activations
    "test_exp",
    "test_log",
    "test_sqrt",
    "test_sin",
    "test_cos",
    "test_tanh",
    "test_sigmoid",
    "test_abs",
    "test_relu",
    "test_relu_expanded_ver18",
    "test_leakyrelu",
    "test_shrink_soft",  # onnxruntime's double Shrink computes in float32: float32 differences
    "test_elu_expanded_ver18",
    "test_clip",
    "test_clip_default_inbounds",
    "test_where_example",
    # linear algebra
    "test_matmul_2d",
    "test_matmul_3d",
    "test_matmul_4d_1d",
    "test_matmul_1d_3d",
    "test_matmul_bcast",
    "test_matmul_1d_1d",
    "test_gemm_all_attributes",
    "test_gemm_transposeA",
    "test_gemm_default_vector_bias",
    # reductions, softmax
    "test_reduce_sum_keepdims_random",
    "test_reduce_sum_do_not_keepdims_random",
    "test_reduce_sum_negative_axes_keepdims_random",
    "test_reduce_sum_empty_axes_input_noop",
    "test_reduce_mean_keepdims_random",
    "test_reduce_mean_do_not_keepdims_random",
    "test_reduce_max_keepdims_random",
    "test_softmax_axis_0",
    "test_softmax_default_axis",
    "test_softmax_axis_1_expanded",
    "test_logsoftmax_axis_1",
    "test_logsoftmax_example_1_expanded_ver18",
    # an expansion whose shapes inference loses (the reverse sweep's shadow shapes)
    "test_rms_normalization_3d_axis1_epsilon_expanded",
    # shape and indexing
    "test_transpose_default",
    "test_transpose_all_permutations_3",
    "test_reshape_negative_dim",
    "test_reshape_reordered_all_dims",
    "test_reshape_zero_and_negative_dim",
    "test_flatten_axis2",
    "test_squeeze_negative_axes",
    "test_unsqueeze_unsorted_axes",
    "test_concat_2d_axis_0",
    "test_concat_3d_axis_negative_1",
    "test_split_variable_parts_2d_opset13",
    "test_split_equal_parts_1d_opset18",
    "test_slice",
    "test_slice_neg_steps",
    "test_slice_default_axes",
    "test_gather_0",
    "test_gather_negative_indices",
    "test_gather_elements_1",
    "test_tile",
    "test_expand_dim_changed",
    "test_constant_pad",
    # normalisations (GroupNormalization: float64 differences need stash_type=DOUBLE; MVN's own
    # model fails onnx's full check, so its outputs get the structural check)
    "test_group_normalization_epsilon",
    "test_layer_normalization_2d_axis1",
    "test_mvn",
    "test_instancenorm_example",
    # scans and selections (CumProd with a run-time axis), TensorScatter, TopK
    "test_cumprod_2d_axis_1",
    "test_cumsum_1d_reverse_exclusive",
    "test_tensorscatter_circular",
    "test_top_k",
    # piecewise-constant and integer-valued results, ai.onnx.ml
    "test_bitcast_float32_to_int32",
    "test_ai_onnx_ml_binarizer",
    "test_ai_onnx_ml_tree_ensemble_single_tree",
    "test_ai_onnx_ml_array_feature_extractor",
    "test_melweightmatrix",
    "test_qlinearmatmul_2D_uint8_float32",
    "test_floor",
    "test_onehot_with_axis",
    # empty reductions: a zero tangent, not 0 * inf
    "test_reduce_l2_empty_set_expanded",
    "test_reduce_sum_empty_set",
    # convolution and pooling
    "test_conv_with_strides_padding",
    "test_maxpool_2d_pads",
    "test_averagepool_2d_strides",
    # sequences: outputs of ragged element shapes (no derivative path: jvp/vjp check validity),
    # vmap of SplitToSequence and of SequenceMap's body
    "test_split_to_sequence_2",
    "test_sequence_map_identity_1_sequence_1_tensor",
    # half precision: a cast to float16 (differentiated through), a float16 model against
    # float64 differences, and a float16 Attention that onnax expands (its primal rounds
    # differently from onnxruntime's fused kernel, within half tolerances);
    # refused with a proper diagnostic: training-mode dropout without a mask
    "test_cast_FLOAT_to_FLOAT16",
    "test_celu_float16",
    "test_attention_4d_fp16",
    "test_training_dropout",
]

NO_FLOAT_CASES = [
    "test_and_bcast4v3d",
    "test_bitshift_right_uint16",
    "test_equal_string_broadcast",
    "test_gathernd_example_int32_batch_dim1",
]
"""Cases without a floating-point graph input (bool, integer, string): vmap only."""

_OPERATOR = driver._OPERATOR


REFUSED = {
    "test_training_dropout": ("jvp", "vjp", "vmap"),
    # Batched quantization scales have no batched form.
    "test_qlinearmatmul_2D_uint8_float32": ("vmap",),
}
"""Sample cases that must be refused (by the transforms listed), with a proper diagnostic."""

MAY_REFUSE: dict[str, tuple[str, ...]] = {}
"""Sample cases that may be refused (by the transforms listed) while that limitation lasts."""


RUNTIME_CASES = [
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal",
    "test_resize_downsample_scales_linear_align_corners",
    "test_training_dropout",
]


@pytest.fixture(scope="module")
def testcases() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wanted = {*CASES, *NO_FLOAT_CASES, *RUNTIME_CASES}
        return {c.name: c for c in driver.collect_cases() if c.name in wanted}


@pytest.mark.parametrize("name", CASES)
def test_node_case(testcases: dict[str, Any], name: str) -> None:
    assert name in testcases, f"{name} is no longer an ONNX backend node test case"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        result = check_case(testcases[name])
    assert set(result) == {*TRANSFORMS, SCOPE}
    assert result[SCOPE] == ("in", ""), result[SCOPE]
    for transform in TRANSFORMS:
        status, detail = result[transform]
        if transform in REFUSED.get(name, ()):
            expected = {"refused"}
        elif transform in MAY_REFUSE.get(name, ()):
            expected = {"pass", "refused"}
        else:
            expected = {"pass"}
        assert status in expected, f"{name} [{transform}]: {status}: {detail}"
        if status == "refused":
            assert _OPERATOR.search(detail), detail


# The oracle itself: a rule that is off by 1 % must be caught, in jvp and in the transpose.


def _scaled(rule: Any, factor: float) -> Any:
    """The rule with its results scaled (test_sin is float32, hence the FLOAT scalar)."""

    def wrong(em: Any, node: Any, *args: Any) -> list[Any]:
        return [
            None if v is None else em.op("Mul", [v, em.scalar(factor, like=ir.DataType.FLOAT)])
            for v in rule(em, node, *args)
        ]

    return wrong


def test_oracle_catches_a_wrong_jvp_rule(
    testcases: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnax.core.registry import jvp_rules
    from onnax.rules import collect

    collect()
    key = ("", "Sin")
    monkeypatch.setitem(
        jvp_rules._rules, key, [(v, _scaled(r, 1.01)) for v, r in jvp_rules._rules[key]]
    )
    result = check_case(testcases["test_sin"])
    assert result["jvp"][0] == "failed", result
    # The jvp is wrong, so the vjp is judged by finite differences alone, element by element.
    assert result["vjp"][0] == "failed", result
    assert result["vjp"][1].startswith("adj x:"), result


def test_oracle_catches_a_wrong_transpose_rule(
    testcases: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnax.core.registry import transpose_rules
    from onnax.rules import collect

    collect()
    # Sin's tangent is Mul(t, Cos(x)): a wrong Mul transpose leaves jvp right and vjp wrong.
    key = ("", "Mul")
    monkeypatch.setitem(
        transpose_rules._rules, key, [(v, _scaled(r, 1.01)) for v, r in transpose_rules._rules[key]]
    )
    result = check_case(testcases["test_sin"])
    assert result["jvp"][0] == "pass", result
    assert result["vjp"][0] == "failed", result
    assert "adjoint identity vs the jvp model" in result["vjp"][1], result


# vmap's oracle (a loop of single-example runs): a batch rule that is off by 1e-4 relative, or
# that forgets to align a batched operand before broadcasting, must be caught.


def _batch_scaled(rule: Any, factor: float) -> Any:
    """The batch rule with its results scaled (test_sin is float32, hence the FLOAT scalar)."""

    def wrong(bx: Any, node: Any, args: Any, flags: Any) -> tuple[list[Any], list[bool]]:
        outs, out_flags = rule(bx, node, args, flags)
        scale = bx.scalar(factor, like=ir.DataType.FLOAT)
        return [None if v is None else bx.op("Mul", [v, scale]) for v in outs], out_flags

    return wrong


def _unaligned(bx: Any, node: Any, args: Any, flags: Any) -> tuple[list[Any], list[bool]]:
    """Add applied to the batched operands as they are: a batched rank-1 ``y`` of shape
    ``[B, 5]`` then lines up its batch axis with ``x``'s last-but-one axis."""
    return [bx.op(node.op_type, list(args))], [True]


def test_vmap_oracle_catches_a_wrong_batch_rule(
    testcases: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnax.core.registry import batch_rules
    from onnax.rules import collect

    collect()
    key = ("", "Sin")
    monkeypatch.setitem(
        batch_rules._rules,
        key,
        [(v, _batch_scaled(r, 1 + 1e-4)) for v, r in batch_rules._rules[key]],
    )
    result = check_case(testcases["test_sin"])
    # jvp and vjp use no batch rule.
    assert result["jvp"][0] == result["vjp"][0] == "pass", result
    status, detail = result["vmap"]
    assert status == "failed", result
    assert detail.startswith("in_axes=0: y: max |batched - loop|"), detail


def test_vmap_oracle_catches_a_batch_rule_that_does_not_align(
    testcases: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from onnax.core.registry import batch_rules
    from onnax.rules import collect

    collect()
    key = ("", "Add")
    monkeypatch.setitem(
        batch_rules._rules, key, [(v, _unaligned) for v, _ in batch_rules._rules[key]]
    )
    # x [3, 4, 5] + y [5]: batching both gives [B, 3, 4, 5] + [B, 5], which cannot broadcast
    # (B = 3 against 4); with only x batched the rule is right, and so the other variant passes.
    result = check_case(testcases["test_add_bcast"], transforms=("vmap",))
    assert set(result) == {"vmap", SCOPE}
    status, detail = result["vmap"]
    assert status == "failed", result
    assert detail.startswith("in_axes=0: "), detail


def test_vmap_covers_cases_without_float_inputs(testcases: dict[str, Any]) -> None:
    # Integer and bool models are out of the jvp/vjp scope but in vmap's.
    for name in NO_FLOAT_CASES:
        result = check_case(testcases[name])
        assert result["jvp"] == result["vjp"] == ("skipped", "no FLOAT/DOUBLE graph input"), result
        assert result[SCOPE] == ("out", "no FLOAT/DOUBLE graph input"), result
        assert result["vmap"][0] == "pass", (name, result)


def test_vmap_refusal_of_batched_axes_is_not_a_failure(testcases: dict[str, Any]) -> None:
    # Batching every input batches ReduceSum's axes, which vmap refuses (each example could
    # reduce other axes); with only the data batched the rule is checked, and the case passes.
    status, detail = check_case(testcases["test_reduce_sum_keepdims_random"], transforms=["vmap"])[
        "vmap"
    ]
    assert status == "pass", detail
    assert detail.startswith("in_axes=0: refused UnsupportedOperatorError"), detail
    assert "ai.onnx::ReduceSum" in detail, detail


# The driver's own rules: what a proper refusal is, the double conversion, the scope.


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        (
            "jvp: no derivative rule for ai.onnx::Foo at opset 18 (node 'n'); the derivative "
            "reaches it through input 0 'x'. Remedy: leave 'x' out of `inputs`.",
            "names no operator as domain::Op",  # Foo is no ONNX operator
        ),
        ("vmap: the rank of input 'x' is unknown; give the model a typed input", "names no"),
        (
            "vmap: ai.onnx::Dropout at opset 22 (node 'd') may draw a random mask inside the "
            "mapped function. Choose how: randomness='same'.",
            "gives no remedy",
        ),
        ("ai.onnx::Cast. Remedy: none.", "gives no reason"),
        (
            "jvp: ai.onnx::Dropout at opset 22 (node 'd') runs in training mode and draws a "
            "random mask. Remedy: export the model for inference.",
            None,
        ),
        (
            "jvp: no derivative rule for ai.onnx.ml::LabelEncoder at opset 4 (the node producing "
            "'y'); the derivative reaches it through input 0 'x'. Remedy: register a rule.",
            None,
        ),
    ],
)
def test_refusal_wording(message: str, problem: str | None) -> None:
    got = driver.refusal_problem(message)
    if problem is None:
        assert got is None, got
    else:
        assert got is not None and got.startswith(problem), got


def test_to_double_computes_group_normalization_in_double() -> None:
    model = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 21]>\n'
        "g (float[2, 4, 3] x, float[4] s, float[4] b) => (float[2, 4, 3] y) {\n"
        " y = GroupNormalization<num_groups = 2, epsilon = 0.01>(x, s, b) }"
    )
    double = driver.to_double(model)
    (node,) = double.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["stash_type"] == onnx.TensorProto.DOUBLE
    assert double.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    # Finite differences of the double model agree with themselves at two step sizes, which
    # float32 normalisation (the default stash_type) does not allow at eps = 1e-6.
    sess = driver._session(double)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4, 3)), "s": rng.standard_normal(4), "b": np.zeros(4)}
    v = rng.standard_normal((2, 4, 3))

    def fd(h: float) -> np.ndarray:
        plus = driver._run(sess, {**feeds, "x": feeds["x"] + h * v})["y"]
        minus = driver._run(sess, {**feeds, "x": feeds["x"] - h * v})["y"]
        return (plus - minus) / (2 * h)

    np.testing.assert_allclose(fd(1e-6), fd(1e-4), atol=1e-6)


def test_operator_domains_pinned_by_the_kernel_are_left_out(testcases: dict[str, Any]) -> None:
    # onnxruntime's 4-D linear Resize accepts scales of exactly 1 on the batch and channel axes
    # only: no step of those elements runs, so the differences leave them out (and the scales
    # of the spatial axes are still checked).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (case,) = driver.collect_cases("test_resize_downsample_scales_linear_align_corners")
        result = check_case(case, transforms=("jvp", "vjp"))
    assert result["jvp"][0] == result["vjp"][0] == "pass", result


def test_scope_excludes_cases_onnxruntime_cannot_run() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (case,) = driver.collect_cases("test_bernoulli_double_expanded")
        result = check_case(case)
    assert result[SCOPE][0] == "out" and "onnxruntime cannot run" in result[SCOPE][1], result
    assert all(result[t][0] == "skipped" for t in TRANSFORMS), result


def _primal_runtime_of(testcases: dict[str, Any], name: str) -> Any:
    case = testcases[name]
    names, _, _ = driver._float_inputs(case.model)
    inits = {t.name for t in case.model.graph.initializer}
    inputs = [n for n in names if n not in inits]
    feeds = {n: driver._to_feed(v) for n, v in zip(inputs, case.data_sets[0][0], strict=False)}
    first = driver._run(driver._session(case.model), feeds)
    return driver._primal_runtime(case, case.model, feeds, first)


def test_oracles_use_the_reference_only_where_onnxruntime_drops_an_infinity(
    testcases: dict[str, Any],
) -> None:
    # onnxruntime's fused Attention writes the lowest float where the specification writes -inf.
    causal = "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal"
    assert _primal_runtime_of(testcases, causal) is driver._ReferenceSession
    # Kernels that merely compute other numbers than the test data stay the judge: a generated
    # model runs the same kernel.
    for name in ("test_resize_downsample_scales_linear_align_corners", "test_training_dropout"):
        assert _primal_runtime_of(testcases, name) is driver._session, name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_case(testcases[causal])
    for t in ("jvp", "vjp"):
        assert result[t] == ("pass", "f64 fd through onnx.reference"), result


def test_summary_counts_the_scope_only() -> None:
    results = {
        "a": {"jvp": ("pass", ""), "vjp": ("pass", ""), "vmap": ("pass", ""), SCOPE: ("in", "")},
        "b": {
            "jvp": (
                "refused",
                "UnsupportedOperatorError: jvp: ai.onnx::Cast at opset 18 (node "
                "'c') casts to FLOAT16. Remedy: cast later.",
            ),
            "vjp": ("pass", ""),
            "vmap": ("pass", ""),
            SCOPE: ("in", ""),
        },
        "c": {
            "jvp": ("skipped", "no FLOAT/DOUBLE graph input"),
            "vjp": ("skipped", "no FLOAT/DOUBLE graph input"),
            "vmap": ("pass", ""),
            SCOPE: ("out", "no FLOAT/DOUBLE graph input"),
        },
    }
    text = driver.summarize(results)
    assert "2 cases in scope (of 3)" in text
    rows = [line.split() for line in text.splitlines()]
    lines = {row[0]: row for row in rows if row and row[0] in TRANSFORMS}
    assert lines["jvp"][1:] == ["1", "1", "0", "0", "50.0%"], lines
    assert lines["vjp"][1:] == ["2", "0", "0", "0", "100.0%"], lines
    assert "ai.onnx::Cast: 1" in text


def test_tie_labels_group_equal_values_and_equal_slices() -> None:
    x = np.array([2.0, 1.0, 2.0, 3.0, 1.0])
    labels = driver.tie_labels(x, None)
    assert labels[0] == labels[2] and labels[1] == labels[4]
    assert len(set(labels.tolist())) == 3
    rows = np.array([[1.0, 0.0], [1.0, 0.0], [2.0, 0.0]])
    by_row = driver.tie_labels(rows, 0)
    # Equal rows share labels position by position; positions within a row never do.
    assert (by_row[0] == by_row[1]).all() and by_row[0, 0] != by_row[0, 1]
    assert len(np.unique(by_row)) == 4
    np.testing.assert_array_equal(driver.tie_labels(rows.T, -1), by_row.T)


@pytest.mark.parametrize(
    "name", ["test_unique_sorted_with_axis", "test_unique_sorted_without_axis"]
)
def test_unique_is_checked_along_tie_preserving_directions(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The corpus inputs hold ties: random steps change Unique's output size. Steps constant on
    # tie groups keep it, so the check passes, and still catches a rule that is 1 % off.
    from onnax.core.registry import jvp_rules
    from onnax.rules import collect

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (case,) = [c for c in driver.collect_cases(name) if c.name == name]
        result = check_case(case, transforms=("jvp", "vjp"))
        assert result["jvp"][0] == result["vjp"][0] == "pass", result
        collect()
        key = ("", "Unique")
        monkeypatch.setitem(
            jvp_rules._rules, key, [(v, _scaled(r, 1.01)) for v, r in jvp_rules._rules[key]]
        )
        wrong = check_case(case, transforms=("jvp", "vjp"))
    assert wrong["jvp"][0] == wrong["vjp"][0] == "failed", wrong


def test_antialiased_scales_are_checked_off_the_kink() -> None:
    name = "test_resize_downsample_scales_linear_antialias"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (case,) = [c for c in driver.collect_cases(name) if c.name == name]
        x, scales = (np.asarray(a) for a in case.data_sets[0][0])
        sess = driver._session(case.model)

        def one_sided(s: np.ndarray, h: float) -> np.ndarray:
            step = np.array([0, 0, h, 0], np.float32)
            at = driver._run(sess, {"X": x, "scales": s})["Y"].astype(np.float64)
            moved = driver._run(sess, {"X": x, "scales": s + step})["Y"].astype(np.float64)
            return (moved - at) / h

        # At the data the scale derivative has a kink (one-sided slopes differ by far more
        # than float32 noise and curvature); 0.5 % higher it has none.
        assert np.abs(one_sided(scales, 1e-3) - one_sided(scales, -1e-3)).max() > 1.0
        off = driver._off_antialias_kink({"scales": scales}, ["scales"])["scales"]
        np.testing.assert_allclose(one_sided(off, 1e-3), one_sided(off, -1e-3), atol=0.2)
        result = check_case(case, transforms=("jvp", "vjp"))
    assert result["jvp"][0] == result["vjp"][0] == "pass", result
    assert "off the antialiasing kink" in result["jvp"][1], result


# The contract: a transform that changes its source, or gives other bytes on a second run or
# on a reloaded source, fails the case whatever its numbers.


def test_driver_fails_a_transform_that_changes_its_source(
    testcases: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = driver.onnax.jvp

    def mutating(model: ir.Model, *args: Any, **kwargs: Any) -> ir.Model:
        model.graph.doc_string = "touched"
        return real(model, *args, **kwargs)

    monkeypatch.setattr(driver.onnax, "jvp", mutating)
    result = check_case(testcases["test_sin"], transforms=("jvp",))
    assert result["jvp"] == ("failed", driver.MUTATED), result


def test_driver_fails_a_nondeterministic_transform(
    testcases: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = driver.onnax.vjp
    calls = iter(range(100))

    def counting(model: ir.Model, *args: Any, **kwargs: Any) -> ir.Model:
        result = real(model, *args, **kwargs)
        result.graph.doc_string = f"run {next(calls)}"
        return result

    monkeypatch.setattr(driver.onnax, "vjp", counting)
    result = check_case(testcases["test_sin"], transforms=("jvp", "vjp"))
    assert result["vjp"] == ("failed", driver.NONDETERMINISTIC), result
    assert result["jvp"][0] == "pass", result


def test_summary_counts_contract_failures() -> None:
    results = {
        "a": {"jvp": ("failed", driver.MUTATED), SCOPE: ("in", "")},
        "b": {"jvp": ("failed", driver.NONDETERMINISTIC), SCOPE: ("in", "")},
        "c": {"jvp": ("pass", ""), SCOPE: ("in", "")},
    }
    assert "mutated source 1, nondeterministic result 1" in driver.summarize(results)
