"""Resize in every mode: jvp, transpose and batch rules.

For fixed roi/scales/sizes, Resize is linear in X: the tangent is the same Resize of the tangent
(with ``extrapolation_value`` 0, since tf_crop_and_resize is affine through it), run by the
runtime's own kernel.

The transpose depends on the mode:

* 'nearest' copies elements: the cotangent is scatter-added back to the copied elements, whose
  flat indices come from the same Resize applied to an int32 grid of flat input indices (so every
  coordinate and rounding rule is the runtime's own).
* 'linear' and 'cubic' are separable: ``Y = X x_1 A_1 ... x_k A_k`` with one
  interpolation matrix ``A_k [out_k, in_k]`` per resized axis. The matrices are built in the graph
  (:mod:`onnax.rules._resize_weights`, which follows onnxruntime's kernels: coordinate clamping
  for linear, Keys coefficients with index clamping and exclude_outside for cubic, rows of zeros
  where tf_crop_and_resize extrapolates, the identity for an axis whose scale is 1), and the
  cotangent is contracted with each one (MatMul on that axis).

With antialias=1 (opset 18) the matrices hold onnxruntime's antialiasing filter taps
(upsample_aa.cc: a triangle or Keys filter widened by 1/scale when shrinking, normalised, outside
taps dropped or moved onto the border), at most ``2 ceil(support) + 1`` per output (a run-time
count).

The derivative with respect to ``scales`` (and ``roi`` for tf_crop_and_resize) is defined for
linear and cubic: it moves the sampling coordinates (and, with antialias, widens the filter), so
``dY = sum_k X x_k (dA_k/dtheta) x_{j != k} A_j dtheta``, built from the same matrices. In
'nearest' mode the output is piecewise constant in scales and roi: their derivative is zero
(almost everywhere), as is that of sizes (integers).

vmap folds the batch into axis 0 when it keeps its size (onnxruntime's linear and cubic kernels
take only 2-D to 5-D inputs with unscaled outer axes), views a 2-D linear/cubic input as
``[B, 1, H, W]``, else adds an axis with scale 1 / the batch size, or from opset 18 lists the
resized axes in ``axes``. A batched roi/scales/sizes is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints
from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of
from onnax.rules._resize_weights import ResizeGeometry, axis_weights, contract

__all__: list[str] = []

_BIG = 2**62


def _str_attr(node: ir.Node, name: str, default: str) -> str:
    attr = node.attributes.get(name)
    return default if attr is None else str(attr.as_string())


def _mode(node: ir.Node) -> str:
    return _str_attr(node, "mode", "nearest")


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _scales_index(em: Emitter) -> int:
    return 1 if em.opset < 11 else 2


def _geometry(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ResizeGeometry:
    """Everything the per-axis weights need, read from the node (x, y give the shapes)."""
    rank = x.shape.rank() if x.shape is not None else None
    if rank is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the rank of the resized input is unknown. "
            "Remedy: give the model's inputs static ranks."
        )
    axes_attr = node.attributes.get("axes")
    axes = (
        [a + rank if a < 0 else a for a in axes_attr.as_ints()]
        if axes_attr is not None
        else list(range(rank))
    )
    sizes = _input(node, 3) if em.opset >= 11 else None
    scales = None if sizes is not None else _input(node, _scales_index(em))
    roi = _input(node, 1) if em.opset >= 11 else None
    return ResizeGeometry(
        rank=rank,
        axes=axes,
        mode=_mode(node),
        ctm=_str_attr(
            node,
            "coordinate_transformation_mode",
            "asymmetric" if em.opset < 11 else "half_pixel",
        ),
        cubic_a=node.attributes.get_float("cubic_coeff_a", -0.75),
        exclude_outside=bool(node.attributes.get_int("exclude_outside", 0)),
        policy=_str_attr(node, "keep_aspect_ratio_policy", "stretch"),
        shape_x=em.shape(x),
        shape_y=em.shape(y),
        scales=scales,
        sizes=sizes,
        roi=roi,
        static_x=x.shape,
        antialias=bool(node.attributes.get_int("antialias", 0)),
    )


# One set of rules for every version from 10: the later ones add inputs (roi, sizes) and
# attributes that the rules read from the node and the opset.
resize = OpRules("Resize", since=10)


# ------------------------------------------------------------------------------------ jvp
@resize.jvp
def _resize_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """The same Resize of the tangent of X, plus the moves of the sampling coordinates."""
    t = tangents[0]
    x, y = node.inputs[0], node.outputs[0]
    if x is None:
        raise InternalRuleError(f"{op_label(node)} jvp: missing input")
    terms: list[ir.Value | None] = []
    if t is not None:
        attrs = attributes_of(node)
        if "extrapolation_value" in attrs:
            attrs["extrapolation_value"] = 0.0
        terms.append(em.op("Resize", [t, *node.inputs[1:]], attrs))
    if _mode(node) != "nearest" and em.opset >= 11:
        terms.extend(_parameter_tangents(em, node, x, y, tangents))
    return [em.add_all(terms)]


def _parameter_tangents(
    em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value, tangents: Tangents
) -> list[ir.Value | None]:
    """The terms of dY from the tangents of roi and scales (linear and cubic modes)."""
    t_roi = tangents[1] if len(tangents) > 1 else None
    t_scales = tangents[2] if len(tangents) > 2 and _input(node, 3) is None else None
    geometry = _geometry(em, node, x, y)
    if t_roi is not None and geometry.ctm != "tf_crop_and_resize":
        t_roi = None  # roi is read only by tf_crop_and_resize
    if t_roi is None and t_scales is None:
        return []
    per_axis = [axis_weights(em, geometry, k, with_slope=True) for k in geometry.processed()]
    matrices = [_cast(em, w.matrix, x) for w in per_axis]
    terms: list[ir.Value | None] = []
    for i, w in enumerate(per_axis):
        slopes: list[tuple[ir.Value, ir.Value]] = []
        if t_scales is not None and w.dcoord_dscale is not None:
            slopes.append((w.dcoord_dscale, _element(em, t_scales, w.position)))
        if t_roi is not None and w.dcoord_droi is not None:
            n = len(geometry.axes)
            start, end = w.dcoord_droi
            slopes.append((start, _element(em, t_roi, w.position)))
            slopes.append((end, _element(em, t_roi, n + w.position)))
        for n_slope, (dcoord, dtheta) in enumerate(slopes):
            assert w.slope is not None
            # d A_k / d theta = slope (d A_k / d coord, per output row) * d coord / d theta.
            dmat = em.op("Mul", [w.slope, em.unsqueeze(dcoord, [1])])
            if n_slope == 0 and t_scales is not None and w.dmatrix_dscale is not None:
                dmat = em.op("Add", [dmat, w.dmatrix_dscale])
            dmat = _cast(em, dmat, x)
            z = x
            for j, (other, m) in enumerate(zip(per_axis, matrices, strict=True)):
                mat = dmat if j == i else m
                z = contract(em, z, em.transpose(mat, [1, 0]), other.axis, geometry.rank)
            scalar = dtheta
            if x.dtype is not None and x.dtype != ir.DataType.FLOAT:
                scalar = em.op("Cast", [dtheta], {"to": x.dtype})
            terms.append(em.op("Mul", [z, scalar]))
    return terms


def _element(em: Emitter, v: ir.Value, index: int) -> ir.Value:
    """Element ``index`` of a 1-D value, as a rank-0 value."""
    return em.op("Gather", [v, em.const(np.array(index, np.int64))], {"axis": 0})


def _cast(em: Emitter, v: ir.Value, like: ir.Value) -> ir.Value:
    """``v`` (float32) in the element type of ``like``."""
    if like.dtype is None or like.dtype == ir.DataType.FLOAT:
        return v
    return em.op("Cast", [v], {"to": like.dtype})


# ------------------------------------------------------------------------------ transpose
@resize.transpose
def _resize_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """The adjoint of Resize in X: a scatter-add (nearest) or the transposed matrices."""
    ct, x = cts[0], node.inputs[0]
    if ct is None or x is None or x.dtype is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    if _mode(node) == "nearest":
        return [_nearest_transpose(em, node, ct, x), *rest]
    geometry = _geometry(em, node, x, node.outputs[0])
    out = ct
    for k in geometry.processed():
        w = axis_weights(em, geometry, k, with_slope=False)
        out = contract(em, out, _cast(em, w.matrix, x), w.axis, geometry.rank)
    return [out, *rest]


def _nearest_transpose(em: Emitter, node: ir.Node, ct: ir.Value, x: ir.Value) -> ir.Value:
    """Scatter-add of the cotangent into the elements each output position copied.

    The source of every output position comes from the same Resize applied to the flat indices
    of the input (int32, exact), so ONNX's coordinate and rounding rules are applied by the
    runtime exactly as in the primal. The sum over duplicates is a ScatterElements with
    ``reduction="add"`` from opset 16, and a contraction with a one-hot matrix before.
    """
    assert x.dtype is not None
    shape_x = em.shape(x)
    numel = em.reduce("ReduceProd", shape_x, None, keepdims=True)
    iota = em.op(
        "Range",
        [
            em.const(np.array(0, np.int64)),
            em.squeeze(numel, [0]),
            em.const(np.array(1, np.int64)),
        ],
    )
    grid = em.op("Reshape", [em.op("Cast", [iota], {"to": ir.DataType.INT32}), shape_x])
    attrs = attributes_of(node)
    if "extrapolation_value" in attrs:
        attrs["extrapolation_value"] = -1.0
    source = em.op("Resize", [grid, *node.inputs[1:]], attrs)
    flat_source = em.op(
        "Reshape", [em.op("Cast", [source], {"to": ir.DataType.INT64}), em.ints([-1])]
    )
    flat_ct = em.op("Reshape", [ct, em.ints([-1])])
    if _str_attr(node, "coordinate_transformation_mode", "") == "tf_crop_and_resize":
        # Extrapolated positions (source -1) copy nothing: drop their cotangent.
        keep = em.op("Not", [em.op("Less", [flat_source, em.const(np.array(0, np.int64))])])
        flat_ct = em.op("Where", [keep, flat_ct, em.scalar(0.0, x.dtype)])
        flat_source = em.op("Where", [keep, flat_source, em.const(np.array(0, np.int64))])
    if em.opset >= 16:
        zeros = em.op("Expand", [em.scalar(0.0, x.dtype), numel])
        flat = em.op(
            "ScatterElements", [zeros, flat_source, flat_ct], {"axis": 0, "reduction": "add"}
        )
    else:
        one_hot = em.op(
            "Cast",
            [em.op("Equal", [em.unsqueeze(flat_source, [1]), iota])],
            {"to": x.dtype},
        )
        flat = em.op("MatMul", [flat_ct, one_hot])
    return em.op("Reshape", [flat, shape_x])


# ---------------------------------------------------------------------------------- batch
@resize.batch
def _resize_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Resize of one more leading axis that keeps its size (scale 1, or the batch size)."""
    shape_roles = {1: "scales"} if bx.opset < 11 else {2: "scales", 3: "sizes"}
    refuse_batched(bx, node, args, batched, shape_roles)
    if bx.opset >= 11:
        refuse_batched(
            bx,
            node,
            args,
            batched,
            {1: "roi"},
            "one Resize node crops every example with the same roi, and a per-example crop has "
            "no batch rule here",
        )
    x, original = args[0], node.inputs[0]
    if x is None or original is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    rank = bx.rank(original)
    inputs = list(args)
    folded = _resize_folded(bx, node, inputs, rank)
    if folded is not None:
        return [folded], [True]
    if rank == 2 and _mode(node) != "nearest":
        return [_resize_2d_as_4d(bx, node, inputs)], [True]
    return [_with_leading_axes(bx, node, inputs, rank, 1)], [True]


