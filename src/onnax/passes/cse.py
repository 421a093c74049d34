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

import onnx_ir as ir

__all__ = ["eliminate_common_subexpressions"]

_NON_DETERMINISTIC = frozenset(
    {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial"}
)
_SEQUENCES = (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS)
_BODIES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)

_Key = tuple[ir.OperatorIdentifier, int, tuple[int, ...], tuple[tuple[str, object], ...]]


def _key(node: ir.Node, size_limit: int) -> _Key | None:
    """What makes two nodes the same computation; None for a node never merged.

    As onnx_ir: control flow (a graph attribute never compares equal), a tensor attribute
    over ``size_limit`` elements (weights are not compared) and random operators are skipped.
    """
    # Every pass of CSE keys every node (a few microseconds each, a few times per transform):
    # the attributes are read from the dict under the UserDict (a C loop, not a generator),
    # and a node without attributes, most of a derivative graph, builds no list to sort.
    attributes: tuple[tuple[str, object], ...] = ()
    data = node.attributes.data
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
    op_type, domain = node.op_type, node.domain
    if op_type in _NON_DETERMINISTIC and domain == "":
        return None
    return (
        (domain, op_type, node.overload),  # node.op_identifier()
        len(node.outputs),
        tuple(map(id, node.inputs)),
        attributes,
    )


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
    first: dict[_Key, ir.Node] = {}
    duplicates: list[ir.Node] = []
    for node in graph:
        key = _key(node, size_limit)
        if key is None:
            continue
        kept = first.get(key)
        if kept is None:
            first[key] = node
            continue
        _replace(graph, node, kept)
        duplicates.append(node)
    if duplicates:
        graph.remove(duplicates, safe=True)
    return bool(duplicates)


def _replace(graph: ir.Graph, node: ir.Node, kept: ir.Node) -> None:
    """Makes everything that reads ``node``'s outputs read ``kept``'s, and detaches ``node``.

    A graph output keeps its name: the kept value takes it, or, when that value is a graph
    input or output itself, an Identity placed before ``node`` holds it (as onnx_ir does).
    """
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
            else:
                new.name = out.name
                graph.outputs[i] = new
    ir.convenience.replace_all_uses_with(olds, news)
    # What graph.remove(node, safe=True) did at once: the node stops reading its inputs.
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
