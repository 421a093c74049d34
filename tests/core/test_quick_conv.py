"""The quick rules of Conv, pooling and BatchNormalization change nothing that inference finds.

As in ``test_quick_infer.py``: each model is inferred with the quick inference and without it
(every node by onnx_shape_inference), and every value's type, dimensions and constant must be
equal; the models cover explicit, VALID and SAME paddings, strides, dilations, groups, a
``kernel_shape`` attribute, 1-D to 3-D, a symbolic batch and (left to the engine) a symbolic
spatial size.
"""

from __future__ import annotations

import onnx_ir as ir
import pytest

from core.test_quick_infer import _compare
from onnax.core import quick_infer
from onnax.core.inference import _settled_constants, infer_shapes
from onnax.core.quick_rules import handler

CONVS = {
    "plain": ("[N, 3, 9, 9]", "[4, 3, 3, 3]", ""),
    "pads strides": ("[N, 3, 9, 8]", "[4, 3, 3, 2]", "<pads = [1, 0, 2, 1], strides = [2, 3]>"),
    "dilations": ("[1, 3, 11, 11]", "[4, 3, 3, 3]", "<dilations = [2, 3]>"),
    "valid": ("[2, 3, 7, 7]", "[4, 3, 2, 2]", '<auto_pad = "VALID", strides = [2, 2]>'),
    "same upper": ("[N, 3, 7, 6]", "[4, 3, 3, 3]", '<auto_pad = "SAME_UPPER", strides = [2, 2]>'),
    "same lower": ("[N, 3, 5, 5]", "[4, 3, 2, 2]", '<auto_pad = "SAME_LOWER">'),
    "groups": ("[N, 4, 6, 6]", "[4, 1, 3, 3]", "<group = 4, pads = [1, 1, 1, 1]>"),
    "kernel attribute": ("[N, 3, 8, 8]", "[4, 3, 3, 3]", "<kernel_shape = [3, 3]>"),
    "1-d": ("[N, 2, 10]", "[3, 2, 4]", "<strides = [3]>"),
    "3-d": ("[1, 2, 5, 6, 7]", "[3, 2, 2, 3, 2]", "<pads = [0, 1, 0, 1, 0, 1]>"),
    "symbolic size": ("[N, 3, H, 9]", "[4, 3, 3, 3]", ""),
}


def _model(x: str, w: str, attrs: str) -> ir.Model:
    text = f"""<ir_version: 10, opset_import: ["" : 21]>
    g (float{x} x, float{w} w, float[C] b) => (float y) {{
        c = Conv {attrs} (x, w)
        r = Relu (c)
        s = Conv {attrs} (r, w)
        y = ReduceSum <keepdims = 0> (s)
    }}"""
    return ir.from_onnx_text(text)


@pytest.mark.parametrize("case", CONVS)
def test_conv_infers_the_same(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x, w, attrs = CONVS[case]
    model = _model(x, w, attrs)
    model.graph.outputs[0].shape = ir.Shape([])
    _compare(model, monkeypatch, infer_shapes)


POOLS = {
    "max": ("MaxPool", "[N, 3, 9, 9]", "<kernel_shape = [3, 3], strides = [2, 2]>"),
    "max ceil": (
        "MaxPool",
        "[1, 3, 8, 7]",
        "<kernel_shape = [3, 2], strides = [2, 2], ceil_mode = 1>",
    ),
    "max pads": ("MaxPool", "[N, 2, 6, 6]", "<kernel_shape = [3, 3], pads = [1, 1, 1, 1]>"),
    "max dilations": ("MaxPool", "[N, 2, 9, 9]", "<kernel_shape = [2, 2], dilations = [2, 3]>"),
    "max same": (
        "MaxPool",
        "[N, 2, 7, 5]",
        '<kernel_shape = [3, 3], auto_pad = "SAME_UPPER", strides = [2, 2]>',
    ),
    "average": ("AveragePool", "[N, 3, 9, 9]", "<kernel_shape = [2, 2], strides = [2, 2]>"),
    "average ceil": (
        "AveragePool",
        "[2, 3, 10]",
        "<kernel_shape = [3], strides = [3], ceil_mode = 1, pads = [0, 2]>",
    ),
    "global average": ("GlobalAveragePool", "[N, 3, 4, 5]", ""),
    "global max": ("GlobalMaxPool", "[N, 3, 4, 5, 2]", ""),
    "symbolic size": ("MaxPool", "[N, 3, H, 9]", "<kernel_shape = [2, 2]>"),
}


@pytest.mark.parametrize("case", POOLS)
def test_pooling_infers_the_same(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    op_type, x, attrs = POOLS[case]
    model = ir.from_onnx_text(
        f"""<ir_version: 10, opset_import: ["" : 21]>
        g (float{x} x) => (float y) {{
            p = {op_type} {attrs} (x)
            r = Relu (p)
            y = ReduceSum <keepdims = 0> (r)
        }}"""
    )
    model.graph.outputs[0].shape = ir.Shape([])
    _compare(model, monkeypatch, infer_shapes)


def test_batch_normalization_infers_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 21]>
        g (float[N, 3, 5, 5] x, float[3] s, float[3] b, float[3] m, float[3] v) => (float y) {
            n = BatchNormalization <epsilon = 0.001> (x, s, b, m, v)
            r = Relu (n)
            y = ReduceSum <keepdims = 0> (r)
        }"""
    )
    model.graph.outputs[0].shape = ir.Shape([])
    _compare(model, monkeypatch, infer_shapes)


def test_the_rules_are_used() -> None:
    """Not vacuous: Conv and BatchNormalization nodes are settled by the quick inference."""
    for op_type in ("Conv", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool"):
        assert handler(op_type, 21) is not None
    model = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 21]>
        g (float[1, 3, 8, 8] x) => (float[1, 4, 6, 6] y) {
            w = Constant <value = float[4, 3, 3, 3] {"""
        + ", ".join(["0.5"] * 108)
        + """}> ()
            c = Conv (x, w)
            y = Relu (c)
        }"""
    )
    constant = model.graph.node(0)  # as prepare's copy has it: the output holds its tensor
    constant.outputs[0].const_value = constant.attributes["value"].as_tensor()
    infer_shapes(model)
    conv = model.graph.node(1).outputs[0]
    conv.shape, conv.type = None, None
    settled = quick_infer.settle(model, set(_settled_constants(model)))
    assert any(node.op_type == "Conv" for node in settled)
    assert conv.shape is not None and list(conv.shape.numpy()) == [1, 4, 6, 6]
