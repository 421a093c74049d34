"""Scans and selections (rules in onnax.rules.scans).

CumSum is checked with every reverse/exclusive combination, negative, constant and run-time axes
and int32 axes at opsets 11 and 14 (its schema's versions) and 18/21/28; CumProd (26) on inputs
with exact zeros, with reverse/exclusive and a negative int32 axis; Trilu upper and lower with a
positive, negative and absent k on a stack of matrices; TopK with largest/smallest along several
axes at 11, 13 and 24 (distinct fills: no ties); ReverseSequence with both axis layouts at 11 and
28; Compress with an axis (positive, negative) and without (flattening) at 11, 13 and 28.
onnxruntime 1.32 has float and double kernels for all of them. vmap is checked on the same
cases with the parameter inputs shared, and the refusal of a batched axis; the refusal of a
run-time CumProd axis too.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from cases import Case, case_id, distinct, parametrize, run_case, vmap_axes
from onnax.errors import UnsupportedOperatorError
from oracles import check_vmap


def with_zeros(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Values near ±1 with about a quarter exact zeros: CumProd's derivative there is exact."""
    x = rng.uniform(0.6, 1.4, shape) * rng.choice([-1.0, 1.0], shape)
    return np.where(rng.uniform(size=shape) < 0.25, 0.0, x).astype(dtype)


