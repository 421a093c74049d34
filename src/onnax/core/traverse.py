"""Walking a model's graphs and nodes, and sorting them, at the cost of the walk alone.

onnx_ir's ``Graph.subgraphs()``, ``Model.graphs()``, ``Graph.all_nodes()`` and ``Graph.sort()``
go through ``RecursiveGraphIterator``, which checks every attribute of every node against a
runtime protocol (``isinstance(attr, Attr)``) and stacks a generator per graph: on a
derivative model of 50k nodes those walks took a tenth of a transform, and most models have
no subgraph at all. The functions here visit the same graphs and nodes in the same order,
reading an attribute's type only (``Attr`` is onnx_ir's only attribute class).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import onnx_ir as ir

from onnax.core.fast_nodes import node_list

__all__ = [
    "all_nodes",
    "bodies",
    "fixed_nesting",
    "flat_block",
    "model_graphs",
    "sort",
    "subgraphs",
]

_GRAPH = ir.AttributeType.GRAPH
_GRAPHS = ir.AttributeType.GRAPHS


def bodies(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by the node's attributes, in attribute order."""
    found: list[ir.Graph] = []
    # The dict under the UserDict: its values() is a C loop, UserDict's a Python generator.
    for attr in node._attributes.data.values():
        kind = attr.type
        if kind is _GRAPH:
            found.append(attr.value)
        elif kind is _GRAPHS:
            found.extend(attr.value)
    return found


_FIXED: dict[ir.Graph, list[ir.Graph]] = {}
"""The subgraphs of the main graphs inside a :func:`fixed_nesting` block, walked once."""


@contextlib.contextmanager
def fixed_nesting(graph: ir.Graph) -> Iterator[None]:
    """A block in which :func:`subgraphs` of ``graph`` is walked once, then remembered.

    For a caller that neither adds, removes nor reorders nodes holding bodies inside the
    block: one shape inference walked the graphs a dozen times (its own steps, each round of
    completion, the records), about two percent of a transform on a derivative model that
    has no subgraph at all. Nested blocks for the same graph keep the outer one's walk.
    """
    if graph in _FIXED:
        yield
        return
    _FIXED[graph] = subgraphs(graph)
    try:
        yield
    finally:
        del _FIXED[graph]


@contextlib.contextmanager
def flat_block(graph: ir.Graph) -> Iterator[bool]:
    """A block in which :func:`subgraphs` of ``graph`` is known empty, if it is at the start.

    For a caller that adds no node holding a body inside the block: removing, reordering,
    renaming, rewriting and annotating nodes leave a graph without bodies without any. The
    cleanup of a derivative model, whose graph mostly has none, walked it half a dozen times
    to find that out again (each walk of a 37k-node graph costs 20 to 30 ms). Yields whether
    the graph is flat; a graph with bodies is walked as usual inside the block.
    """
    fixed = _FIXED.get(graph)
    if fixed is not None:
        yield not fixed
        return
    found = subgraphs(graph)
    if found:
        yield False
        return
    _FIXED[graph] = found
    try:
        yield True
    finally:
        del _FIXED[graph]


def subgraphs(graph: ir.Graph) -> list[ir.Graph]:
    """The graphs nested in ``graph`` at any depth, each once.

    In the order of ``graph.subgraphs()``: depth first, in node and attribute order.
    """
    fixed = _FIXED.get(graph)
    if fixed is not None:
        return list(fixed)  # a list of the caller's own, as a walk gives
    found: dict[ir.Graph, None] = {}

    def visit(g: ir.Graph) -> None:
        # A transform walks its model's graphs a few dozen times: a node without attributes
        # (most of a derivative graph) costs one truth test, not a call of bodies().
        for node in node_list(g):
            if not node._attributes.data:  # the slot: a property call per node cost more
                continue
            for body in bodies(node):
                if body is not graph and body not in found:
                    found[body] = None
                visit(body)

    visit(graph)
    return list(found)


def model_graphs(model: ir.Model) -> list[ir.Graph]:
    """The main graph, then every subgraph, as ``model.graphs()`` yields them."""
    return [model.graph, *subgraphs(model.graph)]


def all_nodes(graph: ir.Graph) -> Iterator[ir.Node]:
    """The nodes of ``graph`` and of its subgraphs, as ``graph.all_nodes()`` yields them.

    Each node is followed by the nodes of its bodies.
    """
    for node in node_list(graph):
        yield node
        if node._attributes.data:  # bodies() only for a node with attributes
            for body in bodies(node):
                yield from all_nodes(body)


def sort(graph: ir.Graph) -> None:
    """``graph.sort()``, skipped where it would change nothing.

    onnx_ir's sort is stable: on a graph already in topological order it keeps the order (the
    node with the largest index among those whose consumers are all placed is always the last
    unplaced one). Its only other effect is to name unnamed nodes and outputs, as the graph
    names what it receives. So a graph without subgraphs, in order, with every node and output
    named, is left alone: the transforms sort a model up to four times, mostly already sorted,
    and the sort costs five times the check.
    """
    if not _sorted_and_named(graph):
        graph.sort()


def _sorted_and_named(graph: ir.Graph) -> bool:
    # Every inference that is not told the graph is sorted checks it, and the check walks
    # every node: the node's and values' slots are read directly (a property call each cost
    # more than the set look-ups), as onnx_ir's properties return them.
    placed: set[ir.Node] = set()
    add = placed.add
    for node in node_list(graph):
        # bodies() only for a node with attributes: a truth test for most nodes.
        if node._name is None or (node._attributes.data and bodies(node)):
            return False
        for value in node._inputs:
            if value is None:
                continue
            producer = value._producer
            # A producer of another graph is an outer value (a body's capture): not ordered here.
            if producer is not None and producer not in placed and producer._graph is graph:
                return False
        for out in node._outputs:
            if out._name is None:
                return False
        add(node)
    return True
