import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.rules.slicing import clamp
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap, session
from rules.shape_checks import (
    check_derivatives_of_vmapped_model,
    check_second_order,
    check_vmap_case,
    check_vmap_of_derivative_model,
    check_vmap_refusal,
    check_vmap_targeted,
    i64,
    lit,
    model,
)

CONCAT_SPLIT = [
    Case(
        "concat_axis1",
        "g ({T}[N, 2] A, {T}[N, 3] B) => ({T}[N, 5] Y) { Y = Concat <axis = 1> (A, B) }",
        opsets=(11, 13),
    ),
    Case(
        # Along the symbolic axis, with inputs of different symbolic sizes.
        "concat_symbolic_axis",
        "g ({T}[N, 2] A, {T}[M, 2] B, {T}[1, 2] C) => ({T}[K, 2] Y) { Y = Concat <axis = 0> (A, B, C) }",
        dims={"N": 3, "M": 2},
        opsets=(11, 13),
    ),
    Case(
        # One input: a copy, its cotangent passed through.
        "concat_single",
        "g ({T}[N, 2] A) => ({T}[N, 2] Y) { B = Sin (A) Y = Concat <axis = 1> (B) }",
        opsets=(11, 13),
    ),
    Case(
        # Only B carries a derivative: A and C get zeros in forward mode and no cotangent.
        "concat_partial",
        "g ({T}[N, 2] A, {T}[N, 3] B, {T}[N, 1] C) => ({T}[N, 6] Y) { Y = Concat <axis = -1> (A, B, C) }",
        inputs=["B"],
        opsets=(13,),
    ),
    Case(
        "split_attr_uneven",
        "g ({T}[N, 7] X) => ({T}[N, 2] Y0, {T}[N, 5] Y1) { Y0, Y1 = Split <axis = 1, split = [2, 5]> (X) }",
        opsets=(11,),
    ),
    Case(
        "split_input_uneven",
        "g ({T}[N, 7] X) => ({T}[N, 2] Y0, {T}[N, 4] Y1, {T}[N, 1] Y2) "
        "{ s = Constant <value = int64[3] {2, 4, 1}> ()\n Y0, Y1, Y2 = Split <axis = 1> (X, s) }",
        opsets=(13, 18),
    ),
    Case(
        "split_num_outputs_uneven",
        "g ({T}[N, 7] X) => ({T}[N, 3] Y0, {T}[N, 3] Y1, {T}[N, 1] Y2) "
        "{ Y0, Y1, Y2 = Split <axis = -1, num_outputs = 3> (X) }",
        opsets=(18, 21),
    ),
    Case(
        "split_symbolic_axis",
        "g ({T}[N, 2] X) => ({T}[1, 2] Y0, {T}[K, 2] Y1) "
        "{ s = Constant <value = int64[2] {1, 2}> ()\n Y0, Y1 = Split <axis = 0> (X, s) }",
        opsets=(13,),
    ),
    Case(
        # The middle output is not a graph output: its cotangent is a zero.
        "split_unused_output",
        "g ({T}[N, 6] X) => ({T}[N, 2] Y0, {T}[N, 2] Y2) { Y0, Y1, Y2 = Split <axis = 1> (X) }",
        opsets=(11, 13),
    ),
    Case(
        # Two outputs of a Concat-Split chain differentiated together.
        "concat_then_split",
        "g ({T}[N, 2] A, {T}[N, 3] B) => ({T}[N, 1] Y0, {T}[N, 4] Y1) "
        "{ c = Concat <axis = 1> (A, B)\n Y0, Y1 = Split <axis = 1, split = [1, 4]> (c) }",
        opsets=(11,),
    ),
]


def slice_case(
    name: str,
    shape: str,
    out: str,
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int] | None,
    opsets: tuple[int, ...],
    dims: dict[str, int] | None = None,
) -> Case:
    args = ["X", "b", "e"]
    consts = [f"b = Constant <value = {lit(starts)}> ()", f"e = Constant <value = {lit(ends)}> ()"]
    if axes is not None:
        consts.append(f"a = Constant <value = {lit(axes)}> ()")
        args.append("a")
    elif steps is not None:
        args.append("")
    if steps is not None:
        consts.append(f"p = Constant <value = {lit(steps)}> ()")
        args.append("p")
    body = "\n ".join([*consts, f"Y = Slice({', '.join(args)})"])
    return Case(
        name,
        f"g ({{T}}[{shape}] X) => ({{T}}[{out}] Y) {{ {body} }}",
        opsets=opsets,
        dims=dims or {},
    )


