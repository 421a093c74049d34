"""onnxruntime's blocked-layout operators (``com.microsoft.nchwc``), as ``ORT_ENABLE_ALL`` saves them.

On x86 CPUs with AVX2 or AVX-512, onnxruntime's NchwcTransformer rewrites 2-D convolutions and
pools into the NCHWc layout: a tensor of shape ``[N, Cp, H, W]`` whose memory holds
``[N, Cp/B, H, W, B]``, the channels zero-padded to ``Cp``, a multiple of the block size ``B``
(8 with AVX2, 16 with AVX-512). The convolution weights are reordered once, into initializers of
the same blocked kind. Each operator is lowered here to its default-domain counterpart between an
unblocking and a reblocking Reshape-Transpose-Reshape, so that derivatives and batched models are
plain ONNX and the derivative with respect to a reordered weight is that of the stored tensor.

The block size is not written in the model: it is the one of the machine that saved it, which
onnxruntime warns is the only machine the model is meant for. It is read from this machine's
onnxruntime (:func:`block_size`), so a model saved on another kind of CPU must be re-saved here.

Filter layouts (onnxruntime's ``nchwc_transformer.cc``): ``OIHWBo`` (``[Op/B, I, kH, kW, B]``)
for depthwise convolutions and for those reading a plain NCHW input of fewer than ``B`` channels;
``OIHWBiBo`` (``[Op/B, I/B, kH, kW, Bi, Bo]``) otherwise.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from onnax.core.emit import Emitter
from onnax.core.registry import OpRules
from onnax.rules._fused import activation, refuse, typed
from onnax.rules._ort_shapes import register_shape_inference

__all__ = ["NCHWC", "block_size"]

NCHWC = "com.microsoft.nchwc"


@functools.cache
def block_size() -> int:
    """The NCHWc block size of this machine's onnxruntime (a ReorderInput's channel padding)."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 1, 1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC)], "probe", [x], [y]
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(NCHWC, 1)],
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        (out,) = session.run(None, {"x": np.zeros((1, 4, 1, 1), np.float32)})
    except Exception:  # no NCHWc kernels on this CPU (or build): reported by the lowerings
        return 0
    return int(out.shape[1])


# A fused node the transform does not reach keeps its kernel: inference must see through it.
register_shape_inference(block_size)


def _block(node: ir.Node) -> int:
    b = block_size()
    if b == 0:
        raise refuse(
            node,
            "this machine's onnxruntime has no NCHWc kernels, so the block size the model was "
            "saved with is unknown",
            "re-save the model on this machine, or at ORT_ENABLE_EXTENDED (no NCHWc layout)",
        )
    return b


def _static(node: ir.Node, v: ir.Value, axis: int) -> int:
    dim = v.shape[axis] if v.shape is not None and v.shape.rank() > axis else None
    if not isinstance(dim, int):
        raise refuse(
            node,
            f"dimension {axis} of {v.name!r} is {dim!r}, not a static size",
            "give the value a static channel count (value_info; NCHWc channels are static)",
        )
    return dim


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _x(node: ir.Node) -> ir.Value:
    x = _input(node, 0)
    if x is None:
        raise refuse(node, "the data input is missing", "give the node its input")
    return x


def _channels(x: ir.Value) -> int | None:
    dim = x.shape[1] if x.shape is not None and x.shape.rank() == 4 else None
    return dim if isinstance(dim, int) else None


