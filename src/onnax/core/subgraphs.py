"""Control-flow subgraphs: what they read from outside, and the hooks that transform them.

The rules for If, Loop and Scan must linearize and transpose their bodies, which is the work of
the passes. Imports point down only (rules know nothing of passes), so the passes hand the rules
a :class:`ScopedEmitter` that carries those walks as callables (:class:`BodyHooks`), together with
the tangent map of the graph being walked (outer values read by a body find their tangents there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.traverse import bodies, model_graphs

__all__ = [
    "TAKEN",
    "BodyHooks",
    "BodyLinearization",
    "ScopedEmitter",
    "as_output",
    "captured_linear",
    "discard_graph",
    "graph_attributes",
    "name_values",
    "new_value_like",
    "redirect_outputs",
    "subgraph_reads",
]


TAKEN = "onnax.subgraphs_taken"
"""``node.meta`` key set by a transpose rule that moved the node's subgraphs to a new node."""


def discard_graph(graph: ir.Graph) -> None:
    """Drops the uses that a graph about to be thrown away registers on outer values."""
    for node in graph.all_nodes():
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)


def name_values(model: ir.Model, prefix: str = "cf") -> None:
    """Makes value names unique across all graphs of a model with control flow.

    Graphs auto-name inserted values with their own counters, and NameFixPass keeps names
    unique only along one scope chain (a name given inside a body is forgotten when it leaves
    the body), so a body value and a later outer value can share a name: an SSA violation that
    onnx.checker and onnxruntime refuse. Here the main graph keeps its names and every other
    unnamed or clashing value, in any body, is renamed.
    """
    graphs = model_graphs(model)
    if len(graphs) == 1:
        return
    owner: dict[str, ir.Value] = {}
    for g in graphs:
        for v in (*g.inputs, *g.initializers.values(), *(o for n in g for o in n.outputs)):
            if v.name:
                owner.setdefault(v.name, v)
    counter = 0
    for g in graphs:
        for v in (*g.inputs, *(o for n in g for o in n.outputs)):
            if v.name and owner.get(v.name) is v:
                continue
            while f"{prefix}_{counter}" in owner:
                counter += 1
            v.name = f"{prefix}_{counter}"
            owner[v.name] = v


def graph_attributes(node: ir.Node) -> list[ir.Graph]:
    """The subgraphs held by the node's attributes (If branches, Loop and Scan bodies)."""
    return bodies(node)


def subgraph_reads(node: ir.Node) -> list[ir.Value]:
    """Values from outside read by the node's subgraphs (If branches, Loop and Scan bodies).

    Read off the inner nodes' inputs rather than value ownership, which also finds a value that
    has just left its graph (vmap swaps batched graph inputs before it walks the nodes).
    """
    reads: list[ir.Value] = []
    if not node._attributes.data:
        return reads  # asked of every node of a sweep: most have no attribute, so no body
    for g in graph_attributes(node):
        inside = {v for n in g.all_nodes() for v in n.outputs} | {
            v for sub in (g, *g.subgraphs()) for v in sub.inputs
        }
        reads.extend(
            v for n in g.all_nodes() for v in n.inputs if v is not None and v not in inside
        )
        # A subgraph output may be an outer value itself (no node reads it inside).
        reads.extend(v for v in g.outputs if v not in inside)
    return reads


def captured_linear(node: ir.Node, linear: set[ir.Value]) -> list[ir.Value]:
    """The linear values the node's subgraphs read from outside, each once, in reading order.

    A transpose rule returns their cotangents after those of the node's explicit inputs.
    """
    seen: dict[ir.Value, None] = {}
    for v in subgraph_reads(node):
        if v in linear:
            seen.setdefault(v, None)
    return list(seen)


def new_value_like(value: ir.Value, name: str | None = None) -> ir.Value:
    """A fresh value with the type and (copied) shape of ``value``."""
    shape = value.shape.copy() if value.shape is not None else None
    return ir.Value(name=name, type=value.type, shape=shape)


def as_output(em: Emitter, value: ir.Value, graph: ir.Graph, taken: set[ir.Value]) -> ir.Value:
    """``value`` itself when it can become an output of ``graph``, else an Identity of it.

    A graph output must be produced inside the graph and appear once: a graph input, an outer
    value, or a value already listed goes through an Identity (emitted through ``em``).
    """
    producer = value.producer()
    if producer is None or producer.graph is not graph or value in taken:
        value = em.op("Identity", [value])
    taken.add(value)
    return value


def redirect_outputs(old: Sequence[ir.Value], new: Sequence[ir.Value]) -> None:
    """Makes every use of ``old[i]`` read ``new[i]``, graph outputs and their names included."""
    for o, n in zip(old, new, strict=True):
        if n.type is None:
            n.type = o.type
        if n.shape is None and o.shape is not None:
            n.shape = o.shape.copy()
        name = o.name
        o.replace_all_uses_with(n, replace_graph_outputs=True)
        if o.is_graph_output() or n.is_graph_output():
            o.name = None
            n.name = name


class BodyLinearization(Protocol):
    """What a control-flow rule may read of a body's linearization (the passes' Linearization)."""

    tangent: dict[ir.Value, ir.Value]
    tangent_of: dict[ir.Value, ir.Value]
    linear_nodes: list[ir.Node]


@dataclasses.dataclass
class BodyHooks:
    """The walks of the passes, handed down to the control-flow rules.

    Attributes:
        mode: ``"forward"`` (JvpPass: a control-flow node is replaced by one computing primal
            and tangent outputs) or ``"linearize"`` (reverse mode: the primal node stays, records
            what the reverse sweep needs, and a separate linear node computes the tangents).
        transform: The user-facing transform name, for messages.
        linearize_body: ``(graph, tangents of values visible in it) -> linearization``: adds the
            tangent nodes into ``graph`` in place, in this mode. Rules read its tangent map and
            store it in the linear node's ``meta`` for :attr:`transpose_body`.
        transpose_body: ``(graph, linearization, seeds, wanted) -> cotangents of wanted``: emits
            the transposed linear nodes of ``graph`` into it, seeded with ``(linear value,
            cotangent)`` pairs, removes the linear nodes and the graph's tangent inputs.
    """

    mode: str
    transform: str
    linearize_body: Callable[[ir.Graph, dict[ir.Value, ir.Value]], BodyLinearization]
    transpose_body: Callable[
        [ir.Graph, BodyLinearization, Sequence[tuple[ir.Value, ir.Value]], Sequence[ir.Value]],
        list[ir.Value | None],
    ]


class ScopedEmitter(Emitter):
    """An emitter that knows the enclosing walk: its hooks and the tangents visible here.

    Args:
        opset: As for :class:`~onnax.core.emit.Emitter`.
        linear: The linear values, shared by every graph of the model.
        hooks: The walks of the pass.
        tangent: The tangent map of the graph being walked (outer tangents included).
        replaced: Filled by a forward-mode rule that replaced the node: old output -> new output.
    """

    def __init__(
        self,
        opset: int,
        linear: set[ir.Value],
        hooks: BodyHooks,
        tangent: dict[ir.Value, ir.Value] | None = None,
    ) -> None:
        super().__init__(opset, linear)
        self.hooks = hooks
        self.tangent: dict[ir.Value, ir.Value] = tangent if tangent is not None else {}
        self.replaced: dict[ir.Value, ir.Value] = {}
