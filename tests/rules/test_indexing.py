import re

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, run

# Opsets around the schema changes: 11 (negative indices), 12 (GatherND batch_dims), 13, 15 (last
# opset without scatter reduction: the one-hot fallback of the gather transposes), 16 (reduction
# add/mul), 18 (max/min), 21.
ALL = (11, 13, 15, 16, 18, 21)
REDUCE = (16, 18, 21)


def spaced(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Distinct values on a 0.25 grid offset by 0.1: no ties within or across inputs filled with
    different offsets, so max/min have a unique winner far from finite-difference steps."""
    n = int(np.prod(shape)) if shape else 1
    return (rng.permutation(n).reshape(shape) * 0.5 + 0.1 - n * 0.25).astype(dtype)


def spaced_odd(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return (spaced(rng, shape, dtype).astype(np.float64) + 0.25).astype(dtype)


GATHER = [
    Case(
        "gather_axis0_repeats_negative",
        "g ({T}[N, 4] D, int64[2, 3] I) => ({T}[2, 3, 4] Y) { Y = Gather<axis=0>(D, I) }",
        opsets=ALL,
        fixed={"I": np.array([[0, 2, -1], [1, 1, 0]])},
    ),
    Case(
        "gather_axis1_repeats",
        "g ({T}[N, 5, 3] D, int64[4] I) => ({T}[N, 4, 3] Y) { Y = Gather<axis=1>(D, I) }",
        opsets=ALL,
        fixed={"I": np.array([4, -1, 0, 2])},
    ),
    Case(
        "gather_axis_neg1_2d_indices",
        "g ({T}[N, 2, 4] D, int64[2, 2] I) => ({T}[N, 2, 2, 2] Y) { Y = Gather<axis=-1>(D, I) }",
        opsets=ALL,
        fixed={"I": np.array([[3, -1], [0, 0]])},
    ),
    Case(
        "gather_scalar_index_axis1",
        "g ({T}[N, 4] D, int64 I) => ({T}[N] Y) { Y = Gather<axis=1>(D, I) }",
        opsets=ALL,
        fixed={"I": np.array(-2)},
    ),
    Case(
        "gather_scalar_index_axis0",
        "g ({T}[5, N] D, int64 I) => ({T}[N] Y) { Y = Gather<axis=0>(D, I) }",
        opsets=(11, 15, 16),
        fixed={"I": np.array(3)},
    ),
    Case(
        "gather_rank1_scalar_index",
        # The rank-0 gather result is multiplied by a vector so that the model has no rank-0
        # output: the vjp pass drops the shape of rank-0 seeds (`if y.shape` is False for []),
        # which onnx.checker(full_check=True) rejects. That is a core issue, not this rule's.
        "g ({T}[N] D, int64 I, {T}[2] C) => ({T}[2] Y) { S = Gather<axis=0>(D, I)\n Y = Mul(S, C) }",
        opsets=(11, 15, 16),
        fixed={"I": np.array(-1)},
    ),
    Case(
        "gather_rank1_int32",
        "g ({T}[N] D, int32[5] I) => ({T}[5] Y) { Y = Gather(D, I) }",
        opsets=(11, 15, 16, 21),
        fixed={"I": np.array([0, 2, 2, -3, 1], dtype=np.int32)},
    ),
    Case(
        # Constant indices (all non-negative): the normalisation is skipped.
        "gather_constant_indices",
        "g ({T}[N, 3] D) => ({T}[N, 3] Y) {\n"
        " I = Constant<value = int64[3] {2, 0, 2}>()\n Y = Gather<axis=1>(D, I) }",
        opsets=(13, 16),
    ),
]

GATHER_ELEMENTS = [
    Case(
        "gather_elements_axis0",
        "g ({T}[3, N] D, int64[4, N] I) => ({T}[4, N] Y) { Y = GatherElements<axis=0>(D, I) }",
        opsets=ALL,
        fixed={"I": np.array([[0, 1, -1], [0, 2, 2], [-3, 1, 0], [2, 2, 1]])},
    ),
    Case(
        "gather_elements_axis_neg1",
        "g ({T}[N, 4] D, int64[N, 6] I) => ({T}[N, 6] Y) { Y = GatherElements<axis=-1>(D, I) }",
        opsets=ALL,
        fixed={"I": np.array([[0, 3, 3, -1, 1, 0], [2, 2, 2, 1, 0, -4], [1, 0, 3, 2, 1, 1]])},
    ),
    Case(
        "gather_elements_3d_axis1",
        "g ({T}[2, 3, N] D, int64[2, 5, N] I) => ({T}[2, 5, N] Y) { Y = GatherElements<axis=1>(D, I) }",
        opsets=(11, 15, 16, 21),
        fixed={"I": np.random.default_rng(5).integers(-3, 3, (2, 5, 3))},
    ),
    Case(
        # Indices smaller than data on the other axis (allowed by GatherElements).
        "gather_elements_smaller_indices",
        "g ({T}[4, 5] D, int64[2, 3] I) => ({T}[2, 3] Y) { Y = GatherElements<axis=1>(D, I) }",
        opsets=(11, 15, 16),
        fixed={"I": np.array([[4, 4, 0], [-1, 1, 2]])},
    ),
]

GATHER_ELEMENTS.append(
    Case(
        # Different symbols on the non-gathered axis: not provably equal, padded at run time.
        "gather_elements_symbolic_smaller_indices",
        "g ({T}[N, 4] D, int64[M, 4] I) => ({T}[M, 4] Y) { Y = GatherElements<axis=1>(D, I) }",
        opsets=(13, 16),
        fixed={"I": np.array([[3, 3, -4, 1], [0, 2, 2, 2]])},
        dims={"N": 3, "M": 2},
    )
)

GATHER_ND = [
    Case(
        "gather_nd_depth2",
        "g ({T}[N, 4, 3] D, int64[3, 2] I) => ({T}[3, 3] Y) { Y = GatherND(D, I) }",
        opsets=ALL,
        fixed={"I": np.array([[0, 1], [0, 1], [2, -1]])},
    ),
    Case(
        "gather_nd_depth1_2d_batch_of_indices",
        "g ({T}[N, 4] D, int64[2, 2, 1] I) => ({T}[2, 2, 4] Y) { Y = GatherND(D, I) }",
        opsets=(11, 15, 16, 21),
        fixed={"I": np.array([[[0], [2]], [[-1], [0]]])},
    ),
    Case(
        "gather_nd_full_depth",
        "g ({T}[N, 4] D, int64[4, 2] I) => ({T}[4] Y) { Y = GatherND(D, I) }",
        opsets=(11, 15, 16),
        fixed={"I": np.array([[0, 3], [2, -1], [0, 3], [-3, 0]])},
    ),
    Case(
        "gather_nd_batch1",
        "g ({T}[N, 4, 3] D, int64[N, 2, 1] I) => ({T}[N, 2, 3] Y) { Y = GatherND<batch_dims=1>(D, I) }",
        opsets=(12, 13, 15, 16, 18, 21),
        fixed={"I": np.array([[[0], [3]], [[-1], [-1]], [[2], [1]]])},
    ),
    Case(
        "gather_nd_batch1_depth2",
        "g ({T}[N, 4, 3, 2] D, int64[N, 5, 2] I) => ({T}[N, 5, 2] Y) { Y = GatherND<batch_dims=1>(D, I) }",
        opsets=(12, 15, 16, 21),
        fixed={
            "I": np.stack(
                [
                    np.random.default_rng(7).integers(-4, 4, (3, 5)),
                    np.random.default_rng(8).integers(-3, 3, (3, 5)),
                ],
                axis=-1,
            )
        },
    ),
    Case(
        "gather_nd_batch2",
        "g ({T}[2, N, 4] D, int64[2, N, 1] I) => ({T}[2, N] Y) { Y = GatherND<batch_dims=2>(D, I) }",
        opsets=(12, 15, 16),
        fixed={"I": np.array([[[0], [3], [-1]], [[1], [1], [2]]])},
    ),
]

_UNIQUE_ROWS = np.array([[0, 2, 1, -1], [1, 0, -1, 0]])  # per column: distinct rows of N=3
_REPEATED_ROWS = np.array([[0, 2, 1, -1], [0, -1, 1, 2], [1, 2, 1, 0]])

SCATTER_ELEMENTS = [
    Case(
        "scatter_elements_none",
        "g ({T}[N, 4] D, int64[2, 4] I, {T}[2, 4] U) => ({T}[N, 4] Y) { Y = ScatterElements<axis=0>(D, I, U) }",
        opsets=ALL,
        fixed={"I": _UNIQUE_ROWS},
    ),
    Case(
        "scatter_elements_none_axis1_updates_only",
        "g ({T}[N, 5] D, int64[N, 2] I, {T}[N, 2] U) => ({T}[N, 5] Y) { Y = ScatterElements<axis=-1>(D, I, U) }",
        opsets=(11, 16, 21),
        fixed={"I": np.array([[4, 0], [-1, 2], [1, 3]])},
        inputs=["U"],
    ),
    Case(
        "scatter_elements_none_data_only",
        "g ({T}[N, 4] D, int64[2, 4] I, {T}[2, 4] U) => ({T}[N, 4] Y) { Y = ScatterElements<axis=0>(D, I, U) }",
        opsets=(13, 18),
        fixed={"I": _UNIQUE_ROWS},
        inputs=["D"],
    ),
    Case(
        "scatter_elements_add_repeated",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="add">(D, I, U) }',
        opsets=REDUCE,
        fixed={"I": _REPEATED_ROWS},
    ),
    Case(
        "scatter_elements_add_updates_only",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="add">(D, I, U) }',
        opsets=(16,),
        fixed={"I": _REPEATED_ROWS},
        inputs=["U"],
    ),
    Case(
        # Repeated indices and zeros among the updates: exercises the zero-count coefficient.
        "scatter_elements_mul_with_zeros",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="mul">(D, I, U) }',
        opsets=(16, 18),
        fixed={
            "I": _REPEATED_ROWS,
            "U": np.array([[0.0, 1.5, -0.7, 0.0], [0.0, -1.2, 0.9, 1.1], [0.8, 0.0, 1.3, -0.6]]),
        },
    ),
    Case(
        "scatter_elements_mul_nonzero",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="mul">(D, I, U) }',
        opsets=(16,),
        fixed={"I": _REPEATED_ROWS},
    ),
    Case(
        "scatter_elements_mul_data_only",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="mul">(D, I, U) }',
        opsets=(18,),
        fixed={"I": _REPEATED_ROWS},
        inputs=["D"],
    ),
    Case(
        "scatter_elements_max",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="max">(D, I, U) }',
        opsets=(18, 21),
        fixed={"I": _REPEATED_ROWS},
        fill={"D": spaced, "U": spaced_odd},
    ),
    Case(
        "scatter_elements_min",
        "g ({T}[N, 4] D, int64[3, 4] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterElements<axis=0, reduction="min">(D, I, U) }',
        opsets=(18,),
        fixed={"I": _REPEATED_ROWS},
        fill={"D": spaced, "U": spaced_odd},
    ),
]

SCATTER_ND = [
    Case(
        "scatter_nd_none",
        "g ({T}[N, 4] D, int64[2, 1] I, {T}[2, 4] U) => ({T}[N, 4] Y) { Y = ScatterND(D, I, U) }",
        opsets=ALL,
        fixed={"I": np.array([[2], [-3]])},
    ),
    Case(
        "scatter_nd_none_depth2",
        "g ({T}[N, 4, 2] D, int64[3, 2] I, {T}[3, 2] U) => ({T}[N, 4, 2] Y) { Y = ScatterND(D, I, U) }",
        opsets=(11, 13, 16, 21),
        fixed={"I": np.array([[0, 3], [2, 0], [0, 1]])},
    ),
    Case(
        "scatter_nd_none_updates_only",
        "g ({T}[N, 4] D, int64[2, 1] I, {T}[2, 4] U) => ({T}[N, 4] Y) { Y = ScatterND(D, I, U) }",
        opsets=(11, 18),
        fixed={"I": np.array([[1], [0]])},
        inputs=["U"],
    ),
    Case(
        "scatter_nd_add_repeated",
        "g ({T}[N, 4] D, int64[3, 1] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterND<reduction="add">(D, I, U) }',
        opsets=REDUCE,
        fixed={"I": np.array([[2], [0], [-1]])},
    ),
    Case(
        "scatter_nd_add_depth2_repeated",
        "g ({T}[N, 4, 2] D, int64[2, 2, 2] I, {T}[2, 2, 2] U) => ({T}[N, 4, 2] Y) {\n"
        ' Y = ScatterND<reduction="add">(D, I, U) }',
        opsets=(16, 21),
        fixed={"I": np.array([[[0, 3], [0, 3]], [[1, -1], [0, 3]]])},
    ),
    Case(
        "scatter_nd_mul_with_zeros",
        "g ({T}[N, 2] D, int64[4, 1] I, {T}[4, 2] U) => ({T}[N, 2] Y) {\n"
        ' Y = ScatterND<reduction="mul">(D, I, U) }',
        opsets=(16, 18),
        fixed={
            "I": np.array([[0], [2], [0], [0]]),
            "U": np.array([[0.0, 1.5], [0.0, -1.2], [0.7, 0.0], [-0.9, 1.1]]),
        },
    ),
    Case(
        "scatter_nd_max",
        "g ({T}[N, 4] D, int64[3, 1] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterND<reduction="max">(D, I, U) }',
        opsets=(18, 21),
        fixed={"I": np.array([[2], [0], [2]])},
        fill={"D": spaced, "U": spaced_odd},
    ),
    Case(
        "scatter_nd_min",
        "g ({T}[N, 4] D, int64[3, 1] I, {T}[3, 4] U) => ({T}[N, 4] Y) {\n"
        ' Y = ScatterND<reduction="min">(D, I, U) }',
        opsets=(18,),
        fixed={"I": np.array([[2], [0], [2]])},
        fill={"D": spaced, "U": spaced_odd},
    ),
]

CASES = GATHER + GATHER_ELEMENTS + GATHER_ND + SCATTER_ELEMENTS + SCATTER_ND


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


# Second order (jvp of the vjp model): the operators the transposes emit (including the one-hot
# fallback before opset 16) must have rules themselves.
SECOND_ORDER = [
    ("gather_axis1_repeats", 13),
    ("gather_axis1_repeats", 16),
    ("gather_scalar_index_axis1", 11),
    ("gather_elements_smaller_indices", 11),
    ("gather_elements_axis0", 16),
    ("gather_nd_batch1", 13),
    ("gather_nd_batch1", 16),
    ("scatter_elements_none", 11),
    ("scatter_nd_add_repeated", 16),
    ("scatter_elements_mul_nonzero", 16),
    ("scatter_nd_max", 18),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER, ids=[f"{n}-{o}" for n, o in SECOND_ORDER])
def test_second_order(name: str, opset: int) -> None:
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vjp(case.model("double", opset), case.inputs)
    check_jvp(vm, case.feeds(vm))


def test_max_tie_shares_derivative() -> None:
    """At a tie between data and an update, each gets half of the derivative (JAX convention)."""
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2] D, int64[1, 1] I, float[1] U) => (float[2] Y) {\n"
        ' Y = ScatterND<reduction="max">(D, I, U) }'
    )
    vm = onnax.vjp(model)
    out = run(
        vm,
        {
            "D": np.array([1.0, 2.0], np.float32),
            "I": np.array([[0]]),
            "U": np.array([1.0], np.float32),
            vm.graph.inputs[3].name: np.array([1.0, 1.0], np.float32),
        },
    )
    grads = [out[o.name] for o in list(vm.graph.outputs)[1:]]
    np.testing.assert_allclose(grads[0], [0.5, 1.0])
    np.testing.assert_allclose(grads[1], [0.5])


def test_gather_nd_symbolic_depth_is_refused() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        "g (float[3, 4] D, int64[2, K] I) => (float[2] Y) { Y = GatherND(D, I) }"
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vjp(model, ["D"])
    msg = str(err.value)
    assert "ai.onnx::GatherND" in msg
    assert re.search(r"node '[^']+'", msg)
    assert "'I'" in msg
    assert "last dimension of 'indices'" in msg
    assert "Remedy" in msg


def test_unknown_scatter_reduction_is_refused() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[3, 4] D, int64[2, 1] I, float[2, 4] U) => (float[3, 4] Y) {\n"
        ' Y = ScatterND<reduction="xor">(D, I, U) }'
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model)
    msg = str(err.value)
    assert "ai.onnx::ScatterND" in msg
    assert "reduction='xor'" in msg
    assert "Remedy" in msg
