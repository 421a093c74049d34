"""Forward-mode linearization: the walk shared by forward and reverse mode.

Every node that an active value (one carrying a tangent) reaches gets its jvp rule applied; the
emitted nodes go into the graph right after the primal node. Tangents are tracked in a map; a
value without an entry has a symbolic zero tangent and costs nothing. The nodes computing
tangents are *linear* in the tangent inputs: reverse mode transposes exactly those.

The walk is graph-generic: the control-flow rules (If, Loop, Scan) linearize their bodies with it
through :class:`~onnax.core.subgraphs.BodyHooks`, seeded with the tangents of the values the body
can see (its own inputs and the outer values it captures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.diagnostics import check_active_node, missing_rule
from onnax.core.fast_ir import copy_shape
from onnax.core.fast_nodes import insert_nodes, node_list
from onnax.core.registry import jvp_rules
from onnax.core.selection import is_float
from onnax.core.subgraphs import BodyHooks, ScopedEmitter, name_values, subgraph_reads
from onnax.errors import UnsupportedOperatorError
from onnax.passes.expand import expand
from onnax.passes.fold_batchnorm import fold_batch_norms
from onnax.passes.stop_gradient import insert_stops
from onnax.rules import collect

__all__ = ["CONTROL_FLOW", "Linearization", "linearize", "linearize_graph"]

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
"""Operators whose rules handle the outer values their subgraphs capture."""


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
        transform: The user-facing transform name.
        replaced: Outputs of nodes that forward mode replaced, mapped to their replacements
            (graph outputs keep their names but become new values).
        stopped: Values left without a tangent whatever their inputs carry (``stop_gradient``;
            main graph only).
    """

    tangent_inputs: list[ir.Value]
    tangent: dict[ir.Value, ir.Value]
    tangent_of: dict[ir.Value, ir.Value]
    linear: set[ir.Value]
    linear_nodes: list[ir.Node]
    opset: int
    transform: str = ""
    replaced: dict[ir.Value, ir.Value] = dataclasses.field(default_factory=dict)
    stopped: frozenset[ir.Value] = frozenset()


def _default_mode(transform: str) -> str:
    return "forward" if transform in ("jvp", "jacfwd") else "linearize"


def needed_nodes(graph: ir.Graph, outputs: Sequence[ir.Value]) -> set[ir.Node]:
    """The nodes of ``graph`` that ``outputs`` depend on (through subgraph captures too)."""
    needed: set[ir.Node] = set()
    stack = [v.producer() for v in outputs]
    while stack:
        node = stack.pop()
        if node is None or node in needed or node.graph is not graph:
            continue
        needed.add(node)
        stack.extend(v.producer() for v in (*node.inputs, *subgraph_reads(node)) if v is not None)
    return needed


def linearize(
    model: ir.Model,
    inputs: list[ir.Value],
    transform: str,
    mode: str | None = None,
    outputs: Sequence[ir.Value] | None = None,
    stop_gradient: Sequence[ir.Value] = (),
) -> Linearization:
    """Adds tangent inputs for ``inputs`` and the nodes computing every reachable tangent.

    The tangent inputs are appended to the graph inputs, unnamed; the caller names them or
    removes them again.

    Args:
        model: The prepared model; changed in place.
        inputs: The primal values to seed.
        transform: The user-facing transform name, for messages.
        mode: ``"forward"`` (control-flow nodes compute primal and tangent in one node) or
            ``"linearize"`` (reverse mode: the primal nodes stay and linear nodes are added
            beside them). Default: forward for jvp, linearize otherwise.
        outputs: The outputs whose tangents are wanted (default: all). Nodes they do not
            depend on are left alone: an operator without a rule there (a sequence operator
            feeding another output, say) does not stop the transform.
        stop_gradient: Main-graph values whose tangent is a symbolic zero (resolved by
            :func:`~onnax.passes.stop_gradient.resolve_stops`); their consumers read them
            through an Identity that cuts the derivative path.

    Raises:
        UnsupportedOperatorError: If an active path reaches an operator without a jvp rule.
        UnsupportedValueError: If it reaches a random operator, a sequence or an optional.
    """
    collect()
    graph = model.graph
    # Before expansion, which may replace the nodes producing stopped values.
    stopped = frozenset(insert_stops(graph, stop_gradient))
    # Conv -> BatchNormalization as one Conv, as onnxruntime runs the primal (see the module).
    fold_batch_norms(graph, {*inputs, *(outputs or ()), *stop_gradient, *stopped})
    expand(model, inputs, jvp_rules, transform)
    opset = model.opset_imports[""]
    lin = Linearization([], {}, {}, set(), [], opset, transform, stopped=stopped)
    for x in inputs:
        t = ir.Value(name=None, type=x.type, shape=x.shape.copy() if x.shape is not None else None)
        graph.inputs.append(t)
        lin.linear.add(t)
        lin.tangent[x] = t
        lin.tangent_of[t] = x
        lin.tangent_inputs.append(t)
    try:
        needed = needed_nodes(graph, outputs) if outputs is not None else None
        linearize_graph(graph, lin, mode or _default_mode(transform), needed)
    except UnsupportedOperatorError as err:
        # jvp rules serve every transform that linearizes and name "jvp" in their refusals;
        # the user called vjp or grad.
        message = str(err)
        if transform != "jvp" and message.startswith("jvp: "):
            raise type(err)(f"{transform}: {message[5:]}") from None
        raise
    name_values(model)
    return lin