def _grouped_shape(em: Emitter, x: ir.Value, block: int, last: bool) -> ir.Value:
    """``[N, Cp/B, -1, B]`` (``last``) or ``[N, Cp/B, B, -1]``, from ``Cp`` when it is known."""
    tail = [-1, block] if last else [block, -1]
    channels = _channels(x)
    if channels is not None:
        return em.ints([0, channels // block, *tail])
    # the channel count is only known at run time (shape inference does not see through
    # onnxruntime's NCHWc operators): Cp/B from Shape
    shape = em.op("Shape", [x])
    groups = em.op("Div", [em.slice(shape, [1], [2], [0]), em.ints([block])])
    return em.op("Concat", [em.ints([0]), groups, em.ints(tail)], {"axis": 0})


def unblock(em: Emitter, x: ir.Value, block: int, like: ir.Value | None = None) -> ir.Value:
    """An NCHWc tensor ``[N, Cp, H, W]`` (memory ``[N, Cp/B, H, W, B]``) as plain NCHW.

    ``like``: a value of the same shape whose rank inference knows, where ``x``'s may be unknown.
    """
    grouped = em.op("Reshape", [x, _grouped_shape(em, x, block, last=True)])
    shape = em.shape(like if like is not None else x)
    return typed(em.op("Reshape", [em.transpose(grouped, [0, 1, 3, 2]), shape]), x)


def reblock(em: Emitter, x: ir.Value, block: int) -> ir.Value:
    """A plain NCHW tensor (channels a multiple of ``block``) in the NCHWc layout."""
    grouped = em.op("Reshape", [x, _grouped_shape(em, x, block, last=False)])
    return typed(em.op("Reshape", [em.transpose(grouped, [0, 1, 3, 2]), em.shape(x)]), x)


# ------------------------------------------------------------------------------ reorders
reorder_input = OpRules("ReorderInput", since=1, domain=NCHWC)


@reorder_input.lowering
def _reorder_input(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    x, b = _x(node), _block(node)
    channels_last = node.attributes.get_int("channels_last", 0)
    c = _static(node, x, 3 if channels_last else 1)
    nchw = typed(em.transpose(x, [0, 3, 1, 2]), x) if channels_last else x
    padded = -(-c // b) * b
    if padded != c:
        pads = em.ints([0, 0, 0, 0, 0, padded - c, 0, 0])
        nchw = typed(em.op("Pad", [nchw, pads]), x)
    grouped = em.op("Reshape", [nchw, em.ints([0, padded // b, b, -1])])
    flat = em.transpose(grouped, [0, 1, 3, 2])
    y = node.outputs[0]
    if y.shape is not None and y.shape.is_static():
        return [em.op("Reshape", [flat, em.shape(y)])]
    # [N, Cp, H, W] from the input's run-time N, H, W
    shape = em.op("Shape", [nchw])
    dims = em.op(
        "Concat",
        [em.slice(shape, [0], [1], [0]), em.ints([padded]), em.slice(shape, [2], [4], [0])],
        {"axis": 0},
    )
    return [em.op("Reshape", [flat, dims])]


reorder_output = OpRules("ReorderOutput", since=1, domain=NCHWC)


@reorder_output.lowering
def _reorder_output(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    x, b = _x(node), _block(node)
    channels = node.attributes.get_int("channels", 0)
    padded = _channels(x)
    if padded is None:
        padded = -(-channels // b) * b  # onnxruntime pads to the next multiple of B
    if not 0 < channels <= padded:
        raise refuse(
            node,
            f"channels={channels} is not in 1..{padded} (the padded channel count)",
            "give ReorderOutput the channel count it was saved with",
        )
    nchw = unblock(em, x, b)
    if channels != padded:
        nchw = typed(em.slice(nchw, [0], [channels], [1]), x)
    if node.attributes.get_int("channels_last", 0):
        nchw = em.transpose(nchw, [0, 2, 3, 1])
    return [nchw]


# ----------------------------------------------------------------------------- convolution
conv = OpRules("Conv", since=1, domain=NCHWC)

CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _filter(em: Emitter, node: ir.Node, w: ir.Value, b: int, per_output: bool) -> ir.Value:
    """The reordered filter as OIHW: ``OIHWBo`` when ``per_output``, else ``OIHWBiBo``."""
    o, i, kh, kw = (_static(node, w, axis) for axis in range(4))
    if per_output:
        blocked = em.op("Reshape", [w, em.ints([o // b, i, kh, kw, b])])
        oihw = em.transpose(blocked, [0, 4, 1, 2, 3])
    else:
        if i % b:
            raise refuse(
                node,
                f"the filter has {i} input channels per group, not a multiple of the block "
                f"size {b}",
                "re-save the model at ORT_ENABLE_EXTENDED (no NCHWc layout)",
            )
        blocked = em.op("Reshape", [w, em.ints([o // b, i // b, kh, kw, b, b])])
        oihw = em.transpose(blocked, [0, 5, 1, 4, 2, 3])
    return typed(em.op("Reshape", [oihw, em.ints([o, i, kh, kw])]), w)


@conv.lowering
def _conv(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # activation(Conv(X, W, B) + Sum), every operand but the filter in the NCHWc layout; a
    # convolution of fewer than B input channels reads plain NCHW
    x, b = _x(node), _block(node)
    w = _input(node, 1)
    if w is None:
        raise refuse(node, "the filter input is missing", "give the node its filter")
    group = node.attributes.get_int("group", 1)
    in_per_group = _static(node, w, 1)
    plain_input = group == 1 and in_per_group < b
    depthwise = group > 1 and in_per_group == 1
    data = x if plain_input else unblock(em, x, b)
    weights = _filter(em, node, w, b, per_output=plain_input or depthwise)
    attrs = {k: a.value for k, a in node.attributes.items() if k in CONV_ATTRIBUTES}
    inputs = [data, weights] + ([node.inputs[2]] if _input(node, 2) is not None else [])
    y = typed(em.op("Conv", inputs, attrs), x)
    total = _input(node, 3)
    if total is not None:
        # the residual has the convolution's shape, which inference knows when it cannot see
        # through an NCHWc operator the transform does not reach
        y = typed(em.op("Add", [y, unblock(em, total, b, like=y)]), x)
    params = node.attributes.get_floats("activation_params", [])
    y = activation(em, node, y, node.attributes.get_string("activation", ""), params)
    return [reblock(em, y, b)]


# ---------------------------------------------------------------------------------- pools
POOLS = {"MaxPool": 1, "AveragePool": 1, "GlobalAveragePool": 1, "GlobalMaxPool": 1}
pools = OpRules(tuple(POOLS), since=1, domain=NCHWC)

POOL_ATTRIBUTES = (
    "auto_pad",
    "ceil_mode",
    "count_include_pad",
    "dilations",
    "kernel_shape",
    "pads",
    "storage_order",
    "strides",
)


@pools.lowering
def _pool(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    x, b = _x(node), _block(node)
    attrs = {k: a.value for k, a in node.attributes.items() if k in POOL_ATTRIBUTES}
    if node.op_type == "MaxPool" and attrs.get("storage_order"):
        attrs.pop("storage_order")  # only the unused Indices output depends on it
    y = typed(em.op(node.op_type, [unblock(em, x, b)], attrs), x)
    return [reblock(em, y, b)]


upsample = OpRules("Upsample", since=1, domain=NCHWC)


@upsample.lowering
def _upsample(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # integer scales of H and W; nearest (floor of the asymmetric source coordinate) or linear
    x, b = _x(node), _block(node)
    scales = node.attributes.get_ints("scales", [])
    mode = node.attributes.get_string("mode", "nearest")
    if len(scales) != 4 or mode not in ("nearest", "linear"):
        raise refuse(
            node,
            f"scales={scales}, mode={mode!r}; expected four integer scales and mode nearest or "
            "linear",
            "re-save the model at ORT_ENABLE_EXTENDED (no NCHWc layout)",
        )
    transform = node.attributes.get_string("coordinate_transformation_mode", "asymmetric")
    attrs: dict[str, object] = {"mode": mode, "coordinate_transformation_mode": transform}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    factors = em.const(np.asarray(scales, np.float32))
    y = typed(em.op("Resize", [unblock(em, x, b), None, factors], attrs), x)
    return [reblock(em, y, b)]
