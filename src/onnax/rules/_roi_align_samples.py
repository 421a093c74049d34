"""The bilinear samples of RoiAlign ('avg'), built in the graph as onnxruntime computes them.

For roi ``k`` (``[x1, y1, x2, y2]`` times spatial_scale, minus 0.5 with half_pixel), bin
``(ph, pw)`` and sample ``(iy, ix)`` the sampling point is
``y = y1 + ph * bin_h + (iy + 0.5) * bin_h / grid_h`` (likewise x), where ``bin_h = roi_h / PH``,
``roi_h = y2 - y1`` (at least 1 with output_half_pixel) and ``grid_h = sampling_ratio`` or
``ceil(roi_h / PH)``; a point outside ``[-1, H]`` contributes nothing, coordinates at most 0
read row 0, and from ``H - 1`` on the last row. Each output averages its ``grid_h * grid_w``
samples (at least 1). Adaptive grids differ per roi: the samples run up to the largest grid and
the surplus is masked.

The samples give four (flat index, weight) taps each, plus the weights' derivatives with respect
to the four roi coordinates, from which the RoiAlign rules build the transpose in X (a scatter-add)
and the derivative with respect to the rois.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.rules._patterns import TypedOps

__all__ = ["RoiSamples"]

_BIG = 2**62


class RoiSamples:
    """The taps of every sample of a RoiAlign node.

    Attributes:
        index: ``[K, O, 4G]`` flat indices into X viewed as ``[N*H*W]`` per channel.
        weights: ``[K, O, 4G]`` weights (the average's 1/count included).
        roi_slopes: Four ``[K, O, 4G]`` derivatives of the weights in x1, y1, x2, y2.
    """

    def __init__(
        self,
        em: Emitter,
        node: ir.Node,
        x: ir.Value,
        rois: ir.Value,
        batch_indices: ir.Value,
        *,
        half_pixel: bool,
    ) -> None:
        dtype = x.dtype
        assert dtype is not None
        f = TypedOps(em, dtype)
        self.em = em
        attrs = node.attributes
        pooled = (attrs.get_int("output_height", 1), attrs.get_int("output_width", 1))
        ratio = attrs.get_int("sampling_ratio", 0)
        scale = attrs.get_float("spatial_scale", 1.0)
        self.shape_x = em.shape(x)
        lengths_int = [em.slice(self.shape_x, [a], [a + 1], [0]) for a in (2, 3)]
        lengths = [em.op("Cast", [em.squeeze(n, [0])], {"to": dtype}) for n in lengths_int]
        roi = [
            em.op(
                "Cast",
                [em.op("Gather", [rois, em.const(np.array(j, np.int64))], {"axis": 1})],
                {"to": dtype},
            )
            for j in range(4)
        ]
        offset = f.c(0.5 if half_pixel else 0.0)
        # Per axis a (0: y/H/rows, 1: x/W/columns): roi coordinates (start j0, end j1).
        taps_per_axis = []
        counts = []
        for a, (j0, j1) in enumerate(((1, 3), (0, 2))):
            start = f("Sub", f("Mul", roi[j0], f.c(scale)), offset)
            end = f("Sub", f("Mul", roi[j1], f.c(scale)), offset)
            raw = f("Sub", end, start)
            size = raw if half_pixel else f("Max", raw, f.c(1.0))
            free = f.c(1.0) if half_pixel else f.mask(f("Greater", raw, f.c(1.0)))
            bins = f.c(float(pooled[a]))
            bin_size = f("Div", size, bins)
            if ratio > 0:
                grid = f("Add", f("Mul", raw, f.c(0.0)), f.c(float(ratio)))
                top = em.ints([ratio])
            else:
                grid = f("Ceil", f("Div", size, bins))
                top = em.op(
                    "Cast",
                    [em.reduce("ReduceMax", grid, None, keepdims=True)],
                    {"to": ir.DataType.INT64},
                )
                top = em.op("Max", [top, em.ints([1])])
            counts.append(grid)
            samples = em.op(
                "Cast",
                [
                    em.op(
                        "Range",
                        [
                            em.const(np.array(0, np.int64)),
                            em.squeeze(top, [0]),
                            em.const(np.array(1, np.int64)),
                        ],
                    )
                ],
                {"to": dtype},
            )  # [G]
            bin_index = (
                f.c(0.0)
                if pooled[a] == 1
                else em.const(np.arange(pooled[a], dtype=dtype.numpy()).reshape(-1, 1))
            )  # [P, 1]
            start3, bin3, grid3 = (em.unsqueeze(v, [1, 2]) for v in (start, bin_size, grid))
            # y = start + p * bin + ((i + 0.5) * bin) / grid  ->  [K, P, G]
            inner = f("Div", f("Mul", f("Add", samples, f.c(0.5)), bin3), grid3)
            coord = f("Add", f("Add", start3, f("Mul", bin_index, bin3)), inner)
            used = f.mask(f("Less", samples, grid3))  # [K, 1, G]
            # d coord / d start and d end (through start and the roi size).
            share = f(
                "Div", f("Add", bin_index, f("Div", f("Add", samples, f.c(0.5)), grid3)), bins
            )
            free3 = free if half_pixel else em.unsqueeze(free, [1, 2])
            d_end = f("Mul", f("Mul", share, free3), f.c(scale))
            d_start = f("Sub", f.c(scale), d_end)
            taps_per_axis.append(
                (self._axis_taps(f, coord, lengths[a]), used, d_start, d_end, lengths_int[a])
            )
        count = f("Max", f("Mul", counts[0], counts[1]), f.c(1.0))
        inverse = em.unsqueeze(f("Div", f.c(1.0), count), [1, 2, 3, 4])  # [K, 1, 1, 1, 1]
        width = lengths_int[1]
        plane = em.op("Mul", [lengths_int[0], width])
        image = em.op("Mul", [em.unsqueeze(batch_indices, [1, 2, 3, 4]), plane])
        (y_taps, y_used, y_ds, y_de, _), (x_taps, x_used, x_ds, x_de, _) = taps_per_axis
        self.outputs = pooled[0] * pooled[1]

        def as_y(v: ir.Value) -> ir.Value:  # [K, PH, G] -> [K, PH, 1, G, 1]
            return em.unsqueeze(v, [2, 4])

        def as_x(v: ir.Value) -> ir.Value:  # [K, PW, G] -> [K, 1, PW, 1, G]
            return em.unsqueeze(v, [1, 3])

        indices, weights = [], []
        slopes: list[list[ir.Value]] = [[], [], [], []]
        for (iy, wy, sy), (ix, wx, sx) in itertools.product(y_taps, x_taps):
            wy5 = f("Mul", as_y(f("Mul", wy, y_used)), inverse)
            sy5 = f("Mul", as_y(f("Mul", sy, y_used)), inverse)
            wx5, sx5 = as_x(f("Mul", wx, x_used)), as_x(f("Mul", sx, x_used))
            flat = em.op(
                "Add",
                [
                    em.op("Mul", [as_y(em.op("Cast", [iy], {"to": ir.DataType.INT64})), width]),
                    as_x(em.op("Cast", [ix], {"to": ir.DataType.INT64})),
                ],
            )
            indices.append(self._flatten(em.op("Add", [flat, image])))
            weights.append(self._flatten(f("Mul", wy5, wx5)))
            along_y = f("Mul", sy5, wx5)
            along_x = f("Mul", wy5, sx5)
            slopes[0].append(self._flatten(f("Mul", along_x, as_x(x_ds))))
            slopes[1].append(self._flatten(f("Mul", along_y, as_y(y_ds))))
            slopes[2].append(self._flatten(f("Mul", along_x, as_x(x_de))))
            slopes[3].append(self._flatten(f("Mul", along_y, as_y(y_de))))
        self.index = em.op("Concat", indices, {"axis": 2})
        self.weights = em.op("Concat", weights, {"axis": 2})
        self.roi_slopes = [em.op("Concat", s, {"axis": 2}) for s in slopes]

    def _flatten(self, v: ir.Value) -> ir.Value:
        """``[K, PH, PW, GH, GW]`` to ``[K, PH*PW, GH*GW]``."""
        return self.em.op("Reshape", [v, self.em.ints([0, self.outputs, -1])])

    @staticmethod
    def _axis_taps(
        f: TypedOps, c: ir.Value, length: ir.Value
    ) -> list[tuple[ir.Value, ir.Value, ir.Value]]:
        """(row, weight, dweight/dcoord) of the two bilinear taps along one axis."""
        last = f("Sub", length, f.c(1.0))
        valid = f.mask(f("Not", f("Or", f("Less", c, f.c(-1.0)), f("Greater", c, length))))
        clamped = f("Max", c, f.c(0.0))
        low = f("Floor", clamped)
        edge = f("Not", f("Less", low, last))
        low = f("Where", edge, last, low)
        high = f("Where", edge, last, f("Add", low, f.c(1.0)))
        frac = f("Where", edge, f.c(0.0), f("Sub", clamped, low))
        interior = f.mask(f("And", f("Greater", c, f.c(0.0)), f("Not", edge)))
        slope = f("Mul", interior, valid)
        return [
            (low, f("Mul", f("Sub", f.c(1.0), frac), valid), f("Neg", slope)),
            (high, f("Mul", frac, valid), slope),
        ]
