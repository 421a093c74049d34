"""Unique (rules in onnax.rules.unique): the values output's derivative, and vmap's refusal.

Flattened (no axis), sorted and in order of first occurrence, and along an axis (rows and
columns), at opsets 11 and 28, float and double (onnxruntime has both kernels). The generic
cases use distinct values: a random direction would split ties, which changes the number of
outputs. Ties are checked separately against differences along a direction that keeps tied
elements tied (their tangent then is the same, and the derivative exists). vmap refuses a batched
input (the output length depends on the data) and batches around a shared Unique.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnax
from cases import Case, case_id, distinct, parametrize, run_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_vmap, fd_jvp, run

CASES = [
    Case(
        "flat_sorted",
        "g ({T}[N, 4] X) => ({T}[M] Y, int64[M] I, int64[K] J, int64[M] C) {\n"
        " Y, I, J, C = Unique(X) }",
        opsets=(11, 28),
        fill={"X": distinct},
    ),
    Case(
        "flat_unsorted_values_only",
        "g ({T}[N, 4] X) => ({T}[M] Y) { Y = Unique<sorted=0>(X) }",
        opsets=(11,),
        fill={"X": distinct},
    ),
    Case(
        "rows",
        "g ({T}[N, 3] X) => ({T}[M, 3] Y, int64[M] I) { Y, I = Unique<axis=0>(X) }",
        opsets=(11, 28),
        fill={"X": distinct},
    ),
    Case(
        "columns_unsorted",
        "g ({T}[2, N] X) => ({T}[2, M] Y, int64[M] I) { Y, I = Unique<axis=-1, sorted=0>(X) }",
        opsets=(11,),
        fill={"X": distinct},
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("name", ["flat_sorted", "rows"])
def test_ties(name: str) -> None:
    """Repeated values (rows): the tangent of each unique value is that of its copies."""
    case = next(c for c in CASES if c.name == name)
    model = case.model("double", 11)
    if name == "rows":
        x = np.array([[1.0, 2.0, 3.0], [0.5, 0.1, 0.2], [1.0, 2.0, 3.0], [0.5, 0.1, 0.2]])
    else:
        x = np.array([[3.0, 1.0, 3.0, 2.0], [1.0, 0.5, 2.0, 3.0]])
    rng = np.random.default_rng(0)
    # A direction that is a function of the value: tied elements move together.
    values = np.unique(x)
    t = dict(zip(values.tolist(), rng.standard_normal(values.size), strict=True))
    direction = np.vectorize(t.get)(x)
    jm = onnax.jvp(model)
    tangent_input = jm.graph.inputs[-1].name
    got = run(jm, {"X": x, tangent_input: direction})
    want = fd_jvp(model, {"X": x}, {"X": direction}, ["Y"])
    np.testing.assert_allclose(
        got[jm.graph.outputs[len(model.graph.outputs)].name], want["Y"], rtol=1e-7, atol=1e-9
    )
    check_adjoint(model, {"X": x})


def test_vmap_refuses_batched_input() -> None:
    model = CASES[0].model("float", 11)
    with pytest.raises(UnsupportedOperatorError, match=r"vmap: ai\.onnx::Unique.*'X'.*Remedy"):
        onnax.vmap(model, in_axes=0)


def test_vmap_around_shared_unique() -> None:
    model = Case(
        "scaled",
        "g ({T}[6] X, {T}[2] S) => ({T}[M, 2] Y) {\n"
        " U = Unique(X)\n K = Constant<value = int64[1] {1}>()\n A = Unsqueeze(U, K)\n"
        " Y = Mul(A, S) }",
    ).model("double", 18)
    feeds = {"X": np.array([3.0, 1.0, 3.0, 2.0, 0.5, 1.0]), "S": np.array([2.0, -1.0])}
    check_vmap(model, feeds, in_axes={"X": None, "S": 0})
