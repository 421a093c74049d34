"""More operator families for the fuzz generator: clipping, Einsum, padding, tiling, cumulative
sums, variadic sums, GatherElements, newer activations, instance norm and ConvTranspose.

:class:`MoreFamilies` is mixed into :class:`fuzz_generator.Generator`, whose helpers (``pick``,
``emit``, ``const``, ``weight``, ``positive_of``) it uses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fuzz_graphs import BATCH, Kink, Val, broadcast
from fuzz_graphs import ints_text as _ints


class MoreFamilies:
    """Families drawn by :meth:`more` (one of them at random)."""

    rng: np.random.Generator
    opset: int
    dtype: str
    pick: Any
    emit: Any
    const: Any
    weight: Any
    fresh: Any
    positive_of: Any
    partner: Any

    def more(self) -> Val | None:
        kinds = ["einsum", "pad", "tile", "cumsum", "variadic", "gather_elements"]
        if self.dtype == "float":  # onnxruntime has float kernels only for these
            kinds += ["clip", "activation", "instance_norm", "conv_transpose"]
        return getattr(self, "_" + str(self.rng.choice(kinds)))()

    def _clip(self) -> Val | None:
        x = self.pick()
        if x is None:
            return None
        lo, hi = self.const(np.array(-0.5), "T"), self.const(np.array(0.8), "T")
        y = self.fresh("v")
        return self.emit(
            f"{y} = Clip ({x.name}, {lo}, {hi})",
            [x.name, lo, hi],
            [Val(y, x.shape)],
            [Kink("abs", (x.name,), (-0.5, 0.8))],
        )

    def _einsum(self) -> Val | None:
        if self.opset < 12:
            return None
        x = self.pick(lambda v: len(v.shape) in (2, 3) and v.shape[-1] != BATCH)
        if x is None:
            return None
        y = self.fresh("v")
        if len(x.shape) == 3 and self.rng.random() < 0.5:
            shape = (x.shape[0], x.shape[2], x.shape[1])
            return self.emit(
                f'{y} = Einsum <equation = "bij->bji"> ({x.name})', [x.name], [Val(y, shape)]
            )
        k, c = int(x.shape[-1]), int(self.rng.integers(1, 4))
        w = self.weight([k, c])
        eq = "ij,jk->ik" if len(x.shape) == 2 else "bij,jk->bik"
        shape = (*x.shape[:-1], c)
        return self.emit(
            f'{y} = Einsum <equation = "{eq}"> ({x.name}, {w})', [x.name, w], [Val(y, shape)]
        )

    def _pad(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return None
        r = len(x.shape)
        pads = [0 if d == BATCH else int(self.rng.integers(0, 2)) for d in x.shape] * 2
        p = self.const(np.array(pads, np.int64), "int64")
        val = self.const(np.array(0.3), "T")
        y = self.fresh("v")
        shape = tuple(
            d if d == BATCH else int(d) + pads[i] + pads[i + r] for i, d in enumerate(x.shape)
        )
        return self.emit(f"{y} = Pad ({x.name}, {p}, {val})", [x.name, p, val], [Val(y, shape)])

    def _tile(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return None
        reps = [1 if d == BATCH else int(self.rng.integers(1, 3)) for d in x.shape]
        rp = self.const(np.array(reps, np.int64), "int64")
        y = self.fresh("v")
        shape = tuple(d if d == BATCH else int(d) * k for d, k in zip(x.shape, reps, strict=True))
        return self.emit(f"{y} = Tile ({x.name}, {rp})", [x.name, rp], [Val(y, shape, x.positive)])

    def _cumsum(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return None
        axis = self.const(np.array(int(self.rng.integers(0, len(x.shape))), np.int64), "int64")
        rev, exc = int(self.rng.integers(0, 2)), int(self.rng.integers(0, 2))
        y = self.fresh("v")
        return self.emit(
            f"{y} = CumSum <exclusive = {exc}, reverse = {rev}> ({x.name}, {axis})",
            [x.name, axis],
            [Val(y, x.shape)],
        )

    def _variadic(self) -> Val | None:
        a = self.pick()
        if a is None:
            return None
        b, bshape, _ = self.partner(a.shape)
        c, cshape, _ = self.partner(a.shape)
        out = broadcast(a.shape, bshape)
        out = broadcast(out, cshape) if out is not None else None
        if out is None:
            return None
        op = str(self.rng.choice(["Sum", "Max"] + ["Mean"] * (self.dtype == "float")))
        kinks = [Kink("gap", (a.name, b)), Kink("gap", (a.name, c)), Kink("gap", (b, c))]
        y = self.fresh("v")
        return self.emit(
            f"{y} = {op} ({a.name}, {b}, {c})",
            [a.name, b, c],
            [Val(y, out)],
            kinks if op == "Max" else [],
        )

    def _gather_elements(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1 and all(d != BATCH for d in v.shape))
        if x is None:
            return None
        axis = int(self.rng.integers(0, len(x.shape)))
        d = int(x.shape[axis])
        shape = [int(s) for s in x.shape]
        shape[axis] = int(self.rng.integers(1, d + 2))
        ind = self.const(self.rng.integers(-d, d, shape).astype(np.int64), "int64")
        y = self.fresh("v")
        return self.emit(
            f"{y} = GatherElements <axis = {axis}> ({x.name}, {ind})",
            [x.name, ind],
            [Val(y, tuple(shape), x.positive)],
        )

    def _activation(self) -> Val | None:
        x = self.pick()
        if x is None:
            return None
        ops = ["HardSigmoid", "PRelu"]
        ops += ["Mish"] * (self.opset >= 18) + ["Gelu"] * (self.opset >= 20)
        op = str(self.rng.choice(ops))
        y = self.fresh("v")
        if op == "HardSigmoid":  # alpha 0.2, beta 0.5: kinks at x = -2.5 and 2.5
            return self.emit(
                f"{y} = HardSigmoid ({x.name})",
                [x.name],
                [Val(y, x.shape)],
                [Kink("abs", (x.name,), (-2.5, 2.5))],
            )
        if op == "PRelu":
            k = int(x.shape[-1]) if x.shape and x.shape[-1] != BATCH else 1
            slope = self.weight([k])
            return self.emit(
                f"{y} = PRelu ({x.name}, {slope})",
                [x.name, slope],
                [Val(y, x.shape)],
                [Kink("abs", (x.name,), (0.0,))],
            )
        return self.emit(f"{y} = {op} ({x.name})", [x.name], [Val(y, x.shape)])

    def _instance_norm(self) -> Val | None:
        x = self.pick(
            lambda v: (
                len(v.shape) >= 3
                and v.shape[1] != BATCH
                and int(np.prod([int(d) for d in v.shape[2:] if d != BATCH])) >= 2
                and BATCH not in v.shape[2:]
            )
        )
        if x is None:
            return None
        c = int(x.shape[1])
        sc, b = self.weight([c]), self.weight([c])
        y = self.fresh("v")
        return self.emit(
            f"{y} = InstanceNormalization <epsilon = 0.01> ({x.name}, {sc}, {b})",
            [x.name, sc, b],
            [Val(y, x.shape)],
        )

    def _conv_transpose(self) -> Val | None:
        if self.dtype != "float":
            return None  # onnxruntime has a float kernel only
        x = self.pick(lambda v: len(v.shape) in (3, 4) and all(d != BATCH for d in v.shape[1:]))
        if x is None:
            return None
        c, nd = int(x.shape[1]), len(x.shape) - 2
        m, k, stride = int(self.rng.integers(1, 3)), 2, int(self.rng.integers(1, 3))
        w = self.weight([c, m, *[k] * nd])
        y = self.fresh("v")
        out = tuple((int(s) - 1) * stride + k for s in x.shape[2:])
        return self.emit(
            f"{y} = ConvTranspose <kernel_shape = {_ints([k] * nd)}, strides = "
            f"{_ints([stride] * nd)}> ({x.name}, {w})",
            [x.name, w],
            [Val(y, (x.shape[0], m, *out))],
        )
