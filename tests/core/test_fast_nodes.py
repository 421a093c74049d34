"""onnax.core.fast_nodes: the direct node walk and insertion match onnx_ir's own methods."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from onnax.core import fast_nodes
from onnax.core.fast_nodes import _state, insert_nodes, node_list


def _graph() -> tuple[ir.Graph, list[ir.Node]]:
    x = ir.Value(name="x")
    nodes = [ir.Node("", "Neg", [x], name="a")]
    for op in ("Abs", "Relu", "Exp"):
        nodes.append(ir.Node("", op, [nodes[-1].outputs[0]]))
    graph = ir.Graph([x], [nodes[-1].outputs[0]], nodes=nodes, opset_imports={"": 21})
    return graph, nodes


def test_the_direct_forms_are_in_use() -> None:
    # Should onnx_ir change its layout the module falls back; then this test tells.
    assert fast_nodes._LIST is fast_nodes._list_direct
    assert fast_nodes._INSERT is fast_nodes._insert_direct


def test_node_list_is_list_of_the_graph_after_edits() -> None:
    graph, nodes = _graph()
    graph.remove(nodes[2], safe=False)
    graph.insert_after(nodes[0], [ir.Node("", "Sin", [nodes[0].outputs[0]])])
    assert node_list(graph) == list(graph)
    assert node_list(ir.Graph([], [], nodes=[])) == []


@pytest.mark.parametrize("anchor", [None, 0, 1, 3])
def test_insert_nodes_matches_insert_after_and_extend(anchor: int | None) -> None:
    states = []
    for insert in (fast_nodes._insert_by_calls, fast_nodes._insert_direct):
        graph, nodes = _graph()
        y = nodes[0].outputs[0]
        new = [
            ir.Node("", "Sin", [y]),  # unnamed node and output: the authority names them
            ir.Node("", "Cos", [y], name="cos", outputs=[ir.Value(name="c")]),
            nodes[2],  # already in the graph: moved
        ]
        insert(graph, None if anchor is None else nodes[anchor], new)
        states.append(_state(graph))
        assert node_list(graph) == list(graph)
    assert states[0] == states[1]


def test_insert_nodes_refuses_a_node_of_another_graph() -> None:
    graph, nodes = _graph()
    other, _ = _graph()
    with pytest.raises(ValueError, match="belongs to another graph"):
        insert_nodes(graph, nodes[0], [next(iter(other))])
    stranger = ir.Node("", "Neg", [ir.Value(name="z")])
    with pytest.raises(ValueError, match="not in the list"):
        insert_nodes(graph, stranger, [ir.Node("", "Abs", [nodes[0].outputs[0]])])


def test_the_slots_hot_walks_read_are_what_the_properties_return() -> None:
    # inference, broadcast_dims, inferred, traverse, shape_fill and cleanup read these slots
    # directly in their walks over every node: should onnx_ir keep them otherwise, this fails.
    body = ir.Graph([], [], nodes=[], name="body")
    node = ir.Node(
        "ai.onnx",
        "If",
        [ir.Value(name="c")],
        attributes=[ir.AttrGraph("then_branch", body), ir.AttrInt64("k", 1)],
    )
    assert node._op_type == node.op_type == "If"
    assert node._domain == node.domain
    assert node._attributes is node.attributes
    assert node._attributes.data == dict(node.attributes)
    assert [a._type for a in node._attributes.data.values()] == [
        a.type for a in node.attributes.values()
    ]


def test_the_value_slots_hot_walks_read_are_what_the_properties_return() -> None:
    # inferred's records and checks read a value's slots directly for every output.
    tensor = ir.tensor(np.ones((2, 3), np.float32))
    c = ir.Value(name="c", const_value=tensor)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, "n"]))
    node = ir.Node("", "Add", [x, c])
    y = node.outputs[0]
    y.shape = ir.Shape([2, 3])
    y.type = ir.TensorType(ir.DataType.FLOAT)
    graph = ir.Graph([x], [y], nodes=[node], opset_imports={"": 21})
    for v in (x, c, y):
        assert v._shape is v.shape
        assert v._type is v.type
        assert v._const_value is v.const_value
        assert v._is_graph_output == v.is_graph_output()
        if v.shape is not None:
            assert tuple(v._shape._dims) == v.shape.dims
    assert y._is_graph_output and graph.outputs[0] is y
