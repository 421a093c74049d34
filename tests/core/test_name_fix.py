"""The flat name fix gives exactly the names onnx_ir's NameFixPass gives (the oracle)."""

from __future__ import annotations

import random

import onnx_ir as ir
import onnx_ir.passes.common as common
import pytest

from onnax.core.name_fix import fix_names_flat

_NAMES = ["", None, "a", "b", "a_1", "v", "v_1", "node", "node_1", "x"]


def _random_model(seed: int) -> ir.Model:
    """A chain of Add/Relu nodes whose values and nodes draw names from a small, clashing pool."""
    rng = random.Random(seed)
    x = ir.Value(name=rng.choice(_NAMES), type=ir.TensorType(ir.DataType.FLOAT))
    inputs = [x]
    if rng.random() < 0.5:
        inputs.append(ir.Value(name=rng.choice(_NAMES), type=ir.TensorType(ir.DataType.FLOAT)))
    init = ir.Value(name=rng.choice(["w", "a", "v", "w_1"]), const_value=ir.tensor([1.0]))
    values = [*inputs, init]
    nodes = []
    for _ in range(rng.randrange(1, 25)):
        op = rng.choice(["Add", "Relu"])
        args = [rng.choice(values)] + ([rng.choice(values)] if op == "Add" else [])
        node = ir.node(op, args)
        nodes.append(node)
        values.append(node.outputs[0])
    outputs = [nodes[-1].outputs[0]]
    if rng.random() < 0.5:
        outputs.append(rng.choice(values[len(inputs) + 1 :]))
    graph = ir.Graph(inputs, outputs, nodes=nodes, initializers=[init], opset_imports={"": 21})
    # Named after construction: the graph names what it receives, and clashes are the point.
    for node in nodes:
        node.name = rng.choice(_NAMES)
        node.outputs[0].name = rng.choice(_NAMES)
    return ir.Model(graph, ir_version=10)


def _names(model: ir.Model) -> list[object]:
    graph = model.graph
    return [
        [v.name for v in graph.inputs],
        [v.name for v in graph.outputs],
        list(graph.initializers),
        [(n.name, [v.name for v in n.inputs if v is not None], [v.name for v in n.outputs])
         for n in graph],
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(200))
def test_same_names_as_name_fix_pass(seed: int) -> None:
    mine, theirs = _random_model(seed), _random_model(seed)
    assert _names(mine) == _names(theirs)
    modified = fix_names_flat(mine)
    expected = common.NameFixPass()(theirs).modified
    assert _names(mine) == _names(theirs)
    assert modified == expected


def test_declines_models_with_subgraphs() -> None:
    cond = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL))
    branch = ir.Graph([], [], nodes=[], opset_imports={"": 21})
    node = ir.node("If", [cond], attributes={"then_branch": branch, "else_branch": branch})
    graph = ir.Graph([cond], [], nodes=[node], opset_imports={"": 21})
    model = ir.Model(graph, ir_version=10)
    node.name = None
    assert fix_names_flat(model) is None
    assert node.name is None
