import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from oracles import check_jvp, check_vjp, check_vmap, run
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


def pad_case(
    name: str,
    shape: str,
    pads: list[int],
    mode: str,
    opsets: tuple[int, ...],
    dims: dict[str, int] | None = None,
) -> Case:
    body = f'p = Constant <value = {lit(pads)}> ()\n Y = Pad <mode = "{mode}"> (X, p)'
    return Case(
        name,
        f"g ({{T}}[{shape}] X) => ({{T}}[K, L] Y) {{ {body} }}",
        opsets=opsets,
        dims=dims or {},
    )


PAD = [
    pad_case("pad_constant", "N, 3", [0, 1, 0, 2], "constant", (11, 13, 18, 21)),
    pad_case("pad_constant_negative", "N, 4", [1, -1, -1, 2], "constant", (11, 13, 19)),
    pad_case("pad_reflect", "N, 4", [0, 2, 1, 3], "reflect", (11, 13, 18, 21), {"N": 4}),
    pad_case("pad_reflect_negative", "N, 5", [1, -1, 0, 2], "reflect", (13,), {"N": 4}),
    pad_case("pad_edge", "N, 3", [2, 1, 1, 3], "edge", (11, 13, 19)),
    pad_case("pad_edge_negative", "N, 4", [-1, 3, 2, -2], "edge", (18,)),
    pad_case("pad_wrap", "N, 4", [1, 2, 3, 1], "wrap", (19, 21)),
    pad_case("pad_wrap_negative", "N, 4", [-1, 2, 2, -1], "wrap", (19,)),
    Case(
        # The padding value carries a derivative: d/dv = number of padded positions.
        "pad_constant_value",
        "g ({T}[N, 3] X, {T} v) => ({T}[K, 4] Y) { p = Constant <value = int64[4] {1, 0, 2, 1}> ()\n Y = Pad(X, p, v) }",
        opsets=(11, 13, 21),
    ),
    Case(
        "pad_constant_value_only",
        "g ({T}[N, 3] X, {T}[1] v) => ({T}[K, 3] Y) { p = Constant <value = int64[4] {1, -1, 2, 1}> ()\n"
        " Y = Pad(X, p, v) }",
        inputs=["v"],
        opsets=(13,),
    ),
    Case(
        "pad_axes",
        "g ({T}[N, 3, 2] X, {T} v) => ({T}[K, 3, L] Y) { p = Constant <value = int64[4] {1, 2, -1, 1}> ()\n"
        " a = Constant <value = int64[2] {-1, 0}> ()\n Y = Pad(X, p, v, a) }",
        opsets=(18, 21),
    ),
    Case(
        "pad_axes_reflect",
        "g ({T}[N, 3, 4] X) => ({T}[N, 3, 7] Y) { p = Constant <value = int64[2] {1, 2}> ()\n"
        ' a = Constant <value = int64[1] {-1}> ()\n Y = Pad <mode = "reflect"> (X, p, , a) }',
        opsets=(18, 21),
    ),
    Case(
        # Pads and axes known at run time only.
        "pad_runtime_edge",
        'g ({T}[N, 3, 4] X, int64[4] p, int64[2] a) => ({T}[K, 3, L] Y) { Y = Pad <mode = "edge"> (X, p, , a) }',
        fixed={"p": i64(2, -1, 1, 2), "a": i64(0, -1)},
        opsets=(18,),
    ),
    Case(
        "pad_runtime_constant",
        "g ({T}[N, 3] X, int64[4] p, {T} v) => ({T}[K, L] Y) { Y = Pad(X, p, v) }",
        fixed={"p": i64(1, -1, 0, 2)},
        opsets=(11, 13),
    ),
    Case(
        "pad_runtime_constant_axes",
        "g ({T}[N, 3] X, int64[2] p, int64[1] a, {T} v) => ({T}[K, L] Y) { Y = Pad(X, p, v, a) }",
        fixed={"p": i64(2, -1), "a": i64(-1)},
        opsets=(18,),
    ),
    Case(
        "pad_runtime_reflect",
        'g ({T}[N, 4] X, int64[4] p) => ({T}[K, L] Y) { Y = Pad <mode = "reflect"> (X, p) }',
        fixed={"p": i64(1, 2, 2, 1)},
        opsets=(11,),
    ),
]

