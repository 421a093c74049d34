"""prepare and cleanup as onnx_ir passes: steps that run, compose and fail on their own."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes as passes
import pytest

from onnax.core.opsets import MIN_OPSET
from onnax.errors import InvalidModelError
from onnax.passes.cleanup import Cleanup, RemoveDeadNodes, cleanup
from onnax.passes.inline_if import SimplifyControlFlow
from onnax.passes.prepare import CheckModel, CloneSource, InferShapes, Prepare, prepare
from onnax.passes.steps import Steps
from onnax.passes.upgrade import UPGRADE_OPSET, UpgradeOpset
from oracles import run, serialized

TANH = """<ir_version: 10, opset_import: ["" : 18]>
g (float[2, 3] x) => (float[2, 3] y) { t = Tanh(x) y = Mul(t, x) }"""

UPSAMPLE_9 = """<ir_version: 4, opset_import: ["" : 9]>
g (float[1, 1, 3] x) => (float[1, 1, 6] y) {
    s = Constant <value = float[3] {1.0, 1.0, 2.0}> ()
    y = Upsample <mode = "linear"> (x, s)
}"""


def test_prepare_is_functional_and_cleanup_in_place() -> None:
    assert not Prepare("jvp").in_place and not Prepare("jvp").changes_input
    assert Cleanup().in_place
    source = ir.from_onnx_text(TANH)
    before = serialized(source)
    prepared = Prepare("jvp")(source).model
    assert prepared is not source
    assert serialized(source) == before
    assert cleanup(prepared) is prepared


def test_the_wrapper_is_the_sequence() -> None:
    source = ir.from_onnx_text(TANH)
    assert serialized(prepare(source, "jvp")) == serialized(Prepare("jvp")(source).model)


def test_a_step_error_reaches_the_caller_unwrapped() -> None:
    """onnx_ir's Sequential wraps errors in PassError; the user must see the model's error."""
    bad = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (float[3] x) => (float[3] y) { y = Transpose <perm = [0, 0]> (x) }"""
    )
    with pytest.raises(InvalidModelError, match=r"jvp: the model fails onnx.checker: .*perm"):
        Prepare("jvp")(bad)
    with pytest.raises(TypeError, match=r"vjp: expected an onnx_ir.Model, got str"):
        Prepare("vjp")("model.onnx")  # type: ignore[arg-type]
    wrapped = passes.Sequential(CloneSource("jvp"), CheckModel("jvp"))
    with pytest.raises(passes.PassError):
        wrapped(bad)


def test_upgrade_converts_in_place_and_keeps_the_sampling() -> None:
    """The step alone: onnxruntime runs the opset-9 source and the converted model alike."""
    source = ir.from_onnx_text(UPSAMPLE_9)
    x = {"x": np.array([[[0.0, 1.0, 2.0]]], np.float32)}
    expected = run(source, x)["y"]
    model = CloneSource("jvp")(source).model
    result = UpgradeOpset("jvp")(model)
    assert result.model is model and result.modified
    assert model.opset_imports[""] == UPGRADE_OPSET >= MIN_OPSET
    assert [n.op_type for n in model.graph if n.op_type != "Constant"] == ["Resize"]
    np.testing.assert_allclose(run(model, x)["y"], expected)


def test_upgrade_refuses_a_newer_opset_than_onnx_knows() -> None:
    model = ir.from_onnx_text(TANH)
    model.opset_imports[""] = 99
    with pytest.raises(InvalidModelError, match=r"grad: .*opset 99, newer than .*Upgrade the onnx"):
        UpgradeOpset("grad")(model)


def test_steps_compose_in_another_order() -> None:
    """A reader can reuse steps: inline a constant If, then infer, then drop what is dead."""
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (float[3] x) => (float[3] y) {
            c = Constant <value = bool {0}> ()
            unused = Exp(x)
            y = If (c) <then_branch = t () => (float[3] a) { a = Sin(x) },
                        else_branch = e () => (float[3] b) { b = Cos(x) }>
        }"""
    )
    out = Steps(CloneSource("jvp"), SimplifyControlFlow(), InferShapes(), RemoveDeadNodes())(
        model
    ).model
    assert [n.op_type for n in out.graph] == ["Cos"]
    assert out.graph.outputs[0].shape == ir.Shape([3])
    xs = {"x": np.array([0.1, 0.2, 0.3], np.float32)}
    np.testing.assert_allclose(run(out, xs)["y"], np.cos(xs["x"]), rtol=1e-6)


def test_check_passes_over_a_lowered_operator_inside_a_body_only() -> None:
    """The operators to hide are found on the model, subgraphs included; others still fail."""
    text = (
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[2, 6] x, float[6] s, bool c) => (float[2, 6] y) {\n"
        "  y = If (c) <\n"
        "    then_branch = t () => (float[2, 6] a) {\n"
        "      a = SimplifiedLayerNormalization<epsilon = 1e-5>(x, s) },\n"
        "    else_branch = e () => (float[2, 6] b) { b = {op} (x) }\n"
        "  >\n"
        "}"
    )
    source = ir.from_onnx_text(text.replace("{op}", "Relu"))
    model = CloneSource("jvp")(source).model
    CheckModel("jvp")(model)
    assert {n.domain for n in model.graph.all_nodes()} == {""}  # the proto's copy only
    refused = CloneSource("jvp")(ir.from_onnx_text(text.replace("{op}", "NoSuchOperator"))).model
    with pytest.raises(InvalidModelError, match="NoSuchOperator"):
        CheckModel("jvp")(refused)