def _resize_2d_as_4d(bx: Batcher, node: ir.Node, inputs: list[ir.Value | None]) -> ir.Value:
    """A batched 2-D linear/cubic Resize as a 4-D one, ``[B, 1, H, W]`` with outer scales 1.

    onnxruntime's linear and cubic kernels take 2-D and 4-D inputs, not 3-D.
    """
    x = inputs[0]
    assert x is not None
    out = _with_leading_axes(bx, node, [bx.unsqueeze(x, [1]), *inputs[1:]], 2, 2)
    return bx.squeeze(out, [1])


def _with_leading_axes(
    bx: Batcher, node: ir.Node, inputs: list[ir.Value | None], rank: int, added: int
) -> ir.Value:
    """Resize of ``inputs[0]``, which has ``added`` new unscaled leading axes."""
    inputs = list(inputs)
    if bx.opset >= 18:
        axes_attr = node.attributes.get("axes")
        axes = list(axes_attr.as_ints()) if axes_attr is not None else list(range(rank))
        attrs = attributes_of(node, axes=[(a + rank if a < 0 else a) + added for a in axes])
        return bx.op("Resize", inputs, attrs)
    sizes = inputs[3] if len(inputs) > 3 else None
    if sizes is not None:
        shape = bx.slice(bx.op("Shape", [inputs[0]]), [0], [added], [0])
        inputs[3] = bx.op("Concat", [shape, sizes], {"axis": 0})
    else:
        index = 1 if bx.opset < 11 else 2
        scales = inputs[index]
        if scales is None:
            raise InternalRuleError(f"{op_label(node)} batch: neither scales nor sizes")
        ones = bx.const(np.ones(added, dtype=np.float32))
        inputs[index] = bx.op("Concat", [ones, scales], {"axis": 0})
    roi = inputs[1] if bx.opset >= 11 and len(inputs) > 1 else None
    if roi is not None and _str_attr(node, "coordinate_transformation_mode", "") == (
        "tf_crop_and_resize"
    ):
        # roi lists all starts, then all ends: the new axes crop [0, 1] (nothing).
        original = node.inputs[1]
        roi_type = (original.dtype if original is not None else None) or ir.DataType.FLOAT
        half = bx.op("Div", [bx.op("Shape", [roi]), bx.ints([2])])
        starts = bx.slice(roi, bx.ints([0]), half, [0])
        ends = bx.slice(roi, half, bx.ints([_BIG]), [0])
        zero = bx.const(np.zeros(added, roi_type.numpy()))
        one = bx.const(np.ones(added, roi_type.numpy()))
        inputs[1] = bx.op("Concat", [zero, starts, one, ends], {"axis": 0})
    return bx.op("Resize", inputs, attributes_of(node))


