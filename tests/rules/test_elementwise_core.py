import pytest

from cases import Case, away_from_zero, case_id, parametrize, positive, run_case, run_vmap_case
from rules.test_elementwise import vmap_derivatives

CASES = [
    Case(
        "add_broadcast",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Add(A, B) }",
        opsets=(13, 14, 18, 21),
    ),
    Case("add_rank_lift", "g ({T}[2, 1, 3] A, {T}[4, 1] B) => ({T}[2, 4, 3] Y) { Y = Add(A, B) }"),
    Case(
        "sub_broadcast",
        "g ({T}[N, 3] A, {T}[N, 1] B) => ({T}[N, 3] Y) { Y = Sub(A, B) }",
        opsets=(13, 18),
    ),
    Case(
        "sub_second_only",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Sub(A, B) }",
        inputs=["B"],
    ),
    Case(
        "mul_broadcast",
        "g ({T}[N, 3] A, {T}[1, 3] B) => ({T}[N, 3] Y) { Y = Mul(A, B) }",
        opsets=(13, 18, 21),
    ),
    Case("mul_self", "g ({T}[N, 3] A) => ({T}[N, 3] Y) { Y = Mul(A, A) }"),
    Case(
        "div",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Div(A, B) }",
        fill={"B": away_from_zero},
        opsets=(13, 18),
    ),
    Case(
        "div_scalar",
        "g ({T}[N, 3] A, {T} B) => ({T}[N, 3] Y) { Y = Div(A, B) }",
        fill={"B": positive},
    ),
    Case(
        "neg_identity",
        "g ({T}[N, 3] A) => ({T}[N, 3] Y) { B = Neg(A)\n Y = Identity(B) }",
        opsets=(13, 18),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(
    ("name", "dtype", "opset"),
    [("add_rank_lift", "float", 18), ("sub_broadcast", "double", 13), ("div_scalar", "float", 18)],
)
def test_vmap_of_derivatives(name: str, dtype: str, opset: int) -> None:
    vmap_derivatives(next(c for c in CASES if c.name == name), dtype, opset)
