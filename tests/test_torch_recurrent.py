"""Recurrent models exported from PyTorch: a 2-layer bidirectional LSTM and the same GRU.

The models (tests/data/torch_{lstm,gru}_2layer_bidir.onnx, written by
examples/export_recurrent_models.py with ``torch.onnx.export(..., dynamo=True)``) map x [5, 2, 3]
through two ONNX LSTM/GRU nodes and a linear head to a rank-0 loss. float32 only: the nodes run
on onnxruntime's float kernels (it has no double ones), which are the finite-difference oracle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from oracles import check_jvp, check_vjp, check_vmap, fd_jvp, run, tolerances

DATA = Path(__file__).parent / "data"
KINDS = ["lstm", "gru"]


def _model(kind: str) -> ir.Model:
    return ir.load(str(DATA / f"torch_{kind}_2layer_bidir.onnx"))


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)}


@pytest.mark.parametrize("kind", KINDS)
def test_model_shape(kind: str) -> None:
    model = _model(kind)
    ops = [n.op_type for n in model.graph]
    assert ops.count(kind.upper()) == 2
    assert [v.name for v in model.graph.outputs] == ["loss"]
    assert (DATA / f"torch_{kind}_2layer_bidir.onnx").stat().st_size < 64 * 1024


@pytest.mark.parametrize("kind", KINDS)
def test_grad(kind: str) -> None:
    model, feeds = _model(kind), _feeds()
    grad = onnax.grad(model)
    got = run(grad, feeds)
    np.testing.assert_allclose(got["loss"], run(model, feeds)["loss"], rtol=1e-6)
    direction = np.random.default_rng(1).standard_normal((5, 2, 3)).astype(np.float32)
    expected = float(fd_jvp(model, feeds, {"x": direction}, ["loss"])["loss"])
    value = float(np.sum(got["grad_x"].astype(np.float64) * direction))
    tol = tolerances(np.dtype(np.float32))
    assert abs(value - expected) <= tol["atol"] + tol["rtol"] * abs(expected), (value, expected)
    check_vjp(model, feeds)


@pytest.mark.parametrize("kind", KINDS)
def test_jvp_of_grad(kind: str) -> None:
    # Hessian-vector products: forward mode through the reverse sweep's Scans.
    grad = onnax.grad(_model(kind))
    check_jvp(grad, _feeds(), outputs=["grad_x"])


@pytest.mark.parametrize("kind", KINDS)
def test_vmap_of_grad(kind: str) -> None:
    grad = onnax.grad(_model(kind))
    check_vmap(grad, _feeds(), in_axes=0)
    check_vmap(grad, _feeds(), in_axes=2, out_axes=-1)


@pytest.mark.parametrize("kind", KINDS)
def test_vjp_with_respect_to_weights(kind: str) -> None:
    model = _model(kind)
    weights = [
        name
        for name, v in model.graph.initializers.items()
        if v.dtype == ir.DataType.FLOAT
        and any(u.node.op_type == kind.upper() and u.idx in (1, 2, 3) for u in v.uses())
    ]
    assert len(weights) == 6  # W, R, B of each layer
    check_vjp(model, _feeds(), inputs=weights)