def _resize_folded(
    bx: Batcher, node: ir.Node, inputs: list[ir.Value | None], rank: int
) -> ir.Value | None:
    """Resize with the batch folded into axis 0, when axis 0 keeps its size; else None.

    onnxruntime's linear and cubic kernels only take 2-D to 5-D inputs with the outer axes
    unscaled, so an extra leading axis must not reach them: [B, d0, ...] becomes [B*d0, ...].
    """
    # (tf_crop_and_resize folds too: onnxruntime ignores the roi of an axis whose scale is 1.)
    if rank < 1:
        return None
    axes_attr = node.attributes.get("axes")
    axes = [a + rank if a < 0 else a for a in axes_attr.as_ints()] if axes_attr else None
    scales = inputs[2] if len(inputs) > 2 else None
    sizes = inputs[3] if len(inputs) > 3 else None
    original = node.inputs[0]
    assert original is not None and original.shape is not None
    first = 0 if axes is None else (axes.index(0) if 0 in axes else None)
    # onnxruntime runs linear and cubic Resize on 4-D and 5-D inputs only when their outer
    # scales are 1, so for those ranks axis 0 keeps its size whenever the model runs at all; for
    # the rest that must be seen in constant scales or sizes.
    known_unscaled = _mode(node) != "nearest" and rank in (4, 5)
    if first is not None and not known_unscaled:
        if sizes is not None:
            wanted = const_ints(sizes)
            if wanted is None or original.shape.dims[0] != wanted[first]:
                return None
        elif scales is not None:
            tensor = ir.convenience.get_const_tensor(scales)
            if tensor is None or float(tensor.numpy().reshape(-1)[first]) != 1.0:
                return None
        else:
            return None
    x = inputs[0]
    assert x is not None
    merged = bx.op(
        "Concat",
        [bx.ints([-1]), bx.slice(bx.unbatched_shape(x, True, original), [1], [_BIG], [0])],
        {"axis": 0},
    )
    if sizes is not None and first is not None:
        d0 = bx.slice(sizes, [first], [first + 1], [0])
        scaled = bx.op("Mul", [d0, bx.batch_size])
        parts = [
            bx.slice(sizes, [0], [first], [0]),
            scaled,
            bx.slice(sizes, [first + 1], [_BIG], [0]),
        ]
        inputs = [*inputs[:3], bx.op("Concat", parts, {"axis": 0})]
    out = bx.op("Resize", [bx.op("Reshape", [x, merged]), *inputs[1:]], attributes_of(node))
    tail = bx.slice(bx.op("Shape", [out]), [1], [_BIG], [0])
    return bx.op(
        "Reshape", [out, bx.op("Concat", [bx.batch_size, bx.ints([-1]), tail], {"axis": 0})]
    )
