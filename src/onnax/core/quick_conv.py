"""More rules of :mod:`onnax.core.quick_infer`: convolutions, pooling and normalization.

As in :mod:`onnax.core.quick_rules` (whose helpers these use), each handler copies one
onnx_shape_inference rule for the cases where it mints no symbol and does no symbolic
arithmetic, and raises :class:`~onnax.core.quick_rules.Unsure` elsewhere. Without them, a
convolutional network's every inference ran the engine: on densenet121's vjp, its completion
rounds ran it for one ``Conv`` left, and its whole-model walks were half of the inference.

``Constant`` is left to the engine on purpose: where a consumer's inference reads a constant
through ``get_const_tensor``, the tensor takes the output's name, which the result keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx_ir as ir

from onnax.core.fast_ir import new_shape
from onnax.core.quick_rules import Dim, Known, Result, Unsure, data_input

__all__ = ["RULES"]


def _ints_attr(node: ir.Node, name: str, default: list[int]) -> list[int]:
    attr = node.attributes.get(name)
    return list(attr.as_ints()) if attr is not None else default


def _check_window(
    n: int, kernel: Sequence[Dim], strides: list[int], dilations: list[int], pads: list[int]
) -> None:
    """Raises Unsure unless the window attributes have ``n`` axes and positive steps."""
    if (
        len(kernel) != n
        or len(strides) != n
        or len(dilations) != n
        or len(pads) != 2 * n
        or any(s <= 0 for s in strides)
        or any(d <= 0 for d in dilations)
    ):
        raise Unsure


def _conv(node: ir.Node, known: Known) -> Result:
    """``infer_conv`` (``_compute_conv_shape``) where every spatial size is a number."""
    if len(node.inputs) < 2 or len(node.outputs) != 1:
        raise Unsure
    x, w = data_input(node.inputs[0], known), data_input(node.inputs[1], known)
    assert x.shape is not None and w.shape is not None
    xd, wd = x.shape.dims, w.shape.dims
    rank = len(xd)
    if rank < 3:
        raise Unsure  # the engine records an error
    n = rank - 2
    kernel_attr = node.attributes.get("kernel_shape")
    if kernel_attr is not None:
        kernel: list[Dim] = list(kernel_attr.as_ints())
    elif len(wd) == rank:
        kernel = list(wd[2:])
    else:
        raise Unsure
    strides = _ints_attr(node, "strides", [1] * n)
    dilations = _ints_attr(node, "dilations", [1] * n)
    auto_pad_attr = node.attributes.get("auto_pad")
    auto_pad = auto_pad_attr.as_string() if auto_pad_attr is not None else "NOTSET"
    pads = _ints_attr(node, "pads", [0] * (2 * n)) if auto_pad == "NOTSET" else [0] * (2 * n)
    _check_window(n, kernel, strides, dilations, pads)
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise Unsure
    spatial: list[Dim] = []
    for i in range(n):
        size, k, s, d = xd[i + 2], kernel[i], strides[i], dilations[i]
        # A symbolic size would be SymPy arithmetic, an unknown kernel a minted symbol.
        if type(size) is not int or type(k) is not int:
            raise Unsure
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            spatial.append(math.ceil(size / s))
        else:
            begin, end = (pads[i], pads[i + n]) if auto_pad == "NOTSET" else (0, 0)
            spatial.append((size + begin + end - (d * (k - 1) + 1)) // s + 1)
    return [(x.dtype, new_shape([xd[0], wd[0], *spatial]))]


def _batch_norm(node: ir.Node, known: Known) -> Result:
    """``infer_batch_normalization`` of the inference form (one output): ``X``'s shape."""
    if len(node.inputs) != 5 or any(v is None for v in node.inputs) or len(node.outputs) != 1:
        raise Unsure  # missing inputs are an engine error; statistics outputs are not mimicked
    x = data_input(node.inputs[0], known)
    if not isinstance(x.type, ir.TensorType):
        raise Unsure
    return [(x.dtype, x.shape)]


def _pool(node: ir.Node, known: Known) -> Result:
    """``infer_max_pool`` (one output) and ``infer_average_pool`` on numeric spatial sizes."""
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise Unsure
    x = data_input(node.inputs[0], known)
    assert x.shape is not None
    xd = x.shape.dims
    n = len(xd) - 2
    kernel_attr = node.attributes.get("kernel_shape")
    if n < 1 or kernel_attr is None:
        raise Unsure  # the engine records an error
    kernel = list(kernel_attr.as_ints())
    auto_pad_attr = node.attributes.get("auto_pad")
    auto_pad = auto_pad_attr.as_string() if auto_pad_attr is not None else "NOTSET"
    strides = _ints_attr(node, "strides", [1] * n)
    pads = _ints_attr(node, "pads", [0] * (2 * n))
    ceil_attr = node.attributes.get("ceil_mode")
    ceil_mode = int(ceil_attr.as_int()) if ceil_attr is not None else 0
    dilations = _ints_attr(node, "dilations", [1] * n)
    _check_window(n, kernel, strides, dilations, pads)
    spatial: list[Dim] = []
    for i in range(n):
        size, s = xd[i + 2], strides[i]
        if type(size) is not int:
            raise Unsure  # a minted symbol or SymPy arithmetic
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            spatial.append(math.ceil(size / s))
            continue
        begin = pads[i]
        numerator = size + begin + pads[i + n] - (dilations[i] * (kernel[i] - 1) + 1)
        if ceil_mode:
            out = math.ceil(numerator / s) + 1
            if (out - 1) * s - begin >= size:  # the last window would start in the padding
                out -= 1
        else:
            out = numerator // s + 1
        spatial.append(out)
    return [(x.dtype, new_shape([xd[0], xd[1], *spatial]))]


def _global_pool(node: ir.Node, known: Known) -> Result:
    """``infer_global_pool``: the batch and channels, then 1s."""
    if len(node.inputs) != 1 or len(node.outputs) != 1:
        raise Unsure
    x = data_input(node.inputs[0], known)
    assert x.shape is not None
    xd = x.shape.dims
    if len(xd) < 3:
        raise Unsure
    return [(x.dtype, new_shape([xd[0], xd[1], *([1] * (len(xd) - 2))]))]


RULES: dict[str, tuple[str, Callable[[ir.Node, Known], Result]]] = {
    "Conv": ("_conv.infer_conv", _conv),
    "BatchNormalization": ("_normalization.infer_batch_normalization", _batch_norm),
    "MaxPool": ("_pooling.infer_max_pool", _pool),
    "AveragePool": ("_pooling.infer_average_pool", _pool),
    **{
        op: ("_pooling.infer_global_pool", _global_pool)
        for op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
    },
}
"""Per operator, the engine rule mimicked and the handler, as in ``quick_rules._RULES``."""