CASES = PAD


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("case", [PAD[4]], ids=case_id)
def test_one_model_serves_several_batch_sizes(case: Case) -> None:
    m = case.model("double", 13)
    for n in (1, 2, 5, 7):
        shape = [n if not isinstance(d, int) else d for d in m.graph.inputs[0].shape.dims]
        feeds = {"X": np.random.default_rng(n).standard_normal(shape)}
        check_jvp(m, feeds)
        check_vjp(m, feeds)


def test_pad_value_derivative_counts_padded_positions() -> None:
    m = model(
        "g (double[2, 3] X, double v) => (double[4, 5] Y) { p = Constant <value = int64[4] {1, -1, 1, 3}> ()\n"
        " Y = Pad(X, p, v) }"
    )
    g = onnax.vjp(m, inputs=["v"])
    got = run(g, {"X": np.zeros((2, 3)), "v": np.array(1.0), "adj_Y": np.ones((4, 5))})
    # 20 outputs, of which X fills rows 1..2 and, its first column cropped, columns 0..1.
    assert float(got["adj_v"]) == pytest.approx(20 - 2 * 2)


BY_NAME = {c.name: c for c in CASES}
# One case per transpose path (one-hot and scatter-add of Pad, run-time parameters), each at
# one opset.
SECOND_ORDER = [
    ("pad_reflect", 13),
    ("pad_reflect", 18),
    ("pad_constant_value", 21),
    ("pad_runtime_edge", 18),
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
        "pad_edge_with_value",
        "g ({T}[N, 3] X, {T} v) => ({T}[K, L] Y) { p = Constant <value = int64[4] {1, 0, 0, 2}> ()\n"
        ' Y = Pad <mode = "edge"> (X, p, v) }',
        opsets=(13,),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TARGETED), ids=case_id)
def test_vmap_targeted(case: Case, dtype: str, opset: int) -> None:
    check_vmap_targeted(case, dtype, opset)


REFUSALS = [
    # (model text, in_axes, fragments of the message)
    (
        "g (double[6] X, int64[2] p) => (double[A] Y) { Y = Pad(X, p) }",
        (None, 0),
        ["ai.onnx::Pad", "pads", "'p'"],
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
    ("pad_constant_value", 11),
    ("pad_reflect", 18),
]


@pytest.mark.parametrize(("name", "opset"), DERIVATIVES)
@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_vmap_of_derivative_models(name: str, opset: int, kind: str) -> None:
    check_vmap_of_derivative_model(BY_NAME[name], opset, kind)


# Variants run_vmap_case does not cover: only a later input batched, the data shared.
ONE_BATCHED = [
    ("pad_constant_value", 11, (None, 0)),
    ("pad_constant_value", 21, (None, -1)),
    ("pad_axes", 18, (None, 0)),
    ("pad_runtime_constant", 13, (None, None, 0)),
]


@pytest.mark.parametrize(("name", "opset", "in_axes"), ONE_BATCHED)
def test_vmap_shared_data(name: str, opset: int, in_axes: tuple[int | None, ...]) -> None:
    case = BY_NAME[name]
    m = case.model("double", opset)
    check_vmap(m, case.feeds(m), in_axes=in_axes)


# Derivatives of vmapped models: the operators the batch rules emit (Where, Cast...) must
# themselves be differentiable.
VMAPPED = [
    ("pad_constant_value", 11),
    ("pad_axes", 21),
]


@pytest.mark.parametrize(("name", "opset"), VMAPPED)
def test_derivatives_of_vmapped_models(name: str, opset: int) -> None:
    check_derivatives_of_vmapped_model({c.name: c for c in CASES + TARGETED}[name], opset)