CASES = [
    Case(
        "cumsum_axis1",
        "g ({T}[N, 4] X) => ({T}[N, 4] Y) {\n"
        " A = Constant<value = int64 {1}>()\n Y = CumSum(X, A) }",
        opsets=(11, 14, 21),
    ),
    Case(
        "cumsum_reverse_exclusive_neg_axis",
        "g ({T}[2, N, 3] X, int64 A) => ({T}[2, N, 3] Y) {\n"
        " Y = CumSum<reverse=1, exclusive=1>(X, A) }",
        opsets=(11, 14, 18),
        fixed={"A": np.array(-2)},
    ),
    Case(
        "cumsum_exclusive_int32_axis",
        "g ({T}[N, 3] X, int32[1] A) => ({T}[N, 3] Y) { Y = CumSum<exclusive=1>(X, A) }",
        opsets=(14, 28),
        fixed={"A": np.array([0], dtype=np.int32)},
    ),
    Case(
        "cumsum_reverse",
        "g ({T}[N, 3] X, int64 A) => ({T}[N, 3] Y) { Y = CumSum<reverse=1>(X, A) }",
        opsets=(14,),
        fixed={"A": np.array(1)},
    ),
    Case(
        "trilu_upper_k",
        "g ({T}[N, 3, 4] X, int64 K) => ({T}[N, 3, 4] Y) { Y = Trilu(X, K) }",
        opsets=(14, 21),
        fixed={"K": np.array(1)},
    ),
    Case(
        "trilu_lower_neg_k",
        "g ({T}[4, N] X, int64 K) => ({T}[4, N] Y) { Y = Trilu<upper=0>(X, K) }",
        opsets=(14, 25),
        fixed={"K": np.array(-1)},
    ),
    Case(
        "trilu_lower_no_k",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { Y = Trilu<upper=0>(X) }",
        opsets=(14,),
    ),
    Case(
        "topk_last_axis",
        "g ({T}[N, 5] X, int64[1] K) => ({T}[N, 2] V, int64[N, 2] I) { V, I = TopK(X, K) }",
        opsets=(11, 24),
        fill={"X": distinct},
        fixed={"K": np.array([2])},
    ),
    Case(
        "topk_smallest_axis0",
        "g ({T}[4, N] X, int64[1] K) => ({T}[3, N] V) {\n V, I = TopK<axis=0, largest=0>(X, K) }",
        opsets=(11, 13, 24),
        fill={"X": distinct},
        fixed={"K": np.array([3])},
    ),
    Case(
        "topk_neg_axis",
        "g ({T}[2, N, 4] X, int64[1] K) => ({T}[2, 1, 4] V) { V, I = TopK<axis=-2>(X, K) }",
        opsets=(11,),
        fill={"X": distinct},
        fixed={"K": np.array([1])},
    ),
    Case(
        "reverse_sequence_time_major",
        "g ({T}[4, N, 2] X, int64[N] L) => ({T}[4, N, 2] Y) {\n"
        " Y = ReverseSequence<batch_axis=1, time_axis=0>(X, L) }",
        opsets=(11, 28),
        fixed={"L": np.array([4, 1, 3])},
    ),
    Case(
        "reverse_sequence_batch_major",
        "g ({T}[N, 4] X, int64[N] L) => ({T}[N, 4] Y) {\n"
        " Y = ReverseSequence<batch_axis=0, time_axis=1>(X, L) }",
        opsets=(11, 28),
        fixed={"L": np.array([2, 4, 0])},
    ),
    Case(
        "compress_axis1",
        "g ({T}[N, 4] X, bool[3] C) => ({T}[N, 2] Y) { Y = Compress<axis=1>(X, C) }",
        opsets=(11, 28),
        fixed={"C": np.array([True, False, True])},
    ),
    Case(
        "compress_neg_axis_constant",
        "g ({T}[3, N] X) => ({T}[2, N] Y) {\n"
        " C = Constant<value = bool[3] {1, 1, 0}>()\n Y = Compress<axis=-2>(X, C) }",
        opsets=(13,),
    ),
    Case(
        "compress_flat",
        "g ({T}[N, 2] X, bool[5] C) => ({T}[3] Y) { Y = Compress(X, C) }",
        opsets=(11, 28),
        fixed={"C": np.array([False, True, True, False, True])},
    ),
    Case(
        "cumprod_axis1_zeros",
        "g ({T}[N, 4] X) => ({T}[N, 4] Y) {\n"
        " A = Constant<value = int64 {1}>()\n Y = CumProd(X, A) }",
        opsets=(26, 28),
        fill={"X": with_zeros},
    ),
    Case(
        "cumprod_reverse_exclusive_neg_axis",
        "g ({T}[3, N, 2] X) => ({T}[3, N, 2] Y) {\n"
        " A = Constant<value = int32[1] {-3}>()\n Y = CumProd<reverse=1, exclusive=1>(X, A) }",
        opsets=(26,),
        fill={"X": with_zeros},
    ),
    Case(
        "cumprod_exclusive",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) {\n"
        " A = Constant<value = int64 {0}>()\n Y = CumProd<exclusive=1>(X, A) }",
        opsets=(27,),
        fill={"X": with_zeros},
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(
    ("case", "opset"),
    [(c, o) for c in CASES for o in c.opsets],
    ids=case_id,
)
def test_vmap(case: Case, opset: int) -> None:
    """vmap against a loop of single runs; the parameter inputs (axis, k, K) are shared.

    ``run_vmap_case``'s all-batched variants would batch them too, which the rules refuse
    (see ``test_vmap_refuses_batched_axis``); the lengths of ReverseSequence may be batched.
    """
    dtype = "float" if opset % 2 else "double"
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
    shared = {
        i
        for i, v in enumerate(inputs)
        if v.dtype in (ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL)
    }
    if case.name.startswith("reverse_sequence"):
        shared = set()
    for axes in vmap_axes(model).values():
        in_axes = tuple(None if i in shared else a for i, a in enumerate(axes))
        if all(a is None for a in in_axes):
            continue
        check_vmap(model, feeds, in_axes=in_axes, out_axes=0)
    check_vmap(
        model,
        feeds,
        in_axes=tuple(None if i in shared else 0 for i in range(len(inputs))),
        out_axes=-1,
    )


def test_vmap_refuses_batched_axis() -> None:
    case = CASES[1]
    model = case.model("float", 14)
    with pytest.raises(UnsupportedOperatorError, match=r"(?s)CumSum.*batched axis.*'A'.*in_axes"):
        check_vmap(model, case.feeds(model), in_axes=(0, 0), out_axes=0)


RUNTIME_AXIS_CASES = [
    Case(
        "cumprod_runtime_axis",
        "g ({T}[N, 3] X, int64 A) => ({T}[N, 3] Y) { Y = CumProd(X, A) }",
        opsets=(26,),
        fill={"X": with_zeros},
        fixed={"A": np.array(1)},
    ),
    Case(
        "cumprod_runtime_neg_axis_reverse_exclusive",
        "g ({T}[2, N, 3] X, int32[1] A) => ({T}[2, N, 3] Y) {\n"
        " Y = CumProd<reverse=1, exclusive=1>(X, A) }",
        opsets=(26, 28),
        fill={"X": with_zeros},
        fixed={"A": np.array([-2], np.int32)},
    ),
]
"""CumProd whose axis is a model input (known at run time only), as in the ONNX node tests."""


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(RUNTIME_AXIS_CASES), ids=case_id)
def test_cumprod_runtime_axis(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)
