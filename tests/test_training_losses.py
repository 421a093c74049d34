"""onnax.training.add_loss against PyTorch-made references and float64 numpy references.

The torch references (tests/data/training/losses.*, made by make_refs.py) hold the loss value
and its gradient with respect to the model output for every case; the gradient here comes from
onnax.grad of the loss model, so the test covers the loss graph and its derivative together.
The numpy references are written from the formulas of the PyTorch documentation, in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from onnax.errors import InvalidModelError, SelectionError
from onnax.training import add_loss
from oracles import check_model_valid, run
from training_models import load_meta, load_refs

REFS = load_refs("losses")
META = load_meta("losses")
CASES: list[dict[str, Any]] = META["cases"]


def identity(shape: list[int | str], dtype: str = "float") -> ir.Model:
    dims = ", ".join(str(d) for d in shape)
    return ir.from_onnx_text(f"""
<ir_version: 10, opset_import: ["" : 17]>
agraph ({dtype}[{dims}] X) => ({dtype}[{dims}] Y) {{ Y = Identity(X) }}
""")


def loss_model(case: dict[str, Any], dtype: str = "float") -> ir.Model:
    return add_loss(
        identity(case["shape"], dtype),
        "Y",
        case["kind"],
        reduction=case.get("reduction", "mean"),
        weight="weight" if case.get("weight") else None,
        probabilities=case.get("probabilities", False),
        label_smoothing=case.get("label_smoothing", 0.0),
        delta=case.get("delta", 1.0),
    )


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_matches_torch_value_and_gradient(case: dict[str, Any]) -> None:
    model = loss_model(case)
    check_model_valid(model)
    name = case["name"]
    feeds = {"X": REFS[f"{name}/x"], "target": REFS[f"{name}/target"]}
    if case.get("weight"):
        feeds["weight"] = REFS[f"{name}/weight"]
    got = run(model, feeds)
    assert got["loss"].shape == () and got["loss"].dtype == np.float32
    np.testing.assert_allclose(got["loss"], REFS[f"{name}/loss"], rtol=2e-6, atol=1e-7)
    g = run(onnax.grad(model, inputs=["X"], output="loss"), feeds)
    np.testing.assert_allclose(g["grad_X"], REFS[f"{name}/grad_x"], rtol=1e-5, atol=1e-7)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def numpy_loss(case: dict[str, Any], feeds: dict[str, np.ndarray]) -> float:
    """The documented formulas of torch.nn.functional, in float64."""
    x, t = feeds["X"], feeds["target"]
    kind, eps = case["kind"], case.get("label_smoothing", 0.0)
    mask = None
    if kind in ("cross_entropy", "nll") and np.issubdtype(t.dtype, np.integer):
        logp = _log_softmax(x) if kind == "cross_entropy" else x
        mask = t != -100
        picked = np.take_along_axis(logp, np.where(mask, t, 0)[:, None], axis=1)[:, 0]
        per = -(1 - eps) * picked - eps / x.shape[1] * logp.sum(axis=1)
        per = per * mask
    elif kind == "cross_entropy":
        soft = t * (1 - eps) + eps / x.shape[1]
        per = -(_log_softmax(x) * soft).sum(axis=1)
    elif kind == "bce_with_logits":
        sig = 1 / (1 + np.exp(-x))
        per = -(t * np.log(sig) + (1 - t) * np.log(1 - sig))
    elif kind == "mse":
        per = (x - t) ** 2
    elif kind == "l1":
        per = np.abs(x - t)
    else:
        d, delta = np.abs(x - t), case.get("delta", 1.0)
        per = np.where(d < delta, 0.5 * d**2, delta * (d - 0.5 * delta))
    if "weight" in feeds:
        per = per * feeds["weight"].reshape([-1] + [1] * (per.ndim - 1))
    if case.get("reduction", "mean") == "sum":
        return float(per.sum())
    return float(per.sum() / (mask.sum() if mask is not None else per.size))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_matches_numpy_in_double(case: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    name = case["name"]
    feeds = {"X": REFS[f"{name}/x"].astype(np.float64) + rng.normal(0, 0.1, case["shape"])}
    target = REFS[f"{name}/target"]
    feeds["target"] = target if target.dtype == np.int64 else target.astype(np.float64)
    if case.get("weight"):
        feeds["weight"] = REFS[f"{name}/weight"].astype(np.float64)
    got = run(loss_model(case, "double"), feeds)["loss"]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, numpy_loss(case, feeds), rtol=1e-12)


def test_bce_gradient_at_zero_logit_is_sigmoid_minus_target() -> None:
    """The stable form's Relu kink sits at x = 0, where the derivative is still 1/2 - t."""
    model = add_loss(identity([2, 2]), "Y", "bce_with_logits", reduction="sum")
    x = np.array([[0.0, 0.0], [0.0, 30.0]], np.float32)
    t = np.array([[0.0, 1.0], [0.25, 1.0]], np.float32)
    got = run(onnax.grad(model, inputs=["X"], output="loss"), {"X": x, "target": t})
    want = 1 / (1 + np.exp(-x.astype(np.float64))) - t
    np.testing.assert_allclose(got["grad_X"], want, atol=1e-7)
    assert np.isfinite(run(model, {"X": -1e4 * np.ones((2, 2), np.float32), "target": t})["loss"])


