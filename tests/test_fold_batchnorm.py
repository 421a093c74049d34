"""Conv -> BatchNormalization folded into one Conv before differentiation (passes.fold_batchnorm).

Every derivative, w.r.t. the data and each of the six parameters (the Conv's weight and bias,
the scale, the shift, the running mean and the variance), is checked against central
differences and the adjoint identity; the structure checks say when the fold happened.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import onnax
import onnax.passes.linearize as linearize_module
from oracles import check_adjoint, check_grad, check_jvp, check_vjp, run

PARAMS = ["w1", "c1b", "s", "b", "m", "v"]

_TYPES = {
    "float16": onnx.TensorProto.FLOAT16,
    "float": onnx.TensorProto.FLOAT,
    "double": onnx.TensorProto.DOUBLE,
}
_NUMPY = {"float16": np.float16, "float": np.float32, "double": np.float64}


def _model(
    dtype: str = "float",
    group: int = 1,
    bias: bool = True,
    opset: int = 17,
    extra: str | None = None,
    batch: str | int = "N",
    attrs: dict[str, int] | None = None,
) -> ir.Model:
    """Conv (``group``) -> BatchNormalization -> Tanh -> Conv -> ReduceSum ``loss``.

    ``extra``: ``"reader"`` adds a second reader of the first Conv's output, ``"output"`` makes
    it a graph output.
    """
    rng = np.random.default_rng(3)
    np_type = _NUMPY[dtype]
    weights = {
        "w1": rng.standard_normal((6, 4 // group, 3, 3)) * 0.3,
        "c1b": rng.standard_normal(6),
        "s": rng.standard_normal(6),
        "b": rng.standard_normal(6),
        "m": rng.standard_normal(6),
        "v": np.abs(rng.standard_normal(6)) + 0.5,
        "w2": rng.standard_normal((2, 6, 1, 1)),
    }
    conv_inputs = ["x", "w1", "c1b"] if bias else ["x", "w1"]
    if not bias:
        del weights["c1b"]
    nodes = [
        helper.make_node("Conv", conv_inputs, ["c1"], pads=[1, 1, 1, 1], group=group),
        helper.make_node(
            "BatchNormalization",
            ["c1", "s", "b", "m", "v"],
            ["n1", "rm", "rv"] if attrs and attrs.get("training_mode") else ["n1"],
            **(attrs or {}),
        ),
        helper.make_node("Tanh", ["n1"], ["h"]),
        helper.make_node("Conv", ["h", "w2"], ["y"]),
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
    ]
    elem = _TYPES[dtype]
    outputs = [helper.make_tensor_value_info("loss", elem, [])]
    if extra == "reader":
        nodes.append(helper.make_node("Sin", ["c1"], ["side"]))
        outputs.append(helper.make_tensor_value_info("side", elem, [batch, 6, 5, 6]))
    if extra == "output":
        outputs.append(helper.make_tensor_value_info("c1", elem, [batch, 6, 5, 6]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, [batch, 4, 5, 6])],
        outputs,
        [numpy_helper.from_array(a.astype(np_type), n) for n, a in weights.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ir.from_proto(proto)


def _feeds(dtype: str = "float", batch: int = 2) -> dict[str, np.ndarray]:
    x = np.random.default_rng(4).standard_normal((batch, 4, 5, 6))
    return {"x": x.astype(_NUMPY[dtype])}


def _ops(model: ir.Model) -> Counter[str]:
    return Counter(n.op_type for n in model.graph)


@pytest.mark.parametrize("opset", [11, 15, 18])
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_every_derivative_through_the_folded_conv(opset: int, group: int, bias: bool) -> None:
    """jvp, vjp and grad w.r.t. the data and every parameter, against differences; the
    derivative models hold no BatchNormalization and one Conv in the forward sweep per unit."""
    model = _model(group=group, bias=bias, opset=opset)
    feeds = _feeds()
    inputs = ["x", *[p for p in PARAMS if bias or p != "c1b"]]
    jm = check_jvp(model, feeds, inputs)
    vm = check_vjp(model, feeds, inputs)
    gm = check_grad(model, feeds, inputs, "loss")
    check_adjoint(model, feeds, inputs)
    for derived in (jm, vm, gm):
        assert _ops(derived)["BatchNormalization"] == 0, _ops(derived)
    # The folded Conv reads the weight through the fold's nodes, not the weight itself.
    forward = [n for n in gm.graph if n.op_type == "Conv" and n.inputs[0].name == "x"]
    assert len(forward) == 1 and forward[0].inputs[1].name != "w1", forward


def test_the_fold_changes_only_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gradient of every parameter with the fold agrees with the one differentiated node by
    node through the BatchNormalization, to float32 rounding."""
    wrt = ["x", *PARAMS]
    folded = onnax.grad(_model(), wrt, "loss")
    monkeypatch.setattr(linearize_module, "fold_batch_norms", lambda *args: 0)
    plain = onnax.grad(_model(), wrt, "loss")
    assert _ops(plain)["BatchNormalization"] >= 1 and _ops(folded)["BatchNormalization"] == 0
    got, want = run(folded, _feeds()), run(plain, _feeds())
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("extra", ["reader", "output"])
def test_a_conv_output_read_elsewhere_is_not_folded(extra: str) -> None:
    """The Conv's output is kept (and so is the BatchNormalization) when something else
    reads it or it is a graph output."""
    model = _model(extra=extra)
    gm = check_grad(model, _feeds(), ["x", *PARAMS], "loss")
    assert _ops(gm)["BatchNormalization"] >= 1


