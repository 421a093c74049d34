"""Simplifying control flow before any transform.

* An If whose condition is a constant (a Constant node or an initializer that is not also a
  graph input) always takes the same branch: the branch's nodes replace it, so no transform
  ever sees the branch that is never taken.
* A Loop without a condition input gets an explicit true condition (and a body that always
  continues, which is what ONNX means by an absent condition): onnx_shape_inference refuses
  the absent one.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnax.core.subgraphs import graph_attributes, name_values

__all__ = ["simplify_control_flow"]


def simplify_control_flow(model: ir.Model) -> None:
    """Inlines constant-condition Ifs and makes Loop conditions explicit, in place."""
    _simplify(model.graph)
    # Graphs name inserted values with their own counters: keep names unique across scopes.
    name_values(model)


def _constant_condition(value: ir.Value | None) -> bool | None:
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    array = tensor.numpy()
    if array.size != 1:
        return None
    return bool(array.reshape(-1)[0])


def _simplify(graph: ir.Graph) -> None:
    changed = True
    while changed:
        changed = False
        for node in list(graph):
            if node.domain != "":
                continue
            if node.op_type == "If":
                taken = _constant_condition(node.inputs[0])
                if taken is not None and _inline(graph, node, taken):
                    changed = True
            elif node.op_type == "Loop" and len(node.inputs) >= 2 and node.inputs[1] is None:
                _explicit_condition(graph, node)
    for node in graph:
        for body in graph_attributes(node):
            _simplify(body)


def _inline(graph: ir.Graph, node: ir.Node, taken: bool) -> bool:
    branch = node.attributes["then_branch" if taken else "else_branch"].as_graph()
    if len(branch.initializers) or len(branch.outputs) != len(node.outputs):
        return False
    nodes = list(branch)
    inside = {v for n in nodes for v in n.outputs}
    outputs = list(branch.outputs)
    branch.outputs.clear()
    branch.remove(nodes)
    graph.insert_before(node, nodes)
    for old, new in zip(node.outputs, outputs, strict=True):
        if new not in inside:
            # An outer value passed straight through: keep a node so names stay apart.
            identity = ir.node("Identity", [new])
            graph.insert_before(node, identity)
            new = identity.outputs[0]
        if new.type is None:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape.copy()
        name = old.name
        was_output = old.is_graph_output()
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        if was_output:
            old.name = None
            new.name = name
    graph.remove(node, safe=True)
    return True


def _explicit_condition(graph: ir.Graph, node: ir.Node) -> None:
    true = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(True))})
    value = true.outputs[0]
    value.dtype = ir.DataType.BOOL
    value.shape = ir.Shape([])
    graph.insert_before(node, true)
    node.replace_input_with(1, value)
    body = node.attributes["body"].as_graph()
    keep = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(True))})
    cond = keep.outputs[0]
    cond.dtype = ir.DataType.BOOL
    cond.shape = ir.Shape([])
    body.append(keep)
    outputs = list(body.outputs)
    body.outputs.clear()
    body.outputs.extend([cond, *outputs[1:]])
