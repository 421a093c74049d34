"""onnax.core.traverse visits what onnx_ir's walks visit, in their order, and sorts as it does."""

from __future__ import annotations

import glob
import os
import random

import onnx_ir as ir
import pytest

from onnax.core import traverse

DATA = os.path.join(os.path.dirname(__file__), "data")

NESTED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, bool c, bool d) => (float[2] y) {
    a = Relu (x)
    y = If (c) <
        then_branch = t () => (float[2] o) {
            o = If (d) <
                then_branch = tt () => (float[2] p) { p = Neg (a) },
                else_branch = te () => (float[2] q) { q = Abs (a) }
            >
        },
        else_branch = e () => (float[2] r) { r = Sigmoid (a) }
    >
}
"""


def _models() -> list[tuple[str, ir.Model]]:
    models = [("nested_if", ir.from_onnx_text(NESTED))]
    for path in sorted(glob.glob(os.path.join(DATA, "*.onnx"))):
        models.append((os.path.basename(path), ir.load(path)))
    return models


@pytest.mark.parametrize(
    ("name", "model"), _models(), ids=lambda p: p if isinstance(p, str) else ""
)
def test_walks_match_onnx_ir(name: str, model: ir.Model) -> None:
    graph = model.graph
    assert traverse.subgraphs(graph) == list(graph.subgraphs())
    assert traverse.model_graphs(model) == list(model.graphs())
    assert list(traverse.all_nodes(graph)) == list(graph.all_nodes())


def test_nested_bodies_are_found() -> None:
    # The model above holds three bodies, one of them two levels deep: a walk that missed the
    # depth would still agree with onnx_ir on a model without nesting.
    assert len(traverse.subgraphs(ir.from_onnx_text(NESTED).graph)) == 4


def test_fixed_nesting_walks_once() -> None:
    graph = ir.from_onnx_text(NESTED).graph
    walked = traverse.subgraphs(graph)
    with traverse.fixed_nesting(graph):
        first = traverse.subgraphs(graph)
        first.clear()  # each call gets a list of its own
        with traverse.fixed_nesting(graph):
            assert traverse.subgraphs(graph) == walked
        assert traverse.subgraphs(graph) == walked
    assert not traverse._FIXED  # the memo ends with the outer block


def _chain(n: int) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    nodes, current = [], x
    for i in range(n):
        node = ir.node("Relu" if i % 2 else "Neg", [current], name=f"n{i}")
        node.outputs[0].name = f"v{i}"
        nodes.append(node)
        # Every third node also reads an earlier value, so the order has several valid forms.
        current = node.outputs[0] if i % 3 else ir.node("Add", [current, x]).outputs[0]
        if not i % 3:
            producer = current.producer()
            assert producer is not None
            producer.name = f"a{i}"
            current.name = f"w{i}"
            nodes.append(producer)
    graph = ir.Graph([x], [current], nodes=nodes, opset_imports={"": 17})
    return ir.Model(graph, ir_version=8)


def _order(model: ir.Model) -> list[str | None]:
    return [n.name for n in model.graph]


def test_sort_of_a_shuffled_graph_is_onnx_irs() -> None:
    model, reference = _chain(30), _chain(30)
    for m in (model, reference):
        nodes = list(m.graph)
        random.Random(0).shuffle(nodes)
        m.graph.extend(nodes)  # re-appending existing nodes moves them to the end
    assert _order(model) == _order(reference)
    assert not traverse._sorted_and_named(model.graph)  # the shuffle broke the order
    traverse.sort(model.graph)
    reference.graph.sort()
    assert _order(model) == _order(reference)


def test_sort_leaves_a_sorted_graph_as_onnx_ir_does() -> None:
    model, reference = _chain(30), _chain(30)
    traverse.sort(model.graph)
    reference.graph.sort()
    assert _order(model) == _order(reference) == [n.name for n in _chain(30).graph]


def test_sort_names_what_onnx_irs_sort_names() -> None:
    # A sorted graph with an unnamed output (a pass cleared it) is not skipped: onnx_ir's sort
    # names it, and the skip must not change what a transform emits.
    model = _chain(6)
    value = next(iter(model.graph)).outputs[0]
    value.name = None
    traverse.sort(model.graph)
    assert value.name is not None


def test_flat_block_knows_a_flat_graph_has_no_subgraphs() -> None:
    flat = ir.from_onnx_text(
        '<ir_version: 8, opset_import: ["" : 17]>\ng (float[2] x) => (float[2] y) { y = Relu (x) }'
    )
    graph = flat.graph
    with traverse.flat_block(graph) as is_flat:
        assert is_flat
        # Nodes without bodies come and go: the answer stays (and no walk is made).
        node = ir.node("Neg", [graph.inputs[0]])
        graph.append(node)
        assert traverse.subgraphs(graph) == []
        with traverse.fixed_nesting(graph):  # nested blocks keep the outer one's answer
            assert traverse.subgraphs(graph) == []
        graph.remove(node, safe=True)
    assert graph not in traverse._FIXED


def test_flat_block_walks_a_graph_with_bodies_as_usual() -> None:
    model = ir.from_onnx_text(NESTED)
    graph = model.graph
    with traverse.flat_block(graph) as is_flat:
        assert not is_flat
        assert len(traverse.subgraphs(graph)) == 4
        outer_if = next(n for n in graph if n.op_type == "If")
        graph.remove(outer_if, safe=False)
        assert traverse.subgraphs(graph) == []  # walked again, not remembered
