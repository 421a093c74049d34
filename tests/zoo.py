"""The light model zoo shipped with onnx, with seeded random weights.

``onnx/backend/test/data/light`` holds nine opset-9 image classifiers whose weights are not stored:
each is built at run time by a ``ConstantOfShape`` filled with 0.02 (and a few real tensors remain,
some with degenerate values such as BatchNorm variances of 1e-12). A deep net with all weights
equal saturates or vanishes, which makes finite differences meaningless. :func:`load` replaces
every float weight by a seeded random initializer scaled by its role (He-normal for Conv and Gemm
weights, so activations stay O(1) through deep ReLU nets; BatchNorm scales near 1 and variances in
[0.5, 1.5]), and removes the ConstantOfShape nodes and their shape inputs. The graph is otherwise
untouched: opset 9, IR version 3 (weights listed among the graph inputs) and every operator stay as
they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnx
import onnx.shape_inference
import onnx_ir as ir

__all__ = ["LIGHT_MODELS", "add_loss", "image_input", "load", "weight_names"]

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)

Init = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _he(fan_in_axes: tuple[int, ...]) -> Init:
    def init(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        fan_in = int(np.prod([shape[a] for a in fan_in_axes if a < len(shape)]))
        return rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))

    return init


def _around(center: float, spread: float) -> Init:
    return lambda rng, shape: center + spread * rng.uniform(-1.0, 1.0, shape)


def _small(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return 0.05 * rng.standard_normal(shape)


# BatchNormalization: scale, bias, mean, variance (positive, away from 0 so 1/sqrt stays tame).
_BN = {1: _around(1.0, 0.2), 2: _small, 3: _small, 4: _around(1.0, 0.5)}


def _role(graph: ir.Graph, value: ir.Value) -> Init:
    """How to fill a weight, from the first consumer that tells (looking through Unsqueeze)."""
    for node, index in value.uses():
        op = node.op_type
        if op in ("Unsqueeze", "Reshape", "Identity") and index == 0:
            return _role(graph, node.outputs[0])
        if op in ("Conv", "ConvTranspose") and index == 1:
            return _he((1, 2, 3, 4))  # [O, I/g, k...]: fan-in is I/g times the kernel
        if op == "Gemm" and index == 1:
            trans_b = node.attributes.get_int("transB", 0)
            return _he((1,) if trans_b else (0,))
        if op == "MatMul" and index == 1:
            return _he((0,))
        if op == "BatchNormalization" and index in _BN:
            return _BN[index]
        if op == "Mul":
            return _around(1.0, 0.2)  # per-channel scales (densenet's and inception's affine)
    return _small  # biases and shifts


def load(name: str, seed: int = 0) -> ir.Model:
    """The light-zoo model ``name`` (see :data:`LIGHT_MODELS`) with seeded random weights."""
    model = ir.from_proto(onnx.load(os.path.join(LIGHT_DIR, f"light_{name}.onnx")))
    graph = model.graph
    rng = np.random.default_rng(seed)
    # Built weights: ConstantOfShape(shape initializer) becomes an initializer of that shape.
    for node in [n for n in graph if n.op_type == "ConstantOfShape"]:
        shape_value = node.inputs[0]
        assert shape_value is not None and shape_value.const_value is not None
        shape = tuple(int(d) for d in shape_value.const_value.numpy())
        out = node.outputs[0]
        name = str(out.name)
        out.name = f"{name}__built"
        weight = ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))
        weight.const_value = ir.tensor(np.zeros(shape, np.float32), name=name)
        out.replace_all_uses_with(weight)
        graph.remove(node, safe=True)
        graph.register_initializer(weight)
        graph.inputs.append(weight)  # IR version 3: every initializer is a graph input too
    for v in list(graph.inputs):
        if v.name and v.name.endswith("__SHAPE") and not v.uses():
            graph.inputs.remove(v)
            graph.initializers.pop(v.name)
    # Every float weight (built or stored) gets a fresh value by role, in name order for seeding.
    for wname in sorted(graph.initializers):
        w = graph.initializers[wname]
        tensor = w.const_value
        if tensor is None or tensor.dtype != ir.DataType.FLOAT or not w.uses():
            continue
        shape = tuple(int(d) for d in tensor.shape)
        values = _role(graph, w)(rng, shape).astype(np.float32)
        w.const_value = ir.tensor(values, name=wname)
    return model


def image_input(model: ir.Model) -> ir.Value:
    """The image: the one rank-4 float graph input that is not an initializer."""
    (image,) = [
        v
        for v in model.graph.inputs
        if v.name not in model.graph.initializers and v.shape is not None and v.shape.rank() == 4
    ]
    return image


def weight_names(model: ir.Model) -> list[str]:
    """The float initializers the primal output depends on, in name order."""
    return sorted(
        n
        for n, v in model.graph.initializers.items()
        if v.const_value is not None
        and v.const_value.dtype == ir.DataType.FLOAT
        and v.uses()
        and n != "loss_weights"
    )


def _logits_layer(graph: ir.Graph, out: ir.Value) -> ir.Node:
    """The Gemm or Conv computing the classifier's logits, walking back from the output."""
    node = out.producer()
    while node is not None and node.op_type not in ("Gemm", "Conv"):
        node = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    assert node is not None, "no classifier layer found"
    return node


