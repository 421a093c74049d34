"""onnx_ir's ``NameFixPass`` for a model without subgraphs or functions, at the cost of one loop.

``NameFixPass`` walks the graph through ``RecursiveGraphIterator`` (a generator per graph, a
runtime protocol check per attribute, entry and exit callbacks) and calls three methods per
value it meets; cleanup runs it once or twice on every derivative model, where it took about
a twentieth of a transform on the benchmark's residual network, which has no subgraph. The
transforms' models mostly have none: :func:`fix_names_flat` gives such a graph exactly the
names the pass gives, in one plain loop over its nodes, and declines (returns None) any
other model, for the pass to name.
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from onnax.core.fast_nodes import node_list
from onnax.core.traverse import subgraphs

__all__ = ["fix_names_flat"]


def _next_name(preferred: str, used: set[str], counter: collections.Counter[str]) -> str:
    """``naming._find_and_record_next_unique_name``: ``preferred``, else its next free ``_k``."""
    name = preferred
    while name in used:
        counter[preferred] += 1
        name = f"{preferred}_{counter[preferred]}"
    used.add(name)
    return name


def fix_names_flat(model: ir.Model) -> bool | None:
    """Names the model as ``NameFixPass`` does, if it has no subgraph and no function.

    The pass names a graph's inputs, then outputs, then initializers, then, node by node in
    graph order, the node, its inputs and its outputs: each value once (the first time it is
    met), keeping its name where no value met before holds it, else taking the name's next
    free ``_k`` (an unnamed value ``v``, an unnamed node ``node``); node names are unique
    among nodes, value names among values. That is what is done here, in the same order with
    the same counters, so the names are the same.

    With a single graph the names are then unique across the model too, so
    :class:`onnax.passes.cleanup.UniqueNamesAcrossScopes` would rename nothing.

    Args:
        model: The model, renamed in place.

    Returns:
        Whether a name changed, as the pass reports it; None when the model has a subgraph
        or a function (nothing is changed then).
    """
    graph = model.graph
    if model.functions or subgraphs(graph):
        return None
    used_values: set[str] = set()
    used_nodes: set[str] = set()
    seen: set[ir.Value] = set()
    value_counter: collections.Counter[str] = collections.Counter()
    node_counter: collections.Counter[str] = collections.Counter()
    modified = False

    def fix_value(value: ir.Value) -> None:
        nonlocal modified
        name = value.name
        if not name:
            value.name = _next_name("v", used_values, value_counter)
            modified = True
        elif name in used_values:
            value.name = _next_name(name, used_values, value_counter)
            modified = True
        else:
            used_values.add(name)
        seen.add(value)

    for value in (*graph.inputs, *graph.outputs):
        if value not in seen:
            fix_value(value)
    # Read after the inputs are named: renaming an initializer re-keys the dict.
    for value in tuple(graph.initializers.values()):
        if value not in seen:
            fix_value(value)
    for node in node_list(graph):
        name = node.name
        if not name:
            node.name = _next_name("node", used_nodes, node_counter)
            modified = True
        elif name in used_nodes:
            node.name = _next_name(name, used_nodes, node_counter)
            modified = True
        else:
            used_nodes.add(name)
        for arg in node.inputs:
            if arg is not None and arg not in seen:
                fix_value(arg)
        for out in node.outputs:
            if out not in seen:
                fix_value(out)
    return modified
