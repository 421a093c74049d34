"""A copy of the caller's model that owns everything a transform may write to.

Every transform works on a copy (the contract's first promise: the source is never changed).
``onnx_ir.Model.clone`` copies nodes, values and graphs but shares the tensor objects, and tensor
objects are not read-only: their ``name`` is written by onnx_ir itself, by
``ir.convenience.get_const_tensor`` (which shape inference calls on every ``Constant``), by
``Value.name``'s setter (a renamed initializer renames its tensor) and by ``ir.to_proto`` (an
initializer's tensor takes the value's name). A shared ``Constant`` tensor without a name would
come back from a transform named after its output, in the caller's model too.

So the copy gets tensor objects of its own that share the *data*: a view costs no memory and no
time proportional to the weights, whatever their storage (in memory, in a protobuf, on disk).
"""

from __future__ import annotations

from collections.abc import Iterator
from copy import deepcopy
from typing import TypeGuard

import onnx_ir as ir

from onnax.core.fast_ir import copy_shape, new_node
from onnax.core.static import attr_tensor
from onnax.core.traverse import model_graphs

__all__ = ["clone_model"]


def clone_model(model: ir.Model) -> ir.Model:
    """A structural copy of ``model`` whose tensor objects are its own (their data is shared).

    onnx_ir's cloner cannot copy a subgraph whose output is a value captured from the enclosing
    graph (``then_branch = () => (X) {}``); such models are copied through their serialised form
    instead, which copies the weights too but is exact.
    """
    flat = _clone_flat(model)
    if flat is not None:
        return flat
    try:
        copy = model.clone()
    except RuntimeError:
        return ir.from_proto(ir.to_proto(model))
    _own_tensors(copy)
    return copy


_BODIES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_TENSOR = ir.AttributeType.TENSOR
_TENSORS = ir.AttributeType.TENSORS


def _clone_flat(model: ir.Model) -> ir.Model | None:
    """What ``model.clone()`` then :func:`_own_tensors` give, in one walk; None if not flat.

    For a model without functions, subgraphs or device configurations (most models, and
    every derivative model of one), which is what onnx_ir's ``Cloner`` then meets only in
    its general form: each node and value went through its error-context wrappers, every
    output's six properties through their setters, and :func:`_own_tensors` walked the copy
    again to give it types and tensors of its own (about a tenth of a jvp). Here each value
    is built once, with its own type and tensors. None sends the model down the general path
    (which also handles, and refuses, what this one does not read).
    """
    source = model.graph
    if model.functions or model.device_configurations:
        return None
    copies: dict[ir.Value, ir.Value] = {}
    for value in source.inputs:
        copies[value] = _copy_value(value, value.is_initializer())
    for value in source.initializers.values():
        if value not in copies:
            copies[value] = _copy_value(value, True)
    nodes = []
    for node in source:
        copy = _copy_node(node, copies)
        if copy is None:
            return None  # the copies made so far are garbage: they read only each other
        nodes.append(copy)
    outputs = [copies.get(v) for v in source.outputs]
    if any(v is None for v in outputs):
        return None  # an output from nowhere: the general path refuses it
    graph = ir.Graph(
        [copies[v] for v in source.inputs],
        outputs,  # type: ignore[arg-type]
        nodes=nodes,
        initializers=[copies[v] for v in source.initializers.values()],
        doc_string=source.doc_string,
        opset_imports=source.opset_imports.copy(),
        name=source.name,
    )
    if source.metadata_props:
        graph.metadata_props.update(source.metadata_props)
    _copy_meta(source, graph)
    return ir.Model(
        graph,
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        domain=model.domain,
        model_version=model.model_version,
        doc_string=model.doc_string,
        functions=[],
        metadata_props=dict(model.metadata_props),
        device_configurations=model.device_configurations,
    )


def _own_type(kind: ir.TypeProtocol | None) -> ir.TypeProtocol | None:
    """A type object of the copy's own, as :func:`_own_tensors` gives it."""
    if kind is None:
        return None
    return ir.TensorType(kind.dtype) if type(kind) is ir.TensorType else deepcopy(kind)