def calibrate(model: ir.Model, image: np.ndarray) -> ir.Model:
    """Rescales the classifier layer so the logits have unit standard deviation on ``image``.

    Random weights in a deep residual or inception net give logits with a spread of tens, which
    saturates the softmax (every derivative ~0) and leaves finite differences with nothing to
    measure. The rescaling is exact for the activations in between (ReLU and pooling are positively
    homogeneous), deterministic, and only touches the last layer's weights.
    """
    from oracles import run

    graph = model.graph
    (out,) = list(graph.outputs)
    layer = _logits_layer(graph, out)
    logits = layer.outputs[0]
    graph.outputs.append(logits)
    try:
        spread = float(np.std(run(model, {image_input(model).name: image})[str(logits.name)]))
    finally:
        graph.outputs.pop()
    for w in layer.inputs[1:]:
        # The weight may reach the layer through a Reshape of a stored tensor.
        while w is not None and w.const_value is None and w.producer() is not None:
            w = w.producer().inputs[0]  # type: ignore[union-attr]
        if w is not None and w.const_value is not None:
            w.const_value = ir.tensor(w.const_value.numpy() / spread, name=w.name)
    return model


def add_loss(model: ir.Model, seed: int = 0, name: str = "loss") -> ir.Model:
    """Appends ``loss = ReduceSum(y * r)`` (r: seeded positive class weights) as an output.

    For a softmax output the class weights are O(n_classes) so that the loss and its derivatives
    are O(1) although every probability is about 1/n_classes.
    """
    graph = model.graph
    (y,) = list(graph.outputs)
    assert y.shape is not None
    shape = [int(d) for d in y.shape.dims]
    n = int(np.prod(shape))
    producer = y.producer()
    if producer is None or producer.op_type != "Softmax":
        # Logits (densenet121): a ReLU net is piecewise linear, so the loss gets the softmax
        # that gives it curvature (a Hessian to test).
        softmax = ir.node("Softmax", [y], {"axis": 1})
        softmax.outputs[0].dtype = ir.DataType.FLOAT
        softmax.outputs[0].shape = ir.Shape(shape)
        graph.append(softmax)
        y = softmax.outputs[0]
    scale = n
    rng = np.random.default_rng(seed)
    r = ir.Value(name="loss_weights", type=y.type, shape=ir.Shape(shape))
    r.const_value = ir.tensor(rng.uniform(-scale, scale, shape).astype(np.float32), name=r.name)
    graph.register_initializer(r)
    graph.inputs.append(r)
    weighted = ir.node("Mul", [y, r])
    total = ir.node("ReduceSum", [weighted.outputs[0]], {"keepdims": 0})
    total.outputs[0].name = name
    total.outputs[0].dtype = ir.DataType.FLOAT
    total.outputs[0].shape = ir.Shape([])
    graph.extend([weighted, total])
    graph.outputs.append(total.outputs[0])
    return model


