"""ScatterElements ScatterND and TensorScatter (rules in onnax.rules.scatter)."""

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap, run
from rules.test_gather import (
    axes_variants,
    check_vmap_examples,
    check_vmap_variants,
    examples_of,
    vmap_params,
    vmapped_feeds,
)

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


CASES = SCATTER_ELEMENTS + SCATTER_ND


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


# Second order (jvp of the vjp model): the operators the transposes emit (including the one-hot
# fallback before opset 16) must have rules themselves.
SECOND_ORDER = [
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


# ------------------------------------------------------------------------------------ vmap
# Batch rules of these families: a missing rule for any other operator (met in the derivative
# models below) skips, one for these fails.


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def _by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


# Per-example index sets (three examples each) for the cases below; the scatters with
# reduction none get unique targets per example.
PER_EXAMPLE_INDICES: list[tuple[str, tuple[int, ...], dict[str, list[np.ndarray]]]] = [
    (
        "scatter_elements_none",
        (11, 16),
        {
            "I": [
                _UNIQUE_ROWS,
                np.array([[1, 0, 2, 0], [2, 1, 0, 1]]),
                np.array([[-1, 1, 0, 2], [0, 2, 1, 1]]),
            ]
        },
    ),
    (
        "scatter_elements_add_repeated",
        (16,),
        {
            "I": [
                _REPEATED_ROWS,
                np.array([[2, 2, 2, 0], [1, 1, 0, 0], [0, 2, -1, 1]]),
                np.zeros((3, 4), np.int64),
            ]
        },
    ),
    (
        "scatter_nd_none_depth2",
        (11, 16),
        {
            "I": [
                np.array([[0, 3], [2, 0], [0, 1]]),
                np.array([[1, 1], [-1, 3], [0, 0]]),
                np.array([[2, 2], [1, 2], [0, 2]]),
            ]
        },
    ),
    (
        "scatter_nd_add_repeated",
        (16, 18),
        {"I": [np.array([[2], [0], [-1]]), np.array([[1], [1], [1]]), np.array([[0], [2], [0]])]},
    ),
    (
        "scatter_nd_max",
        (18,),
        {"I": [np.array([[2], [0], [2]]), np.array([[1], [1], [0]]), np.array([[0], [2], [1]])]},
    ),
]


@pytest.mark.parametrize(
    ("name", "opset"),
    [(n, o) for n, opsets, _ in PER_EXAMPLE_INDICES for o in opsets],
    ids=[f"{n}-{o}" for n, opsets, _ in PER_EXAMPLE_INDICES for o in opsets],
)
def test_vmap_per_example_indices(name: str, opset: int) -> None:
    """Batched indices that differ between examples (each example must read and write its own
    slice), with the data and updates batched or shared."""
    indices = next(i for n, _, i in PER_EXAMPLE_INDICES if n == name)
    case = _by_name(name)
    dtype = "double" if opset % 2 else "float"
    model, examples = examples_of(case, opset, dtype, indices)
    for in_axes in axes_variants(model, "I"):
        check_vmap_examples(model, [dict(ex) for ex in examples], in_axes)


@pytest.mark.parametrize(
    ("case", "opset"),
    [(c, o) for c in SCATTER_ELEMENTS + SCATTER_ND for o in sorted({c.opsets[0], c.opsets[-1]})],
    ids=case_id,
)
def test_vmap_shared_indices(case: Case, opset: int) -> None:
    """Scatters with shared indices and batched updates (the data batched or shared), as in the
    transposes of the gathers under jacrev."""
    model = case.model("double", opset)
    feeds = case.feeds(model)
    check_vmap(model, feeds, in_axes={"U": 0})
    check_vmap(model, feeds, in_axes={"D": 1, "U": -1})


# The derivative models of a few cases under vmap: all inputs batched, and only the tangents
# (jvp) or output seeds (vjp) batched with the primal shared, which is how jacfwd/jacrev batch
# them. Their transposes emit ScatterND/ScatterElements with reduction="add", the one-hot
# fallback (Equal/Range/Cast/MatMul) and layout operators.
DERIVED = [
    ("scatter_elements_none", 16),
    ("scatter_nd_add_repeated", 16),
    ("scatter_nd_none_depth2", 13),
]


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(("name", "opset"), DERIVED, ids=[f"{n}-{o}" for n, o in DERIVED])
def test_vmap_of_derivatives(name: str, opset: int, mode: str) -> None:
    case = _by_name(name)
    model = case.model("double", opset)
    derived = onnax.jvp(model, case.inputs) if mode == "jvp" else onnax.vjp(model, case.inputs)
    feeds = case.feeds(derived)
    n_primal = len(model.graph.inputs)
    n_inputs = len(derived.graph.inputs)
    check_vmap_variants(derived, feeds, 0, [None] * n_primal + [0] * (n_inputs - n_primal))


# Derivatives of vmapped models: the operators the batch rules emit (GatherND with batch_dims,
# ScatterND over index tuples led by the batch coordinate, Range/Expand/Concat...) must have
# jvp and transpose rules (closure), so that grad(vmap(f)) works.
OF_VMAP = [
    ("scatter_elements_none", 13, {"D": 0, "U": 1}),
    ("scatter_nd_add_repeated", 16, {"D": 0, "I": 0, "U": 0}),
    ("scatter_nd_none_depth2", 11, {"U": 0}),
]


@pytest.mark.parametrize(
    ("name", "opset", "in_axes"), OF_VMAP, ids=[f"{n}-{o}" for n, o, _ in OF_VMAP]
)
def test_derivatives_of_vmap(name: str, opset: int, in_axes: dict[str, int | None]) -> None:
    case = _by_name(name)
    vm = onnax.vmap(case.model("double", opset), in_axes=in_axes)
    feeds = vmapped_feeds(case, vm, in_axes)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


# TensorScatter (24): linear in (past_cache, update); linear and circular modes, default and
# explicit axis, with and without write indices.
TENSOR_SCATTER_CASES = [
    Case(
        "tensor_scatter_prefill",
        "g ({T}[2, 3, 5, 4] past, {T}[2, 3, 2, 4] update) => ({T}[2, 3, 5, 4] y) {\n"
        " y = TensorScatter(past, update) }",
        opsets=(24, 28),
    ),
    Case(
        "tensor_scatter_indices_axis1",
        "g ({T}[2, 5, 3] past, {T}[2, 2, 3] update, int64[2] idx) => ({T}[2, 5, 3] y) {\n"
        " y = TensorScatter<axis = 1>(past, update, idx) }",
        opsets=(24,),
        fixed={"idx": np.array([1, 3])},
    ),
    Case(
        "tensor_scatter_circular",
        "g ({T}[2, 4, 3] past, {T}[2, 3, 3] update, int64[2] idx) => ({T}[2, 4, 3] y) {\n"
        ' y = TensorScatter<axis = -2, mode = "circular">(past, update, idx) }',
        opsets=(24,),
        fixed={"idx": np.array([2, 3])},
    ),
    Case(
        "tensor_scatter_update_only",
        "g ({T}[2, 5, 3] past, {T}[2, 2, 3] update, int64[2] idx) => ({T}[2, 5, 3] y) {\n"
        " y = TensorScatter<axis = 1>(past, update, idx) }",
        opsets=(24,),
        fixed={"idx": np.array([0, 2])},
        inputs=["update"],
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TENSOR_SCATTER_CASES), ids=case_id)
def test_tensor_scatter(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("case", TENSOR_SCATTER_CASES[:3], ids=case_id)
def test_tensor_scatter_vmap(case: Case) -> None:
    model = case.model("float", 24)
    feeds = case.feeds(model)
    check_vmap(model, feeds, in_axes=(0, 0, None)[: len(model.graph.inputs)], out_axes=0)
    check_vmap(model, feeds, in_axes=(None, 1, 0)[: len(model.graph.inputs)], out_axes=1)
