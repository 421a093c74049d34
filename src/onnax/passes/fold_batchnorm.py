"""Folding an inference-mode BatchNormalization into the Conv before it, ahead of differentiation.

``BatchNormalization(Conv(x, W, b))`` in inference mode is ``Conv(x, W * a, (b - mean) * a + B)``
with the per-channel factor ``a = scale / sqrt(var + eps)``: onnxruntime makes that rewrite in
the primal (its ConvBNFusion), but not in a derivative model, where the Conv's output is also
read by the BatchNormalization's derivative (``xhat``, for the scale's gradient). Differentiated
node by node, every Conv -> BatchNormalization unit then costs a Conv, a BatchNormalization and a
second one for ``xhat`` in the forward sweep (three passes over the activation onnxruntime can
no longer fuse with a following Relu), and ``sum(g * xhat)`` per channel in the backward sweep.

Written as the folded Conv, whose weight and bias are small nodes over the parameters, the
same chain rule needs none of that: the scale's gradient comes from the weight gradient of the
folded Conv, ``G = dL/d(W * a)``, as ``sum(G * W)`` over each output channel (the transpose of
``W * a`` with respect to ``a``), a weight-sized product; the forward is the one Conv onnxruntime
runs in the primal (the weight and bias nodes read only initializers, so it folds them at load).
Every parameter keeps its derivative (W, b, scale, B, mean and var are read by the new nodes).
Where none of them is differentiated (initializers, not selected: a derivative w.r.t. the data
only), the folded weight and bias are computed here, in the parameters' type, and become new
initializers: the derivative model holds the primal's one Conv and no nodes over the
parameters (shufflenet's vjp transform 0.30 -> 0.22 s; the source's tensors are not touched).

The fold applies to a main-graph Conv whose output only the BatchNormalization reads, in
inference mode (no ``training_mode``, no statistics outputs), float or double throughout (a
half-precision factor would round the weight the kernel keeps in float), when none of the two
values involved is a graph output, a differentiated input or a stop_gradient cut (those keep
their names and values).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx_ir as ir

__all__ = ["fold_batch_norms"]

_FOLDED_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def fold_batch_norms(graph: ir.Graph, keep: Collection[ir.Value]) -> int:
    """Rewrites every foldable Conv -> BatchNormalization pair of ``graph`` in place.

    Args:
        graph: The main graph of a prepared (shape-inferred) model.
        keep: Values that must stay as they are (differentiated inputs, selected outputs,
            stop_gradient cuts).

    Returns:
        The number of pairs folded.
    """
    folded = 0
    names: set[str] | None = None
    for bn in list(graph):
        conv = _foldable(bn, keep)
        if conv is None:
            continue
        params = [conv.inputs[1], *conv.inputs[2:3], *bn.inputs[1:]]
        if all(_constant(v, keep) for v in params):
            if names is None:
                names = _taken_names(graph)
            weight, bias = _fold_numbers(graph, conv, bn, names)
        else:
            weight, bias = _fold_nodes(graph, conv, bn)
        _rewire(graph, conv, bn, weight, bias)
        folded += 1
    return folded


def _constant(value: ir.Value | None, keep: Collection[ir.Value]) -> bool:
    """An initializer whose data is known and which no derivative is asked of."""
    return (
        value is not None
        and value.is_initializer()
        and not value.is_graph_input()
        and value.const_value is not None
        and value not in keep
    )


def _taken_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in (*graph.inputs, *graph.initializers.values()) if v.name}
    names.update(o.name for node in graph for o in node.outputs if o.name)
    return names


def _fold_numbers(
    graph: ir.Graph, conv: ir.Node, bn: ir.Node, names: set[str]
) -> tuple[ir.Value, ir.Value]:
    """The folded weight and bias as new initializers, computed here.

    No parameter is differentiated: the derivative model then holds the one Conv onnxruntime
    runs, with no nodes over the parameters.
    """
    weight = conv.inputs[1]
    assert weight is not None and weight.const_value is not None
    w = weight.const_value.numpy()
    scale, shift, mean, var = (_array(v) for v in bn.inputs[1:])
    bias = _array(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else 0
    eps = np.array(bn.attributes.get_float("epsilon", 1e-5), w.dtype)
    factor = scale / np.sqrt(var + eps)
    folded_weight = w * factor.reshape(-1, *[1] * (w.ndim - 1))
    folded_bias = (bias - mean) * factor + shift
    values = []
    for array, base in ((folded_weight, weight.name), (folded_bias, f"{weight.name}_bias")):
        name = _fresh(f"{base or 'conv'}_bn_folded", names)
        tensor = ir.tensor(np.ascontiguousarray(array, dtype=w.dtype), name=name)
        value = ir.Value(
            name=name,
            type=ir.TensorType(ir.DataType.from_numpy(w.dtype)),
            shape=ir.Shape(list(array.shape)),
            const_value=tensor,
        )
        graph.register_initializer(value)
        values.append(value)
    return values[0], values[1]


def _array(value: ir.Value | None) -> np.ndarray:
    assert value is not None and value.const_value is not None
    return value.const_value.numpy()


def _fresh(base: str, names: set[str]) -> str:
    name, k = base, 1
    while name in names:
        name, k = f"{base}_{k}", k + 1
    names.add(name)
    return name


def _foldable(bn: ir.Node, keep: Collection[ir.Value]) -> ir.Node | None:
    """The Conv feeding ``bn`` when the pair can be folded (module doc), else None."""
    if bn.op_type != "BatchNormalization" or bn.domain != "" or len(bn.inputs) != 5:
        return None
    if bn.attributes.get_int("training_mode", 0) or any(o.name for o in bn.outputs[1:]):
        return None
    c, y = bn.inputs[0], bn.outputs[0]
    conv = c.producer() if c is not None else None
    if conv is None or conv.op_type != "Conv" or conv.domain != "" or conv.graph is not bn.graph:
        return None
    if c is None or len(c.uses()) != 1 or c.is_graph_output() or y.is_graph_output():
        return None
    if c in keep or y in keep:
        return None
    values = [*conv.inputs, *bn.inputs[1:], y]
    if any(v is None or v.dtype is None for v in values) or len(conv.inputs) < 2:
        return None
    if len({v.dtype for v in values if v is not None}) != 1 or y.dtype not in _FOLDED_TYPES:
        return None
    weight = conv.inputs[1]
    if weight is None or weight.shape is None or c.shape is None:
        return None
    if len(weight.shape) != len(c.shape) or len(weight.shape) < 3:
        return None
    return conv if _pays(weight.shape, c.shape) else None


_WEIGHT_PASSES_PER_ACTIVATION_PASS = 2
"""Folded, a unit's backward makes about three passes over the weight (``G * a``, and
``G * W`` summed per channel) where unfolded it made about six over the activation (the forward's
BatchNormalization and ``xhat``, ``g * xhat`` summed per channel, ``g * a``): the fold pays
while the weight per output channel is at most about twice the activation per output channel.
(resnet50 at batch 1, every pair folded: the weight-sized products of the late stages, 2048
channels of 7x7, cost more than the passes saved.)"""


def _pays(weight: ir.Shape, out: ir.Shape) -> bool:
    """Whether the fold saves work (above); a symbolic batch counts as one example."""
    per_channel = 1
    for d in weight.dims[1:]:
        if not isinstance(d, int):
            return True
        per_channel *= d
    positions = out.dims[0] if isinstance(out.dims[0], int) else 1
    for d in out.dims[2:]:
        if not isinstance(d, int):
            return True  # run-time spatial sizes: images, large in practice
        positions *= d
    return per_channel <= _WEIGHT_PASSES_PER_ACTIVATION_PASS * positions


def _value(node: ir.Node, like: ir.Value, dims: ir.Shape | list[int | ir.SymbolicDim]) -> ir.Value:
    out = node.outputs[0]
    assert like.dtype is not None
    out.dtype = like.dtype
    out.shape = ir.Shape(dims)
    return out


def _fold_nodes(graph: ir.Graph, conv: ir.Node, bn: ir.Node) -> tuple[ir.Value, ir.Value]:
    """The folded weight and bias as nodes over the parameters, inserted before the Conv."""
    weight = conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    scale, shift, mean, var = bn.inputs[1], bn.inputs[2], bn.inputs[3], bn.inputs[4]
    assert weight is not None and weight.shape is not None and weight.dtype is not None
    assert scale is not None and shift is not None and mean is not None and var is not None
    y = bn.outputs[0]
    dtype = weight.dtype.numpy()
    channels = list(weight.shape.dims[:1])
    eps = bn.attributes.get_float("epsilon", 1e-5)
    nodes: list[ir.Node] = []

    def add(op: str, inputs: list[ir.Value | None], dims: list) -> ir.Value:
        node = ir.Node("", op, inputs)
        nodes.append(node)
        return _value(node, y, dims)

    def const(array: np.ndarray) -> ir.Value:
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(array))])
        nodes.append(node)
        out = node.outputs[0]
        out.dtype = ir.DataType.from_numpy(array.dtype)
        out.shape = ir.Shape(list(array.shape))
        out.const_value = ir.tensor(array)
        return out

    # a = scale / sqrt(var + eps), as onnxruntime's own fold computes it.
    root = add("Sqrt", [add("Add", [var, const(np.array(eps, dtype))], channels)], channels)
    factor = add("Div", [scale, root], channels)
    # As rows [M, C*k]: the weight's gradient then sums G * W per channel over one trailing
    # axis of a matrix (onnxruntime's ReduceSum over three axes of the 4-D weight measured
    # twice as slow).
    static = weight.shape.is_static()
    per_channel = [int(np.prod(weight.shape.numpy()[1:]))] if static else [None]
    rows = add("Reshape", [weight, const(np.array([0, -1], np.int64))], [*channels, *per_channel])
    column = add("Reshape", [factor, const(np.array([-1, 1], np.int64))], [*channels, 1])
    scaled = add("Mul", [rows, column], [*channels, *per_channel])
    if static:
        dims = const(np.array(list(weight.shape.numpy()), np.int64))
    else:
        dims = add("Shape", [weight], [len(weight.shape)])
        dims.dtype = ir.DataType.INT64
    folded_weight = add("Reshape", [scaled, dims], list(weight.shape.dims))
    centred = (
        add("Sub", [bias, mean], channels) if bias is not None else add("Neg", [mean], channels)
    )
    folded_bias = add("Add", [add("Mul", [centred, factor], channels), shift], channels)
    graph.insert_before(conv, nodes)
    return folded_weight, folded_bias


def _rewire(
    graph: ir.Graph, conv: ir.Node, bn: ir.Node, folded_weight: ir.Value, folded_bias: ir.Value
) -> None:
    """The Conv reads the folded weight and bias and computes the normalisation's output."""
    y = bn.outputs[0]
    c = conv.outputs[0]
    conv.replace_input_with(1, folded_weight)
    if len(conv.inputs) < 3:
        conv.resize_inputs(3)
    conv.replace_input_with(2, folded_bias)
    # The Conv now computes y: its output takes y's readers, name, type and shape.
    y.replace_all_uses_with(c)
    name, shape = y.name, y.shape
    y.name = None
    assert y.dtype is not None
    c.name, c.dtype = name, y.dtype
    c.shape = shape.copy() if shape is not None else None
    for i in range(len(bn.inputs)):
        bn.replace_input_with(i, None)
    graph.remove(bn)