# --------------------------------------------------------------------------- float64 twin
# onnxruntime has no double kernels for Conv, AveragePool, GlobalAveragePool and LRN. The twin
# computes the same function in float64 with operators that have them (Pad, Slice, Einsum,
# ReduceMean...), so finite differences can use a step of 1e-6: small enough that almost no
# ReLU or max-pool switch lies inside [x - eps v, x + eps v], which in float32 (eps = 1e-2)
# makes central differences of a deep ReLU net wrong by 5-30%.


class _Builder:
    """Collects the nodes of one replacement, with static int64 constants."""

    def __init__(self) -> None:
        self.nodes: list[ir.Node] = []

    def op(self, op_type: str, inputs: list[ir.Value], attrs: dict | None = None) -> ir.Value:
        node = ir.node(op_type, inputs, attrs or {})
        self.nodes.append(node)
        return node.outputs[0]

    def const(self, array: np.ndarray) -> ir.Value:
        return self.op("Constant", [], {"value": ir.tensor(array)})

    def ints(self, values: list[int]) -> ir.Value:
        return self.const(np.array(values, np.int64))

    def window_slices(
        self,
        x: ir.Value,
        kernel: list[int],
        strides: list[int],
        dilations: list[int],
        out_hw: list[int],
    ) -> list[ir.Value]:
        """One strided Slice per kernel offset (x already padded), each of size out_hw."""
        slices = []
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                starts = [i * dilations[0], j * dilations[1]]
                ends = [
                    s + (o - 1) * st + 1 for s, o, st in zip(starts, out_hw, strides, strict=True)
                ]
                slices.append(
                    self.op(
                        "Slice",
                        [
                            x,
                            self.ints(starts),
                            self.ints(ends),
                            self.ints([2, 3]),
                            self.ints(strides),
                        ],
                    )
                )
        return slices


def _static(value: ir.Value) -> list[int]:
    assert value.shape is not None, value
    return [int(d) for d in value.shape.dims]


