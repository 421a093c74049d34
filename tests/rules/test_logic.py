"""Comparisons, logic, bitwise operators and the rounding family (rules in onnax.rules.logic).

Their derivative is zero: derivatives flow past them (checked against finite differences, which
see zero away from the jumps), and their batch rules against a loop.
"""

import numpy as np
import onnx_ir as ir
import pytest

from cases import Case, away_from_zero, case_id, distinct, parametrize, run_case, run_vmap_case
from rules.test_elementwise import (
    check_vmap_examples,
    vmap_derivatives,
)


def off_integers(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """k + u with u in [0.15, 0.35]: away from the jumps of Floor/Ceil (integers) and Round (halves)."""
    return (rng.integers(-3, 3, shape) + rng.uniform(0.15, 0.35, shape)).astype(dtype)


def offset_distinct(offset: float):
    def fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return (distinct(rng, shape, dtype) + offset).astype(dtype)

    return fill


def per_dtype(name: str, text: str, **kwargs: object) -> list[Case]:
    """Cases whose text needs the ONNX type code of {T} (Cast's ``to``) as ``{TO}``."""
    return [
        Case(f"{name}_{dt}", text.replace("{TO}", str(code)), dtypes=(dt,), **kwargs)  # type: ignore[arg-type]
        for dt, code in (("float", 1), ("double", 11))
    ]


OPSETS = (11, 13, 18, 21)

CASES = [
    # Derivatives flow past the rounding family (a zero tangent through the rounded factor).
    Case(
        "floor_product",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { f = Floor(X)\n Y = Mul(X, f) }",
        fill={"X": off_integers},
        opsets=OPSETS,
    ),
    Case(
        "ceil_round",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { c = Ceil(X)\n r = Round(X)\n p = Mul(X, c)\n Y = Add(p, r) }",
        fill={"X": off_integers},
        opsets=OPSETS,
    ),
    Case(
        "sign_abs",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { s = Sign(X)\n Y = Mul(X, s) }",
        fill={"X": away_from_zero},
        opsets=OPSETS,
    ),
    # A float output of a zero-derivative operator gets a materialised zero tangent.
    Case(
        "floor_output",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y, {T}[N, 3] Z) { Y = Floor(X)\n Z = Sign(X) }",
        fill={"X": off_integers},
        opsets=(11, 21),
    ),
    *per_dtype(
        "cast_floor",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { f = Floor(X)\n i = Cast <to = 7> (f)\n c = Cast <to = {TO}> (i)\n Y = Mul(X, c) }",
        fill={"X": off_integers},
        opsets=OPSETS,
    ),
    # Comparisons and logic steer a Where.
    Case(
        "compare_where",
        "g ({T}[N, 3] X, {T}[3] Z) => ({T}[N, 3] Y) { g = Greater(X, Z)\n l = Less(X, Z)\n e = Equal(X, Z)\n"
        " o = Or(g, e)\n x = Xor(o, l)\n n = Not(x)\n a = And(g, x)\n m = Mul(Z, Z)\n w = Where(a, X, m)\n Y = Where(n, Z, w) }",
        fill={"X": distinct, "Z": offset_distinct(0.1)},
        opsets=OPSETS,
    ),
    Case(
        "compare_or_equal",
        "g ({T}[N, 3] X, {T}[3] Z) => ({T}[N, 3] Y) { g = GreaterOrEqual(X, Z)\n l = LessOrEqual(X, Z)\n"
        " m = Mul(X, X)\n w = Where(g, X, m)\n Y = Where(l, Z, w) }",
        fill={"X": distinct, "Z": offset_distinct(0.1)},
        opsets=(13, 18, 21),
    ),
    Case(
        "isnan_isinf",
        "g ({T}[N, 3] X, {T}[3] Z) => ({T}[N, 3] Y) { a = IsNaN(X)\n b = IsInf(X)\n c = Or(a, b)\n Y = Where(c, Z, X) }",
        opsets=OPSETS,
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


# ------------------------------------------------------------------------------------ vmap
def model_at(opset: int, text: str) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(
    ("name", "dtype", "opset"),
    [
        ("compare_where", "double", 13),
        ("floor_product", "float", 18),
        ("isnan_isinf", "double", 21),
    ],
)
def test_vmap_of_derivatives(name: str, dtype: str, opset: int) -> None:
    vmap_derivatives(next(c for c in CASES if c.name == name), dtype, opset)


@pytest.mark.parametrize(
    ("opset", "text"),
    [
        (
            18,
            "g (int32[N, 3] A, int32[3] B) => (int32[N, 3] Y) { a = BitwiseAnd(A, B)\n"
            " o = BitwiseOr(a, B)\n x = BitwiseXor(o, A)\n Y = BitwiseNot(x) }",
        ),
        (
            11,
            'g (uint32[N, 3] A, uint32[3] B) => (uint32[N, 3] Y) { Y = BitShift <direction = "LEFT"> (A, B) }',
        ),
        (
            21,
            'g (uint8[N, 3] A, uint8[N, 1] B) => (uint8[N, 3] Y) { Y = BitShift <direction = "RIGHT"> (A, B) }',
        ),
        (
            13,
            "g (int64[N, 3] A, int64[3] B) => (bool[N, 3] Y) { e = Equal(A, B)\n l = Less(A, B)\n"
            " g = Greater(A, B)\n o = Or(e, l)\n x = Xor(o, g)\n n = Not(x)\n Y = And(n, e) }",
        ),
        (
            16,
            "g (int32[N, 3] A, int32[3] B) => (bool[N, 3] Y, bool[N, 3] Z) { Y = LessOrEqual(A, B)\n Z = GreaterOrEqual(A, B) }",
        ),
    ],
)
def test_integer_and_boolean_operators(opset: int, text: str) -> None:
    # Integer operands differ per example (check_vmap would batch identical copies).
    model = model_at(opset, text)
    rng = np.random.default_rng(8)
    a_type = model.graph.inputs[0].dtype.numpy()
    b_shape = tuple(d if isinstance(d, int) else 2 for d in model.graph.inputs[1].shape.dims)
    examples = [
        {
            "A": rng.integers(0, 6, (2, 3)).astype(a_type),
            "B": rng.integers(0, 6, b_shape).astype(a_type),
        }
        for _ in range(3)
    ]
    for in_axes in ({"A": 0, "B": 0}, {"A": 1}, {"B": 0}, {"A": 2, "B": 1}):
        check_vmap_examples(model, examples, in_axes)
