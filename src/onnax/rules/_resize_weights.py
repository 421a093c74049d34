"""Per-axis interpolation matrices of Resize (linear and cubic), built in the graph.

Linear and cubic Resize without antialias are separable: along each resized axis ``k`` the output
is ``A_k [out_k, in_k]`` applied to the input. The matrices follow onnxruntime's CPU kernels
(upsample.cc), all in float32 as there:

* an axis whose scale is exactly 1, or a Resize whose output shape equals its input shape, is
  copied (identity), whatever the coordinate transformation;
* linear clamps the source coordinate into ``[0, in - 1]`` and interpolates between
  ``floor(c)`` and ``min(floor(c) + 1, in - 1)``;
* cubic uses Keys' coefficients of ``c - floor(c)`` at ``floor(c) - 1 .. floor(c) + 2`` with the
  indices clamped, or with the outside taps dropped and the rest renormalised
  (exclude_outside);
* tf_crop_and_resize gives a row of zeros (the extrapolated constant is not linear in X) where
  the source coordinate falls outside ``[0, in - 1]``.

With ``with_slope`` the builder also returns ``dA_k / dcoord`` (one row per output position) and
the derivative of the coordinates with respect to the axis' scale and roi bounds, from which the
Resize rules build the derivative with respect to scales and roi.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter

__all__ = ["AxisWeights", "ResizeGeometry", "axis_weights", "contract"]


@dataclasses.dataclass
class ResizeGeometry:
    """What the weights of one Resize node depend on.

    Attributes:
        rank: Rank of X.
        axes: The X axes that scales/sizes/roi list, in their order.
        mode: 'linear' or 'cubic'.
        ctm: coordinate_transformation_mode.
        cubic_a: cubic_coeff_a.
        exclude_outside: exclude_outside.
        policy: keep_aspect_ratio_policy.
        shape_x: Run-time shape of X (1-D int64).
        shape_y: Run-time shape of Y (1-D int64).
        scales: The scales input (sizes mode: None).
        sizes: The sizes input, or None.
        roi: The roi input, or None.
        static_x: X's inferred shape.
    """

    rank: int
    axes: list[int]
    mode: str
    ctm: str
    cubic_a: float
    exclude_outside: bool
    policy: str
    shape_x: ir.Value
    shape_y: ir.Value
    scales: ir.Value | None
    sizes: ir.Value | None
    roi: ir.Value | None
    static_x: ir.Shape | None
    antialias: bool = False

    def processed(self) -> list[int]:
        """The axes that may be resized, without those statically known to be copied."""
        if self.rank == 4:
            # onnxruntime resizes NCHW (H, W) or NHWC (H, W); axis 0 always keeps its scale 1.
            candidates = [1, 2, 3]
        elif self.rank == 5:
            candidates = [2, 3, 4]
        else:
            candidates = list(range(self.rank))
        unit = self._static_unit_axes()
        return [k for k in candidates if k in self.axes and k not in unit]

    def _static_unit_axes(self) -> set[int]:
        if self.scales is not None:
            tensor = ir.convenience.get_const_tensor(self.scales)
            if tensor is None:
                return set()
            values = tensor.numpy().reshape(-1)
            return {k for k, s in zip(self.axes, values, strict=False) if float(s) == 1.0}
        if self.sizes is not None and self.policy == "stretch" and self.static_x is not None:
            tensor = ir.convenience.get_const_tensor(self.sizes)
            if tensor is None:
                return set()
            wanted = [int(v) for v in tensor.numpy().reshape(-1)]
            dims = self.static_x.dims
            return {k for k, n in zip(self.axes, wanted, strict=False) if dims[k] == n}
        return set()


@dataclasses.dataclass
class AxisWeights:
    """The interpolation matrix of one axis, and optionally its derivatives.

    Attributes:
        axis: The X axis.
        position: Its index in scales/sizes (roi: start at ``position``, end at
            ``len(axes) + position``).
        matrix: ``A [out, in]`` (float32).
        slope: ``dA / dcoord [out, in]`` (float32), row ``i`` for the coordinate of output ``i``.
        dcoord_dscale: ``dcoord / dscale [out]``, None when scales are not an input.
        dcoord_droi: ``(dcoord / droi_start, dcoord / droi_end)`` for tf_crop_and_resize.
        dmatrix_dscale: ``dA / dscale`` at fixed coordinates (antialias: the filter's width).
    """

    axis: int
    position: int
    matrix: ir.Value
    slope: ir.Value | None = None
    dcoord_dscale: ir.Value | None = None
    dcoord_droi: tuple[ir.Value, ir.Value] | None = None
    dmatrix_dscale: ir.Value | None = None


class _F:
    """Small float32 arithmetic on emitted values (keeps the formulas readable)."""

    def __init__(self, em: Emitter) -> None:
        self.em = em

    def c(self, number: float) -> ir.Value:
        return self.em.const(np.array(number, np.float32))

    def __call__(self, op: str, *args: ir.Value) -> ir.Value:
        return self.em.op(op, list(args))


def _scalar_at(em: Emitter, v: ir.Value, index: int) -> ir.Value:
    return em.op("Gather", [v, em.const(np.array(index, np.int64))], {"axis": 0})


def _to_float(em: Emitter, v: ir.Value) -> ir.Value:
    return em.op("Cast", [v], {"to": ir.DataType.FLOAT})


def _scale(em: Emitter, g: ResizeGeometry, axis: int, position: int) -> ir.Value:
    """The float32 scale onnxruntime uses on ``axis`` (rank 0)."""
    if g.scales is not None:
        return _to_float(em, _scalar_at(em, g.scales, position))
    assert g.sizes is not None
    if g.policy == "stretch":
        out_len = _to_float(em, _scalar_at(em, g.shape_y, axis))
        in_len = _to_float(em, _scalar_at(em, g.shape_x, axis))
        return em.op("Div", [out_len, in_len])
    # not_larger / not_smaller: one scale for all listed axes, sizes / input lengths min or max.
    in_dims = em.op("Gather", [g.shape_x, em.ints(g.axes)], {"axis": 0})
    ratios = em.op("Div", [_to_float(em, g.sizes), _to_float(em, in_dims)])
    op = "ReduceMin" if g.policy == "not_larger" else "ReduceMax"
    return em.reduce(op, ratios, None, keepdims=False)


def _coordinates(
    em: Emitter,
    g: ResizeGeometry,
    x: ir.Value,
    s: ir.Value,
    lo: ir.Value,
    li: ir.Value,
    position: int,
) -> tuple[ir.Value, ir.Value | None, tuple[ir.Value, ir.Value] | None]:
    """Source coordinates of the outputs ``x`` and their derivatives (scale, roi bounds).

    ``lo``/``li`` are the output/input lengths (float32, rank 0).
    """
    f = _F(em)
    half, one = f.c(0.5), f.c(1.0)
    s2 = f("Mul", s, s)
    zeros = f("Mul", x, f.c(0.0))
    lo_gt1 = f("Greater", lo, one)
    li_m1 = f("Sub", li, one)
    safe_lo_m1 = f("Max", f("Sub", lo, one), one)
    droi: tuple[ir.Value, ir.Value] | None = None
    ctm = g.ctm
    if ctm in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        xh = f("Add", x, half)
        coord = f("Sub", f("Div", xh, s), half)
        dscale = f("Neg", f("Div", xh, s2))
        if ctm == "half_pixel_symmetric":
            adjustment = f("Div", lo, f("Mul", s, li))
            offset = f("Mul", f("Div", li, f.c(2.0)), f("Sub", one, adjustment))
            coord = f("Add", offset, f("Div", xh, s))
            coord = f("Sub", coord, half)
            dscale = f("Add", dscale, f("Div", lo, f("Mul", f.c(2.0), s2)))
        if ctm == "pytorch_half_pixel":
            coord = f("Where", lo_gt1, coord, zeros)
            dscale = f("Where", lo_gt1, dscale, zeros)
    elif ctm == "asymmetric":
        coord = f("Div", x, s)
        dscale = f("Neg", f("Div", x, s2))
    elif ctm == "align_corners":
        coord = f("Where", lo_gt1, f("Div", f("Mul", x, li_m1), safe_lo_m1), zeros)
        dscale = zeros
    elif ctm == "tf_crop_and_resize":
        assert g.roi is not None
        n = len(g.axes)
        start = _to_float(em, _scalar_at(em, g.roi, position))
        end = _to_float(em, _scalar_at(em, g.roi, n + position))
        many = f(
            "Add",
            f("Mul", start, li_m1),
            f("Div", f("Mul", f("Mul", x, f("Sub", end, start)), li_m1), safe_lo_m1),
        )
        single = f("Add", zeros, f("Mul", f("Mul", half, f("Add", start, end)), li_m1))
        coord = f("Where", lo_gt1, many, single)
        dscale = zeros
        frac = f("Div", x, safe_lo_m1)
        d_end = f("Where", lo_gt1, f("Mul", frac, li_m1), f("Add", zeros, f("Mul", half, li_m1)))
        d_start = f(
            "Where",
            lo_gt1,
            f("Mul", f("Sub", one, frac), li_m1),
            f("Add", zeros, f("Mul", half, li_m1)),
        )
        droi = (d_start, d_end)
    else:
        raise ValueError(f"coordinate_transformation_mode {ctm!r}")
    return coord, dscale, droi


def _linear_taps(
    em: Emitter, coord: ir.Value, li_m1: ir.Value
) -> list[tuple[ir.Value, ir.Value, ir.Value]]:
    """(index, weight, dweight/dcoord) of linear interpolation, as onnxruntime clamps it."""
    f = _F(em)
    c = f("Max", f("Min", coord, li_m1), f.c(0.0))
    i0 = f("Floor", c)
    i1 = f("Min", f("Add", i0, f.c(1.0)), li_m1)
    w1 = f("Abs", f("Sub", c, i0))
    w0 = f("Abs", f("Sub", c, i1))
    same = f("Equal", i0, i1)
    w0 = f("Where", same, f.c(0.5), w0)
    w1 = f("Where", same, f.c(0.5), w1)
    inside = em.op(
        "Cast",
        [f("And", f("Greater", coord, f.c(0.0)), f("Less", coord, li_m1))],
        {"to": ir.DataType.FLOAT},
    )
    return [(i0, w0, f("Neg", inside)), (i1, w1, inside)]


def _cubic_taps(
    em: Emitter, coord: ir.Value, li: ir.Value, a: float, exclude_outside: bool
) -> list[tuple[ir.Value, ir.Value, ir.Value]]:
    """(index, weight, dweight/dcoord) of Keys' cubic convolution with coefficient ``a``."""
    f = _F(em)
    base = f("Floor", coord)
    s = f("Sub", coord, base)
    ca = f.c(a)

    def p(u: ir.Value) -> ir.Value:  # outer taps: ((a u - 5a) u + 8a) u - 4a
        inner = f("Sub", f("Mul", ca, u), f.c(5 * a))
        return f("Sub", f("Mul", f("Add", f("Mul", inner, u), f.c(8 * a)), u), f.c(4 * a))

    def dp(u: ir.Value) -> ir.Value:  # 3a u^2 - 10a u + 8a
        return f("Add", f("Mul", f("Sub", f("Mul", f.c(3 * a), u), f.c(10 * a)), u), f.c(8 * a))

    def q(u: ir.Value) -> ir.Value:  # inner taps: ((a + 2) u - (a + 3)) u^2 + 1
        inner = f("Sub", f("Mul", f.c(a + 2), u), f.c(a + 3))
        return f("Add", f("Mul", f("Mul", inner, u), u), f.c(1.0))

    def dq(u: ir.Value) -> ir.Value:  # 3(a + 2) u^2 - 2(a + 3) u
        return f("Mul", f("Sub", f("Mul", f.c(3 * (a + 2)), u), f.c(2 * (a + 3))), u)

    one, two = f.c(1.0), f.c(2.0)
    sp1, om, tm = f("Add", s, one), f("Sub", one, s), f("Sub", two, s)
    coeffs = [p(sp1), q(s), q(om), p(tm)]
    slopes = [dp(sp1), dq(s), f("Neg", dq(om)), f("Neg", dp(tm))]
    indices = [f("Add", base, f.c(float(j - 1))) for j in range(4)]
    if exclude_outside:
        masks = [
            em.op(
                "Cast",
                [f("And", f("Not", f("Less", i, f.c(0.0))), f("Less", i, li))],
                {"to": ir.DataType.FLOAT},
            )
            for i in indices
        ]
        coeffs = [f("Mul", c, m) for c, m in zip(coeffs, masks, strict=True)]
        slopes = [f("Mul", d, m) for d, m in zip(slopes, masks, strict=True)]
        total = f("Add", f("Add", coeffs[0], coeffs[1]), f("Add", coeffs[2], coeffs[3]))
        dtotal = f("Add", f("Add", slopes[0], slopes[1]), f("Add", slopes[2], slopes[3]))
        coeffs = [f("Div", c, total) for c in coeffs]
        slopes = [
            f("Div", f("Sub", d, f("Mul", c, dtotal)), total)
            for c, d in zip(coeffs, slopes, strict=True)
        ]
    li_m1 = f("Sub", li, one)
    clamped = [f("Max", f("Min", i, li_m1), f.c(0.0)) for i in indices]
    return list(zip(clamped, coeffs, slopes, strict=True))


def _antialias(
    em: Emitter, center: ir.Value, li: ir.Value, s: ir.Value, g: ResizeGeometry
) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """Taps of onnxruntime's antialiasing filter (upsample_aa.cc) around ``center`` ([m]).

    The filter (triangle for linear, Keys for cubic) is widened by ``1 / scale`` when shrinking;
    the window ``[floor(center - support + 0.5), floor(center + support + 0.5))`` holds at most
    ``2 ceil(support) + 1`` taps (a run-time count, so the taps run along a second axis); the
    weights are normalised to sum 1; outside taps are dropped (exclude_outside) or moved onto the
    border pixels.

    Returns:
        ``(index, weight, dweight/dcenter, dweight/dscale at a fixed center)``, each ``[m, w]``.
    """
    f = _F(em)
    half_size = 1.0 if g.mode == "linear" else 2.0
    inverse = f("Div", f.c(1.0), s)
    widened = f("Not", f("Less", inverse, f.c(1.0)))  # shrinking: the filter is widened
    support = f("Where", widened, f("Mul", f.c(half_size), inverse), f.c(half_size))
    factor = f("Where", widened, f("Div", f.c(1.0), inverse), f.c(1.0))
    dfactor = em.op("Cast", [widened], {"to": ir.DataType.FLOAT})
    window = f("Add", f("Mul", f("Ceil", support), f.c(2.0)), f.c(1.0))
    # The window's ends are rounded down (also below zero), as the runtime's results show.
    low = f("Floor", f("Add", f("Sub", center, support), f.c(0.5)))
    high = f("Floor", f("Add", f("Add", center, support), f.c(0.5)))
    if g.exclude_outside:
        low = f("Max", low, f.c(0.0))
        high = f("Min", high, li)
    steps = em.unsqueeze(em.op("Range", [f.c(0.0), window, f.c(1.0)]), [0])  # [1, w]
    x = f("Add", em.unsqueeze(low, [1]), steps)  # [m, w]
    inside = em.op("Cast", [f("Less", x, em.unsqueeze(high, [1]))], {"to": ir.DataType.FLOAT})
    offset = f("Add", f("Sub", x, em.unsqueeze(center, [1])), f.c(0.5))
    v = f("Mul", offset, factor)
    u = f("Abs", v)
    raw = f("Mul", _aa_filter(f, u, g), inside)
    draw_du = f("Mul", _aa_filter_slope(f, u, g), f("Mul", inside, f("Sign", v)))
    total = em.reduce_sum(raw, [1], keepdims=True)
    total = f("Where", f("Equal", total, f.c(0.0)), f.c(1.0), total)
    weight = f("Div", raw, total)

    def normalised(draw: ir.Value) -> ir.Value:
        dtotal = em.reduce_sum(draw, [1], keepdims=True)
        return f("Div", f("Sub", draw, f("Mul", weight, dtotal)), total)

    d_center = normalised(f("Mul", draw_du, f("Neg", factor)))
    d_scale = normalised(f("Mul", draw_du, f("Mul", offset, dfactor)))
    last = f("Sub", li, f.c(1.0))
    return f("Max", f("Min", x, last), f.c(0.0)), weight, d_center, d_scale


def _aa_filter(f: _F, u: ir.Value, g: ResizeGeometry) -> ir.Value:
    """The antialiasing filter at ``u >= 0``."""
    if g.mode == "linear":
        return f("Max", f("Sub", f.c(1.0), u), f.c(0.0))
    a = g.cubic_a
    near = f(
        "Add", f("Mul", f("Mul", f("Sub", f("Mul", f.c(a + 2), u), f.c(a + 3)), u), u), f.c(1.0)
    )
    far = f(
        "Mul",
        f("Sub", f("Mul", f("Add", f("Mul", f("Sub", u, f.c(5.0)), u), f.c(8.0)), u), f.c(4.0)),
        f.c(a),
    )
    zero = f.c(0.0)
    return f("Where", f("Less", u, f.c(1.0)), near, f("Where", f("Less", u, f.c(2.0)), far, zero))


def _aa_filter_slope(f: _F, u: ir.Value, g: ResizeGeometry) -> ir.Value:
    """The derivative of the antialiasing filter at ``u >= 0``."""
    zero = f.c(0.0)
    if g.mode == "linear":
        return f("Where", f("Less", u, f.c(1.0)), f.c(-1.0), zero)
    a = g.cubic_a
    near = f("Mul", f("Sub", f("Mul", f.c(3 * (a + 2)), u), f.c(2 * (a + 3))), u)
    far = f(
        "Mul", f("Add", f("Mul", f("Sub", f("Mul", f.c(3.0), u), f.c(10.0)), u), f.c(8.0)), f.c(a)
    )
    return f("Where", f("Less", u, f.c(1.0)), near, f("Where", f("Less", u, f.c(2.0)), far, zero))


def axis_weights(em: Emitter, g: ResizeGeometry, axis: int, *, with_slope: bool) -> AxisWeights:
    """The interpolation matrix of ``axis`` (and its derivatives when ``with_slope``)."""
    f = _F(em)
    position = g.axes.index(axis)
    lo = _to_float(em, _scalar_at(em, g.shape_y, axis))
    li = _to_float(em, _scalar_at(em, g.shape_x, axis))
    s = _scale(em, g, axis, position)
    x = em.op("Range", [f.c(0.0), lo, f.c(1.0)])
    coord, dscale, droi = _coordinates(em, g, x, s, lo, li, position)
    # onnxruntime copies an axis whose scale is 1, and the whole tensor when no length changes.
    same_shape = em.op(
        "Cast",
        [
            em.reduce(
                "ReduceMin",
                em.op("Cast", [em.op("Equal", [g.shape_x, g.shape_y])], {"to": ir.DataType.INT64}),
                None,
                keepdims=False,
            )
        ],
        {"to": ir.DataType.BOOL},
    )
    identity = f("Or", f("Equal", s, f.c(1.0)), same_shape)
    coord = f("Where", identity, x, coord)
    zeros = f("Mul", x, f.c(0.0))
    li_m1 = f("Sub", li, f.c(1.0))
    direct: ir.Value | None = None  # antialias: dA/dscale at fixed coordinates
    if g.antialias:
        index, weight, d_center, direct = _antialias(em, f("Add", coord, f.c(0.5)), li, s, g)
        taps = [(index, weight, d_center)]
    elif g.mode == "cubic":
        taps = _cubic_taps(em, coord, li, g.cubic_a, g.exclude_outside)
    else:
        taps = _linear_taps(em, coord, li_m1)
    valid: ir.Value | None = None
    if g.ctm == "tf_crop_and_resize":
        outside = f("Or", f("Less", coord, f.c(0.0)), f("Greater", coord, li_m1))
        valid = em.op("Cast", [em.op("Not", [outside])], {"to": ir.DataType.FLOAT})
    columns = em.unsqueeze(em.op("Range", [f.c(0.0), li, f.c(1.0)]), [0])

    def dense(values: list[ir.Value]) -> ir.Value:
        terms = []
        for (index, _, _), v in zip(taps, values, strict=True):
            if g.antialias:  # [m, w] taps: one-hot [m, w, n], summed over the window
                if valid is not None:
                    v = f("Mul", v, em.unsqueeze(valid, [1]))
                hot = em.op(
                    "Cast",
                    [f("Equal", em.unsqueeze(index, [2]), em.unsqueeze(columns, [0]))],
                    {"to": ir.DataType.FLOAT},
                )
                terms.append(
                    em.reduce_sum(f("Mul", hot, em.unsqueeze(v, [2])), [1], keepdims=False)
                )
                continue
            if valid is not None:
                v = f("Mul", v, valid)
            hot = em.op(
                "Cast", [f("Equal", em.unsqueeze(index, [1]), columns)], {"to": ir.DataType.FLOAT}
            )
            terms.append(f("Mul", hot, em.unsqueeze(v, [1])))
        total = em.add_all(terms)
        assert total is not None
        return total

    weights = AxisWeights(axis, position, dense([w for _, w, _ in taps]))
    if with_slope:
        weights.slope = dense([d for _, _, d in taps])
        keep = f("Where", identity, zeros, f("Add", zeros, f.c(1.0)))
        if g.scales is not None and dscale is not None:
            weights.dcoord_dscale = f("Mul", dscale, keep)
            if direct is not None:
                weights.dmatrix_dscale = f("Mul", dense([direct]), em.unsqueeze(keep, [1]))
        if droi is not None:
            weights.dcoord_droi = (f("Mul", droi[0], keep), f("Mul", droi[1], keep))
    return weights


def contract(em: Emitter, v: ir.Value, mat: ir.Value, axis: int, rank: int) -> ir.Value:
    """``v`` with its axis ``axis`` (size m) contracted with ``mat [m, p]`` (size p after)."""
    if axis == rank - 1:
        return em.op("MatMul", [v, mat])
    if axis == rank - 2:
        return em.op("MatMul", [em.transpose(mat, [1, 0]), v])
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = em.op("MatMul", [em.transpose(v, perm), mat])
    inverse = [perm.index(i) for i in range(rank)]
    return em.transpose(moved, inverse)
