"""Moves the primal work of a linear Scan's body into a Scan of its own, for ``linearize``.

In linearize mode a linear Scan reads the recorded states of the primal Scan and recomputes, in
every iteration, the primal values its tangents need (the ``1 - tanh²`` of an RNN step, the gates
of an LSTM cell). That suits reverse mode, which runs the linear part once, but ``linearize``
runs it once per Jacobian-vector product. So here the body's primal part runs once, in a new
*residual Scan* over the same scan inputs that returns, stacked by iteration, the values the
tangent nodes read; the linear Scan takes those as extra scan inputs and keeps only its tangent
nodes. The residual Scan reads primal values only, so the split puts it in the forward model.

A Scan is left as it is when it carries a primal state (its primal part could not run without
the tangent state loop) or when its body's primal part has nothing to store.
"""

from __future__ import annotations

import onnx_ir as ir

from onnax.core.batching import detach
from onnax.core.subgraphs import graph_attributes, new_value_like, subgraph_reads

__all__ = ["as_outputs", "drop_node", "hoist_scan", "reads", "remove_dead"]


def reads(node: ir.Node) -> list[ir.Value]:
    """The values ``node`` reads, through its subgraphs too."""
    return [v for v in (*node.inputs, *subgraph_reads(node)) if v is not None]


def hoist_scan(graph: ir.Graph, node: ir.Node, linear: set[ir.Value]) -> bool:
    """Rewrites the linear Scan ``node`` of ``graph`` (in place) as the module docstring says.

    Args:
        graph: The main graph of a joint model (``split.joint_model``).
        node: A Scan of ``graph`` that reads a tangent.
        linear: The values of ``graph`` computed from its tangent inputs so far.

    Returns:
        Whether it was rewritten.
    """
    body = node.attributes["body"].as_graph()
    n_scan = node.attributes["num_scan_inputs"].as_int()
    n_state = len(node.inputs) - n_scan
    outer = list(node.inputs)
    seeds = {b for b, v in zip(body.inputs, outer, strict=True) if v in linear}
    while True:
        tangent, tangent_nodes, moved = _partition(body, seeds | linear)
        # A state whose start is a zero (no tangent input reaches it) is a tangent all the same
        # when its update reads one.
        more = {
            b for b, o in zip(body.inputs[:n_state], body.outputs, strict=False) if o in tangent
        }
        if more <= seeds:
            break
        seeds |= more
    if any(b not in seeds for b in body.inputs[:n_state]):
        return False  # a primal state: its update would have to run in both Scans
    residuals: dict[ir.Value, None] = {}
    for inner in tangent_nodes:
        for v in reads(inner):
            if v.producer() in moved:
                residuals.setdefault(v, None)
    if not residuals or any(v.producer() in moved for v in body.outputs):
        return False
    order = {inner: i for i, inner in enumerate(body)}
    ordered = sorted(residuals, key=lambda v: (order.get(v.producer(), -1), v.index() or 0))  # type: ignore[arg-type]
    primal_scan = [k for k in range(n_scan) if body.inputs[n_state + k] not in seeds]
    _add_residual_scan(graph, node, body, n_state, ordered, tangent_nodes, primal_scan)
    return True


def _partition(
    body: ir.Graph, tangent_reads: set[ir.Value]
) -> tuple[set[ir.Value], set[ir.Node], set[ir.Node]]:
    """The body's tangent values, its tangent nodes, and its primal nodes that vary by iteration.

    Args:
        body: The Scan body.
        tangent_reads: The tangent body inputs and captured outer tangents.
    """
    tangent = set(tangent_reads)
    varying = {b for b in body.inputs if b not in tangent}
    tangent_nodes: set[ir.Node] = set()
    moved: set[ir.Node] = set()
    for inner in body:
        inner_reads = reads(inner)
        if any(v in tangent for v in inner_reads):
            tangent.update(inner.outputs)
            tangent_nodes.add(inner)
        elif any(v in varying for v in inner_reads):
            # Primal and different in every iteration: computed once, stacked.
            varying.update(inner.outputs)
            moved.add(inner)
    return tangent, tangent_nodes, moved