SLICE = [
    slice_case("slice_static", "N, 6", "N, 4", [1], [5], [1], None, (11, 13, 18)),
    slice_case("slice_no_axes_clamped_end", "4, 6", "2, 4", [1, 2], [3, 100], None, None, (13,)),
    slice_case("slice_reverse", "N, 6", "N, 5", [-2], [-100], [1], [-1], (13,)),
    slice_case(
        "slice_reverse_two_axes", "N, 5", "2, 5", [4, 0], [-(2**63), 2], [1, -2], [-1, 1], (13, 21)
    ),
    slice_case("slice_step2", "N, 7", "N, 3", [1], [100], [1], [2], (11, 13)),
    slice_case("slice_step_neg2", "N, 7", "N, 4", [6], [-100], [-1], [-2], (13, 18)),
    slice_case("slice_symbolic_neg", "N, 3", "K, 3", [-4], [-1], [0], None, (11, 13, 21), {"N": 6}),
    slice_case(
        "slice_symbolic_neg_step",
        "N, 3",
        "K, 2",
        [-1, 0],
        [-5, 2],
        [0, 1],
        [-2, 1],
        (13,),
        {"N": 6},
    ),
    slice_case("slice_empty", "N, 6", "N, 0", [4], [2], [1], [1], (13,)),
    slice_case("slice_omitted_axes", "5, N", "2, K", [1, -1], [4, -100], None, [2, -1], (13,)),
    Case(
        # Every slice parameter is a graph input: known at run time only.
        "slice_runtime",
        "g ({T}[N, 7] X, int64[2] b, int64[2] e, int64[2] a, int64[2] p) => ({T}[K, L] Y) { Y = Slice(X, b, e, a, p) }",
        fixed={"b": i64(-1, 1), "e": i64(-100, 6), "a": i64(0, -1), "p": i64(-2, 1)},
        dims={"N": 5},
        opsets=(11, 13, 21),
    ),
    Case(
        "slice_runtime_no_axes",
        "g ({T}[N, 7] X, int64[2] b, int64[2] e) => ({T}[K, L] Y) { Y = Slice(X, b, e) }",
        fixed={"b": i64(1, -3), "e": i64(100, 7)},
        opsets=(13,),
    ),
    Case(
        "slice_runtime_int32",
        "g ({T}[N, 7] X, int32[1] b, int32[1] e, int32[1] a) => ({T}[N, L] Y) { Y = Slice(X, b, e, a) }",
        fixed={
            "b": np.array([2], np.int32),
            "e": np.array([-1], np.int32),
            "a": np.array([1], np.int32),
        },
        opsets=(13,),
    ),
]

CASES = CONCAT_SPLIT + SLICE


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def test_split_one_output_selected() -> None:
    m = model(
        "g (double[N, 7] X) => (double[N, 3] Y0, double[N, 4] Y1) { Y0, Y1 = Split <axis = 1, split = [3, 4]> (X) }",
        11,
    )
    feeds = {"X": np.random.default_rng(0).standard_normal((3, 7))}
    check_vjp(m, feeds, outputs=["Y1"])
    check_adjoint(m, feeds, outputs=["Y1"])


def test_single_input_concat_transposes_to_nothing() -> None:
    """A one-input Concat is a copy: reverse mode passes its cotangent on, no Slice copies it."""
    m = next(c for c in CONCAT_SPLIT if c.name == "concat_single").model("double", 13)
    ops = [n.op_type for n in onnax.vjp(m).graph]
    assert "Slice" not in ops and ops.count("Concat") == 1, ops  # the primal's


def test_static_slice_transposes_to_pad() -> None:
    m = SLICE[2].model("double", 13)
    ops = {n.op_type for n in onnax.vjp(m).graph}
    assert "Pad" in ops and "ScatterND" not in ops


def test_dynamic_slice_transposes_to_scatter() -> None:
    m = SLICE[6].model("double", 13)
    ops = {n.op_type for n in onnax.vjp(m).graph}
    assert "ScatterND" in ops


@pytest.mark.parametrize("case", [SLICE[6], SLICE[7]], ids=case_id)
def test_one_model_serves_several_batch_sizes(case: Case) -> None:
    m = case.model("double", 13)
    for n in (1, 2, 5, 7):
        shape = [n if not isinstance(d, int) else d for d in m.graph.inputs[0].shape.dims]
        feeds = {"X": np.random.default_rng(n).standard_normal(shape)}
        check_jvp(m, feeds)
        check_vjp(m, feeds)


