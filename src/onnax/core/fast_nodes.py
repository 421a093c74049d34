"""Walking and growing a graph's node list at the cost of the links alone.

onnx_ir keeps a graph's nodes in a ``DoublyLinkedSet``. Iterating it runs a generator that,
for every node, checks the box's owner, calls the ``erased`` property and asserts the value:
a transform walks its model a few dozen times, and those walks were a tenth of a vjp.
:func:`node_list` reads the same chain of boxes in a plain loop (an erased box is unlinked
from the chain when it is erased, so the chain holds exactly the nodes iteration yields).

``Graph.insert_after`` and ``Graph.extend`` pass each node through
``_set_node_graph_to_self_and_assign_names`` (two method calls of the name authority per
node, a property setter) and then ``_insert_one_after`` (another call and a ``_LinkBox``
constructor): emission inserts every derivative node that way. :func:`insert_nodes` does
the same in one loop, leaving the same names, links and counters.

Both check once, on a small graph, that onnx_ir keeps its nodes as they read them
(:func:`_checked`); otherwise they fall back to the public methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
from onnx_ir import _linked_list

__all__ = ["insert_nodes", "node_list"]


def _list_direct(graph: ir.Graph) -> list[ir.Node]:
    root = graph._nodes._root
    nodes: list[ir.Node] = []
    add = nodes.append
    box = root.next
    while box is not root:
        add(box.value)  # type: ignore[arg-type]  # a linked box holds a node
        box = box.next
    return nodes


def _list_by_iteration(graph: ir.Graph) -> list[ir.Node]:
    return list(graph)


def _insert_by_calls(graph: ir.Graph, anchor: ir.Node | None, nodes: Sequence[ir.Node]) -> None:
    if anchor is None:
        graph.extend(nodes)
    else:
        graph.insert_after(anchor, nodes)


def _insert_direct(graph: ir.Graph, anchor: ir.Node | None, nodes: Sequence[ir.Node]) -> None:
    authority = graph._name_authority
    node_names = authority._node_names
    value_names = authority._value_names
    # First every node, as Graph.insert_after names them all before linking any.
    for node in nodes:
        owner = node._graph
        if owner is not None and owner is not graph:
            raise ValueError(
                f"The node '{node!r}' belongs to another graph. Please remove it first with "
                "Graph.remove()."
            )
        name = node._name
        if name is None:
            # The authority's _unique_node_name, without its two method calls per node.
            while True:
                name = f"node_{node._op_type}_{authority._node_counter}"
                authority._node_counter += 1
                if name not in node_names:
                    break
            node.name = name
        node_names.add(name)
        for value in node._outputs:
            name = value._name
            if name is None:
                while True:  # _unique_value_name
                    name = f"val_{authority._value_counter}"
                    authority._value_counter += 1
                    if name not in value_names:
                        break
                value.name = name  # the setter: it names a constant's tensor too
            value_names.add(name)
        node._graph = graph
    linked = graph._nodes
    boxes = linked._value_ids_to_boxes
    if anchor is None:
        box = linked._root.prev
    else:
        found = boxes.get(id(anchor))
        if found is None:
            raise ValueError(f"Value {anchor!r} is not in the list")
        box = found
    new_box = _linked_list._LinkBox
    for node in nodes:
        if id(node) in boxes:
            # Already in the list (moved, or the anchor itself): the list's own way.
            box = linked._insert_one_after(box, node)
            continue
        new = new_box(linked, node)
        after = box.next
        box.next = new
        new.prev = box
        new.next = after
        after.prev = new
        boxes[id(node)] = new
        box = new
    linked._length = len(boxes)


def _state(graph: ir.Graph) -> tuple[object, ...]:
    nodes = list(graph)
    authority = graph._name_authority
    return (
        [(n.name, n.graph is graph, [v.name for v in n.outputs]) for n in nodes],
        [n.name for n in reversed(graph)],
        len(graph),
        authority._node_counter,
        authority._value_counter,
        sorted(authority._node_names),
        sorted(authority._value_names),
    )


def _checked() -> tuple[
    Callable[[ir.Graph], list[ir.Node]],
    Callable[[ir.Graph, ir.Node | None, Sequence[ir.Node]], None],
]:
    """The direct forms if they give what the public methods give, else the public methods."""

    def build(
        insert: Callable[[ir.Graph, ir.Node | None, Sequence[ir.Node]], None],
    ) -> ir.Graph:
        x = ir.Value(name="x")
        first = ir.Node("", "Neg", [x], name="first")
        graph = ir.Graph([x], [], nodes=[first], opset_imports={"": 21})
        second = ir.Node("", "Abs", [first.outputs[0]])
        insert(graph, None, [second])
        third = ir.Node("", "Relu", [first.outputs[0]], name="third")
        fourth = ir.Node("", "Exp", [third.outputs[0]])
        insert(graph, first, [third, fourth])
        graph.remove(third)
        insert(graph, second, [third, second])
        return graph

    try:
        calls, direct = build(_insert_by_calls), build(_insert_direct)
        same = _state(calls) == _state(direct) and _list_direct(direct) == list(direct)
        same = same and _list_direct(calls) == list(calls)
    except Exception:  # a graph of another layout: the public methods are always right
        same = False
    if same:
        return _list_direct, _insert_direct
    return _list_by_iteration, _insert_by_calls


_LIST, _INSERT = _checked()


def node_list(graph: ir.Graph) -> list[ir.Node]:
    """``list(graph)``: the graph's nodes in order (its own nodes only, not its bodies')."""
    return _LIST(graph)


def insert_nodes(graph: ir.Graph, anchor: ir.Node | None, nodes: Sequence[ir.Node]) -> None:
    """``graph.insert_after(anchor, nodes)``, or ``graph.extend(nodes)`` if ``anchor`` is None.

    Unnamed nodes and outputs get the names the graph's name authority gives, as those
    methods give them.

    Raises:
        ValueError: If a node belongs to another graph, or ``anchor`` is not in ``graph``.
    """
    _INSERT(graph, anchor, nodes)
