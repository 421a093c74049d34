"""Reverse mode as linearize + transpose (the JAX decomposition).

After :func:`~onnax.passes.linearize.linearize` the graph holds the primal nodes, the primal-only
helper values the jvp rules needed (``Cos(x)`` for ``Sin``), and the linear nodes computing
tangents. Shape inference then gives every linear value a shape. The linear nodes are walked
backwards and each one's transpose rule turns the cotangent of its output into cotangents of its
linear inputs, summed where a value has several consumers. Finally the linear nodes and the
tangent inputs are removed: the reverse sweep never reads a tangent.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import transpose_rules
from onnax.core.shapes import ShapeOracle
from onnax.passes.linearize import Linearization
from onnax.passes.prepare import infer_shapes

__all__ = ["transpose_linear"]


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
    graph = model.graph
    infer_shapes(model)
    primal_values = [v for v in graph.inputs if v not in lin.linear]
    primal_values += [v for n in graph for v in n.outputs if v not in lin.linear]
    oracle = ShapeOracle(primal_values, lin.tangent_of)
    em = Emitter(lin.opset, lin.linear)
    em.shape_witness = lambda v: oracle(em, v)

    cotangent: dict[ir.Value, ir.Value] = {}

    def accumulate(value: ir.Value, ct: ir.Value) -> None:
        previous = cotangent.get(value)
        cotangent[value] = ct if previous is None else em.op("Add", [previous, ct])

    for y, seed in seeds:
        t = lin.tangent.get(y)
        if t is not None:
            accumulate(t, seed)
    for node in reversed(lin.linear_nodes):
        cts_out = [cotangent.pop(o, None) for o in node.outputs]
        if all(c is None for c in cts_out):
            continue
        rule = transpose_rules.lookup(node.domain, node.op_type, lin.opset)
        if rule is None:
            raise InternalRuleError(
                f"a jvp rule emitted {node.op_type} on a tangent, but it has no transpose rule"
            )
        mask = [v is not None and v in lin.linear for v in node.inputs]
        cts_in = rule(em, node, cts_out, mask)
        for value, ct, is_linear in zip(node.inputs, cts_in, mask, strict=False):
            if ct is not None and is_linear and value is not None:
                accumulate(value, ct)
        graph.extend(em.take())
    results = [cotangent.get(lin.tangent[x]) for x in inputs]
    graph.extend(em.take())
    _remove_linear(graph, lin)
    return results


def _remove_linear(graph: ir.Graph, lin: Linearization) -> None:
    for node in lin.linear_nodes:
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)
    graph.remove(lin.linear_nodes, safe=True)
    for t in lin.tangent_inputs:
        graph.inputs.remove(t)
