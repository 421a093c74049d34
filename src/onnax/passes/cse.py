"""Common-subexpression elimination in time proportional to the graph.

onnx_ir's ``CommonSubexpressionEliminationPass`` removes each duplicate with its own
``graph.remove(node, safe=True)``, and every such call makes a set of the graph's outputs: a
gradient w.r.t. every weight has thousands of outputs and CSE finds thousands of duplicates,
so the pass was quadratic (a fifth of a grad at 30k nodes). :func:`eliminate_common_subexpressions`
does what that pass does, node for node and in the same order, but detaches each duplicate at
once and removes them all in one call at the end, and it compares larger constants
(:data:`SIZE_LIMIT`); with onnx_ir's size limit the model it leaves is the same.
"""

from __future__ import annotations

import operator

import onnx_ir as ir

from onnax.core.fast_ir import detach_inputs, remove_detached
from onnax.core.fast_nodes import node_list

__all__ = ["eliminate", "eliminate_common_subexpressions"]

_NON_DETERMINISTIC = frozenset(
    {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial"}
)
_SEQUENCES = (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS)
_BODIES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)

_Key = tuple[object, ...]

# One C call reading a node's slots (as onnax.core.produced does): through the properties, a
# Python call each, and with the inputs turned into a tuple of ids, keying cost more than
# two microseconds a node, and every pass keys every node (twice per transform, on graphs of
# tens of thousands of nodes). The input tuple is onnx_ir's own (replaced, never changed in
# place, on every edit), and values compare by identity, as their ids did.
_NODE_SLOTS = operator.attrgetter(
    "_domain", "_op_type", "_overload", "_outputs", "_attributes", "_inputs"
)


def _key(node: ir.Node, size_limit: int) -> _Key | None:
    """What makes two nodes the same computation; None for a node never merged.

    As onnx_ir: control flow (a graph attribute never compares equal), a tensor attribute
    over ``size_limit`` elements (weights are not compared) and random operators are skipped.
    Two keys are equal when the operators (domain, type, overload), the numbers of outputs,
    the attributes and the inputs (the same value objects, in order) are.
    """
    domain, op_type, overload, outputs, attrs, inputs = _NODE_SLOTS(node)
    if op_type in _NON_DETERMINISTIC and domain == "":
        return None
    # The attributes are read from the dict under the UserDict (a C loop, not a generator),
    # and a node without attributes, most of a derivative graph, builds no list to sort.
    attributes: tuple[tuple[str, object], ...] = ()
    data = attrs.data
    if data:
        pairs: list[tuple[str, object]] = []
        for name, attr in data.items():
            kind = attr.type
            if kind in _BODIES:
                return None
            value = attr.value
            if kind in _SEQUENCES:
                value = tuple(value)
            elif kind is ir.AttributeType.TENSOR:
                if value.size > size_limit:
                    return None
                array = value.numpy()
                value = (array.shape, str(array.dtype), array.tobytes())
            pairs.append((name, value))
        pairs.sort(key=_first)  # names are unique: the order of sorted(dict.items())
        attributes = tuple(pairs)
    # One flat tuple: the inputs last, so keys of different input counts differ in length.
    return (domain, op_type, overload, len(outputs), attributes, *inputs)


def _first(pair: tuple[str, object]) -> str:
    return pair[0]


# onnx_ir compares tensors of up to 10 elements. A second transform re-emits the first one's
# constants (MaxPool backward's tap kernel [C*9, 1, 3, 3] and window offsets, im2col kernels),
# and equal computations on two copies of them never merged: jvp(grad) of squeezenet ran
# MaxPool's index chain twice (10 % of its time). Comparing up to 64 Ki elements (256 KiB of
# float32, hashed once per pass) merges those and still leaves weights stored as Constants alone.
SIZE_LIMIT = 1 << 16


def eliminate_common_subexpressions(graph: ir.Graph, size_limit: int = SIZE_LIMIT) -> bool:
    """onnx_ir's CSE on ``graph`` (not its subgraphs), removing the duplicates in one call.

    Args:
        graph: The graph, changed in place.
        size_limit: Tensor attributes with more elements than this are not compared.

    Returns:
        Whether a node was removed.
    """
    return eliminate(graph, size_limit)[0]


def eliminate(graph: ir.Graph, size_limit: int = SIZE_LIMIT) -> tuple[bool, bool]:
    """:func:`eliminate_common_subexpressions`, also telling whether a second run would do nothing.

    A second run removes nothing when no duplicate was read by a node keyed before it (in a
    sorted graph, none is: a consumer comes after its producer and is keyed on the kept
    twin's outputs already) and no Identity was added for a graph output: every node that
    stays is then keyed on the inputs it has, and no two of those keys are equal. The cleanup
    reads it to skip the confirming run after a simplification that changed nothing.

    Returns:
        Whether a node was removed, and whether the graph is now free of duplicates.
    """
    first: dict[_Key, ir.Node] = {}
    duplicates: list[ir.Node] = []
    keyed: set[ir.Node] = set()
    settled = True
    for node in node_list(graph):
        key = _key(node, size_limit)
        if key is None:
            continue
        kept = first.get(key)
        if kept is None:
            first[key] = node
            keyed.add(node)
            continue
        if settled:
            settled = not any(user in keyed for out in node.outputs for user, _ in out.uses())
        settled = _replace(graph, node, kept) and settled
        duplicates.append(node)
    if duplicates:
        remove_detached(graph, duplicates)  # remove(safe=True): _replace detached them
    return bool(duplicates), settled


def _replace(graph: ir.Graph, node: ir.Node, kept: ir.Node) -> bool:
    """Makes everything that reads ``node``'s outputs read ``kept``'s, and detaches ``node``.

    A graph output keeps its name: the kept value takes it, or, when that value is a graph
    input or output itself, an Identity placed before ``node`` holds it (as onnx_ir does).

    Returns:
        False if it added an Identity (a node no key was made for), else True.
    """
    added = False
    olds, news = node.outputs, kept.outputs
    if any(v.is_graph_output() for v in olds):
        mapping = dict(zip(olds, news, strict=True))
        for i, out in enumerate(graph.outputs):
            if out not in mapping:
                continue
            new = mapping[out]
            if new.is_graph_output() or new.is_graph_input():
                identity = ir.node(
                    "Identity",
                    inputs=[new],
                    outputs=[ir.Value(name=out.name, type=out.type, shape=out.shape)],
                )
                graph.outputs[i] = identity.outputs[0]
                graph.insert_before(node, identity)
                added = True
            else:
                new.name = out.name
                graph.outputs[i] = new
    ir.convenience.replace_all_uses_with(olds, news)
    # What graph.remove(node, safe=True) did at once: the node stops reading its inputs.
    detach_inputs(node)
    return not added
