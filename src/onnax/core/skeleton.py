"""The *skeleton* of a model: its proto with the weights demoted to typed graph inputs.

onnx.checker, onnx.version_converter and onnx.shape_inference only work on protobuf. Serialising
the weights for them would make a transform's time and memory grow with the size of the model's
data; the skeleton keeps everything they read (types, shapes, small constants such as axes and
scales) and leaves the large tensors out. :func:`restore_weights` turns a converted skeleton
back into a model holding the original tensors.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

__all__ = ["SKELETON_MAX_ELEMENTS", "is_weight", "restore_weights", "skeleton_proto"]

SKELETON_MAX_ELEMENTS = 1024
"""Initializers up to this size stay in the skeleton: shapes, axes, scales and other small
constants that the checker or a version adapter may read. Larger ones are weights."""


def is_weight(value: ir.Value) -> bool:
    """Whether ``value`` is an initializer too large to travel in the skeleton."""
    tensor = value.const_value
    return tensor is not None and tensor.size > SKELETON_MAX_ELEMENTS


def skeleton_proto(model: ir.Model) -> tuple[onnx.ModelProto, list[str]]:
    """The proto of ``model`` with every large initializer demoted to a typed graph input.

    ``model`` is changed only while serialising and restored before returning (it must be the
    transform's own copy all the same). Returns the proto and the demoted names that were
    initializers only (not graph inputs), in the order they were appended to the graph inputs.
    """
    graph = model.graph
    demoted: list[tuple[ir.Value, ir.TensorProtocol, bool]] = []
    inlined: list[tuple[ir.Value, ir.TensorProtocol]] = []
    for name, value in list(graph.initializers.items()):
        if not is_weight(value):
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                # The checker resolves an external reference against the working directory
                # (a proto has no folder); the skeleton carries the few small ones inline.
                inlined.append((value, tensor))
                value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
            continue
        tensor = value.const_value
        assert tensor is not None
        graph.initializers.pop(name)
        value.const_value = None
        if value.type is None:
            value.type = ir.TensorType(tensor.dtype)
        if value.shape is None:
            value.shape = ir.Shape(tensor.shape.numpy())
        appended = not value.is_graph_input()
        if appended:
            graph.inputs.append(value)
        demoted.append((value, tensor, appended))
    try:
        proto = ir.to_proto(model)
    finally:
        for value, tensor in inlined:
            value.const_value = tensor
        # The appended inputs are the last ones, in order: popped from the end, as a
        # remove() of each scanned and shifted the list (quadratic in the weights).
        for value, _, appended in reversed(demoted):
            if appended:
                popped = graph.inputs.pop()
                assert popped is value
        for value, tensor, _ in demoted:
            value.const_value = tensor
            graph.register_initializer(value)
    return proto, [str(v.name) for v, _, appended in demoted if appended]


def restore_weights(source: ir.Model, converted: ir.Model, appended: list[str]) -> None:
    """Turns the demoted inputs of ``converted`` back into initializers sharing the tensors."""
    graph = converted.graph
    inputs = {v.name: v for v in graph.inputs}
    for name, original in source.graph.initializers.items():
        if not is_weight(original):
            continue
        value = inputs[name]
        if name in appended:
            graph.inputs.remove(value)
        value.const_value = original.const_value
        graph.register_initializer(value)
