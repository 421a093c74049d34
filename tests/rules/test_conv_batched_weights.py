"""vmap of Conv and ConvTranspose whose data and weight are both batched.

Two forms of :mod:`onnax.rules.conv`, against a loop of single runs (``check_vmap``) and
differentiated again: with a static batch size (``axis_size``) the examples become groups of one
operator (``group = B * g``); with a run-time batch size, a depthwise Conv of one example whose
kernel outnumbers its output (the classic weight-gradient Conv of a batch-1 gradient, as
per-example gradients of a depthwise network vmap it) is one banded GEMM over the ``B * C``
channels. Other batched weights keep the im2col (``tests/rules/test_conv.py``).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import onnax
from cases import Case
from oracles import check_jvp, check_vjp, check_vmap
from rules.test_conv import CASES, _conv

GROUPED = ["conv2d_groups", "convT2d_groups", "conv1d_bias", "convT1d_output_shape"]


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def _ops(model: object) -> Counter[str]:
    return Counter(n.op_type for n in model.graph)  # type: ignore[attr-defined]


@pytest.mark.parametrize("in_axes", [{"X": 0, "W": 0}, {"X": 2, "W": 1}], ids=str)
@pytest.mark.parametrize("name", GROUPED)
def test_examples_as_groups(name: str, in_axes: dict[str, int]) -> None:
    """A static batch: one Conv (ConvTranspose) with ``B`` times the groups, no MatMul."""
    case = _case(name)
    model = case.model("float", 13)
    vm = check_vmap(model, case.feeds(model), in_axes=in_axes, axis_size=3)
    op_type = "ConvTranspose" if name.startswith("convT") else "Conv"
    (source,) = list(model.graph)
    (op,) = [n for n in vm.graph if n.op_type == op_type]
    assert op.attributes.get_int("group", 1) == 3 * source.attributes.get_int("group", 1), op
    assert _ops(vm)["MatMul"] == 0, _ops(vm)


def test_examples_as_groups_one_example() -> None:
    """A statically single example: the folds are Reshapes (no Transpose), the bias batched."""
    case = _conv("one", "1, 4, 6, 5", "6, 2, 3, 3", "1, 6, 4, 3", "group=2", bias="6")
    model = case.model("float", 13)
    in_axes = {"X": 0, "W": 0, "B": 0}
    vm = check_vmap(model, case.feeds(model), in_axes=in_axes, axis_size=3)
    assert _ops(vm)["Transpose"] == 0, _ops(vm)


@pytest.mark.parametrize("name", ["conv2d_groups", "convT2d_groups"])
def test_examples_as_groups_differentiated(name: str) -> None:
    case = _case(name)
    vm = onnax.vmap(case.model("float", 13), in_axes={"X": 0, "W": 0}, axis_size=3)
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)


# Depthwise, one example, the kernel at least the output (the classic weight-gradient Conv of
# a batch-1 depthwise gradient: kernel = cotangent, output = weight).
LARGE_DEPTHWISE = [
    _conv("dw_large_2d", "1, 3, 9, 8", "3, 1, 7, 6", "1, 3, 6, 5", "group=3, pads=[1, 1, 2, 1]"),
    _conv("dw_large_valid", "1, 2, 12, 11", "2, 1, 10, 9", "1, 2, 3, 3", "group=2"),
    _conv("dw_equal_2d", "1, 2, 7, 7", "2, 1, 7, 7", "1, 2, 7, 7", "group=2, pads=[3, 3, 3, 3]"),
    _conv("dw_large_1d", "1, 4, 14", "4, 1, 11", "1, 4, 7", "group=4, pads=[2, 1]"),
]


@pytest.mark.parametrize("case", LARGE_DEPTHWISE, ids=lambda c: c.name)
def test_depthwise_batched_kernel_banded(case: Case) -> None:
    """A run-time batch: the banded GEMM (MatMul + Gather), no one-hot im2col Conv."""
    model = case.model("float", 13)
    vm = check_vmap(model, case.feeds(model), in_axes={"X": 0, "W": 0})
    ops = _ops(vm)
    assert ops["Conv"] == 0 and ops["MatMul"] == 1 and ops["Gather"] >= 1, ops


def test_depthwise_batched_kernel_differentiated() -> None:
    case = LARGE_DEPTHWISE[0]
    vm = onnax.vmap(case.model("float", 13), in_axes={"X": 0, "W": 0})
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)


def test_per_example_depthwise_gradients() -> None:
    """vmap of the weight gradient of a batch-1 depthwise Conv (classic form) over examples
    agrees with a loop, and emits no one-hot im2col."""
    text = (
        "g (float[1, 3, 10, 9] X, float[3, 1, 7, 7] W) => (float[1, 3, 10, 9] Y)"
        " { Y = Conv<group=3, pads=[3, 3, 3, 3]>(X, W) }"
    )
    model = Case("dw7", text).model("float", 13)
    vjp = onnax.vjp(model, ["W"])
    rng = np.random.default_rng(0)
    shapes = {v.name: [int(d) for d in v.shape.dims] for v in vjp.graph.inputs}  # type: ignore[union-attr, arg-type]
    feeds = {name: rng.standard_normal(s).astype(np.float32) for name, s in shapes.items()}
    vm = check_vmap(vjp, feeds, in_axes=[0, None, 0])
    convs = [n for n in vm.graph if n.op_type == "Conv"]
    one_hot = [n for n in convs if n.inputs[1] is not None and n.inputs[1].const_value is not None]
    assert not one_hot, one_hot
