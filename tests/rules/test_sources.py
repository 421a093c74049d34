import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, vmap_axes
from onnax.errors import UnsupportedOperatorError
from oracles import run
from rules.shape_checks import check_second_order, check_vmap_case, check_vmap_refusal, model

CASES = [
    Case(
        # Constants and ConstantOfShape on the path: no tangent flows through them.
        "constant_sources",
        "g ({T}[N, 3] X) => ({T}[N, 6] Y) { s = Constant <value = int64[2] {1, 3}> ()\n"
        " z = ConstantOfShape <value = {T}[1] {1.5}> (s)\n"
        " m = Mul(X, z)\n c = Constant <value = int64[4] {0, 1, 0, -1}> ()\n p = Pad(X, c)\n"
        " Y = Concat <axis = 1> (m, p) }",
        opsets=(11, 21),
    ),
    Case(
        # Keep (limit - start) / delta far from an integer: the length must not change under FD.
        "range",
        "g ({T} s, {T} l, {T} d) => ({T}[K] Y) { Y = Range(s, l, d) }",
        fixed={"s": np.array(0.3), "l": np.array(5.1), "d": np.array(0.7)},
        opsets=(11, 21),
    ),
    Case(
        "range_negative_delta",
        "g ({T} s, {T} l, {T} d) => ({T}[K] Y) { Y = Range(s, l, d) }",
        fixed={"s": np.array(2.0), "l": np.array(-1.3), "d": np.array(-0.6)},
        inputs=["s", "d"],
        opsets=(13,),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def test_range_derivative_values() -> None:
    m = model("g (double s, double l, double d) => (double[K] Y) { Y = Range(s, l, d) }")
    j = onnax.jvp(m)
    feeds = {"s": 0.5, "l": 3.0, "d": 0.75, "fwd_s": 1.0, "fwd_l": 5.0, "fwd_d": 2.0}
    got = run(j, {k: np.array(v) for k, v in feeds.items()})
    np.testing.assert_allclose(got["fwd_Y"], 1.0 + 2.0 * np.arange(4))


BY_NAME = {c.name: c for c in CASES}
SECOND_ORDER = [
    ("range", 21),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER)
def test_second_order(name: str, opset: int) -> None:
    check_second_order(BY_NAME[name], opset)


# ----------------------------------------------------------------------------------- vmap
# Every input of Range decides the length of its result: refused whatever is batched.
VMAP_REFUSED = {"range", "range_negative_delta"}


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    m = case.model(dtype, opset)
    if case.name in VMAP_REFUSED:
        for axes in vmap_axes(m).values():
            with pytest.raises(UnsupportedOperatorError, match="Range"):
                onnax.vmap(m, in_axes=axes)
        return
    check_vmap_case(case, dtype, opset)


REFUSALS = [
    # (model text, in_axes, fragments of the message)
    (
        "g (int64[2] s) => (double[A, B] Y) { Y = ConstantOfShape <value = double[1] {1.0}> (s) }",
        0,
        ["ai.onnx::ConstantOfShape", "shape", "'s'"],
    ),
    (
        "g (double s, double l, double d) => (double[K] Y) { Y = Range(s, l, d) }",
        (None, 0, None),
        ["ai.onnx::Range", "limit", "'l'", "length"],
    ),
]


@pytest.mark.parametrize(("text", "in_axes", "fragments"), REFUSALS, ids=lambda p: str(p)[:30])
def test_vmap_refuses_batched_shape_inputs(
    text: str, in_axes: object, fragments: list[str]
) -> None:
    check_vmap_refusal(text, in_axes, fragments)
