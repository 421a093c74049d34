"""LRN (rules in onnax.rules.lrn: a lowering and a batch rule).

Every case has a symbolic batch dimension N. Float only: onnxruntime has no double LRN kernel,
and its LRN needs a 4-D input and an odd size. Opsets straddle the schema versions 1/13.

vmap is checked on every case (all inputs batched at 0, 1, -1; only X batched, which folds the
batch) and on the jvp/vjp models of one case. The helpers of those checks are test_norm's, whose
graph-shape and float-only second-order checks cover LRN too.
"""

from __future__ import annotations

import pytest

from cases import Case, case_id, parametrize, run_case, run_vmap_case
from oracles import check_vmap
from rules.test_norm import FLOAT, derived_model, vmap_params

CASES = [
    # ---------------------------------------------------------------------------------- LRN
    Case(
        "LRN-size3",
        "g ({T}[N, 4, 2, 2] X) => ({T}[N, 4, 2, 2] Y) "
        "{ Y = LRN<size=3, alpha=0.6, beta=0.75, bias=1.5>(X) }",
        opsets=(11, 13),
        dtypes=FLOAT,
    ),
    Case(
        # A window wider than the channels, and a symbolic channel count (Slice bounds
        # counted from the end; the transposes scatter instead of padding).
        "LRN-size5-symbolic-C",
        "g ({T}[N, C, 2, 1] X) => ({T}[N, C, 2, 1] Y) { Y = LRN<size=5, alpha=0.8, beta=0.5>(X) }",
        opsets=(13,),
        dims={"C": 3},
        dtypes=FLOAT,
    ),
    Case(
        "LRN-size1",
        "g ({T}[N, 2, 2, 2] X) => ({T}[N, 2, 2, 2] Y) { Y = LRN<size=1, alpha=0.5>(X) }",
        opsets=(13,),
        dtypes=FLOAT,
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


# ------------------------------------------------------------------------- vmap of derivatives
DERIVATIVES = [
    ("LRN-size3", 13, "float"),
]


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(
    ("name", "opset", "dtype"), DERIVATIVES, ids=[f"{n}-{o}" for n, o, _ in DERIVATIVES]
)
def test_vmap_of_derivatives(name: str, opset: int, dtype: str, mode: str) -> None:
    """vmap of the jvp/vjp models with every input batched."""
    derived, feeds, _ = derived_model(_case(name), opset, dtype, mode)
    check_vmap(derived, feeds, in_axes=0)


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(
    ("name", "opset", "dtype"), DERIVATIVES, ids=[f"{n}-{o}" for n, o, _ in DERIVATIVES]
)
def test_vmap_of_derivatives_seeds_only(name: str, opset: int, dtype: str, mode: str) -> None:
    """vmap of the jvp/vjp models over the tangents/seeds alone (rows of a Jacobian)."""
    derived, feeds, extra = derived_model(_case(name), opset, dtype, mode)
    check_vmap(derived, feeds, in_axes={v.name: -1 for v in extra})