def _copy_value(value: ir.Value, initializer: bool) -> ir.Value:
    """A value's copy (a graph input, a node's output), with a view of an initializer's tensor."""
    tensor = value.const_value
    shape = value.shape
    copy = ir.Value(
        name=value.name,
        type=_own_type(value.type),
        shape=None if shape is None else copy_shape(shape),
        doc_string=value.doc_string,
        const_value=_view(tensor) if initializer and tensor is not None else None,
    )
    if value.metadata_props:
        copy.metadata_props.update(value.metadata_props)
    _copy_meta(value, copy)
    return copy


def _copy_node(node: ir.Node, copies: dict[ir.Value, ir.Value]) -> ir.Node | None:
    """The copy of a node of a flat graph, its outputs recorded in ``copies``; None if not flat."""
    if node.device_configurations:
        return None
    inputs: list[ir.Value | None] = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        known = copies.get(value)
        if known is None:
            return None  # an outer-scope or unsorted value: the general path decides
        inputs.append(known)
    attributes: list[ir.Attr] = []
    for attr in node.attributes.data.values():
        kind = attr.type
        if kind in _BODIES:
            return None
        # The copy's own tensor objects, as _own_tensors gives them; other attributes are
        # shared, as onnx_ir's cloner shares them.
        if kind is _TENSOR:
            attr = ir.AttrTensor(attr.name, _view(attr_tensor(attr)), attr.doc_string)
        elif kind is _TENSORS:
            attr = ir.AttrTensors(attr.name, [_view(t) for t in attr.as_tensors()], attr.doc_string)
        attributes.append(attr)
    outputs = [_copy_value(out, initializer=False) for out in node.outputs]
    # The constructor's node (fast_ir.new_node): the outputs are fresh copies, the
    # attributes Attr objects of the node's own distinct names.
    new = new_node(
        node.domain,
        node.op_type,
        inputs,
        attributes,
        len(outputs),
        overload=node.overload,
        outputs=outputs,
        version=node.version,
        name=node.name,
        doc_string=node.doc_string,
        metadata_props={**node.metadata_props},
    )
    _copy_meta(node, new)
    for out, copy in zip(node.outputs, outputs, strict=True):
        copies[out] = copy
    _carry_constant(new)
    return new


def _copy_meta(source: ir.Value | ir.Node | ir.Graph, copy: ir.Value | ir.Node | ir.Graph) -> None:
    """onnx_ir's ``Cloner.clone_meta`` (a shallow copy), if ``source`` has any meta."""
    # Read without creating it: the meta property makes a store for each object it is read on.
    meta = source._metadata
    if not meta:
        return
    for key, value in meta.items():
        copy.meta[key] = value
    for key in meta._invalid_keys:  # what the cloner copies too
        copy.meta.invalidate(key)


# The exact class first: onnx_ir's tensor classes take isinstance through the runtime protocol
# machinery, a few microseconds a test, for each tensor of the model at every clone.
def _external(tensor: ir.TensorProtocol) -> TypeGuard[ir.ExternalTensor]:
    kind = type(tensor)
    if kind is ir.ExternalTensor:
        return True
    return kind is not ir.Tensor and isinstance(tensor, ir.ExternalTensor)


def _in_memory(tensor: ir.TensorProtocol) -> TypeGuard[ir.Tensor]:
    return type(tensor) is ir.Tensor or isinstance(tensor, ir.Tensor)