def test_slice_clamp_matches_onnxruntime() -> None:
    # ONNX clamps differently from Python slicing (a negative step clamps start to dim - 1).
    m = model(
        "g (int64[N] X, int64[1] b, int64[1] e, int64[1] p) => (int64[K] Y) "
        "{ a = Constant <value = int64[1] {0}> ()\n Y = Slice(X, b, e, a, p) }"
    )
    sess = session(m)
    rng = np.random.default_rng(0)
    for _ in range(1000):
        dim = int(rng.integers(0, 6))
        start, end = (int(v) for v in rng.integers(-9, 9, 2))
        step = int(rng.choice([-3, -2, -1, 1, 2, 3]))
        feeds = {"X": np.arange(dim), "b": i64(start), "e": i64(end), "p": i64(step)}
        s, e = clamp(start, end, step, dim)
        assert list(range(s, e, step)) == sess.run(None, feeds)[0].tolist(), (dim, start, end, step)


BY_NAME = {c.name: c for c in CASES}
# One case per transpose path (Pad path and scatter path of Slice, run-time parameters), each
# at one opset.
SECOND_ORDER = [
    ("concat_partial", 13),
    ("split_unused_output", 11),
    ("slice_reverse", 13),
    ("slice_symbolic_neg", 11),
    ("slice_runtime", 13),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER)
def test_second_order(name: str, opset: int) -> None:
    check_second_order(BY_NAME[name], opset)


# ----------------------------------------------------------------------------------- vmap
@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    check_vmap_case(case, dtype, opset)


TARGETED = [
    Case(
        "slice_runtime_unknown_length_int32",
        "g ({T}[N, 7] X, int32[K] b, int32[K] e) => ({T}[A, B] Y) { Y = Slice(X, b, e) }",
        fixed={"b": np.array([1, -3], np.int32), "e": np.array([100, 7], np.int32)},
        opsets=(13,),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TARGETED), ids=case_id)
def test_vmap_targeted(case: Case, dtype: str, opset: int) -> None:
    check_vmap_targeted(case, dtype, opset)


REFUSALS = [
    # (model text, in_axes, fragments of the message)
    (
        "g (double[6] X, int64[2] s) => (double[A] Y0, double[B] Y1) { Y0, Y1 = Split(X, s) }",
        (0, 0),
        ["ai.onnx::Split", "split sizes", "'s'"],
    ),
    (
        "g (double[6] X, int64[1] b, int64[1] e) => (double[A] Y) { Y = Slice(X, b, e) }",
        (0, None, 0),
        ["ai.onnx::Slice", "ends", "'e'"],
    ),
]


@pytest.mark.parametrize(("text", "in_axes", "fragments"), REFUSALS, ids=lambda p: str(p)[:30])
def test_vmap_refuses_batched_shape_inputs(
    text: str, in_axes: object, fragments: list[str]
) -> None:
    check_vmap_refusal(text, in_axes, fragments)


# vmap of derivative models: the primal inputs and per-example tangents/cotangents batched
# (shape-like inputs shared), and only the seeds batched (many directions in one pass).
DERIVATIVES = [
    ("concat_partial", 13),
    ("slice_runtime", 13),
]


@pytest.mark.parametrize(("name", "opset"), DERIVATIVES)
@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_vmap_of_derivative_models(name: str, opset: int, kind: str) -> None:
    check_vmap_of_derivative_model(BY_NAME[name], opset, kind)


# Variants run_vmap_case does not cover: only a later input batched, the data shared.
ONE_BATCHED = [
    ("concat_symbolic_axis", 13, (None, 0, None)),
    ("concat_then_split", 11, (None, 1)),
]


@pytest.mark.parametrize(("name", "opset", "in_axes"), ONE_BATCHED)
def test_vmap_shared_data(name: str, opset: int, in_axes: tuple[int | None, ...]) -> None:
    case = BY_NAME[name]
    m = case.model("double", opset)
    check_vmap(m, case.feeds(m), in_axes=in_axes)


# Derivatives of vmapped models: the operators the batch rules emit (Where, NonZero, Range,
# ReduceProd on shapes, Cast...) must themselves be differentiable.
VMAPPED = [
    ("slice_runtime_unknown_length_int32", 13),
]


@pytest.mark.parametrize(("name", "opset"), VMAPPED)
def test_derivatives_of_vmapped_models(name: str, opset: int) -> None:
    check_derivatives_of_vmapped_model({c.name: c for c in CASES + TARGETED}[name], opset)