def test_half_output_gives_float_loss_of_the_widened_values() -> None:
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float16)
    t = np.array([0, 2, 1, 1, 0])
    half = run(add_loss(identity([5, 3], "float16"), "Y", "cross_entropy"), {"X": x, "target": t})
    full = run(
        add_loss(identity([5, 3]), "Y", "cross_entropy"), {"X": x.astype(np.float32), "target": t}
    )
    assert half["loss"].dtype == np.float32
    np.testing.assert_allclose(half["loss"], full["loss"], rtol=1e-6)


def test_existing_target_input_is_used_and_source_untouched() -> None:
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 17]>
agraph (float[4, 3] X, int32[4] labels) => (float[4, 3] Y) { Y = Identity(X) }
""")
    before = ir.to_proto(model).SerializeToString()
    lm = add_loss(model, "Y", "cross_entropy", target="labels", name="ce")
    assert ir.to_proto(model).SerializeToString() == before
    assert [v.name for v in lm.graph.inputs] == ["X", "labels"]
    assert [v.name for v in lm.graph.outputs] == ["Y", "ce"]
    x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 1], np.int32)
    want = numpy_loss({"kind": "cross_entropy"}, {"X": x.astype(np.float64), "target": labels})
    np.testing.assert_allclose(run(lm, {"X": x, "labels": labels})["ce"], want, rtol=1e-6)


# Diagnostics: what failed, found against expected, and a remedy.


def test_unknown_output_lists_outputs() -> None:
    with pytest.raises(SelectionError, match=r"no graph output named 'logits'.*\['Y'\].*Remedy"):
        add_loss(identity([2, 3]), "logits", "mse")


def test_wrong_target_dtype_for_class_indices() -> None:
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 17]>
agraph (float[4, 3] X, float[4] t) => (float[4, 3] Y) { Y = Identity(X) }
""")
    with pytest.raises(
        SelectionError, match=r"target input 't' is FLOAT, expected INT64.*probabilities=True"
    ):
        add_loss(model, "Y", "cross_entropy", target="t")


def test_wrong_target_dtype_for_regression() -> None:
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 17]>
agraph (float[4, 3] X, int64[4, 3] t) => (float[4, 3] Y) { Y = Identity(X) }
""")
    with pytest.raises(
        SelectionError,
        match=r"add_loss\(mse\): target input 't' is INT64, expected a floating-point",
    ):
        add_loss(model, "Y", "mse", target="t")


def test_integer_output_is_refused() -> None:
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 17]>
agraph (int64[4] X) => (int64[4] Y) { Y = Identity(X) }
""")
    with pytest.raises(SelectionError, match=r"output 'Y' is INT64, expected FLOAT16.*Remedy"):
        add_loss(model, "Y", "l1")


def test_class_loss_needs_a_class_axis() -> None:
    with pytest.raises(SelectionError, match=r"shape \[3\], expected rank 2 or more"):
        add_loss(identity([3]), "Y", "nll")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "hinge"}, r"unknown loss kind 'hinge', expected one of \['mse'"),
        ({"kind": "mse", "reduction": "none"}, r"reduction 'none', expected 'mean' or 'sum'"),
        ({"kind": "nll", "label_smoothing": 0.1}, r"applies to 'cross_entropy' only"),
        ({"kind": "mse", "probabilities": True}, r"probabilities=True applies to 'cross_entropy'"),
        ({"kind": "cross_entropy", "label_smoothing": 1.5}, r"expected a value in \[0, 1\]"),
        ({"kind": "huber", "delta": 0.0}, r"delta=0.0, expected a positive"),
    ],
)
def test_bad_options(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        add_loss(identity([2, 3]), "Y", **kwargs)


def test_loss_name_in_use() -> None:
    with pytest.raises(SelectionError, match=r"'X' for the loss output is already used.*name="):
        add_loss(identity([2, 3]), "Y", "mse", name="X")


def test_old_opset_is_refused_with_the_converter() -> None:
    model = ir.from_onnx_text("""
<ir_version: 7, opset_import: ["" : 11]>
agraph (float[2, 3] X) => (float[2, 3] Y) { Y = Identity(X) }
""")
    with pytest.raises(
        InvalidModelError, match=r"opset 11, expected 13 or later.*version_converter"
    ):
        add_loss(model, "Y", "mse")