def test_stopped_conv_output_is_not_folded() -> None:
    """A stop_gradient cut on the Conv's output stays where the user put it; the scale's
    gradient goes through xhat as before."""
    model = _model()
    gm = onnax.grad(model, ["s"], "loss", stop_gradient=["c1"])
    assert _ops(gm)["BatchNormalization"] >= 1
    check_grad(model, _feeds(), ["s"], "loss", transformed=gm)


def test_training_mode_is_not_folded() -> None:
    """training_mode=1 normalises with the batch's statistics: no fold, the rule differentiates it."""
    model = _model(opset=15, attrs={"training_mode": 1})
    gm = check_grad(model, _feeds(batch=3), ["x", "w1", "s", "b"], "loss")
    assert sum(1 for n in gm.graph if n.op_type == "Conv" and n.inputs[1].name == "w1") >= 1


def test_half_precision_is_not_folded() -> None:
    """A float16 factor would round the folded weight: the pair stays as it is."""
    gm = onnax.grad(_model("float16"), ["x", *PARAMS], "loss")
    assert _ops(gm)["BatchNormalization"] >= 1


def test_weight_larger_than_the_activation_is_not_folded() -> None:
    """With a 1x1 output per example the folded weight's gradient would cost more passes over
    the weight than the fold saves over the activation: kept (module doc's measurement)."""
    rng = np.random.default_rng(5)
    weights = {
        "w": rng.standard_normal((8, 16, 3, 3)),
        "s": rng.standard_normal(8),
        "b": rng.standard_normal(8),
        "m": rng.standard_normal(8),
        "v": np.abs(rng.standard_normal(8)) + 0.5,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
        helper.make_node("ReduceSum", ["n"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 1, 1])],
        [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    feeds = {"x": rng.standard_normal((1, 16, 1, 1)).astype(np.float32)}
    gm = check_grad(model, feeds, ["x", "w", "s"], "loss")
    assert _ops(gm)["BatchNormalization"] >= 1


@pytest.mark.parametrize("bias", [True, False])
def test_undifferentiated_parameters_fold_into_new_initializers(bias: bool) -> None:
    """W.r.t. the data only, the folded weight and bias are computed at transform time: the
    derivative model holds one Conv reading two new initializers, no nodes over the
    parameters, and the source keeps its own tensors, unchanged."""
    model = _model(bias=bias)
    before = ir.to_proto(model).SerializeToString()
    vm = check_vjp(model, _feeds(), ["x"])
    check_adjoint(model, _feeds(), ["x"])
    assert ir.to_proto(model).SerializeToString() == before
    (forward,) = [n for n in vm.graph if n.op_type == "Conv" and n.inputs[0].name == "x"]
    folded = [v for v in forward.inputs[1:] if v is not None]
    assert len(folded) == 2 and all(v.is_initializer() for v in folded), folded
    assert all(v.name not in model.graph.initializers for v in folded), folded
    assert not {"BatchNormalization", "Sqrt", "Div"} & set(_ops(vm)), _ops(vm)