def _lower_conv(b: _Builder, node: ir.Node) -> ir.Value:
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    n, c, _, _ = _static(x)
    o, cg, kh, kw = _static(w)
    groups = node.attributes.get_int("group", 1)
    pads = list(node.attributes.get_ints("pads", [0, 0, 0, 0]))
    strides = list(node.attributes.get_ints("strides", [1, 1]))
    dil = list(node.attributes.get_ints("dilations", [1, 1]))
    out_hw = _static(node.outputs[0])[2:]
    xp = b.op("Pad", [x, b.ints([0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]])])
    terms = []
    for k, s in enumerate(b.window_slices(xp, [kh, kw], strides, dil, out_hw)):
        i, j = divmod(k, kw)
        s5 = b.op("Reshape", [s, b.ints([n, groups, c // groups, *out_hw])])
        # The weight is read in the graph, so that differences along it are seen.
        tap = b.op("Slice", [w, b.ints([i, j]), b.ints([i + 1, j + 1]), b.ints([2, 3])])
        wij = b.op("Reshape", [tap, b.ints([groups, o // groups, cg])])
        terms.append(b.op("Einsum", [s5, wij], {"equation": "ngchw,goc->ngohw"}))
    total = b.op("Sum", terms) if len(terms) > 1 else terms[0]
    y = b.op("Reshape", [total, b.ints([n, o, *out_hw])])
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        y = b.op("Add", [y, b.op("Reshape", [node.inputs[2], b.ints([1, o, 1, 1])])])
    return y


def _lower_average_pool(b: _Builder, node: ir.Node) -> ir.Value:
    x = node.inputs[0]
    assert x is not None
    assert node.attributes.get_int("ceil_mode", 0) == 0
    kernel = list(node.attributes.get_ints("kernel_shape"))
    pads = list(node.attributes.get_ints("pads", [0, 0, 0, 0]))
    strides = list(node.attributes.get_ints("strides", [1, 1]))
    out_hw = _static(node.outputs[0])[2:]
    pad = b.ints([0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]])
    total = b.op("Sum", b.window_slices(b.op("Pad", [x, pad]), kernel, strides, [1, 1], out_hw))
    if node.attributes.get_int("count_include_pad", 0):
        count = b.const(np.array(float(np.prod(kernel))))
    else:
        ones = b.const(np.ones([1, 1, *_static(x)[2:]]))
        count = b.op(
            "Sum", b.window_slices(b.op("Pad", [ones, pad]), kernel, strides, [1, 1], out_hw)
        )
    return b.op("Div", [total, count])


def _lower_lrn(b: _Builder, node: ir.Node) -> ir.Value:
    x = node.inputs[0]
    assert x is not None
    size = node.attributes.get_int("size")
    alpha = node.attributes.get_float("alpha", 1e-4)
    beta = node.attributes.get_float("beta", 0.75)
    bias = node.attributes.get_float("bias", 1.0)
    c = _static(x)[1]
    before, after = (size - 1) // 2, size // 2  # ceil((size - 1) / 2) = size // 2
    sq = b.op("Pad", [b.op("Mul", [x, x]), b.ints([0, before, 0, 0, 0, after, 0, 0])])
    parts = [b.op("Slice", [sq, b.ints([k]), b.ints([k + c]), b.ints([1])]) for k in range(size)]
    scale = b.op(
        "Add",
        [
            b.const(np.array(bias)),
            b.op("Mul", [b.const(np.array(alpha / size)), b.op("Sum", parts)]),
        ],
    )
    return b.op("Div", [x, b.op("Pow", [scale, b.const(np.array(beta))])])


_LOWER = {
    "Conv": _lower_conv,
    "AveragePool": _lower_average_pool,
    "GlobalAveragePool": lambda b, node: b.op(
        "ReduceMean", [node.inputs[0]], {"axes": [2, 3], "keepdims": 1}
    ),
    "LRN": _lower_lrn,
}


def float64_twin(model: ir.Model) -> ir.Model:
    """The same function in float64, runnable by onnxruntime (a finite-difference oracle).

    Older models are first brought to opset 17 by onnx.version_converter (through onnax's
    prepare, which also infers the static shapes the lowering needs).
    """
    from onnax.passes.prepare import prepare

    # onnx's own inference for the static shapes: onnx_shape_inference has no LRN rule.
    proto = onnx.shape_inference.infer_shapes(ir.to_proto(prepare(model, "float64 twin")))
    twin = ir.from_proto(proto)
    graph = twin.graph
    for node in list(graph):
        lower = _LOWER.get(node.op_type)
        if lower is None:
            continue
        b = _Builder()
        y = lower(b, node)
        graph.insert_before(node, b.nodes)
        out = node.outputs[0]
        y.type, y.shape = out.type, out.shape  # later lowerings read the static shape
        out.replace_all_uses_with(y, replace_graph_outputs=True)
        name = out.name
        out.name = None
        y.name = name
        graph.remove(node, safe=True)
    _retype(graph, ir.DataType.FLOAT, ir.DataType.DOUBLE, [*graph.inputs])
    return twin


def _retype(
    graph: ir.Graph,
    source: ir.DataType,
    target: ir.DataType,
    extra: list[ir.Value],
    casts: bool = False,
) -> None:
    """Values (node outputs and ``extra``), initializers and Constant tensors of element type
    ``source`` become ``target``; with ``casts``, Casts to ``source`` too."""
    for value in [*extra, *(o for n in graph for o in n.outputs)]:
        if value.dtype == source:
            value.dtype = target
    for name, value in graph.initializers.items():
        tensor = value.const_value
        if tensor is not None and tensor.dtype == source:
            value.const_value = ir.tensor(tensor.numpy().astype(target.numpy()), name=name)
            value.dtype = target
    for node in graph:
        if node.op_type == "Constant":
            t = node.attributes["value"].as_tensor()
            if t.dtype == source:
                node.attributes["value"] = ir.AttrTensor(
                    "value", ir.tensor(t.numpy().astype(target.numpy()))
                )
        if casts and node.op_type == "Cast" and node.attributes.get_int("to") == source:
            node.attributes["to"] = ir.AttrInt64("to", target)


def float32_of(twin: ir.Model) -> ir.Model:
    """The float64 twin computed in float32: the twin's operators at the model's precision."""
    model = ir.from_proto(ir.to_proto(twin))
    graph = model.graph
    extra = [*graph.inputs, *graph.outputs]
    _retype(graph, ir.DataType.DOUBLE, ir.DataType.FLOAT, extra, casts=True)
    return model
