"""Gather GatherElements GatherND and ArrayFeatureExtractor (rules in onnax.rules.gather)."""

import re

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_jvp, check_model_valid, check_vjp, check_vmap, run

# Opsets around the schema changes: 11 (negative indices), 12 (GatherND batch_dims), 13, 15 (last
# opset without scatter reduction: the one-hot fallback of the gather transposes), 16 (reduction
# add/mul), 18 (max/min), 21.
ALL = (11, 13, 15, 16, 18, 21)


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


CASES = GATHER + GATHER_ELEMENTS + GATHER_ND


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
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER, ids=[f"{n}-{o}" for n, o in SECOND_ORDER])
def test_second_order(name: str, opset: int) -> None:
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vjp(case.model("double", opset), case.inputs)
    check_jvp(vm, case.feeds(vm))


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


# ------------------------------------------------------------------------------------ vmap
# Batch rules of these families: a missing rule for any other operator (met in the derivative
# models below) skips, one for these fails.


def vmap_params(cases: list[Case]) -> list[tuple[Case, str, int]]:
    """Every case at every opset, alternating float and double between opsets (both dtypes
    when a case has a single opset): the batch rules do not depend on the element type, and
    running every (dtype, opset) pair would double the time for nothing."""
    params = []
    for c in cases:
        if len(c.opsets) == 1:
            params += [(c, d, c.opsets[0]) for d in c.dtypes]
        else:
            params += [(c, c.dtypes[i % len(c.dtypes)], o) for i, o in enumerate(c.opsets)]
    return params


def check_vmap_examples(
    model: ir.Model,
    examples: list[dict[str, np.ndarray]],
    in_axes: dict[str, int | None],
    out_axes: int = 0,
) -> None:
    """vmap(model) on explicit per-example feeds against a loop of single runs, stacked.

    Unlike ``oracles.check_vmap`` (which batches integer inputs as identical copies), each
    example brings its own values of every batched input; shared inputs (in_axes None or
    absent) are taken from the first example for all.
    """
    vm = onnax.vmap(model, in_axes=in_axes, out_axes=out_axes)
    check_model_valid(vm)
    feeds: dict[str, np.ndarray] = {}
    for v in model.graph.inputs:
        axis = in_axes.get(v.name)
        if axis is None:
            feeds[v.name] = np.asarray(examples[0][v.name])
            for ex in examples:
                ex[v.name] = feeds[v.name]
        else:
            feeds[v.name] = np.stack([np.asarray(ex[v.name]) for ex in examples], axis=axis)
    singles = [run(model, ex) for ex in examples]
    got = run(vm, feeds)
    for y in model.graph.outputs:
        want = np.stack([s[y.name] for s in singles], axis=out_axes)
        assert got[y.name].shape == want.shape, (y.name, got[y.name].shape, want.shape)
        tol = 1e-10 if want.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(got[y.name], want, rtol=tol, atol=tol, err_msg=y.name)


def check_vmap_variants(
    model: ir.Model,
    feeds: dict[str, np.ndarray],
    *variants: object,
) -> None:
    """``check_vmap`` for each in_axes variant."""
    for in_axes in variants:
        check_vmap(model, feeds, in_axes=in_axes)


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def examples_of(
    case: Case, opset: int, dtype: str, indices: dict[str, list[np.ndarray]]
) -> tuple[ir.Model, list[dict[str, np.ndarray]]]:
    """The case's model and one feed per entry of ``indices`` (which replaces fixed inputs)."""
    model = case.model(dtype, opset)
    n = len(next(iter(indices.values())))
    examples = [case.feeds(model, seed=s) for s in range(n)]
    for name, values in indices.items():
        for ex, value in zip(examples, values, strict=True):
            ex[name] = np.asarray(value, dtype=ex[name].dtype)
    return model, examples


def _by_name(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


# Per-example index sets (three examples each) for the cases below; the scatters with
# reduction none get unique targets per example.
PER_EXAMPLE_INDICES: list[tuple[str, tuple[int, ...], dict[str, list[np.ndarray]]]] = [
    (
        "gather_axis0_repeats_negative",
        (11, 13),
        {
            "I": [
                np.array([[0, 2, -1], [1, 1, 0]]),
                np.array([[2, 2, 2], [-3, 0, 1]]),
                np.array([[1, 0, 2], [0, -2, 1]]),
            ]
        },
    ),
    (
        "gather_axis_neg1_2d_indices",
        (11, 13),
        {
            "I": [
                np.array([[3, -1], [0, 0]]),
                np.array([[1, 2], [-4, 3]]),
                np.array([[0, 0], [2, 2]]),
            ]
        },
    ),
    (
        "gather_scalar_index_axis1",
        (11, 13),
        {"I": [np.array(-2), np.array(0), np.array(3)]},
    ),
    (
        "gather_rank1_int32",
        (11, 16),
        {"I": [np.array([0, 2, 2, -3, 1]), np.array([1, 1, 0, 2, -1]), np.array([2, 0, 1, 0, 2])]},
    ),
    (
        "gather_elements_axis_neg1",
        (11, 13),
        {"I": [np.random.default_rng(s).integers(-4, 4, (3, 6)) for s in range(3)]},
    ),
    (
        "gather_elements_smaller_indices",
        (13,),
        {"I": [np.random.default_rng(s).integers(-5, 5, (2, 3)) for s in range(3)]},
    ),
    (
        "gather_nd_depth2",
        (11, 12, 13),
        {
            "I": [
                np.array([[0, 1], [0, 1], [2, -1]]),
                np.array([[1, 3], [-1, 0], [0, 0]]),
                np.array([[2, 2], [1, 1], [0, -4]]),
            ]
        },
    ),
    (
        "gather_nd_batch1_depth2",
        (12, 13),
        {"I": [np.random.default_rng(s).integers(-3, 3, (3, 5, 2)) for s in range(3)]},
    ),
    (
        "gather_nd_batch2",
        (12, 16),
        {"I": [np.random.default_rng(s).integers(-4, 4, (2, 3, 1)) for s in range(3)]},
    ),
]


def axes_variants(model: ir.Model, indices: str) -> list[dict[str, int | None]]:
    """in_axes with the indices batched, every other input batched or shared in turn."""
    others = [v.name for v in model.graph.inputs if v.name != indices]
    variants: list[dict[str, int | None]] = [{indices: 0}]  # indices only
    variants.append({indices: -1, **{n: 0 for n in others}})  # everything batched
    for n in others:  # one other input batched along its last axis
        variants.append({indices: 0, n: -1})
    return variants


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


def test_vmap_gather_nd_batch_dims_symbolic_depth_is_refused() -> None:
    """Shared data with batched indices and batch_dims > 0 needs the output rank."""
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        "g (float[3, 4, 5] D, int64[3, 2, K] I) => (float[3, 2, 5] Y) {\n"
        " S = GatherND<batch_dims=1>(D, I)\n Y = Identity(S) }"
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes={"I": 0})
    msg = str(err.value)
    for fact in ("vmap", "ai.onnx::GatherND", "'S'", "rank", "Remedy"):
        assert fact in msg, (fact, msg)


