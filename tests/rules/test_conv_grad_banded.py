"""The banded depthwise weight gradient with a static batch: rows in ``(N, O')`` order.

Checked against central differences and the adjoint identity (``run_case``); the regression is
structural: on a channels-last cotangent (convnext's depthwise Conv feeds a Transpose to NHWC)
every Transpose of the weight gradient moves a single axis, which onnxruntime copies fast, where
the ``(O', N)`` rows read the cotangent fully reversed (20x slower on convnext-tiny's maps).
"""

from __future__ import annotations

from collections import Counter

import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from rules.test_conv import _conv

CASES = [
    _conv("banded_static_1d", "24, 3, 30", "3, 1, 17", "24, 3, 15", "group=3, pads=[1, 0]"),
    _conv(
        "banded_static_strided_dilated",
        "4, 2, 13, 12",
        "2, 1, 5, 4",
        "4, 2, 6, 9",
        "group=2, strides=[2, 1], dilations=[1, 2], pads=[2, 1, 1, 2]",
    ),
    # Rows cropped (the tail no window reads), uneven pads.
    _conv(
        "banded_static_cropped",
        "8, 2, 11, 10",
        "2, 1, 5, 5",
        "8, 2, 3, 7",
        "group=2, strides=[3, 1], pads=[2, 1, 0, 0]",
    ),
    Case(
        "banded_static_channels_last",
        "g ({T}[3, 4, 10, 9] X, {T}[4, 1, 7, 7] W) => ({T}[3, 10, 9, 4] Y) {"
        " C = Conv<group=4, pads=[3, 3, 3, 3]>(X, W)"
        " Y = Transpose<perm=[0, 2, 3, 1]>(C) }",
        opsets=(13,),
        dtypes=("float",),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def _moves_one_axis(perm: list[int]) -> bool:
    """Whether ``perm`` takes one axis out and puts it back elsewhere (or is the identity)."""
    axes = list(range(len(perm)))
    for src in axes:
        rest = [a for a in axes if a != src]
        if any([*rest[:dst], src, *rest[dst:]] == perm for dst in axes):
            return True
    return False


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_weight_gradient_banded_single_axis_moves(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    model = case.model("float", case.opsets[-1])
    grad = onnax.vjp(model, ["W"])
    ops = Counter(n.op_type for n in grad.graph)
    assert ops["Gather"] == (2 if "1d" not in name else 1), ops  # the rows and the band
    perms = [list(n.attributes["perm"].value) for n in grad.graph if n.op_type == "Transpose"]
    assert perms, ops
    assert all(_moves_one_axis(p) for p in perms), perms
