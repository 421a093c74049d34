"""ONNX backend node test cases of the core operators, through onnax.jvp, onnax.vjp and onnax.vmap.

Covers a fixed, deterministic sample of ``onnx.backend.test.case.node`` cases for the core
operators (arithmetic, elementwise math and activations, MatMul/Gemm, reductions, Softmax and
LogSoftmax, shape and indexing ops, Expand, Pad, Where, Clip, Pow, Max/Min), checked by
``tests/benchmarks/node_corpus.py``'s :func:`check_case`: jvp against central finite
differences of the primal through onnxruntime (float64 when the model converts to double), vjp
by the adjoint identity against the jvp model and the same differences, vmap (every input
batched, and only the first float input batched) against a loop of single-example runs, all
generated models through ``onnx.checker`` (full check) and onnxruntime. No case may be
``failed`` or ``crashed``; ``refused`` is allowed only with a message naming the operator
(``domain::Op``), so that a missing rule is visible but not an error. The oracles themselves
are tested by breaking rules on purpose (a scaled jvp, transpose or batch rule, a broadcasting
batch rule that forgets to align its operands). The full corpus runs with
``uv run python tests/benchmarks/node_corpus.py``.
"""

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import onnx_ir as ir
import pytest

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))

from node_corpus import TRANSFORMS, check_case, collect_cases

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
]

NO_FLOAT_CASES = [
    "test_and_bcast4v3d",
    "test_bitshift_right_uint16",
    "test_equal_string_broadcast",
    "test_gathernd_example_int32_batch_dim1",
    "test_celu_float16",
]
"""Cases without a FLOAT/DOUBLE graph input (bool, integer, string, float16): vmap only."""

_OPERATOR = re.compile(r"[\w.]+::\w+")


@pytest.fixture(scope="module")
def testcases() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wanted = {*CASES, *NO_FLOAT_CASES}
        return {c.name: c for c in collect_cases() if c.name in wanted}


@pytest.mark.parametrize("name", CASES)
def test_node_case(testcases: dict[str, Any], name: str) -> None:
    assert name in testcases, f"{name} is no longer an ONNX backend node test case"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_case(testcases[name])
    assert set(result) == set(TRANSFORMS)
    for transform, (status, detail) in result.items():
        assert status in ("pass", "refused"), f"{name} [{transform}]: {status}: {detail}"
        if status == "refused":
            assert _OPERATOR.search(detail), (
                f"{name} [{transform}] refused without naming the operator: {detail}"
            )


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
    assert set(result) == {"vmap"}
    status, detail = result["vmap"]
    assert status == "failed", result
    assert detail.startswith("in_axes=0: "), detail


def test_vmap_covers_cases_without_float_inputs(testcases: dict[str, Any]) -> None:
    # Integer and bool models are out of the jvp/vjp scope but in vmap's.
    for name in NO_FLOAT_CASES:
        result = check_case(testcases[name])
        assert result["jvp"] == result["vjp"] == ("skipped", "no FLOAT/DOUBLE graph input"), result
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
