"""DequantizeLinear (rules in onnax.rules.quant): the derivative with respect to the scale.

Per tensor (opsets 10, 13, 19), per axis (13, 21, with a positive and a negative axis, with and
without a zero point, int8 and uint8) and blocked (21, 23, 25: a block that divides the axis and
one that does not), in float only: the scale's type is float, float16 or bfloat16 (no double in
the schema). x and the zero point are integer inputs with fixed values; the scale is the only
differentiable input. vmap against a loop with every in_axes variant (so batched and shared
scales and zero points in each layout).
"""

from __future__ import annotations

import numpy as np
import pytest

from cases import Case, case_id, parametrize, run_case, run_vmap_case

RNG = np.random.default_rng(7)


def ints(shape: tuple[int, ...], dtype: type = np.int8) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -100), min(info.max, 100) + 1, shape).astype(dtype)


FLOAT = ("float",)

CASES = [
    Case(
        "per_tensor",
        "g (int8[N, 4] X, {T} S, int8 Z) => ({T}[N, 4] Y) { Y = DequantizeLinear(X, S, Z) }",
        opsets=(10, 13, 19),
        dtypes=FLOAT,
        fixed={"X": ints((3, 4)), "Z": np.array(3, np.int8)},
    ),
    Case(
        "per_tensor_no_zero_point_rank3",
        "g (uint8[2, N, 4] X, {T}[1] S) => ({T}[2, N, 4] Y) { Y = DequantizeLinear(X, S) }",
        opsets=(13, 21),
        dtypes=FLOAT,
        fixed={"X": ints((2, 3, 4), np.uint8)},
    ),
    Case(
        "per_axis",
        "g (int8[N, 3, 4] X, {T}[3] S, int8[3] Z) => ({T}[N, 3, 4] Y) {\n"
        " Y = DequantizeLinear<axis=1>(X, S, Z) }",
        opsets=(13, 21),
        dtypes=FLOAT,
        fixed={"X": ints((3, 3, 4)), "Z": np.array([1, -2, 0], np.int8)},
    ),
    Case(
        "per_axis_negative_uint8",
        "g (uint8[N, 2, 4] X, {T}[4] S, uint8[4] Z) => ({T}[N, 2, 4] Y) {\n"
        " Y = DequantizeLinear<axis=-1>(X, S, Z) }",
        opsets=(19,),
        dtypes=FLOAT,
        fixed={"X": ints((3, 2, 4), np.uint8), "Z": np.array([128, 3, 0, 255], np.uint8)},
    ),
    Case(
        "per_axis_first_no_zero_point",
        "g (int32[5, N] X, {T}[5] S) => ({T}[5, N] Y) { Y = DequantizeLinear<axis=0>(X, S) }",
        opsets=(13,),
        dtypes=FLOAT,
        fixed={"X": ints((5, 3), np.int32)},
    ),
    Case(
        "blocked_even",
        "g (int8[N, 4, 3] X, {T}[N, 2, 3] S, int8[N, 2, 3] Z) => ({T}[N, 4, 3] Y) {\n"
        " Y = DequantizeLinear<axis=1, block_size=2>(X, S, Z) }",
        opsets=(21, 23),
        dtypes=FLOAT,
        fixed={"X": ints((3, 4, 3)), "Z": ints((3, 2, 3))},
    ),
    Case(
        "blocked_ragged_last_axis",
        "g (int8[2, 5] X, {T}[2, 2] S) => ({T}[2, 5] Y) {\n"
        " Y = DequantizeLinear<axis=-1, block_size=3>(X, S) }",
        opsets=(21, 25),
        dtypes=FLOAT,
        fixed={"X": ints((2, 5))},
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)
