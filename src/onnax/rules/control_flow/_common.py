"""What the jvp and transpose rules of If, Loop and Scan share.

Placing emitted nodes into bodies and typing their outputs, the activity analysis of
loop-carried states, and the record a linear control-flow node keeps for its transpose rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.selection import is_float
from onnax.core.subgraphs import (
    BodyLinearization,
    ScopedEmitter,
    as_output,
    new_value_like,
    subgraph_reads,
)

__all__ = [
    "LINEAR_META",
    "LinearInfo",
    "active_states",
    "body_emitter",
    "copy_type",
    "emit_node",
    "flush",
    "linear_info",
    "new_inputs",
    "outer_seeds",
    "place_tangents",
    "primal_in_body",
    "scoped",
    "set_inputs",
    "set_outputs",
    "tangent_or_zero",
]

LINEAR_META = "onnax.control_flow"
"""``node.meta`` key of a linear control-flow node: what its transpose rule needs."""


def scoped(em: Emitter) -> ScopedEmitter:
    """``em`` as the ScopedEmitter of the passes, whose hooks walk bodies."""
    if not isinstance(em, ScopedEmitter):
        raise InternalRuleError("control-flow rules need the ScopedEmitter of the passes")
    return em


def body_emitter(em: ScopedEmitter) -> ScopedEmitter:
    """A fresh emitter for nodes that go into a subgraph (constants are not shared)."""
    return ScopedEmitter(em.opset, em.linear, em.hooks)


def emit_node(
    em: Emitter,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Mapping[str, object],
    num_outputs: int,
) -> ir.Node:
    """Emits one node and returns it (not its outputs, as :meth:`Emitter.op_multi` does).

    The caller names it, annotates it and decides which of its outputs are linear: unlike
    ``op_multi``, nothing marks the outputs linear because an input is.
    """
    node = ir.node(op_type, list(inputs), attributes=dict(attributes), num_outputs=num_outputs)  # type: ignore[arg-type]
    em.nodes.append(node)
    return node


def place_tangents(
    em: Emitter,
    node: ir.Node,
    result: list[ir.Value | None],
    positions: Sequence[int],
    tangents: Sequence[ir.Value],
) -> None:
    """Records ``tangents`` as the linear tangents of ``node``'s outputs at ``positions``."""
    for k, t in zip(positions, tangents, strict=True):
        copy_type(t, node.outputs[k])
        em.linear.add(t)
        result[k] = t


def copy_type(target: ir.Value, source: ir.Value | None) -> None:
    """Gives ``target`` the type and shape of ``source`` (if any)."""
    if source is None:
        return
    target.type = source.type
    target.shape = source.shape.copy() if source.shape is not None else None


def flush(em: Emitter, graph: ir.Graph, *, front: bool = False) -> list[ir.Node]:
    """Moves the nodes emitted through ``em`` into ``graph`` (at the front if asked)."""
    nodes = em.take()
    if not nodes:
        return nodes
    if front and len(graph) > 0:
        graph.insert_before(graph[0], nodes)
    else:
        graph.extend(nodes)
    return nodes


def set_outputs(
    graph: ir.Graph,
    em: Emitter,
    values: Sequence[ir.Value],
    like: Sequence[ir.Value],
    lin: BodyLinearization | None = None,
) -> None:
    """Replaces the outputs of ``graph`` by ``values`` (wrapped where they cannot be outputs).

    Each output gets the type and shape of the matching value of ``like`` (the checker wants
    typed subgraph outputs, and emitted nodes have none). A wrapper of a tangent is a linear
    node: it joins ``lin`` so that the transposition of the body sees it.
    """
    nodes = flush(em, graph)
    taken: set[ir.Value] = set()
    outs = [as_output(em, v, graph, taken) for v in values]
    for o, ref in zip(outs, like, strict=True):
        if o.type is None:
            o.type = ref.type
        if o.shape is None and ref.shape is not None:
            o.shape = ref.shape.copy()
    nodes += flush(em, graph)
    if lin is not None:
        lin.linear_nodes.extend(n for n in nodes if any(o in em.linear for o in n.outputs))
    graph.outputs.clear()
    graph.outputs.extend(outs)


def set_inputs(graph: ir.Graph, values: Sequence[ir.Value]) -> None:
    """Replaces the inputs of ``graph`` by ``values``."""
    graph.inputs.clear()
    graph.inputs.extend(values)


def _active_values(graph: ir.Graph, seeds: Iterable[ir.Value]) -> set[ir.Value]:
    """Float values of ``graph`` that depend on ``seeds`` (an over-approximation of activity)."""
    active = set(seeds)
    for node in graph:
        if any(v is not None and v in active for v in node.inputs) or any(
            v in active for v in subgraph_reads(node)
        ):
            active.update(o for o in node.outputs if is_float(o))
    return active


def active_states(
    graph: ir.Graph,
    state_in: Sequence[ir.Value],
    state_out: Sequence[ir.Value],
    initially: Iterable[int],
    other_seeds: Iterable[ir.Value],
) -> list[int]:
    """The loop-carried states with a tangent: a fixpoint over the body.

    A state whose initial tangent is zero becomes active after one iteration when the body mixes
    an active value (a scan input, a captured outer value, another active state) into it.
    """
    others = list(other_seeds)
    active = {j for j in initially if is_float(state_in[j])}
    while True:
        reach = _active_values(graph, [*others, *(state_in[j] for j in active)])
        grown = active | {
            j for j, v in enumerate(state_out) if v in reach and is_float(state_in[j])
        }
        if grown == active:
            return sorted(active)
        active = grown


def outer_seeds(em: ScopedEmitter, node: ir.Node) -> list[ir.Value]:
    """The outer values read by ``node``'s bodies that have a tangent."""
    return [v for v in subgraph_reads(node) if v in em.tangent]


def new_inputs(values: Sequence[ir.Value]) -> list[ir.Value]:
    """Fresh values typed like ``values`` (new body inputs)."""
    return [new_value_like(v) for v in values]


def tangent_or_zero(em: Emitter, tangent: ir.Value | None, primal: ir.Value | None) -> ir.Value:
    """``tangent``, or a zero shaped like ``primal`` where it is a symbolic zero."""
    if tangent is not None:
        return tangent
    if primal is None:
        raise InternalRuleError("a zero tangent for an absent value")
    return em.zeros_like(primal)


@dataclasses.dataclass
class LinearInfo:
    """What the transpose rule of a linear control-flow node needs to know."""

    lins: list[BodyLinearization]
    counts: dict[str, int]


def linear_info(node: ir.Node) -> LinearInfo:
    """The :class:`LinearInfo` its jvp rule left on a linear control-flow node."""
    info = node.meta.get(LINEAR_META)
    if not isinstance(info, LinearInfo):
        raise InternalRuleError(
            f"{node.op_type} applied to a tangent without the record of its linearization"
        )
    return info


def primal_in_body(lin: BodyLinearization, t: ir.Value, graph: ir.Graph) -> ir.Value:
    """The primal value a body tangent input belongs to (its shape witness)."""
    primal = lin.tangent_of.get(t)
    if primal is None:
        raise InternalRuleError(f"no primal for tangent input {t.name!r} of {graph.name!r}")
    return primal
