"""Constant folding of the shape arithmetic an expansion creates.

Function bodies compute shapes at run time (``Shape``, ``Gather``, ``Concat``...) because they
must serve every input shape. Once instantiated for a node whose shapes are known, that arithmetic
is constant: folding it lets the rules see static shapes (and keeps ``Shape`` of a tangent out of
derivative models). Folding only ever runs on the small standalone models holding an expansion,
so its cost is proportional to what was expanded, never to the user's graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnax.core.diagnostics import RANDOM_OPS
from onnax.core.inference import infer_shapes
from onnax.core.static import constant_of, evaluate, static_shape

__all__ = ["MAX_FOLDED_ELEMENTS", "fold_constants"]

MAX_FOLDED_ELEMENTS = 4096
"""Results larger than this stay computed: folding is for shape arithmetic, not for data."""


def _foldable(node: ir.Node) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in RANDOM_OPS:
        return False
    if node.op_type == "Constant":
        return False
    return not any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    )


def _replace_by_constants(graph: ir.Graph, node: ir.Node, results: list[np.ndarray]) -> None:
    for out, array in zip(node.outputs, results, strict=True):
        const = ir.node("Constant", [], attributes={"value": ir.tensor(array)})
        new = const.outputs[0]
        new.dtype = ir.DataType.from_numpy(array.dtype)
        new.shape = ir.Shape(list(array.shape))
        new.const_value = ir.tensor(array)
        graph.insert_before(node, const)
        ir.convenience.replace_all_uses_with(out, new, replace_graph_outputs=True)
        if out.is_graph_output():
            new.name = out.name
    _drop(graph, node)


def _drop(graph: ir.Graph, node: ir.Node) -> None:
    """Removes ``node``; the nodes of its subgraphs stop reading outer values.

    A node left in a discarded subgraph still counts as a use of the values it reads, which
    would keep dead code alive (and reading values that vmap has replaced).
    """
    for attr in node.attributes.values():
        graphs = (
            [attr.as_graph()]
            if attr.type == ir.AttributeType.GRAPH
            else list(attr.as_graphs())
            if attr.type == ir.AttributeType.GRAPHS
            else []
        )
        for g in graphs:
            for inner in g.all_nodes():
                for i in range(len(inner.inputs)):
                    inner.replace_input_with(i, None)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    graph.remove(node, safe=True)


def _inline_branch(graph: ir.Graph, node: ir.Node) -> bool:
    """Replaces an ``If`` whose condition is constant by the branch it takes."""
    cond = constant_of(node.inputs[0]) if node.inputs else None
    if cond is None or cond.size != 1:
        return False
    name = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    branch = node.attributes[name].as_graph()
    inner = list(branch)
    results = list(branch.outputs)
    branch.outputs.clear()
    branch.remove(inner)
    graph.insert_before(node, inner)
    for out, new in zip(node.outputs, results, strict=True):
        if new.producer() not in inner:
            # The branch passes an outer value through: give the result a node of its own.
            copy = ir.node("Identity", [new])
            copy.outputs[0].type, copy.outputs[0].shape = new.type, new.shape
            graph.insert_before(node, copy)
            new = copy.outputs[0]
        ir.convenience.replace_all_uses_with(out, new, replace_graph_outputs=True)
    _drop(graph, node)
    return True


def _fold_once(graph: ir.Graph, opset: int) -> bool:
    changed = False
    for node in list(graph):
        if node.op_type == "If" and node.domain in ("", "ai.onnx"):
            changed = _inline_branch(graph, node) or changed
            continue
        if not _foldable(node):
            continue
        results: list[np.ndarray] | None = None
        if node.op_type in ("Shape", "Size"):
            static = static_shape(node)
            results = [static] if static is not None else None
        elif node.op_type == "CastLike":
            # Bodies cast their constants to the input's type: only the dtype is needed.
            like = node.inputs[1].dtype if len(node.inputs) > 1 and node.inputs[1] else None
            source = constant_of(node.inputs[0])
            if like is not None and source is not None and like.is_floating_point():
                results = [source.astype(like.numpy())]
        if results is None:
            args = [constant_of(v) for v in node.inputs]
            if any(a is None and v is not None for a, v in zip(args, node.inputs, strict=True)):
                continue
            try:
                results = evaluate(node, args, opset)
            except Exception:
                continue  # leave it computed: the runtime will evaluate it
        if sum(r.size for r in results) > MAX_FOLDED_ELEMENTS:
            continue
        _replace_by_constants(graph, node, results)
        changed = True
    return changed


def _remove_dead(graph: ir.Graph) -> None:
    for node in reversed(list(graph)):
        if all(not o.uses() and not o.is_graph_output() for o in node.outputs):
            _drop(graph, node)


def fold_constants(model: ir.Model, max_rounds: int = 8) -> bool:
    """Folds static ``Shape``/``Size`` and nodes of constant inputs, re-inferring shapes.

    Only the top-level graph of ``model`` is folded; its nodes must be sorted.

    Returns:
        Whether anything was folded.
    """
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
    folded = False
    for _ in range(max_rounds):
        if not _fold_once(model.graph, opset):
            break
        folded = True
        _remove_dead(model.graph)
        # Shapes inferred before folding may merge both branches of an If: infer afresh.
        for node in model.graph.all_nodes():
            for out in node.outputs:
                if out.const_value is None and not out.is_graph_output():
                    out.shape = None
        infer_shapes(model)
    return folded