def _add_residual_scan(
    graph: ir.Graph,
    node: ir.Node,
    body: ir.Graph,
    n_state: int,
    residuals: list[ir.Value],
    tangent_nodes: set[ir.Node],
    primal_scan: list[int],
) -> None:
    n_scan = len(node.inputs) - n_state
    axes = _ints(node, "scan_input_axes", n_scan)
    directions = _ints(node, "scan_input_directions", n_scan)
    # The residual Scan: a copy of the body over the primal scan inputs, without the tangent
    # nodes, returning the residuals of each iteration.
    originals = list(body)
    copy = body.clone(allow_outer_scope_values=True)
    copies = list(copy)
    position = {inner: i for i, inner in enumerate(originals)}
    wanted = [copies[position[v.producer()]].outputs[v.index()] for v in residuals]  # type: ignore[index]
    for original, c in reversed(list(zip(originals, copies, strict=True))):
        if original in tangent_nodes:
            drop_node(copy, c)
    copy_inputs = list(copy.inputs)
    copy.outputs.clear()
    copy.outputs.extend(as_outputs(copy, wanted))
    remove_dead(copy)
    copy.inputs.clear()
    copy.inputs.extend(copy_inputs[n_state + k] for k in primal_scan)
    attributes = [
        ir.AttrInt64("num_scan_inputs", len(primal_scan)),
        ir.AttrGraph("body", copy),
        ir.AttrInt64s("scan_input_axes", [axes[k] for k in primal_scan]),
        ir.AttrInt64s("scan_input_directions", [directions[k] for k in primal_scan]),
    ]
    stacked = [ir.Value(name=None, type=v.type) for v in residuals]
    residual_scan = ir.Node(
        "",
        "Scan",
        [node.inputs[n_state + k] for k in primal_scan],
        attributes,
        outputs=stacked,
        name=f"{node.name}_residuals" if node.name else None,
    )
    graph.insert_before(node, residual_scan)
    # The linear Scan: the residuals come in as extra scan inputs, read in iteration order.
    new_inputs = []
    for v in residuals:
        r = new_value_like(v)
        v.replace_all_uses_with(r)
        new_inputs.append(r)
    remove_dead(body)
    body.inputs.extend(new_inputs)
    start = len(node.inputs)
    node.resize_inputs(start + len(stacked))
    for i, s in enumerate(stacked):
        node.replace_input_with(start + i, s)
    _set_scan_inputs(
        node,
        body,
        n_state,
        [*axes, *[0] * len(stacked)],
        [*directions, *[0] * len(stacked)],
    )


def _set_scan_inputs(
    node: ir.Node, body: ir.Graph, n_state: int, axes: list[int], directions: list[int]
) -> None:
    """Drops the scan inputs the body no longer reads (those only the primal part read)."""
    inputs = list(node.inputs)
    body_inputs = list(body.inputs)
    keep = [k for k in range(len(axes)) if body_inputs[n_state + k].uses()]
    for i in range(len(inputs)):
        node.replace_input_with(i, None)
    node.resize_inputs(n_state + len(keep))
    for i, v in enumerate([*inputs[:n_state], *(inputs[n_state + k] for k in keep)]):
        node.replace_input_with(i, v)
    body.inputs.clear()
    body.inputs.extend([*body_inputs[:n_state], *(body_inputs[n_state + k] for k in keep)])
    node.attributes["num_scan_inputs"] = ir.AttrInt64("num_scan_inputs", len(keep))
    node.attributes["scan_input_axes"] = ir.AttrInt64s("scan_input_axes", [axes[k] for k in keep])
    node.attributes["scan_input_directions"] = ir.AttrInt64s(
        "scan_input_directions", [directions[k] for k in keep]
    )


def _ints(node: ir.Node, name: str, n: int) -> list[int]:
    attr = node.attributes.get(name)
    return list(attr.as_ints()) if attr is not None else [0] * n


def as_outputs(graph: ir.Graph, values: list[ir.Value]) -> list[ir.Value]:
    """Each value as a distinct output produced inside ``graph`` (an Identity where needed)."""
    outputs: list[ir.Value] = []
    for v in values:
        if v in outputs or v.producer() is None or v.producer().graph is not graph:  # type: ignore[union-attr]
            ident = ir.Node("", "Identity", [v], num_outputs=1)
            graph.append(ident)
            v = ident.outputs[0]
        outputs.append(v)
    return outputs


def drop_node(graph: ir.Graph, node: ir.Node) -> None:
    """Removes ``node`` with the uses it and its bodies register on what they read."""
    for sub in graph_attributes(node):
        detach(sub)
    for i, v in enumerate(node.inputs):
        if v is not None:
            node.replace_input_with(i, None)
    graph.remove(node, safe=False)


def remove_dead(graph: ir.Graph) -> None:
    """Removes the nodes of ``graph`` that no output and no other node needs, last first."""
    outputs = set(graph.outputs)
    for inner in reversed(list(graph)):
        if not any(o in outputs or o.uses() for o in inner.outputs):
            drop_node(graph, inner)
