"""Shape inference for the onnxruntime operators that onnx_shape_inference does not know.

onnx_shape_inference knows most ``com.microsoft`` operators but not FusedConv, FusedGemm or the
``com.microsoft.nchwc`` layout. A fused node that a transform does not reach keeps its kernel,
and without these its outputs would stay untyped, so that a rule downstream that needs a rank
(Conv, the pools) refuses. Each delegates to the rule of the default-domain operator it fuses:
an NCHWc tensor has the 4-D shape ``[N, Cp, H, W]`` of its padded channels.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
import onnx_shape_inference as osi

__all__ = ["register_shape_inference"]

_DELEGATES = {
    ("com.microsoft", "FusedConv"): ("Conv", 11),
    ("com.microsoft", "FusedGemm"): ("Gemm", 13),
    ("com.microsoft.nchwc", "Conv"): ("Conv", 11),
    ("com.microsoft.nchwc", "MaxPool"): ("MaxPool", 12),
    ("com.microsoft.nchwc", "AveragePool"): ("AveragePool", 11),
    ("com.microsoft.nchwc", "GlobalAveragePool"): ("GlobalAveragePool", 1),
    ("com.microsoft.nchwc", "GlobalMaxPool"): ("GlobalMaxPool", 1),
}


Infer = Callable[[osi.ShapeInferenceContext, ir.Node], None]


def _delegate(op_type: str, version: int) -> Infer:
    def infer(ctx: osi.ShapeInferenceContext, node: ir.Node) -> None:
        rule = osi.registry.get("", op_type, version)
        if rule is not None:
            rule(ctx, node)

    return infer


def _set(ctx: osi.ShapeInferenceContext, node: ir.Node, dims: list[object] | None) -> None:
    x = node.inputs[0]
    if x is None:
        return
    if dims is None:
        ctx.set_dtype(node.outputs[0], x.dtype)
        return
    named = [
        d
        if isinstance(d, int) or (d is not None and getattr(d, "value", None) is not None)
        else ctx.new_symbolic_dim()
        for d in dims
    ]  # onnx_shape_inference wants every unknown dimension named
    ctx.set_shape_and_dtype(node.outputs[0], ir.Shape(named), x.dtype)  # type: ignore[arg-type]


def _four(node: ir.Node) -> list[object] | None:
    x = node.inputs[0]
    if x is None or x.shape is None or x.shape.rank() != 4:
        return None
    return list(x.shape.dims)


def _reorder_input(block_size: Callable[[], int]) -> Infer:
    def infer(ctx: osi.ShapeInferenceContext, node: ir.Node) -> None:
        _reorder_input_shape(ctx, node, block_size())

    return infer


def _reorder_input_shape(ctx: osi.ShapeInferenceContext, node: ir.Node, b: int) -> None:
    dims = _four(node)
    if dims is None or not b:
        return _set(ctx, node, None)
    if node.attributes.get_int("channels_last", 0):
        dims = [dims[0], dims[3], dims[1], dims[2]]
    c = dims[1]
    dims[1] = -(-c // b) * b if isinstance(c, int) else ctx.new_symbolic_dim()
    _set(ctx, node, dims)


def _reorder_output(ctx: osi.ShapeInferenceContext, node: ir.Node) -> None:
    dims = _four(node)
    if dims is None:
        return _set(ctx, node, None)
    dims[1] = node.attributes.get_int("channels", 0)
    if node.attributes.get_int("channels_last", 0):
        dims = [dims[0], dims[2], dims[3], dims[1]]
    _set(ctx, node, dims)


def _upsample(ctx: osi.ShapeInferenceContext, node: ir.Node) -> None:
    dims, scales = _four(node), node.attributes.get_ints("scales", [])
    if dims is None or len(scales) != 4:
        return _set(ctx, node, None)
    _set(
        ctx,
        node,
        [d * s if isinstance(d, int) else None for d, s in zip(dims, scales, strict=True)],
    )


_registered = False


def register_shape_inference(block_size: Callable[[], int]) -> None:
    """Registers the rules with onnx_shape_inference (once; rules it has already are kept).

    Args:
        block_size: The NCHWc block size of this machine (0: no NCHWc kernels).
    """
    global _registered
    if _registered:
        return
    _registered = True
    osi.registry.collect()
    rules = {key: _delegate(*target) for key, target in _DELEGATES.items()}
    rules[("com.microsoft.nchwc", "ReorderInput")] = _reorder_input(block_size)
    rules[("com.microsoft.nchwc", "ReorderOutput")] = _reorder_output
    rules[("com.microsoft.nchwc", "Upsample")] = _upsample
    for (domain, op_type), rule in rules.items():
        if osi.registry.get(domain, op_type, 1) is None:
            osi.registry.register(domain, op_type, since_version=1)(rule)
