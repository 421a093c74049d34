"""What the last shape inference of a model knew, node by node, so that the next may pass over.

A transform infers the model it was given, adds nodes, and infers again: most of the second
round's time would go into nodes whose outputs it knows already. :func:`remember` keeps, at the
end of an inference, a record of each node whose outputs it fully knows; :func:`unchanged`
gives, at the start of the next, the nodes whose record still holds, which inference may pass
over (:func:`onnax.core.inference.infer_shapes` with ``new_only``).

A record holds what onnx_shape_inference reads to infer the node: its operator, attributes and
inputs (the same value objects, with the same type, shape and ``const_value``), and what its
outputs held afterwards. Inferring a node whose record holds finds what its outputs hold
already, so passing over it changes nothing, with three exceptions, which get no record:

* a ``Constant`` whose output has no ``const_value``: a passed-over node is moved to a domain
  without inference rules, and ``get_const_tensor`` reads only default-domain ``Constant``
  nodes, so a consumer inferred after it would not see its value (a ``Squeeze`` then kept the
  rank of its input);
* a node with an output whose contents inference tracks symbolically (a ``Shape`` of a value
  with symbolic dimensions, and the shape arithmetic after it): the engine keeps those contents
  for the length of one run only, and a ``Reshape`` to them inferred after a passed-over
  ``Shape`` would find no shape;
* a node holding subgraphs (the nodes of its bodies get records of their own).
"""

from __future__ import annotations

import weakref
from typing import Any

import onnx_ir as ir
from onnx_shape_inference import SYM_DATA_KEY

from onnax.core.fast_nodes import node_list
from onnax.core.traverse import subgraphs

__all__ = ["passable", "remember", "unchanged"]

_BODIES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)

_Record = tuple[Any, ...]

_RECORDS: weakref.WeakKeyDictionary[ir.Graph, dict[int, tuple[weakref.ref[ir.Node], _Record]]] = (
    weakref.WeakKeyDictionary()
)
"""Per main graph, the record of each node of the model (subgraphs included) at the end of its
last recording inference, by ``id`` of the node with a weak reference to it (a plain dict:
a ``WeakKeyDictionary`` per node cost a third of the records' time). Not in ``graph.meta``: a
copy of the model would carry it, and a copied node is not one that inference saw. Records
hold weak references only (to nodes, values and tensors), so they keep no graph alive."""


def remember(model: ir.Model) -> None:
    """Records, at the end of an inference of ``model``, what it knew of each node."""
    records: dict[int, tuple[weakref.ref[ir.Node], _Record]] = {}
    states: dict[ir.Value, tuple[Any, ...]] = {}
    for graph in (model.graph, *subgraphs(model.graph)):
        for node in node_list(graph):
            record = _record(node, states)
            if record is not None:
                records[id(node)] = (weakref.ref(node), record)
    _RECORDS[model.graph] = records


def unchanged(model: ir.Model) -> list[ir.Node]:
    """The nodes whose record from the last recording inference of ``model`` still holds."""
    records = _RECORDS.get(model.graph)
    if not records:
        return []
    graphs = {model.graph, *subgraphs(model.graph)}
    found = []
    states: dict[ir.Value, tuple[Any, ...]] = {}
    for ref, record in records.values():
        node = ref()
        if node is not None and node.graph in graphs and _record(node, states) == record:
            found.append(node)
    return found


def passable(node: ir.Node) -> bool:
    """Whether inference may pass over ``node`` when its inputs are as it last inferred them.

    Not so for the exceptions of this module's introduction, nor for a node with an output
    not fully known (:func:`_fully_known`).
    """
    # Every inference records and checks every node: the attributes are read from the dict
    # under the UserDict (a C loop, not a generator), here and in the record.
    for attr in node._attributes.data.values():
        if attr._type in _BODIES:
            return False
    constant = node._op_type == "Constant" and node._domain in ("", "ai.onnx")
    for out in node.outputs:
        if not _fully_known(out):
            return False
        if out.const_value is None:
            # Read without the metadata_props property, which makes a dict for each value
            # it is read on.
            props = out._metadata_props
            if constant or (props and SYM_DATA_KEY in props):
                return False
    return True


def _record(node: ir.Node, states: dict[ir.Value, tuple[Any, ...]]) -> _Record | None:
    """What inference reads and writes for ``node``, or None if it must always infer it.

    ``states`` holds the :func:`_state` of the values seen so far in this walk (nothing
    changes during one), so that a value read by several nodes is looked at once: the
    states were most of the records' time.
    """
    if not passable(node):
        return None
    inputs: list[tuple[Any, ...] | None] = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        state = states.get(value)
        if state is None:
            state = states[value] = _state(value)
        inputs.append(state)
    outputs = []
    for value in node.outputs:
        state = states.get(value)
        if state is None:
            state = states[value] = _state(value)
        outputs.append(state)
    return (
        node.op_type,
        node.domain,
        node.version,
        tuple(node.attributes.data.values()),
        tuple(inputs),
        tuple(outputs),
    )


def _fully_known(value: ir.Value) -> bool:
    """A value of known type whose dimensions are all numbers or names, not a graph output.

    Inference names the unnamed dimensions of the values it reads, and re-inferring the
    producer first would give them the producer's names instead (as where
    ``forget_guessed_broadcasts`` made a dimension unknown); a graph output has a declared
    shape that inference may refine.
    """
    # The slots, as the properties return them: every record and check asks every output.
    shape = value._shape
    if value._type is None or shape is None or value._is_graph_output:
        return False
    # A loop, not all() over a generator: every node's outputs are asked, at every record.
    for d in shape._dims:  # noqa: SIM110
        if not isinstance(d, int) and d.value is None:
            return False
    return True


def _state(value: ir.Value) -> tuple[Any, ...]:
    """The identity, type, shape and constant of a value, by weak reference.

    A weak reference compares equal to another only while both referents live and are the
    same object; a dead one equals none but itself, so a value or tensor replaced since
    (and freed, its address maybe reused) does not pass for the one recorded.
    """
    # The slots, as the properties return them (a property call each cost more than the rest).
    shape = value._shape
    tensor = value._const_value
    kind = value._type
    return (
        weakref.ref(value),
        type(kind),
        None if kind is None else kind.dtype,  # value.dtype
        None if shape is None else tuple(shape._dims),  # shape.dims: a tuple, taken afresh
        None if tensor is None else _weak(tensor),
    )


def _weak(tensor: ir.TensorProtocol) -> object:
    try:
        return weakref.ref(tensor)
    except TypeError:  # a tensor class without weak references: held (it holds no graph)
        return _Same(tensor)


class _Same:
    """Compares equal to a wrapper of the same object only (tensors have no value equality)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)
