"""Quantization: DequantizeLinear and QuantizeLinear.

**DequantizeLinear**: the derivative with respect to the scale, and batching.

``y = (x - zero_point) * scale`` (cast to ``output_dtype`` from opset 23) with ``x`` and
``zero_point`` integer (or 8-bit float) tensors: only the scale can carry a derivative. ``y`` is
linear in the scale, so the tangent is the operator itself applied to the scale's tangent (same
``x``, zero point and attributes). The transpose sums ``ct * (x - zero_point)`` over the elements
each scale entry multiplies, per layout:

* per tensor (a scale with one element): over everything;
* per axis (opset 13: a 1-D scale along ``axis``): over every other axis;
* blocked (opset 21: ``block_size > 0``, a scale of the rank of ``x`` with ``ceil(D / block)``
  entries along ``axis``): the axis is zero-padded to whole blocks, split into
  ``[blocks, block_size]`` and summed over the block.

The coefficient ``x - zero_point`` is the operator itself with a scale of ones.

Batch rules: with only ``x`` batched, the operator applies with its axis shifted past the batch
axis (a per-tensor scale applies as it is). A batched per-tensor or per-axis scale or zero point
is spelled out (``Cast`` to the scale's type, ``Sub``, ``Mul`` by the scale aligned to its axis).
Blocked layouts batch every operand (the scale has the rank of ``x``) and shift the axis.

**QuantizeLinear**'s output is an integer (or 8-bit float) tensor, which carries no derivative
(a zero rule). Under vmap its quantization axis shifts past the batch axis; per-example
parameters are a per-axis quantization along the batch axis itself (opset 13 on), or written out
(``Round``, ``Clip``, ``Cast``) for a per-tensor scale at opsets 11 and 12.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher, shift_axes
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, original_input
from onnax.rules.zero import optional_arg, original_name, required_arg


# ------------------------------------------------------------------------ DequantizeLinear
def _layout(node: ir.Node, opset: int) -> str:
    """``"tensor"``, ``"axis"`` or ``"block"``."""
    scale = node.inputs[1]
    assert scale is not None
    if opset >= 21 and node.attributes.get_int("block_size", 0) > 0:
        return "block"
    if opset < 13:
        return "tensor"
    if scale.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} at opset {opset} ({node_label(node)}): the rank of the scale "
            f"{scale.name!r} is unknown, so per-tensor and per-axis quantization cannot be told "
            "apart. Remedy: give the scale a static shape."
        )
    if scale.shape.rank() == 0:
        return "tensor"
    dims = scale.shape.dims
    static = [d for d in dims if isinstance(d, int)]
    if len(static) == len(dims) and math.prod(static) == 1:
        return "tensor"
    return "axis"


def _rank(node: ir.Node) -> int:
    x = node.inputs[0]
    if x is None or x.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the rank of x is unknown; the derivative "
            "with respect to the scale needs it. Remedy: give the model's inputs static ranks."
        )
    return x.shape.rank()


def _axis(node: ir.Node, rank: int) -> int:
    axis = node.attributes.get_int("axis", 1)
    return axis + rank if axis < 0 else axis


dequantize_linear = OpRules("DequantizeLinear", since=10)


@dequantize_linear.jvp
def _dequantize_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[1] if len(tangents) > 1 else None
    if t is None:
        return [None]
    return [em.op("DequantizeLinear", [node.inputs[0], t, *node.inputs[2:]], attributes_of(node))]


@dequantize_linear.transpose
def _dequantize_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    x, scale = node.inputs[0], node.inputs[1]
    assert ct is not None and x is not None and scale is not None
    if scale.dtype is None:
        raise InternalRuleError(f"{op_label(node)}: the scale has no element type")
    ones = em.op("Expand", [em.scalar(1.0, scale.dtype), em.shape(scale)])
    centred = em.op("DequantizeLinear", [x, ones, *node.inputs[2:]], attributes_of(node))
    weighted = em.op("Mul", [ct, centred])
    layout = _layout(node, em.opset)
    rank = _rank(node)
    if layout == "tensor":
        out = em.op("Reshape", [em.reduce_sum(weighted, None, keepdims=False), em.shape(scale)])
    elif layout == "axis":
        axis = _axis(node, rank)
        out = em.reduce_sum(weighted, [a for a in range(rank) if a != axis], keepdims=False)
    else:
        out = _block_sum(em, node, weighted, rank)
    out_dtype = node.outputs[0].dtype
    if out_dtype is not None and out_dtype != scale.dtype:
        out = em.op("Cast", [out], {"to": scale.dtype})
    return [None, out, *[None] * (len(node.inputs) - 2)]


def _block_sum(em: Emitter, node: ir.Node, weighted: ir.Value, rank: int) -> ir.Value:
    """Sums ``weighted`` (shaped like x) over each block along the axis."""
    x = node.inputs[0]
    assert x is not None
    axis = _axis(node, rank)
    block = node.attributes.get_int("block_size", 0)
    shape = em.shape(x)
    size = em.slice(shape, [axis], [axis + 1], [0])
    blocks = em.op("Div", [em.op("Add", [size, em.ints([block - 1])]), em.ints([block])])
    pad = em.op("Sub", [em.op("Mul", [blocks, em.ints([block])]), size])
    pieces = [em.ints([0] * (rank + axis)), pad]
    if rank - axis - 1:
        pieces.append(em.ints([0] * (rank - axis - 1)))
    padded = em.op("Pad", [weighted, em.op("Concat", pieces, {"axis": 0})])
    split = [em.slice(shape, [0], [axis], [0])] if axis else []
    split += [blocks, em.ints([block])]
    if rank - axis - 1:
        split.append(em.slice(shape, [axis + 1], [rank], [0]))
    grouped = em.op("Reshape", [padded, em.op("Concat", split, {"axis": 0})])
    return em.reduce_sum(grouped, [axis + 1], keepdims=False)


@dequantize_linear.batch
def _dequantize_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    x0 = node.inputs[0]
    assert x0 is not None
    rank = bx.rank(x0)
    layout = _layout(node, bx.opset)
    fs = batched[1]
    fz = len(batched) > 2 and batched[2] and args[2] is not None
    if layout == "block" or not (fs or fz):
        inputs: list[ir.Value | None] = list(args)
        if layout == "block":
            inputs = [
                None if a is None or v is None else bx.materialize(a, b, v)
                for a, b, v in zip(args, batched, node.inputs, strict=True)
            ]
        attrs = attributes_of(node)
        if layout != "tensor":
            attrs["axis"] = _axis(node, rank) + 1
        return [bx.op("DequantizeLinear", inputs, attrs)], [True]
    return [_spelled_out(bx, node, args, batched, layout, rank)], [True]


def _spelled_out(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool], layout: str, rank: int
) -> ir.Value:
    """``(Cast(x) - Cast(zero_point)) * scale`` with a batched scale or zero point."""
    x, scale = args[0], args[1]
    x0, scale0 = node.inputs[0], node.inputs[1]
    assert x is not None and scale is not None and x0 is not None and scale0 is not None
    dtype = scale0.dtype
    if dtype is None:
        raise InternalRuleError(f"{op_label(node)}: the scale has no element type")

    axis = _axis(node, rank)

    def aligned(arg: ir.Value, is_batched: bool) -> ir.Value:
        """A scale or zero point shaped to broadcast against x (rank ``rank``, batched or not)."""
        if layout == "tensor":
            if not is_batched:
                return arg  # one element broadcasts as it is
            flat = bx.op("Reshape", [arg, bx.ints([-1])])  # [B]
            return bx.unsqueeze(flat, list(range(1, rank + 1)))
        # Per axis: [C] -> [C, 1...] (right-aligned onto x's axis); [B, C] -> [B, 1.., C, 1..].
        trailing = rank - axis - 1
        if not is_batched:
            return bx.unsqueeze(arg, list(range(1, 1 + trailing)))
        return bx.unsqueeze(arg, [*range(1, 1 + axis), *range(axis + 2, axis + 2 + trailing)])

    value = bx.op("Cast", [x], {"to": dtype})
    zp, zp0 = (args[2], node.inputs[2]) if len(args) > 2 else (None, None)
    if zp is not None and zp0 is not None:
        zp_f = bx.op("Cast", [zp], {"to": dtype})
        value = bx.op("Sub", [value, aligned(zp_f, batched[2])])
    y = bx.op("Mul", [value, aligned(scale, batched[1])])
    out_dtype = node.outputs[0].dtype
    if out_dtype is not None and out_dtype != dtype:
        y = bx.op("Cast", [y], {"to": out_dtype})
    return y


# --------------------------------------------------------------------------- QuantizeLinear
# Its output is an integer (or 8-bit float) tensor.
quantize_linear = OpRules("QuantizeLinear", since=10)
quantize_linear.zero()


@quantize_linear.batch
def _quantize_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """QuantizeLinear with its quantization axis shifted past the batch axis.

    Shared parameters: a per-tensor (scalar) scale applies as is, a per-axis (1-D) one along the
    shifted axis, a blocked one (same rank as x) is broadcast along the batch first. Batched
    parameters are only expressible for a per-tensor scale (opset >= 13): one scale per example is
    a per-axis quantization along the batch axis itself.
    """
    x, scale, zero_point = required_arg(args, 0), required_arg(args, 1), optional_arg(args, 2)
    x_orig, scale_orig = original_input(node, 0), original_input(node, 1)
    zp_orig = node.inputs[2] if len(node.inputs) > 2 else None
    rank, scale_rank = bx.rank(x_orig), bx.rank(scale_orig)
    zp_batched = zero_point is not None and batched[2]
    block_size = node.attributes.get_int("block_size", 0)
    axis = node.attributes.get_int("axis", 1)
    if not batched[1] and not zp_batched:
        if scale_rank == 0 or not -rank <= axis < rank:
            # Per-tensor: the axis is ignored (and valid for the batched rank if it was before).
            return [bx.op("QuantizeLinear", list(args), attributes_of(node))], [True]
        attrs = attributes_of(node, axis=shift_axes([axis], rank)[0])
        if block_size > 0:
            # Blocked: the scale has x's rank; give it (and the zero point) the batch axis too.
            scale = bx.materialize(scale, False, scale_orig)
            if zero_point is not None and zp_orig is not None:
                zero_point = bx.materialize(zero_point, False, zp_orig)
        inputs = [x, scale] if zero_point is None else [x, scale, zero_point]
        return [bx.op("QuantizeLinear", inputs, attrs)], [True]
    per_tensor = scale_rank == 0 and (zp_orig is None or bx.rank(zp_orig) == 0)
    if bx.opset < 13 and bx.opset >= 11 and per_tensor:
        return [_quantize_explicit(bx, node, args, batched)], [True]
    if not per_tensor or block_size > 0 or bx.opset < 13:
        index = 1 if batched[1] else 2
        name = original_name(node, index)
        why = (
            "at opset 10 QuantizeLinear has no axis attribute and ONNX no Round"
            if bx.opset < 11
            else "the quantization parameters are per-axis or blocked"
        )
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets a batched "
            f"quantization parameter (input {index} {name!r}): each example would quantize "
            f"with its own parameters, which needs a per-axis quantization along the batch axis, "
            f"but {why}. Remedy: give the inputs {name!r} is computed from in_axes None "
            "(share the quantization parameters), or use a scalar scale and zero point at "
            "opset >= 11."
        )
    x = bx.materialize(x, batched[0], x_orig)
    scale = bx.materialize(scale, batched[1], scale_orig)
    inputs = [x, scale]
    if zero_point is not None and zp_orig is not None:
        inputs.append(bx.materialize(zero_point, batched[2], zp_orig))
    # One scale per example: per-axis quantization along axis 0, the batch axis.
    return [bx.op("QuantizeLinear", inputs, attributes_of(node, axis=0))], [True]


def _quantize_explicit(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> ir.Value:
    """Per-tensor QuantizeLinear-10 with per-example parameters, written out.

    Before opset 13 there is no per-axis form to carry one scale per example, so the
    definition is computed directly: ``y = saturate(round(x / scale) + zero_point)``, rounding
    half to even, in float32 (x is float32 or int32, the scale float32, the zero point uint8 or
    int8, as the opset-10 schema allows). Division (not a reciprocal), round-half-to-even and
    saturation to the integer range are what onnxruntime's kernel does, so the results agree
    exactly; the zero point and the rounded quotient are small integers, exact in float32.
    """
    x, scale, zero_point = required_arg(args, 0), required_arg(args, 1), optional_arg(args, 2)
    x_orig, scale_orig = original_input(node, 0), original_input(node, 1)
    zp_orig = node.inputs[2] if len(node.inputs) > 2 else None
    rank = bx.rank(x_orig)
    x = bx.materialize(x, batched[0], x_orig)
    if x_orig.dtype != ir.DataType.FLOAT:
        x = bx.op("Cast", [x], {"to": ir.DataType.FLOAT})
    scale = bx.align(scale, batched[1], scale_orig, rank)
    q = bx.op("Round", [bx.op("Div", [x, scale])])
    out_type = ir.DataType.UINT8
    if zero_point is not None and zp_orig is not None:
        out_type = zp_orig.dtype or out_type
        zp = bx.align(zero_point, batched[2], zp_orig, rank)
        q = bx.op("Add", [q, bx.op("Cast", [zp], {"to": ir.DataType.FLOAT})])
    info = np.iinfo(out_type.numpy())
    low, high = bx.scalar(info.min, ir.DataType.FLOAT), bx.scalar(info.max, ir.DataType.FLOAT)
    return bx.op("Cast", [bx.op("Clip", [q, low, high])], {"to": out_type})