# The derivative models of a few cases under vmap: all inputs batched, and only the tangents
# (jvp) or output seeds (vjp) batched with the primal shared, which is how jacfwd/jacrev batch
# them. Their transposes emit ScatterND/ScatterElements with reduction="add", the one-hot
# fallback (Equal/Range/Cast/MatMul) and layout operators.
DERIVED = [
    ("gather_axis1_repeats", 13),
    ("gather_axis1_repeats", 16),
    ("gather_scalar_index_axis1", 16),
    ("gather_elements_axis0", 11),
    ("gather_elements_axis0", 16),
    ("gather_nd_batch1", 13),
    ("gather_nd_batch1", 16),
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


def vmapped_feeds(
    case: Case, vm: ir.Model, in_axes: dict[str, int | None]
) -> dict[str, np.ndarray]:
    """Feeds for ``vm = vmap(case.model(...), in_axes)``: the case's fixed inputs stacked three
    times at their axis, the others filled as the case says (symbolic sizes, the batch
    included, are 3)."""
    batched = Case(
        case.name,
        case.text,
        fill=case.fill,
        fixed={
            n: v if in_axes.get(n) is None else np.stack([np.asarray(v)] * 3, axis=in_axes[n])
            for n, v in case.fixed.items()
        },
        dims=case.dims,
    )
    return batched.feeds(vm)


# Derivatives of vmapped models: the operators the batch rules emit (GatherND with batch_dims,
# ScatterND over index tuples led by the batch coordinate, Range/Expand/Concat...) must have
# jvp and transpose rules (closure), so that grad(vmap(f)) works.
OF_VMAP = [
    ("gather_axis1_repeats", 13, {"D": 0, "I": 0}),
    ("gather_axis1_repeats", 16, {"D": 2, "I": 1}),
    ("gather_scalar_index_axis1", 11, {"D": 0, "I": 0}),
    ("gather_elements_axis0", 13, {"D": 0}),
    ("gather_nd_depth2", 11, {"D": 1, "I": 0}),
    ("gather_nd_batch1", 16, {"D": 0, "I": 0}),
    ("gather_nd_batch1", 13, {"I": 0}),
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


# ai.onnx.ml::ArrayFeatureExtractor: a column selection along the last axis (linear in X).
def _afe_model(x_type: str, out_type: str) -> ir.Model:
    return ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18, "ai.onnx.ml" : 3]>\n'
        f"g ({x_type} X, int64[3] idx) => ({out_type} Z) {{\n"
        " Z = ai.onnx.ml.ArrayFeatureExtractor(X, idx) }"
    )


@pytest.mark.parametrize(
    ("x_type", "out_type"),
    [
        ("float[N, 5]", "float[N, 3]"),
        ("double[2, 3, 5]", "double[2, 3, 3]"),
        ("float[5]", "float[1, 3]"),
    ],
)
def test_array_feature_extractor(x_type: str, out_type: str) -> None:
    model = _afe_model(x_type, out_type)
    rng = np.random.default_rng(0)
    shape = tuple(3 if d == "N" else int(d) for d in x_type.split("[")[1][:-1].split(", "))
    dtype = np.float32 if x_type.startswith("float") else np.float64
    feeds = {"X": rng.standard_normal(shape).astype(dtype), "idx": np.array([4, 0, 4])}
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_adjoint(model, feeds)
    check_vmap(model, feeds, in_axes=(0, None), out_axes=0)


def test_array_feature_extractor_refuses_batched_indices() -> None:
    model = _afe_model("float[N, 5]", "float[N, 3]")
    feeds = {"X": np.ones((2, 5), np.float32), "idx": np.array([4, 0, 1])}
    with pytest.raises(
        UnsupportedOperatorError,
        match=r"(?s)ai\.onnx\.ml::ArrayFeatureExtractor.*batched indices.*'idx'.*Remedy",
    ):
        check_vmap(model, feeds, in_axes=(None, 0), out_axes=0)
