"""Remembering the models a transform returned, so that a chain of transforms checks each once.

Every transform's result passes onnx.checker's full check (the transform contract), and
``jvp(grad(m))`` then gave that result to the checker again: on the benchmark's gradient
model, serialising its skeleton and checking it took an eighth of the jvp. :func:`remember`
records a result together with its :func:`fingerprint`; :func:`unedited` tells ``prepare``
that a model is such a result *and* that nothing in it has changed since, in which case the
check would find what it found before and is not run again.

No flag is stored in the model: the record lives here, keyed on the model object (weakly, so
it goes with the model), and the fingerprint is recomputed at every look-up. It covers what
the check reads: opsets and IR version, every graph's name, inputs, outputs and initializers,
each node's operator, name, input and output names and attributes (subgraphs recursively),
each value's name, type and shape, and each tensor's type, shape and, where the checker's
skeleton carries it (:data:`~onnax.core.skeleton.SKELETON_MAX_ELEMENTS`), its bytes. Any edit a
user makes through onnx_ir's API, and any in-place change of a small tensor's data, changes it;
a model with model-local functions is never remembered (prepare inlines them, and checking
them is not worth a second walk).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Hashable

import onnx_ir as ir

from onnax.core.fast_nodes import node_list
from onnax.core.skeleton import SKELETON_MAX_ELEMENTS
from onnax.core.traverse import bodies

__all__ = ["fingerprint", "remember", "unedited"]

_REMEMBERED: weakref.WeakKeyDictionary[ir.Model, int] = weakref.WeakKeyDictionary()
"""The results of transforms, each with its fingerprint when it was returned."""

_GRAPH = ir.AttributeType.GRAPH
_GRAPHS = ir.AttributeType.GRAPHS
_TENSOR = ir.AttributeType.TENSOR
_TENSORS = ir.AttributeType.TENSORS


def remember(model: ir.Model) -> ir.Model:
    """Records ``model``, a transform's result that passes onnx.checker, as it is now.

    Returns:
        ``model``.
    """
    key = None if model.functions else fingerprint(model)
    if key is not None:
        _REMEMBERED[model] = key
    return model


def unedited(model: ir.Model) -> bool:
    """Whether ``model`` is a remembered result that nothing has changed since."""
    recorded = _REMEMBERED.get(model)
    return recorded is not None and not model.functions and fingerprint(model) == recorded


def fingerprint(model: ir.Model) -> int | None:
    """A hash of everything in ``model`` that onnx.checker's full check reads.

    None when this version of onnx_ir keeps its nodes and values in other slots than those
    :data:`_NODE_KEY` and :func:`_graph_parts` read: no model is then remembered.
    """
    if not _SLOTS_KNOWN:
        return None
    parts: list[Hashable] = [
        model.ir_version,
        tuple(sorted(model.opset_imports.items())),
        model.producer_name,
        model.producer_version,
        model.domain,
        model.model_version,
    ]
    _graph_parts(model.graph, parts)
    return hash(tuple(parts))


# One C call reading a node's or value's slots: through the public properties (a Python call
# each) the walk cost a fifth of the check it saves, read this way a twentieth. A node's input
# and output tuples are replaced, never changed, on every edit, and they are taken as they
# are: an input's name and type are those of its producer's output, a graph input or an
# initializer, each fingerprinted where it is defined.
_NODE_KEY = operator.attrgetter(
    "_op_type", "_domain", "_overload", "_version", "_name", "_inputs", "_outputs"
)


def _slots_known() -> bool:
    """Whether nodes and values keep what the keys read in those slots, inputs as tuples."""
    node_slots = {"_op_type", "_domain", "_overload", "_version", "_name", "_inputs", "_outputs"}
    if not (
        node_slots <= set(ir.Node.__slots__)
        and {"_name", "_type", "_shape"} <= set(ir.Value.__slots__)
    ):
        return False
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, "n"]))
    node = ir.Node("", "Identity", [x], name="n", attributes=[ir.AttrInt64("k", 1)])
    key = _NODE_KEY(node)
    # The slots _graph_parts reads for an output, as the properties return them.
    slots_read = (
        x._name == x.name
        and x._type is x.type
        and x._shape is x.shape
        and x.type._dtype is x.dtype  # type: ignore[union-attr]
        and tuple(x._shape._dims) == x.shape.dims  # type: ignore[union-attr]
        and node._attributes.data == dict(node.attributes)
    )
    # Hashed as they are: tuples, which an edit replaces (a list edited in place would not be).
    return (
        slots_read
        and key[4] == "n"
        and key[5] == (x,)
        and type(key[5]) is tuple
        and type(key[6]) is tuple
    )


_SLOTS_KNOWN = _slots_known()


def _graph_parts(graph: ir.Graph, parts: list[Hashable]) -> None:
    parts.append(("graph", graph.name, tuple(sorted(graph.opset_imports.items()))))
    parts.append(tuple(_value_key(v) for v in graph.inputs))
    parts.append(tuple(_value_key(v) for v in graph.outputs))
    for name, value in graph.initializers.items():
        tensor = value.const_value
        parts.append((name, _value_key(value), None if tensor is None else _tensor_key(tensor)))
    append = parts.append
    node_key = _NODE_KEY
    tensor_type = ir.TensorType
    for node in node_list(graph):
        key = node_key(node)
        append(key)
        for out in key[-1]:
            # A type object can be retyped in place, a shape resized: their contents count.
            # The slots, as Value.name, .type and .shape, TensorType.dtype and Shape.dims
            # return them (a property call each was most of the walk).
            kind = out._type
            shape = out._shape
            append(
                (
                    out._name,
                    kind._dtype if type(kind) is tensor_type else _type_key(kind),
                    None if shape is None else tuple(shape._dims),
                )
            )
        data = node._attributes.data
        if data:
            for attr_name, attr in data.items():
                append((attr_name, *_attr_key(attr)))
            for body in bodies(node):
                _graph_parts(body, parts)


def _type_key(kind: ir.TypeProtocol | None) -> Hashable:
    if kind is None:
        return None
    if type(kind) is ir.TensorType:
        return kind.dtype
    return repr(kind)  # sequence, optional or sparse types: rare, and nested


def _value_key(value: ir.Value) -> Hashable:
    shape = value.shape
    return (value.name, _type_key(value.type), None if shape is None else shape.dims)


def _tensor_key(tensor: ir.TensorProtocol) -> Hashable:
    dims = tuple(tensor.shape.dims)
    if tensor.size > SKELETON_MAX_ELEMENTS:
        # A weight: the skeleton demotes it to a typed input, the check reads no data.
        return (tensor.dtype, dims, tensor.name)
    return (tensor.dtype, dims, tensor.name, tensor.tobytes())


def _attr_key(attr: ir.Attr) -> tuple[Hashable, ...]:
    kind = attr.type
    if attr.is_ref():
        return (attr.name, kind, "ref", attr.ref_attr_name)
    value = attr.value
    if kind is _TENSOR:
        return (attr.name, kind, _tensor_key(value))
    if kind is _TENSORS:
        return (attr.name, kind, tuple(_tensor_key(t) for t in value))
    if kind is _GRAPH or kind is _GRAPHS:
        return (attr.name, kind)  # the bodies follow the node's entry
    if isinstance(value, Hashable):
        return (attr.name, kind, value)
    return (attr.name, kind, repr(value))