def linearize_graph(
    graph: ir.Graph, lin: Linearization, mode: str, needed: set[ir.Node] | None = None
) -> None:
    """Linearizes ``graph`` in place, reading and extending ``lin`` (its tangent map is seeded).

    Emitted linear nodes are appended to ``lin.linear_nodes``. With ``needed``, only those
    nodes are linearized.
    """

    def linearize_body(body: ir.Graph, seeds: dict[ir.Value, ir.Value]) -> Linearization:
        sub = Linearization(
            [], dict(seeds), lin.tangent_of, lin.linear, [], lin.opset, lin.transform
        )
        for x, t in seeds.items():
            if t not in lin.tangent_of:
                # A tangent input of the body (outer tangents are known already).
                lin.tangent_of[t] = x
                lin.linear.add(t)
        linearize_graph(body, sub, mode)
        return sub

    def no_transpose(*_: object) -> list[ir.Value | None]:
        raise AssertionError("transposition is not part of linearization")

    hooks = BodyHooks(
        mode=mode,
        transform=lin.transform,
        linearize_body=linearize_body,
        transpose_body=no_transpose,
    )
    em = ScopedEmitter(lin.opset, lin.linear, hooks, lin.tangent)
    tangent = lin.tangent
    for node in node_list(graph):
        if needed is not None and node not in needed:
            continue
        tangents_in = [tangent.get(v) if v is not None else None for v in node.inputs]
        captured = [v for v in subgraph_reads(node) if v in tangent]
        if tangents_in.count(None) == len(tangents_in) and not captured:
            continue  # no tangent in (counted in C: every node of the model is asked)
        active = [t is not None for t in tangents_in]
        check_active_node(lin.transform, node, lin.opset, active)
        rule = jvp_rules.lookup(node.domain, node.op_type, lin.opset)
        if rule is None or (captured and not (node.domain == "" and node.op_type in CONTROL_FLOW)):
            raise missing_rule(lin.transform, node, lin.opset, active)
        em.replaced = {}
        tangents_out = rule(em, node, tangents_in)
        emitted = em.take()
        if emitted:
            insert_nodes(graph, node, emitted)
            linear = lin.linear
            for n in emitted:
                for o in n.outputs:
                    if o in linear:
                        lin.linear_nodes.append(n)
                        break
        outputs = [em.replaced.get(o, o) for o in node.outputs]
        if em.replaced:
            # A forward-mode control-flow rule replaced the node by one computing both.
            graph.remove(node, safe=True)
            lin.replaced.update(em.replaced)
        for original, out, t_out in zip(node.outputs, outputs, tangents_out, strict=False):
            if original in lin.stopped or out in lin.stopped:
                # stop_gradient: the rule's tangent nodes are left dead for cleanup; reverse
                # mode never sends them a cotangent.
                continue
            if t_out is not None and (is_float(out) or out.type is None):
                # A tangent has its primal's shape by contract. Saying so now keeps the symbols
                # that inference would otherwise invent for broadcasts, so transposes can find a
                # shape witness later.
                if out.shape is not None and not t_out.is_graph_input():
                    t_out.shape = copy_shape(out.shape)  # out.shape.copy(), unconverted
                if t_out.type is None and out.type is not None:
                    t_out.type = out.type
                tangent[out] = t_out
                lin.tangent_of.setdefault(t_out, out)
