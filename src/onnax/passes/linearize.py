"""Forward-mode linearization: the walk shared by forward and reverse mode.

Every node that an active value (one carrying a tangent) reaches gets its jvp rule applied; the
emitted nodes go into the graph right after the primal node. Tangents are tracked in a map; a
value without an entry has a symbolic zero tangent and costs nothing. The nodes computing
tangents are *linear* in the tangent inputs: reverse mode transposes exactly those.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from onnax.core.diagnostics import check_active_node, missing_rule
from onnax.core.emit import Emitter
from onnax.core.registry import jvp_rules
from onnax.core.selection import is_float
from onnax.core.subgraphs import subgraph_reads
from onnax.rules import collect

__all__ = ["Linearization", "linearize"]


@dataclasses.dataclass
class Linearization:
    """The result of :func:`linearize`.

    Attributes:
        tangent_inputs: One new graph input per selected input, in selection order.
        tangent: Maps a primal value to its tangent (absent: symbolic zero).
        tangent_of: Maps a tangent to its primal value (used for run-time shapes).
        linear: Every value computed from the tangent inputs.
        linear_nodes: The nodes producing linear values, in graph order.
        opset: The default-domain opset of the model.
    """

    tangent_inputs: list[ir.Value]
    tangent: dict[ir.Value, ir.Value]
    tangent_of: dict[ir.Value, ir.Value]
    linear: set[ir.Value]
    linear_nodes: list[ir.Node]
    opset: int


def linearize(model: ir.Model, inputs: list[ir.Value], transform: str) -> Linearization:
    """Adds tangent inputs for ``inputs`` and the nodes computing every reachable tangent.

    The tangent inputs are appended to the graph inputs, unnamed; the caller names them or
    removes them again.

    Raises:
        UnsupportedOperatorError: If an active path reaches an operator without a jvp rule.
        UnsupportedValueError: If it reaches a random operator, a sequence or an optional.
    """
    collect()
    graph = model.graph
    opset = model.opset_imports[""]
    linear: set[ir.Value] = set()
    em = Emitter(opset, linear)
    tangent: dict[ir.Value, ir.Value] = {}
    tangent_of: dict[ir.Value, ir.Value] = {}
    tangent_inputs: list[ir.Value] = []
    for x in inputs:
        t = ir.Value(name=None, type=x.type, shape=x.shape.copy() if x.shape is not None else None)
        graph.inputs.append(t)
        linear.add(t)
        tangent[x] = t
        tangent_of[t] = x
        tangent_inputs.append(t)
    linear_nodes: list[ir.Node] = []
    for node in list(graph):
        tangents_in = [tangent.get(v) if v is not None else None for v in node.inputs]
        captured = [v for v in subgraph_reads(node) if v in tangent]
        if all(t is None for t in tangents_in) and not captured:
            continue
        active = [t is not None for t in tangents_in]
        check_active_node(transform, node, opset, active)
        rule = jvp_rules.lookup(node.domain, node.op_type, opset)
        if rule is None or captured:
            raise missing_rule(transform, node, opset, active)
        tangents_out = rule(em, node, tangents_in)
        emitted = em.take()
        if emitted:
            graph.insert_after(node, emitted)
            linear_nodes.extend(n for n in emitted if any(o in linear for o in n.outputs))
        for out, t_out in zip(node.outputs, tangents_out, strict=False):
            if t_out is not None and (is_float(out) or out.type is None):
                # A tangent has its primal's shape by contract. Saying so now keeps the symbols
                # that inference would otherwise invent for broadcasts, so transposes can find a
                # shape witness later.
                if out.shape is not None and not t_out.is_graph_input():
                    t_out.shape = out.shape.copy()
                if t_out.type is None and out.type is not None:
                    t_out.type = out.type
                tangent[out] = t_out
                tangent_of.setdefault(t_out, out)
    return Linearization(tangent_inputs, tangent, tangent_of, linear, linear_nodes, opset)
