"""Loss operators (rules in onnax.rules.losses).

NegativeLogLikelihoodLoss (opsets 12, 13, 18, 22) and SoftmaxCrossEntropyLoss (12, 13, 18), with
every reduction, with and without class weights (differentiated too), with ``ignore_index``
present among the targets, rank-2 (``[N, C]``) and rank-4 (``[N, C, 2, 2]``) inputs and a
symbolic ``N``. SoftmaxCrossEntropyLoss is also tested with its second output ``log_prob``.

vmap is checked on every case (all inputs batched at 0, 1, -1 including the integer targets;
only the input batched, with shared targets and weights).
"""

from __future__ import annotations

import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, positive, run_case, run_vmap_case
from oracles import check_vmap

C = 4
# Targets for N = 3; the class 1 entries are ignored where ignore_index=1.
T2 = np.array([0, 1, 3], np.int64)
T4 = np.array([[[0, 1], [2, 3]], [[1, 1], [3, 0]], [[2, 0], [1, 2]]], np.int64)


def _case(op: str, rank: int, reduction: str, weighted: bool, ignore: bool, **kw: object) -> Case:
    xdims = "N, 4" if rank == 2 else "N, 4, 2, 2"
    tdims = "N" if rank == 2 else "N, 2, 2"
    w_in = f", {{T}}[{C}] w" if weighted else ""
    w_arg = ", w" if weighted else ""
    attrs = [f'reduction: string = "{reduction}"']
    if ignore:
        attrs.append("ignore_index: int = 1")
    # "{T} y" is rank 0 in ONNX text ("{T}[] y" would leave the shape unknown).
    y_type = f"{{T}}[{tdims}]" if reduction == "none" else "{T}"
    log_prob = bool(kw.pop("log_prob", False))
    outs = f"{y_type} y" + (f", {{T}}[{xdims}] lp" if log_prob else "")
    lhs = "y, lp" if log_prob else "y"
    text = f"""
        agraph ({{T}}[{xdims}] x, int64[{tdims}] t{w_in}) => ({outs}) {{
            {lhs} = {op} <{", ".join(attrs)}> (x, t{w_arg})
        }}
    """
    name = f"{op}-r{rank}-{reduction}-{'w' if weighted else 'nw'}-{'ig' if ignore else 'noig'}"
    if log_prob:
        name += "-lp"
    fill = {"w": positive}
    if op == "NegativeLogLikelihoodLoss":
        fill["x"] = lambda rng, shape, dtype: (-rng.uniform(0.2, 3.0, shape)).astype(dtype)
    return Case(
        name,
        text,
        fixed={"t": T2 if rank == 2 else T4},
        fill=fill,
        **kw,  # type: ignore[arg-type]
    )


NLL_OPSETS = (12, 13, 18, 22)
SCE_OPSETS = (12, 13, 18)

CASES: list[Case] = []
for _rank in (2, 4):
    for _red in ("none", "sum", "mean"):
        for _w, _ig in ((True, True), (False, True), (True, False), (False, False)):
            if _rank == 4 and not _ig:
                continue  # rank 4 is tested with ignore_index (the harder path)
            CASES.append(
                _case("NegativeLogLikelihoodLoss", _rank, _red, _w, _ig, opsets=NLL_OPSETS)
            )
            CASES.append(
                _case(
                    "SoftmaxCrossEntropyLoss",
                    _rank,
                    _red,
                    _w,
                    _ig,
                    opsets=SCE_OPSETS,
                    log_prob=_red == "mean",
                )
            )


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def _named(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


SHARED = [
    _named("NegativeLogLikelihoodLoss-r4-mean-w-ig"),
    _named("NegativeLogLikelihoodLoss-r2-sum-w-noig"),
    _named("SoftmaxCrossEntropyLoss-r4-mean-w-ig-lp"),
    _named("SoftmaxCrossEntropyLoss-r2-none-w-ig"),
]


@pytest.mark.parametrize("case", SHARED, ids=case_id)
def test_vmap_shared_input(case: Case) -> None:
    """The input shared: targets and/or weights batched (materialized input; per-example
    weights selected with GatherElements)."""
    model = case.model("float", 13)
    feeds = case.feeds(model)
    check_vmap(model, feeds, in_axes={"x": None, "t": 0, "w": 0})
    check_vmap(model, feeds, in_axes={"x": None, "t": None, "w": -1})
    check_vmap(model, feeds, in_axes={"x": 1, "t": None, "w": 0})


@pytest.mark.parametrize("case", SHARED, ids=case_id)
def test_vmap_of_jvp(case: Case) -> None:
    """vmap of the jvp model: the emitted tangent operators batch too."""
    model = case.model("float", 13)
    jm = onnax.jvp(model)
    rng = np.random.default_rng(1)
    feeds = case.feeds(model)
    for v in jm.graph.inputs:
        if v.name not in feeds:
            feeds[v.name] = rng.standard_normal(
                [d if isinstance(d, int) else 3 for d in v.shape.dims]
            ).astype(np.float32)
    check_vmap(jm, feeds, in_axes=0)


def test_vmap_folds_into_n() -> None:
    """Only the input batched, reduction none: one loss node on the folded batch, no loop."""
    model = _named("NegativeLogLikelihoodLoss-r4-none-nw-ig").model("float", 13)
    ops = [n.op_type for n in onnax.vmap(model, in_axes={"x": 0, "t": None}).graph]
    assert ops.count("NegativeLogLikelihoodLoss") == 1
    assert "Loop" not in ops and "Scan" not in ops


def test_jvp_uses_ordinary_operators() -> None:
    """The tangent never goes through the loss operator itself (which has no transpose)."""
    model = _named("SoftmaxCrossEntropyLoss-r4-mean-w-ig-lp").model("float", 13)
    ops = {n.op_type for n in onnax.jvp(model).graph}
    assert ops >= {"GatherElements", "Gather", "ReduceSum"}
    assert sum(n.op_type == "SoftmaxCrossEntropyLoss" for n in onnax.jvp(model).graph) == 1
