"""Removing many graph inputs at once: the skeleton's demoted weights, the tangent inputs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

import onnax
from onnax.core.skeleton import SKELETON_MAX_ELEMENTS, skeleton_proto
from onnax.passes.transpose import _drop_inputs


def _weighted_model(weights: int) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([4, 4]))
    size = SKELETON_MAX_ELEMENTS + 4  # large enough to be demoted
    values, nodes, y = [], [], x
    for i in range(weights):
        w = ir.Value(name=f"w{i}", const_value=ir.tensor(np.ones((size,), np.float32)))
        w.type, w.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([size])
        values.append(w)
        reduced = ir.Node("", "ReduceSum", [w], attributes=[ir.AttrInt64("keepdims", 0)])
        add = ir.Node("", "Add", [y, reduced.outputs[0]])
        nodes += [reduced, add]
        y = add.outputs[0]
    loss = ir.Node("", "ReduceSum", [y], attributes=[ir.AttrInt64("keepdims", 0)])
    nodes.append(loss)
    y = loss.outputs[0]
    y.name = "y"
    # One weight is a graph input too (an overridable initializer): it stays an input.
    graph = ir.Graph(
        [x, values[1]], [y], nodes=nodes, initializers=values, opset_imports={"": 21}, name="g"
    )
    return ir.Model(graph, ir_version=10)


def test_skeleton_gives_back_the_inputs_and_initializers_as_they_were() -> None:
    model = _weighted_model(6)
    graph = model.graph
    before = (list(graph.inputs), list(graph.initializers.items()))
    flags = [(v.is_graph_input(), v.is_initializer(), v.graph) for v in graph.initializers.values()]
    proto, appended = skeleton_proto(model)
    assert appended == ["w0", "w2", "w3", "w4", "w5"]
    assert [i.name for i in proto.graph.input] == ["x", "w1", *appended]
    assert (list(graph.inputs), list(graph.initializers.items())) == before
    after = [(v.is_graph_input(), v.is_initializer(), v.graph) for v in graph.initializers.values()]
    assert after == flags
    assert all(v.const_value is not None for v in graph.initializers.values())


def test_drop_inputs_keeps_the_others_in_order() -> None:
    a, t1, b, t2 = (ir.Value(name=n) for n in ("a", "t1", "b", "t2"))
    graph = ir.Graph([a, t1, b, t2], [], nodes=[])
    _drop_inputs(graph, {t1, t2})
    assert list(graph.inputs) == [a, b]
    assert a.is_graph_input() and b.is_graph_input() and a.graph is graph
    assert not t1.is_graph_input() and not t2.is_graph_input() and t1.graph is None
    _drop_inputs(graph, {t1})  # nothing to drop: unchanged
    assert list(graph.inputs) == [a, b]


def test_a_gradient_wrt_many_weights_keeps_the_interface() -> None:
    model = _weighted_model(5)
    result = onnax.grad(model, inputs=["x", *(f"w{i}" for i in range(5))], output="y")
    assert [v.name for v in result.graph.inputs] == ["x", "w1"]
    outputs = [v.name for v in result.graph.outputs]
    assert outputs == ["y", "grad_x", *(f"grad_w{i}" for i in range(5))]