def _view(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    """A new tensor object with the same name, metadata and data as ``tensor``."""
    metadata = dict(tensor.metadata_props)
    shape = ir.Shape(tensor.shape.numpy())
    if _external(tensor):
        # Stays external (the data is read from the same file, memory-mapped), so a result
        # saved with external data keeps it there.
        return ir.ExternalTensor(
            tensor.location,
            tensor.offset,
            tensor.length,
            tensor.dtype,
            shape=tensor.shape,
            name=tensor.name,
            doc_string=tensor.doc_string,
            metadata_props=metadata,
            base_dir=tensor.base_dir,
        )
    if _in_memory(tensor):
        return ir.Tensor(
            tensor.raw,
            dtype=tensor.dtype,
            shape=tensor.shape,
            name=tensor.name,
            doc_string=tensor.doc_string,
            metadata_props=metadata,
        )
    if tensor.dtype == ir.DataType.STRING:
        return ir.StringTensor(
            tensor.numpy().reshape(-1).tolist(),
            shape=shape,
            name=tensor.name,
            doc_string=tensor.doc_string,
            metadata_props=metadata,
        )
    # Any other storage (a tensor in a protobuf, a packed or lazy tensor): read through on
    # demand, never copied.
    return ir.LazyTensor(
        lambda: tensor,
        dtype=tensor.dtype,
        shape=shape,
        name=tensor.name,
        doc_string=tensor.doc_string,
        metadata_props=metadata,
    )


def _graphs(model: ir.Model) -> Iterator[ir.Graph | ir.Function]:
    yield from model_graphs(model)
    for function in model.functions.values():
        yield function
        for node in function.all_nodes():
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    yield attr.as_graph()
                    yield from attr.as_graph().subgraphs()
                elif attr.type == ir.AttributeType.GRAPHS:
                    for graph in attr.as_graphs():
                        yield graph
                        yield from graph.subgraphs()


def _own_tensors(model: ir.Model) -> None:
    """Gives every tensor attribute and initializer of ``model`` a view of its own.

    Every occurrence gets its own view, as in a reloaded model: an in-memory model may hold one
    tensor object in several places (a rule's cached constant in a body and in its copy), and
    the names inference writes into it would then depend on which place it saw last. Constant
    values that only live in memory (not serialised) are dropped, except that a ``Constant``'s
    output carries its attribute's tensor (:func:`_carry_constant`).
    """
    for graph in _graphs(model):
        values: list[ir.Value] = list(graph.inputs)
        if isinstance(graph, ir.Graph):
            values.extend(graph.initializers.values())
        for node in graph:
            values.extend(node.outputs)
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR:
                    node.attributes[name] = ir.AttrTensor(
                        name, _view(attr_tensor(attr)), attr.doc_string
                    )
                elif attr.type == ir.AttributeType.TENSORS:
                    node.attributes[name] = ir.AttrTensors(
                        name, [_view(t) for t in attr.as_tensors()], attr.doc_string
                    )
        for value in values:
            if value.type is not None:
                # onnx_ir's clone shares the type objects, and ``Value.dtype``'s setter edits
                # the type in place: retyping a value of the copy would retype the caller's.
                kind = value.type
                value.type = (
                    ir.TensorType(kind.dtype) if type(kind) is ir.TensorType else deepcopy(kind)
                )
            if value.const_value is None:
                continue
            if value.is_initializer():
                value.const_value = _view(value.const_value)
            else:
                # In-memory state that serialisation drops (a value folded by an earlier
                # inference): the copy starts as a reloaded model would, so ``f(g)`` and
                # ``f(reload(g))`` are the same model. Constants get theirs back below.
                value.const_value = None
        for node in graph:
            _carry_constant(node)


def _carry_constant(node: ir.Node) -> None:
    """Gives a ``Constant``'s output its tensor as ``const_value``, as emitted constants have.

    Readers (shape inference, ``get_const_tensor``) then take the tensor directly: without it
    they check the attribute against ``TensorProtocol``, a runtime protocol check that cost
    more than the rest of inference for each of the thousands of constants a big graph reads.
    The attribute's own tensor object, so a reloaded source (which has no ``const_value``)
    reads the same tensor.
    """
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return
    attr = node.attributes.get("value")
    if attr is None or attr.type != ir.AttributeType.TENSOR or attr.is_ref():
        return
    node.outputs[0].const_value = attr.value
