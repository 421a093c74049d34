"""onnx_ir objects built without the conversions their constructors run on every element.

``ir.Shape(dims)`` passes each dimension through ``_maybe_convert_to_symbolic_dim`` (a chain
of ``isinstance`` and ``hasattr`` tests) and copies the list twice; the shape inference and
annotation of a derivative model build a shape or two per node, from dimensions that are
already what the conversion returns (numbers and ``SymbolicDim`` objects read off other
shapes), and those conversions were a thirtieth of a jvp. :func:`new_shape` builds the very
object ``ir.Shape`` builds, in place of its constructor, where the dimensions are known to be
so. Should onnx_ir's ``Shape`` keep other state, the module falls back to the constructor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir

__all__ = ["copy_shape", "detach_inputs", "new_node", "new_shape", "remove_detached"]

Dim = int | ir.SymbolicDim

_new = object.__new__


def _direct(dims: list[Dim]) -> ir.Shape:
    shape = _new(ir.Shape)
    # The attributes Shape.__init__ sets, given dimensions it would keep as they are.
    shape._dims = dims
    shape._denotations = [None] * len(dims)
    shape._frozen = False
    return shape


def _state(shape: ir.Shape) -> tuple[object, ...]:
    slots = tuple(getattr(shape, name) for name in ir.Shape.__slots__)
    return (slots, getattr(shape, "__dict__", None))


def _checked() -> Callable[[list[Dim]], ir.Shape]:
    """:func:`_direct` if it builds what the constructor builds, else the constructor."""
    dims: list[Dim] = [2, ir.SymbolicDim("N"), ir.SymbolicDim(None)]
    try:
        same = _state(_direct(list(dims))) == _state(ir.Shape(dims))
    except Exception:  # a Shape of another layout: the constructor is always right
        same = False
    return _direct if same else ir.Shape


_BUILD = _checked()


def new_shape(dims: list[Dim]) -> ir.Shape:
    """``ir.Shape(dims)`` for a list of ``int`` and ``SymbolicDim`` objects it may keep.

    Args:
        dims: The dimensions: exact ``int`` objects and ``ir.SymbolicDim`` objects only. The
            shape takes the list itself (the caller gives up its own).

    Returns:
        A new, unfrozen shape without denotations.
    """
    return _BUILD(dims)


def copy_shape(shape: ir.Shape) -> ir.Shape:
    """``shape.copy()``: a new, unfrozen shape of the same dimensions and denotations.

    A shape's dimensions are what the constructor's conversion keeps already; cloning a model
    copies a shape per value, and the conversion was a tenth of the copy.
    """
    if _BUILD is not _direct:
        return shape.copy()
    copy = _direct(list(shape._dims))
    copy._denotations = list(shape._denotations)
    return copy


# ------------------------------------------------------------------------------ nodes
# ``ir.Node(...)`` normalises its domain, passes every attribute through the ``Attributes``
# container's checked ``__setitem__`` (a Python call and a runtime ``isinstance`` each, by way
# of ``UserDict.update``), builds each output through ``Value.__init__``'s keyword handling and
# checks its arguments; a derivative model emits tens of thousands of nodes, whose arguments
# the emitter has built itself (``Attr`` objects of distinct names, fresh outputs), and that
# cost half of what building them cost. :func:`new_node` sets the very slots the constructor
# sets; should onnx_ir's ``Node``, ``Value`` or ``Attributes`` keep other state, or set these
# otherwise, the module falls back to the constructor (:func:`_checked_node`).


def _direct_value(producer: ir.Node, index: int) -> ir.Value:
    value = _new(ir.Value)
    # The attributes Value.__init__ sets for a node's output (producer and index only).
    value._producer = producer
    value._index = index
    value._metadata = None
    value._metadata_props = None
    value._name = None
    value._shape = None
    value._type = None
    value._const_value = None
    value._uses = {}
    value.doc_string = None
    value._graph = None
    value._is_graph_input = False
    value._is_graph_output = False
    value._is_initializer = False
    return value


def _direct_node(
    domain: str,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Sequence[ir.Attr],
    num_outputs: int,
    outputs: Sequence[ir.Value] | None = None,
    name: str | None = None,
    overload: str = "",
    version: int | None = None,
    doc_string: str | None = None,
    metadata_props: dict[str, str] | None = None,
) -> ir.Node:
    node = _new(ir.Node)
    # The attributes Node.__init__ sets, given exact Attr objects and no graph.
    node._name = name
    node._domain = "" if domain == "ai.onnx" else domain
    node._op_type = op_type
    held = tuple(inputs)
    node._inputs = held
    if outputs is None:
        node._outputs = tuple([_direct_value(node, i) for i in range(num_outputs)])
    else:
        for i, out in enumerate(outputs):
            out._producer = node
            out._index = i
        node._outputs = tuple(outputs)
    container: Any = _new(_ATTRIBUTES)
    container._owner = node
    container.data = {attr.name: attr for attr in attributes}
    node._attributes = container
    node._overload = overload
    node._version = version
    node._metadata = None
    node._metadata_props = metadata_props
    node.device_configurations = ()
    node._graph = None
    node.doc_string = doc_string
    usage = _USAGE
    for i, value in enumerate(held):
        if value is not None:
            value._uses[usage(node, i)] = None
    return node


def _constructed(
    domain: str,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Sequence[ir.Attr],
    num_outputs: int,
    outputs: Sequence[ir.Value] | None = None,
    name: str | None = None,
    overload: str = "",
    version: int | None = None,
    doc_string: str | None = None,
    metadata_props: dict[str, str] | None = None,
) -> ir.Node:
    return ir.Node(
        domain,
        op_type,
        inputs,
        attributes=attributes,
        num_outputs=None if outputs is not None else num_outputs,
        outputs=outputs,
        name=name,
        overload=overload,
        version=version,
        doc_string=doc_string,
        metadata_props=metadata_props,
    )


def _node_state(node: ir.Node) -> tuple[object, ...]:
    """Everything a node holds, its outputs' and attribute container's state included."""
    slots = {name: getattr(node, name) for name in ir.Node.__slots__}
    outputs = slots.pop("_outputs")
    container = slots.pop("_attributes")
    values = [
        tuple(
            (name, getattr(v, name) if name != "_producer" else getattr(v, name) is node)
            for name in ir.Value.__slots__
        )
        for v in outputs
    ]
    held = (type(container), container.__dict__.get("_owner") is node, dict(container.data))
    extra = {k: v for k, v in container.__dict__.items() if k not in ("_owner", "data")}
    return (slots, getattr(node, "__dict__", None), values, held, extra)


def _checked_node() -> tuple[Callable[..., ir.Node], type, type]:
    """:func:`_direct_node` with the classes it needs, if it builds what the constructor builds.

    Else the constructor (and placeholders for the classes).
    """
    global _USAGE, _ATTRIBUTES
    try:
        a, b = ir.Value(name="a"), ir.Value(name="b")
        attr = ir.Attr("axis", ir.AttributeType.INT, 1)
        built = _constructed("ai.onnx", "Split", [a, None, b], [attr], 2)
        # The classes the constructor uses for uses and attributes, read off its result.
        _USAGE, _ATTRIBUTES = type(next(iter(a._uses))), type(built.attributes)
        direct = _direct_node("ai.onnx", "Split", [a, None, b], [attr], 2)
        same = _node_state(built) == _node_state(direct)
        uses = [(u.node is direct, u.idx) for u in (*a._uses, *b._uses)]
        same = same and uses == [(False, 0), (True, 0), (False, 2), (True, 2)]
        # With the arguments of a copy: its own outputs, a name, an overload and the rest.
        copied = {
            "name": "n",
            "overload": "o",
            "version": 3,
            "doc_string": "d",
            "metadata_props": {"k": "v"},
        }
        outs = [ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT)) for _ in range(2)]
        built = _constructed("", "Split", [a], [attr], 2, outputs=outs, **copied)  # type: ignore[arg-type]
        outs = [ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT)) for _ in range(2)]
        direct = _direct_node("", "Split", [a], [attr], 2, outputs=outs, **copied)  # type: ignore[arg-type]
        same = same and _node_state(built) == _node_state(direct)
    except Exception:  # a Node of another layout: the constructor is always right
        same = False
    if not same:
        return _constructed, object, object
    return _direct_node, _USAGE, _ATTRIBUTES


_USAGE: type = object
_ATTRIBUTES: type = object
_BUILD_NODE, _USAGE, _ATTRIBUTES = _checked_node()


def new_node(
    domain: str,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Sequence[ir.Attr],
    num_outputs: int,
    *,
    outputs: Sequence[ir.Value] | None = None,
    name: str | None = None,
    overload: str = "",
    version: int | None = None,
    doc_string: str | None = None,
    metadata_props: dict[str, str] | None = None,
) -> ir.Node:
    """``ir.Node(domain, op_type, inputs, attributes=attributes, num_outputs=num_outputs)``.

    Args:
        domain: The operator's domain (``"ai.onnx"`` is normalised to ``""``, as there).
        op_type: The operator.
        inputs: The inputs (None for an omitted one); the node becomes a use of each.
        attributes: ``ir.Attr`` objects of distinct names (of equal names the last is kept).
        num_outputs: How many fresh outputs the node gets, when ``outputs`` is None.
        outputs: Values without a producer that become the node's outputs, in order.
        name: The node's name.
        overload: The function overload it calls.
        version: The opset version of its operator.
        doc_string: Its documentation string.
        metadata_props: Its metadata properties (the dict itself is held).

    Returns:
        A new node in no graph.
    """
    return _BUILD_NODE(
        domain,
        op_type,
        inputs,
        attributes,
        num_outputs,
        outputs,
        name,
        overload,
        version,
        doc_string,
        metadata_props,
    )


# ------------------------------------------------------------------------- detaching
# Removing a node starts by making it read nothing, ``replace_input_with(i, None)`` for each
# input: each call rebuilds the input tuple through a generator and checks the index, and the
# cleanup and the reverse sweep detach tens of thousands of nodes. :func:`detach_inputs` ends
# in the very same state; should onnx_ir's nodes keep their inputs otherwise, it makes the
# calls (:func:`_checked_detach`).


def _detach_by_calls(node: ir.Node) -> None:
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)


def _detach_direct(node: ir.Node) -> None:
    if node.device_configurations:
        _detach_by_calls(node)  # sharding specs of the inputs go too: the method's own way
        return
    held = node._inputs
    if not held:
        return
    node._inputs = (None,) * len(held)
    for i, value in enumerate(held):
        if value is not None:
            value._remove_usage(node, i)


def _checked_detach() -> Callable[[ir.Node], None]:
    """:func:`_detach_direct` if it leaves what the calls leave, else the calls."""

    def state(node: ir.Node, values: list[ir.Value]) -> tuple[object, ...]:
        return (node.inputs, [[(u.node is node, u.idx) for u in v.uses()] for v in values])

    try:
        a, b = ir.Value(name="a"), ir.Value(name="b")
        results = []
        for detach in (_detach_by_calls, _detach_direct):
            other = ir.Node("", "Add", [a, b])
            node = ir.Node("", "Sum", [a, None, b, a])
            detach(node)
            results.append(state(node, [a, b]))
            detach(other)
        same = results[0] == results[1] and results[0][0] == (None,) * 4
    except Exception:  # a Node of another layout: the calls are always right
        same = False
    return _detach_direct if same else _detach_by_calls


_DETACH = _checked_detach()


def detach_inputs(node: ir.Node) -> None:
    """``node.replace_input_with(i, None)`` for every input ``i``: it reads nothing after.

    Args:
        node: The node; its inputs become None (as many as it had), and it stops being a use
            of the values it read.
    """
    _DETACH(node)


def remove_detached(graph: ir.Graph, nodes: Sequence[ir.Node]) -> None:
    """``graph.remove(nodes, safe=True)`` for nodes that :func:`detach_inputs` detached already.

    The safe removal checks that no node kept reads an output of a removed one and that no
    removed output is a graph output, then detaches each node's inputs one call at a time: on
    nodes that read nothing already that rebuilt every input tuple for nothing (the reverse
    sweep removes every linear node, tens of thousands). The checks are the same (a
    ``ValueError`` leaves the graph as it was); a node still reading something is detached.

    Raises:
        ValueError: If a node is not in ``graph``, is read by a node that stays, or computes
            a graph output.
    """
    removed = frozenset(nodes)
    graph_outputs = frozenset(graph.outputs)
    for node in removed:
        if node.graph is not graph:
            raise ValueError(f"The node '{node!r}' does not belong to this graph.")
        for out in node.outputs:
            if out in graph_outputs:
                raise ValueError(f"Node '{node!r}' is still an output of the graph.")
            if any(user not in removed for user, _ in out.uses()):
                raise ValueError(f"Output value '{out!r}' is still used by nodes that stay.")
    for node in removed:
        detach_inputs(node)
    graph.remove(list(removed))
