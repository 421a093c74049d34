"""The depthwise weight gradient of one example as one GEMM per channel (``toeplitz``).

Checked against central differences and the adjoint identity (``run_case``) on the geometries
it takes: square and rectangular maps and kernels, symmetric, uneven and no pads, a channels-
last cotangent (convnext's depthwise Conv feeds a Transpose to NHWC); and structurally: the
form is taken exactly where :func:`toeplitz_fits` says (one example, stride and dilation 1,
more than 16 kernel elements, at least 64 output positions) and computes the gradient with one
MatMul, no Conv.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from oracles import check_vmap
from rules.test_conv import _conv
from rules.test_conv_grad import _weight_gradient_ops

CASES = [
    _conv("toeplitz_7x7", "1, 3, 9, 9", "3, 1, 7, 7", "1, 3, 9, 9", "group=3, pads=[3, 3, 3, 3]"),
    _conv(
        "toeplitz_rectangular",
        "1, 2, 11, 8",
        "2, 1, 3, 7",
        "1, 2, 11, 6",
        "group=2, pads=[1, 2, 1, 2]",
    ),
    _conv(
        "toeplitz_uneven_pads",
        "1, 4, 9, 10",
        "4, 1, 5, 5",
        "1, 4, 9, 8",
        "group=4, pads=[3, 0, 1, 2]",
    ),
    _conv("toeplitz_no_pads", "1, 2, 12, 13", "2, 1, 5, 6", "1, 2, 8, 8", "group=2"),
    _conv(
        "toeplitz_bias",
        "1, 3, 8, 8",
        "3, 1, 5, 5",
        "1, 3, 8, 8",
        "group=3, pads=[2, 2, 2, 2]",
        bias="3",
    ),
    Case(
        "toeplitz_channels_last",
        "g ({T}[1, 4, 10, 9] X, {T}[4, 1, 7, 7] W) => ({T}[1, 10, 9, 4] Y) {"
        " C = Conv<group=4, pads=[3, 3, 3, 3]>(X, W)"
        " Y = Transpose<perm=[0, 2, 3, 1]>(C) }",
        opsets=(13,),
        dtypes=("float",),
    ),
]

NOT_TAKEN = [
    # A batch: the banded GEMM; strided, dilated or fewer than 64 output positions: the classic
    # Conv; 16 taps or fewer: the per-offset shifts.
    _conv("batch", "2, 3, 9, 9", "3, 1, 7, 7", "2, 3, 9, 9", "group=3, pads=[3, 3, 3, 3]"),
    _conv("strided", "1, 3, 9, 9", "3, 1, 5, 5", "1, 3, 3, 3", "group=3, strides=[2, 2]"),
    _conv("dilated", "1, 3, 11, 11", "3, 1, 5, 5", "1, 3, 3, 3", "group=3, dilations=[2, 2]"),
    _conv("small_kernel", "1, 3, 9, 9", "3, 1, 4, 4", "1, 3, 6, 6", "group=3"),
    _conv("small_map", "1, 3, 7, 7", "3, 1, 7, 7", "1, 3, 7, 7", "group=3, pads=[3, 3, 3, 3]"),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_taken_one_product_no_conv(name: str) -> None:
    ops = _weight_gradient_ops(next(c for c in CASES if c.name == name))
    assert ops["MatMul"] == 1 and ops["Expand"] == 1, ops
    assert ops["Conv"] == 0, ops


@pytest.mark.parametrize("name", [c.name for c in NOT_TAKEN])
def test_not_taken(name: str) -> None:
    ops = _weight_gradient_ops(next(c for c in NOT_TAKEN if c.name == name))
    assert ops["Expand"] == 0, ops


def test_matches_numpy_at_convnext_size() -> None:
    """A convnext-tiny stage-0 map (56x56x96, 7x7, pads 3), against a float64 numpy sum."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 96, 56, 56)).astype(np.float32)
    g = rng.standard_normal((1, 96, 56, 56)).astype(np.float32)
    w = rng.standard_normal((96, 1, 7, 7)).astype(np.float32)
    case = _conv(
        "convnext", "1, 96, 56, 56", "96, 1, 7, 7", "1, 96, 56, 56", "group=96, pads=[3, 3, 3, 3]"
    )
    grad = onnax.vjp(case.model("float", 13), ["W"])
    assert _weight_gradient_ops(case)["MatMul"] == 1
    session = ort.InferenceSession(
        ir.serde.serialize_model(grad).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (dw,) = session.run(["adj_W"], {"X": x, "W": w, "adj_Y": g})
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (3, 3), (3, 3)))
    expected = np.empty((96, 1, 7, 7))
    for a in range(7):
        for b in range(7):
            window = padded[0, :, a : a + 56, b : b + 56]
            expected[:, 0, a, b] = np.einsum("cij,cij->c", g[0].astype(np.float64), window)
    np.testing.assert_allclose(dw, expected, rtol=2e-5, atol=2e-4)


@pytest.mark.parametrize("name", ["toeplitz_7x7", "toeplitz_uneven_pads", "toeplitz_bias"])
def test_vmap_of_weight_gradient(name: str) -> None:
    """Per-example weight gradients (vmap of the batch-1 vjp): the Toeplitz form batched by
    the Gather, Pad, Expand, Slice and MatMul rules, against a loop of single runs."""
    case = next(c for c in CASES if c.name == name)
    grad = onnax.vjp(case.model("float", 13), ["W"])
    assert _weight_gradient_ops(case)["Expand"] == 1
    rng = np.random.default_rng(4)
    feeds = {
        v.name: rng.standard_normal([int(d) for d in v.shape.dims]).astype(np.float32)
        for v in grad.graph.inputs
    }
    axes = {v.name: (0 if v.name in ("X", "adj_Y") else None) for v in grad.graph.inputs}
    check_vmap(grad, feeds, in_axes=axes)
