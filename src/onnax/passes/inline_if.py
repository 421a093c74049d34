"""Simplifying control flow before any transform.

* An If whose condition is a constant (a Constant node or an initializer that is not also a
  graph input) always takes the same branch: the branch's nodes replace it, so no transform
  ever sees the branch that is never taken. So does an If whose condition is small arithmetic
  over constants and static shapes (``Size(x) == 4`` with ``x`` of static shape ``[4]``, as
  the function bodies of AffineGrid and others write it): besides sparing the transforms a
  branch, this keeps shape inference from giving the If's outputs the shapes of the only
  branch it could infer (onnx-shape-inference does, when the other branch's are unknown),
  which made later nodes look inconsistent.
* A Loop without a condition input gets an explicit true condition (and a body that always
  continues, which is what ONNX means by an absent condition): onnx_shape_inference refuses
  the absent one.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes as passes

from onnax.core.inference import infer_shapes
from onnax.core.static import constant_of, evaluate, static_shape
from onnax.core.subgraphs import graph_attributes, name_values

__all__ = ["SimplifyControlFlow", "simplify_control_flow"]


_STATIC_OPS = frozenset(
    {
        "Identity",
        "Cast",
        "Not",
        "And",
        "Or",
        "Xor",
        "Equal",
        "Greater",
        "GreaterOrEqual",
        "Less",
        "LessOrEqual",
        "Add",
        "Sub",
        "Mul",
        "Gather",
        "Squeeze",
        "Unsqueeze",
        "Reshape",
        "Concat",
        "Slice",
        "ReduceProd",
        "ReduceSum",
        "ReduceMin",
        "ReduceMax",
    }
)
"""Operators a condition may be computed with and still be decided before any transform."""

_MAX_STATIC_DEPTH = 32
_MAX_STATIC_ELEMENTS = 64


class SimplifyControlFlow(passes.InPlacePass):
    """Inlines constant-condition Ifs and makes Loop conditions explicit (a step of prepare)."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        simplify_control_flow(model)
        return passes.PassResult(model, modified=True)


def simplify_control_flow(model: ir.Model) -> None:
    """Inlines constant-condition Ifs and makes Loop conditions explicit, in place."""
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    if _simplify(model.graph, opset):
        infer_shapes(model)
        _scalar_range_inputs(model.graph)
    # Graphs name inserted values with their own counters: keep names unique across scopes.
    name_values(model)


def _constant_condition(value: ir.Value | None, opset: int) -> bool | None:
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    array = tensor.numpy() if tensor is not None else _static_value(value, opset, 0)
    if array is None or array.size != 1:
        return None
    return bool(array.reshape(-1)[0])


def _static_value(value: ir.Value | None, opset: int, depth: int) -> np.ndarray | None:
    """The value's content when constants and static shapes determine it, else None."""
    if value is None or value.is_graph_input() or depth > _MAX_STATIC_DEPTH:
        return None
    constant = constant_of(value)
    if constant is not None:
        return constant
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type in ("Shape", "Size"):
        return static_shape(node)
    if node.op_type not in _STATIC_OPS or any(a.is_ref() for a in node.attributes.values()):
        return None
    args = [_static_value(v, opset, depth + 1) for v in node.inputs]
    if any(a is None and v is not None for a, v in zip(args, node.inputs, strict=True)):
        return None
    if any(a is not None and a.size > _MAX_STATIC_ELEMENTS for a in args):
        return None
    try:
        results = evaluate(node, args, opset)
    except Exception:  # an undecidable condition stays a run-time If
        return None
    return results[list(node.outputs).index(value)]


def _simplify(graph: ir.Graph, opset: int) -> bool:
    """Simplifies ``graph`` and its subgraphs; returns whether an If was inlined."""
    inlined = False
    changed = True
    while changed:
        changed = False
        for node in list(graph):
            if node.domain != "":
                continue
            if node.op_type == "If":
                taken = _constant_condition(node.inputs[0], opset)
                if taken is not None and _inline(graph, node, taken):
                    changed = inlined = True
            elif node.op_type == "Loop" and len(node.inputs) >= 2 and node.inputs[1] is None:
                _explicit_condition(graph, node)
    for node in graph:
        for body in graph_attributes(node):
            inlined = _simplify(body, opset) or inlined
    return inlined


def _scalar_range_inputs(graph: ir.Graph) -> None:
    """Reshapes one-element 1-D inputs of ``Range`` to the scalars its schema requires.

    Function bodies (AffineGrid's) feed Range with ``Split`` pieces of shape ``[1]`` behind an
    If; onnxruntime's kernel accepts them, and its load-time shape inference only looks once
    the If is inlined, when it refuses the model ("Input to 'Range' op should be scalars").
    """
    for node in list(graph):
        for body in graph_attributes(node):
            _scalar_range_inputs(body)
        if node.op_type != "Range" or node.domain not in ("", "ai.onnx"):
            continue
        for i, value in enumerate(node.inputs):
            if value is None or value.shape is None or list(value.shape.dims) != [1]:
                continue
            empty = ir.node(
                "Constant", [], attributes={"value": ir.tensor(np.zeros(0, dtype=np.int64))}
            )
            reshape = ir.node("Reshape", [value, empty.outputs[0]])
            reshape.outputs[0].type = value.type
            reshape.outputs[0].shape = ir.Shape([])
            graph.insert_before(node, [empty, reshape])
            node.replace_input_with(i, reshape.outputs[0])


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
    # The branch not taken still counts as a user of the outer values its nodes read, which
    # would keep their producers alive (and reading values that vmap has replaced).
    for inner in node.attributes["else_branch" if taken else "then_branch"].as_graph().all_nodes():
        for i in range(len(inner.inputs)):
            inner.replace_input_with(i, None)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
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
