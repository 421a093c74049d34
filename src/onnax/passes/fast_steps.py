"""Cleanup steps that do what onnx_ir's do, in time proportional to the graph alone.

On a derivative model of tens of thousands of nodes, onnx_ir's ``RemoveUnusedNodesPass`` spent
most of its time asking ``onnx.defs.get_schema`` for the optional outputs of every node it keeps
(a tenth of a jvp of a 3k-node network, the pass running twice), and ``Graph.sort`` rebuilt an
order the graph already had. :class:`RemoveUnusedNodes` asks once per operator and opset;
:class:`SortGraph` sorts only a graph that is out of order (:func:`onnax.core.traverse.sort`).
Both leave exactly the model their onnx_ir counterparts leave.
"""

from __future__ import annotations

import dataclasses
import functools

import onnx
import onnx_ir as ir
import onnx_ir.passes as passes

from onnax.core import traverse
from onnax.core.fast_ir import detach_inputs

__all__ = ["RemoveUnusedNodes", "SortGraph", "remove_unused_initializers", "trim"]

_OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic


@dataclasses.dataclass(frozen=True)
class _Outputs:
    """What the schema says of an operator's outputs."""

    optional: tuple[bool, ...]
    """Per formal output, whether it is optional."""
    has_training_mode: bool
    """Whether the schema has a ``training_mode`` attribute (BatchNormalization from 14 on)."""


@functools.cache
def _schema_outputs(op_type: str, opset: int, domain: str) -> _Outputs | None:
    """The schema's output options; None where nothing may be removed.

    That is: no schema, a variadic output, or no optional output.
    """
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain=domain)
    except Exception:  # as onnx_ir: any failure means "leave the outputs"
        return None
    optional = []
    for formal in schema.outputs:
        if formal.option == _VARIADIC:
            return None
        optional.append(formal.option == _OPTIONAL)
    if not any(optional):
        return None
    return _Outputs(tuple(optional), "training_mode" in schema.attributes)


_OPTIONAL_OUTPUTS: dict[tuple[str, int, str], bool] = {}
"""Per operator, opset and domain met, whether :func:`_schema_outputs` found optional outputs
(a plain dict: the cached function hashes its three arguments at every call)."""


def _remove_unused_optional_outputs(
    node: ir.Node, graph_outputs: frozenset[ir.Value], opset: int
) -> None:
    """onnx_ir's ``_remove_unused_optional_outputs``, with the schema read from the cache."""
    if node.domain not in {"", "onnx.ai"}:
        return
    info = _schema_outputs(node.op_type, opset, node.domain)
    _OPTIONAL_OUTPUTS[(node.op_type, opset, node.domain)] = info is not None
    if info is None:
        return
    if node.op_type == "BatchNormalization":
        # Before opset 14, output arity selects training or inference behaviour.
        if not info.has_training_mode:
            return
        training_mode = node.attributes.get("training_mode")
        # Training uses batch statistics: only remove outputs when inference is known.
        if training_mode is not None and (
            training_mode.is_ref()
            or training_mode.type != ir.AttributeType.INT
            or training_mode.as_int() != 0
        ):
            return
        node.attributes.pop("training_mode", None)
    outputs = node.outputs
    for i, out in enumerate(outputs):
        optional = i < len(info.optional) and info.optional[i]
        if optional and out not in graph_outputs and not out.uses():
            out.name = ""
    count = len(outputs)
    for out in reversed(outputs):
        if out.name:
            break
        count -= 1
    node.resize_outputs(count)


def _remove_trailing_empty_inputs(node: ir.Node) -> None:
    inputs = node.inputs
    count = len(inputs)
    while count and inputs[count - 1] is None:
        count -= 1
    node.resize_inputs(count)


def trim(node: ir.Node, graph_outputs: frozenset[ir.Value], opset: int | None) -> None:
    """What ``RemoveUnusedNodesPass`` does to a node it keeps.

    Its trailing empty inputs go, and (given the opset of its schema) its trailing optional
    outputs that nothing reads.
    """
    # Asked of every node the cleanup keeps (twice per transform): the common case, no
    # trailing empty input and no schema with optional outputs, costs two look-ups.
    inputs = node._inputs
    if inputs and inputs[-1] is None:
        _remove_trailing_empty_inputs(node)
    if opset is not None and _OPTIONAL_OUTPUTS.get((node.op_type, opset, node.domain), True):
        _remove_unused_optional_outputs(node, graph_outputs, opset)


def remove_unused_initializers(model: ir.Model) -> int:
    """Removes the main graph's initializers nothing reads (as ``RemoveUnusedNodesPass``).

    Returns:
        How many were removed.
    """
    graph_outputs = frozenset(model.graph.outputs)
    graph_inputs = frozenset(model.graph.inputs)
    initializers = model.graph.initializers
    count = 0
    for init in list(initializers.values()):
        if not (init.uses() or init in graph_outputs or init in graph_inputs):
            assert init.name is not None
            del initializers[init.name]
            count += 1
    return count


def _remove_unused_nodes(
    graph: ir.Graph | ir.Function, opset: int | None, *, is_subgraph: bool = False
) -> int:
    """onnx_ir's ``_remove_unused_nodes_in_graph_like``."""
    graph_outputs = frozenset(graph.outputs)
    if not is_subgraph:
        opset = graph.opset_imports.get("", opset)
    dead: list[ir.Node] = []
    count = 0
    for node in reversed(graph):
        if not any(out in graph_outputs or out.uses() for out in node.outputs):
            # What graph.remove(node, safe=True) does first, so that its producers (visited
            # next) see it gone; the removal itself waits for one call, as each call makes a
            # set of the graph's outputs.
            detach_inputs(node)
            dead.append(node)
            continue
        trim(node, graph_outputs, opset)
        for body in traverse.bodies(node):
            count += _remove_unused_nodes(body, opset, is_subgraph=True)
    if dead:
        graph.remove(dead, safe=True)
    return count + len(dead)


class RemoveUnusedNodes(passes.InPlacePass):
    """onnx_ir's ``RemoveUnusedNodesPass`` with the schema lookups cached.

    Dead nodes and unused initializers go, optional outputs nothing reads are dropped; the
    model's inputs and outputs stay.
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        count = _remove_unused_nodes(model.graph, None)
        count += remove_unused_initializers(model)
        for function in model.functions.values():
            count += _remove_unused_nodes(function, None)
        return passes.PassResult(model, modified=bool(count))


class SortGraph(passes.InPlacePass):
    """Sorts the main graph's nodes topologically (:func:`onnax.core.traverse.sort`)."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        traverse.sort(model.graph)
        return passes.PassResult(model, modified=True)
