"""Reverse mode as linearize + transpose (the JAX decomposition).

After :func:`~onnax.passes.linearize.linearize` the graph holds the primal nodes, the primal-only
helper values the jvp rules needed (``Cos(x)`` for ``Sin``), and the linear nodes computing
tangents. Shape inference then gives every linear value a shape. The linear nodes are walked
backwards and each one's transpose rule turns the cotangent of its output into cotangents of its
linear inputs, summed where a value has several consumers. Finally the linear nodes and the
tangent inputs are removed: the reverse sweep never reads a tangent.

The walk is graph-generic: the transpose rules of If, Loop and Scan transpose their linear bodies
with it (through :class:`~onnax.core.subgraphs.BodyHooks`). A node whose subgraphs read outer
linear values returns their cotangents after those of its explicit inputs, in the order of
:func:`~onnax.core.subgraphs.captured_linear`.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import onnx_ir as ir

from onnax.core.emit import InternalRuleError
from onnax.core.fast_ir import detach_inputs, remove_detached
from onnax.core.fast_nodes import insert_nodes, node_list
from onnax.core.inference import infer_shapes
from onnax.core.registry import transpose_rules
from onnax.core.shapes import ShapeOracle, dims_key, expand_input
from onnax.core.subgraphs import (
    TAKEN,
    BodyHooks,
    BodyLinearization,
    ScopedEmitter,
    captured_linear,
    discard_graph,
    graph_attributes,
    name_values,
)
from onnax.errors import UnsupportedOperatorError
from onnax.passes.linearize import Linearization

__all__ = ["transpose_graph", "transpose_linear"]


def transpose_linear(
    model: ir.Model,
    lin: Linearization,
    seeds: Sequence[tuple[ir.Value, ir.Value]],
    inputs: Sequence[ir.Value],
) -> list[ir.Value | None]:
    """Emits the reverse sweep and returns the cotangent of each input (None: zero).

    Args:
        model: The linearized model; changed in place.
        lin: Its linearization.
        seeds: ``(primal output, cotangent seed)`` pairs.
        inputs: The selected primal inputs whose cotangents are wanted.
    """
    infer_shapes(model, new_only=True)
    # A control-flow rule may have replaced the node producing an output (the primal Loop of
    # reverse mode, which gains an iteration counter): its seed belongs to the replacement.
    outputs = [(lin.replaced.get(y, y), s) for y, s in seeds]
    linear_seeds = [(lin.tangent[y], s) for y, s in outputs if y in lin.tangent]
    try:
        results = transpose_graph(
            model.graph, lin, linear_seeds, [lin.tangent[x] for x in inputs], []
        )
    except UnsupportedOperatorError as err:
        # Transpose rules do not know which transform runs them: say it.
        message = str(err)
        if not message.startswith(f"{lin.transform}: "):
            raise type(err)(f"{lin.transform}: {message}") from None
        raise
    _drop_inputs(model.graph, set(lin.tangent_inputs))
    name_values(model)
    return results


def transpose_graph(
    graph: ir.Graph,
    lin: Linearization,
    seeds: Sequence[tuple[ir.Value, ir.Value]],
    wanted: Sequence[ir.Value],
    outer_values: Sequence[ir.Value],
) -> list[ir.Value | None]:
    """Transposes the linear nodes of ``graph`` in place; returns the cotangents of ``wanted``.

    Args:
        graph: The graph (main graph or a body) holding ``lin.linear_nodes``.
        lin: Its linearization.
        seeds: ``(linear value, cotangent)`` pairs; linear values may be outputs of the graph.
        wanted: Linear values whose cotangents are returned (graph inputs or outer values).
        outer_values: Non-linear values of the enclosing graphs, visible here by capture: shape
            witnesses for linear values.

    The linear nodes are removed afterwards, and so are the graph inputs that are linear.
    """
    values = [v for v in graph.inputs if v not in lin.linear]
    values += [v for n in node_list(graph) for v in n.outputs if v not in lin.linear]
    scope_values = [*values, *outer_values]
    oracle = ShapeOracle(scope_values, lin.tangent_of)

    def transpose_body(
        body: ir.Graph,
        sub: BodyLinearization,
        body_seeds: Sequence[tuple[ir.Value, ir.Value]],
        body_wanted: Sequence[ir.Value],
    ) -> list[ir.Value | None]:
        assert isinstance(sub, Linearization)
        return transpose_graph(body, sub, body_seeds, body_wanted, scope_values)

    def no_linearize(*_: object) -> Linearization:
        raise AssertionError("linearization is not part of transposition")

    hooks = BodyHooks(
        mode="transpose",
        transform=lin.transform,
        linearize_body=no_linearize,
        transpose_body=transpose_body,
    )
    em = ScopedEmitter(lin.opset, lin.linear, hooks)
    em.shape_witness = lambda v: oracle(em, v)

    cotangent: dict[ir.Value, ir.Value] = {}

    def accumulate(value: ir.Value, ct: ir.Value) -> None:
        previous = cotangent.get(value)
        if previous is None:
            cotangent[value] = ct
            return
        # Add the Expanded term unexpanded: the other one has the value's shape (the transpose
        # contract) and broadcasts it (see expand_input).
        if expand_input(previous) is not None and expand_input(ct) is None:
            previous, ct = ct, previous
        small = expand_input(ct)
        if small is None or not _full_size(previous, value):
            small = ct
        cotangent[value] = em.op("Add", [previous, small])

    for t, seed in seeds:
        if t in lin.linear:
            accumulate(t, seed)
    for node in reversed(lin.linear_nodes):
        cts_out = [cotangent.pop(o, None) for o in node.outputs]
        if cts_out.count(None) == len(cts_out):
            continue  # no cotangent reaches the node (counted in C)
        rule = transpose_rules.lookup(node.domain, node.op_type, lin.opset)
        if rule is None:
            raise InternalRuleError(
                f"a jvp rule emitted {node.op_type} on a tangent, but it has no transpose rule"
            )
        mask = [v is not None and v in lin.linear for v in node.inputs]
        captured = captured_linear(node, lin.linear)
        cts_in = rule(em, node, cts_out, mask)
        n_in = len(node.inputs)
        for value, ct, is_linear in zip(node.inputs, cts_in[:n_in], mask, strict=False):
            if ct is not None and is_linear and value is not None:
                accumulate(value, ct)
        extra = list(cts_in[n_in:])
        if extra or captured:
            if len(extra) != len(captured):
                raise InternalRuleError(
                    f"the transpose rule of {node.op_type} returned {len(extra)} cotangents for "
                    f"{len(captured)} captured linear values"
                )
            for value, ct in zip(captured, extra, strict=True):
                if ct is not None:
                    accumulate(value, ct)
        insert_nodes(graph, None, em.take())
    results = [cotangent.get(w) for w in wanted]
    insert_nodes(graph, None, em.take())
    _remove_linear(graph, lin)
    return results


def _full_size(ct: ir.Value, value: ir.Value) -> bool:
    """Whether ``ct`` has ``value``'s shape, as far as shapes are known (the contract)."""
    have, want = dims_key(ct.shape), dims_key(value.shape)
    return have is None or want is None or have == want


def _remove_linear(graph: ir.Graph, lin: Linearization) -> None:
    for node in lin.linear_nodes:
        detach_inputs(node)
        # Bodies first: node.meta makes a store for each of the many linear nodes it is read on.
        held = graph_attributes(node) if node.attributes.data else []
        if held and not node.meta.get(TAKEN):
            # A body that was not transposed still reads outer values: drop those uses.
            for body in held:
                discard_graph(body)
    linear_outputs = [v for v in graph.outputs if v in lin.linear]
    for v in linear_outputs:
        # Only a body can output linear values (its tangents); its rule sets new outputs.
        graph.outputs.remove(v)
    remove_detached(graph, lin.linear_nodes)  # remove(safe=True) of nodes detached above
    _drop_inputs(graph, lin.linear)


def _drop_inputs(graph: ir.Graph, dropped: Container[ir.Value]) -> None:
    """Removes every graph input in ``dropped``, keeping the others in order.

    In one assignment: a gradient w.r.t. every weight has a tangent input per weight, and a
    ``remove`` of each scanned and shifted the list (quadratic in the weights).
    """
    inputs = graph.inputs
    if any(v in dropped for v in inputs):
        inputs[:] = [v for v in inputs if v not in dropped]
