"""Random valid float graphs for the fuzzer (:mod:`fuzzing` checks and shrinks them).

The generator keeps values inside the operators' domains (``positive`` values for Log, Sqrt,
Div's denominator, Pow's base) and records every kink it crosses (:class:`Kink`: Relu at 0, Max
of two values, the top of a ReduceMax...) so that :func:`fuzzing.validate` can reject sample
points where finite differences would straddle one. Shapes are static except the symbolic
leading dimension ``N`` (a dynamic batch); element types are float32 or float64 and opsets
11 to 24, drawn from the seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from fuzz_families import MoreFamilies
from fuzz_graphs import BATCH, Const, Dim, Kink, Op, Shape, Spec, Val, broadcast, typed
from fuzz_graphs import ints_text as _ints

UNARY = ["Tanh", "Sigmoid", "Sin", "Cos", "Neg", "Identity", "Exp"]
# onnxruntime has float kernels only for these (and for Conv and the average pools).
UNARY_FLOAT_ONLY = ["Softplus", "Erf", "Atan", "Asinh", "Softsign", "Selu", "Elu", "Cosh", "Sinh"]
POSITIVE_OUT = {"Sigmoid", "Softplus", "Exp", "Cosh"}
DOMAIN_UNARY = ["Log", "Sqrt", "Reciprocal"]
KINKED_UNARY = {"Relu": (0.0,), "Abs": (0.0,), "LeakyRelu": (0.0,)}
KINKED_AT_ZERO = {"Selu", "Elu", "Softsign"}
REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSumExp",
]


class Generator(MoreFamilies):
    """Builds one random :class:`Spec` from a seed."""

    def __init__(self, seed: int, opset: int | None = None, dtype: str | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.opset = opset if opset is not None else int(self.rng.integers(11, 25))
        self.dtype = dtype or str(self.rng.choice(["float", "double"]))
        self.pool: list[Val] = []
        self.consumed: set[str] = set()
        self.inputs: list[Val] = []
        self.flags: list[str] = []
        self.consts: list[Const] = []
        self.ops: list[Op] = []
        self.count = 0

    # --- names, inputs, constants -------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def new_input(self, shape: Shape, positive: bool = False) -> Val:
        v = Val(self.fresh("x"), tuple(shape), positive)
        self.inputs.append(v)
        self.pool.append(v)
        return v

    def const(self, data: np.ndarray, dtype: str) -> str:
        name = self.fresh("c")
        self.consts.append(Const(name, dtype, np.asarray(data)))
        return name

    def weight(self, shape: Sequence[int], positive: bool = False) -> str:
        data = self.rng.uniform(0.5, 1.5, shape) if positive else self.rng.standard_normal(shape)
        return self.const(np.asarray(data * (1.0 if positive else 0.7)), "T")

    def random_shape(self) -> Shape:
        rank = int(self.rng.integers(1, 4))
        dims: list[Dim] = [int(self.rng.integers(1, 5)) for _ in range(rank)]
        if self.rng.random() < 0.5:
            dims[0] = BATCH
        return tuple(dims)

    def pick(self, ok: object = None) -> Val | None:
        cands = [v for v in self.pool if ok is None or ok(v)]  # type: ignore[operator]
        if not cands:
            return None
        # Prefer recent values so the graph is deep rather than a fan of one-node paths.
        w = np.arange(1, len(cands) + 1, dtype=float) ** 2
        return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]

    def emit(self, text: str, reads: Sequence[str], outs: Sequence[Val], kinks=()) -> Val:
        self.ops.append(Op(text, tuple(reads), tuple(outs), tuple(kinks)))
        self.consumed.update(reads)
        self.pool.extend(outs)
        return outs[0]

    def positive_of(self, x: Val) -> Val:
        """``x`` if positive, else a positive function of it (one more node)."""
        if x.positive:
            return x
        op = str(self.rng.choice(["Sigmoid", "Exp"] + ["Softplus"] * (self.dtype == "float")))
        y = Val(self.fresh("v"), x.shape, True)
        return self.emit(f"{y.name} = {op} ({x.name})", [x.name], [y])

    def partner(self, shape: Shape, positive: bool = False) -> tuple[str, Shape, bool]:
        """A second operand broadcasting against ``shape``: a pool value, initializer or input."""
        r = self.rng.random()
        if r < 0.4:
            cand = self.pick(
                lambda v: broadcast(shape, v.shape) == shape and (v.positive or not positive)
            )
            if cand is not None:
                return cand.name, cand.shape, cand.positive
        k = int(self.rng.integers(0, len(shape) + 1))
        sub = [d if self.rng.random() < 0.7 else 1 for d in shape[len(shape) - k :]]
        if r < 0.75:
            sub = [1 if d == BATCH else d for d in sub]
            return self.weight([int(d) for d in sub], positive), tuple(sub), positive
        v = self.new_input(tuple(sub), positive)
        return v.name, v.shape, positive

    # --- families ------------------------------------------------------------------------
    def unary(self) -> Val | None:
        x = self.pick()
        if x is None:
            return None
        ops = UNARY + (UNARY_FLOAT_ONLY if self.dtype == "float" else [])
        kinds = ["smooth"] * 6 + ["domain"] * 2 + ["kinked"]
        kind = str(self.rng.choice(kinds))
        y = self.fresh("v")
        if kind == "domain":
            p = self.positive_of(x)
            op = str(self.rng.choice(DOMAIN_UNARY))
            return self.emit(f"{y} = {op} ({p.name})", [p.name], [Val(y, x.shape, op != "Log")])
        if kind == "kinked":
            op = str(self.rng.choice(list(KINKED_UNARY)[: 3 if self.dtype == "float" else 2]))
            attr = " <alpha = 0.1>" if op == "LeakyRelu" else ""
            kink = Kink("abs", (x.name,), KINKED_UNARY[op])
            return self.emit(
                f"{y} = {op}{attr} ({x.name})", [x.name], [Val(y, x.shape, op == "Abs")], [kink]
            )
        op = str(self.rng.choice(ops))
        pos = op in POSITIVE_OUT or (x.positive and op == "Identity")
        # Selu's slope jumps at 0 (gamma against gamma * alpha), and Elu's and Softsign's
        # second derivatives do (the Hessian-vector products of jvp(grad)): differences across
        # 0 are not derivatives (found by the sweep: "wrong" results that were steps over it).
        kinks = [Kink("abs", (x.name,), (0.0,))] if op in KINKED_AT_ZERO else []
        return self.emit(f"{y} = {op} ({x.name})", [x.name], [Val(y, x.shape, pos)], kinks)

    def binary(self) -> Val | None:
        a = self.pick()
        if a is None:
            return None
        op = str(self.rng.choice(["Add", "Sub", "Mul", "Mul", "Div", "Pow", "Max", "Min"]))
        if op == "Pow":
            a = self.positive_of(a)
        b, bshape, bpos = self.partner(a.shape, positive=op == "Div")
        out = broadcast(a.shape, bshape)
        if out is None:
            return None
        if op == "Pow":
            # A bounded exponent keeps Pow well conditioned; the base is positive.
            t = self.fresh("v")
            self.emit(f"{t} = Tanh ({b})", [b], [Val(t, bshape)])
            b = t
        y = self.fresh("v")
        kinks = [Kink("gap", (a.name, b))] if op in ("Max", "Min") else []
        pos = {
            "Add": a.positive and bpos,
            "Mul": a.positive and bpos,
            "Div": a.positive,
            "Pow": True,
            "Max": a.positive or bpos,
            "Min": a.positive and bpos,
        }.get(op, False)
        return self.emit(f"{y} = {op} ({a.name}, {b})", [a.name, b], [Val(y, out, pos)], kinks)

    def matmul(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1 and v.shape[-1] != BATCH)
        if x is None:
            return None
        k = int(x.shape[-1])
        c = int(self.rng.integers(1, 5))
        y = self.fresh("v")
        if len(x.shape) == 2 and self.rng.random() < 0.4:
            trans = int(self.rng.integers(0, 2))
            w = self.weight([c, k] if trans else [k, c])
            bias = self.weight([c])
            return self.emit(
                f"{y} = Gemm <alpha = 0.5, beta = 1.5, transB = {trans}> ({x.name}, {w}, {bias})",
                [x.name, w, bias],
                [Val(y, (x.shape[0], c))],
            )
        other = self.pick(lambda v: v.shape == (k, c)) if self.rng.random() < 0.3 else None
        w = other.name if other is not None else self.weight([k, c])
        shape = (*x.shape[:-1], c)
        return self.emit(f"{y} = MatMul ({x.name}, {w})", [x.name, w], [Val(y, shape)])

    def reduce(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return None
        op = str(self.rng.choice(REDUCE))
        if op in ("ReduceL2", "ReduceProd"):
            # Keep away from the kink of the norm at 0 and the cancellations of a product.
            x = self.positive_of(x)
        rank = len(x.shape)
        n = int(self.rng.integers(1, rank + 1))
        axes = sorted(int(a) for a in self.rng.choice(rank, n, replace=False))
        keep = int(self.rng.integers(0, 2))
        shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(x.shape))
        shape = tuple(d for d in shape if d is not None)
        neg = [a - rank if self.rng.random() < 0.3 else a for a in axes]
        y = self.fresh("v")
        reads = [x.name]
        if self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13):
            ax = self.const(np.array(neg, np.int64), "int64")
            text = f"{y} = {op} <keepdims = {keep}> ({x.name}, {ax})"
            reads.append(ax)
        else:
            text = f"{y} = {op} <keepdims = {keep}, axes = {_ints(neg)}> ({x.name})"
        kinks = [Kink("top", (x.name,), tuple(axes))] if op in ("ReduceMax", "ReduceMin") else []
        pos = x.positive and op not in ("ReduceLogSumExp",)
        return self.emit(text, reads, [Val(y, shape, pos)], kinks)

    def shape_op(self) -> Val | None:
        kind = str(
            self.rng.choice(
                [
                    "Reshape",
                    "Transpose",
                    "Concat",
                    "Slice",
                    "Squeeze",
                    "Unsqueeze",
                    "Expand",
                    "Gather",
                ]
            )
        )
        return getattr(self, "_" + kind.lower())()

    def _reshape(self) -> Val | None:
        x = self.pick(lambda v: all(d != BATCH for d in v.shape[1:]) and len(v.shape) >= 1)
        if x is None:
            return None
        lead = x.shape[:1] if x.shape[0] == BATCH else ()
        rest = [int(d) for d in x.shape[len(lead) :]]
        total = int(np.prod(rest)) if rest else 1
        dims: list[int] = []
        left = total
        for _ in range(int(self.rng.integers(0, 3))):
            divs = [d for d in range(1, left + 1) if left % d == 0]
            d = int(self.rng.choice(divs))
            dims.append(d)
            left //= d
        dims.append(left)
        target = [0] * len(lead) + list(dims)
        if self.rng.random() < 0.4:
            target[int(self.rng.integers(len(lead), len(target)))] = -1
        s = self.const(np.array(target, np.int64), "int64")
        y = self.fresh("v")
        return self.emit(
            f"{y} = Reshape ({x.name}, {s})",
            [x.name, s],
            [Val(y, (*lead, *dims), x.positive)],
        )

    def _transpose(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 2)
        if x is None:
            return None
        perm = [int(p) for p in self.rng.permutation(len(x.shape))]
        y = self.fresh("v")
        shape = tuple(x.shape[p] for p in perm)
        return self.emit(
            f"{y} = Transpose <perm = {_ints(perm)}> ({x.name})",
            [x.name],
            [Val(y, shape, x.positive)],
        )

    def _concat(self) -> Val | None:
        x = self.pick(lambda v: any(d != BATCH for d in v.shape))
        if x is None:
            return None
        axes = [i for i, d in enumerate(x.shape) if d != BATCH]
        axis = int(self.rng.choice(axes))
        other = self.pick(
            lambda v: (
                len(v.shape) == len(x.shape)
                and v.name != x.name
                and all(
                    a == b
                    for i, (a, b) in enumerate(zip(v.shape, x.shape, strict=True))
                    if i != axis
                )
                and v.shape[axis] != BATCH
            )
        )
        if other is None:
            shape = list(x.shape)
            shape[axis] = int(self.rng.integers(1, 4))
            other = self.new_input(tuple(shape), x.positive)
        y = self.fresh("v")
        shape = list(x.shape)
        shape[axis] = int(x.shape[axis]) + int(other.shape[axis])
        ax = axis - len(shape) if self.rng.random() < 0.3 else axis
        return self.emit(
            f"{y} = Concat <axis = {ax}> ({x.name}, {other.name})",
            [x.name, other.name],
            [Val(y, tuple(shape), x.positive and other.positive)],
        )

    def _slice(self) -> Val | None:
        x = self.pick(lambda v: any(d != BATCH and int(d) >= 2 for d in v.shape))
        if x is None:
            return None
        axes = [i for i, d in enumerate(x.shape) if d != BATCH and int(d) >= 2]
        axis = int(self.rng.choice(axes))
        d = int(x.shape[axis])
        if self.rng.random() < 0.25:
            start, end, step = d - 1, -d - 1, -1
            n = d
        else:
            start = int(self.rng.integers(0, d - 1))
            end = int(self.rng.integers(start + 1, d + 1))
            step = int(self.rng.integers(1, 3))
            n = len(range(start, end, step))
            start = start - d if self.rng.random() < 0.3 else start
        names = [self.const(np.array([v], np.int64), "int64") for v in (start, end, axis, step)]
        y = self.fresh("v")
        shape = list(x.shape)
        shape[axis] = n
        return self.emit(
            f"{y} = Slice ({x.name}, {', '.join(names)})",
            [x.name, *names],
            [Val(y, tuple(shape), x.positive)],
        )

    def _squeeze(self) -> Val | None:
        x = self.pick(lambda v: 1 in v.shape)
        if x is None:
            return None
        axes = [i for i, d in enumerate(x.shape) if d == 1]
        y = self.fresh("v")
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return self._with_axes("Squeeze", x, axes, y, shape)

    def _unsqueeze(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) <= 3)
        if x is None:
            return None
        axis = int(self.rng.integers(0 if x.shape[:1] != (BATCH,) else 1, len(x.shape) + 1))
        shape = (*x.shape[:axis], 1, *x.shape[axis:])
        return self._with_axes("Unsqueeze", x, [axis], self.fresh("v"), shape)

    def _with_axes(self, op: str, x: Val, axes: list[int], y: str, shape: Shape) -> Val:
        if self.opset >= 13:
            ax = self.const(np.array(axes, np.int64), "int64")
            return self.emit(
                f"{y} = {op} ({x.name}, {ax})", [x.name, ax], [Val(y, shape, x.positive)]
            )
        return self.emit(
            f"{y} = {op} <axes = {_ints(axes)}> ({x.name})", [x.name], [Val(y, shape, x.positive)]
        )

    def _expand(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) <= 3)
        if x is None:
            return None
        target = [
            int(self.rng.integers(2, 4)) if d == 1 else (1 if d == BATCH else d) for d in x.shape
        ]
        lead = [int(self.rng.integers(1, 3))] if self.rng.random() < 0.4 else []
        s = self.const(np.array(lead + target, np.int64), "int64")
        shape = tuple(lead) + tuple(
            BATCH if d == BATCH else t for d, t in zip(x.shape, target, strict=True)
        )
        y = self.fresh("v")
        return self.emit(f"{y} = Expand ({x.name}, {s})", [x.name, s], [Val(y, shape, x.positive)])

    def _gather(self) -> Val | None:
        x = self.pick(lambda v: any(d != BATCH for d in v.shape))
        if x is None:
            return None
        axis = int(self.rng.choice([i for i, d in enumerate(x.shape) if d != BATCH]))
        d = int(x.shape[axis])
        ishape = [(), (2,), (3,), (2, 2)][int(self.rng.integers(0, 4))]
        idx = self.rng.integers(-d, d, ishape)
        ind = self.const(np.asarray(idx, np.int64), "int64")
        y = self.fresh("v")
        shape = (*x.shape[:axis], *ishape, *x.shape[axis + 1 :])
        return self.emit(
            f"{y} = Gather <axis = {axis}> ({x.name}, {ind})",
            [x.name, ind],
            [Val(y, shape, x.positive)],
        )

    def norm(self) -> Val | None:
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return None
        rank = len(x.shape)
        kind = str(
            self.rng.choice(
                [
                    "Softmax",
                    "LogSoftmax",
                    "LayerNormalization",
                    "BatchNormalization",
                    "LpNormalization",
                ]
            )
        )
        y = self.fresh("v")
        axis = int(self.rng.integers(-rank, rank))
        if kind in ("Softmax", "LogSoftmax"):
            if self.opset < 13:
                axis = -1  # the old flattening semantics: keep it to the last axis
            return self.emit(
                f"{y} = {kind} <axis = {axis}> ({x.name})",
                [x.name],
                [Val(y, x.shape, kind == "Softmax")],
            )
        if kind == "LayerNormalization" and self.opset >= 17:
            norm_shape = x.shape[axis:]
            if BATCH in norm_shape or int(np.prod([int(d) for d in norm_shape])) < 2:
                return None
            sc = self.weight([int(d) for d in norm_shape])
            b = self.weight([int(d) for d in norm_shape])
            return self.emit(
                f"{y} = LayerNormalization <axis = {axis}> ({x.name}, {sc}, {b})",
                [x.name, sc, b],
                [Val(y, x.shape)],
            )
        if kind == "BatchNormalization" and rank >= 2 and x.shape[1] != BATCH:
            c = int(x.shape[1])
            ps = [self.weight([c]), self.weight([c]), self.weight([c]), self.weight([c], True)]
            return self.emit(
                f"{y} = BatchNormalization <epsilon = 0.01> ({x.name}, {', '.join(ps)})",
                [x.name, *ps],
                [Val(y, x.shape)],
            )
        if kind == "LpNormalization":
            p = self.positive_of(x)  # away from the kink of the norm at 0
            return self.emit(
                f"{y} = LpNormalization <axis = {axis}, p = 2> ({p.name})",
                [p.name],
                [Val(y, x.shape, True)],
            )
        return None

    def conv(self) -> Val | None:
        x = self.pick(
            lambda v: (
                len(v.shape) in (3, 4) and all(d != BATCH and int(d) >= 2 for d in v.shape[1:])
            )
        )
        if x is None:
            if self.rng.random() < 0.5:
                return None
            lead: Dim = BATCH if self.rng.random() < 0.5 else int(self.rng.integers(1, 3))
            x = self.new_input(
                (lead, *[int(self.rng.integers(2, 4))] + [int(self.rng.integers(3, 6))] * 2)
            )
        spatial = [int(d) for d in x.shape[2:]]
        c = int(x.shape[1])
        kinds = ["Conv", "Conv", "AveragePool", "MaxPool", "GlobalAveragePool"]
        kind = str(self.rng.choice(kinds if self.dtype == "float" else ["MaxPool"]))
        y = self.fresh("v")
        nd = len(spatial)
        if kind == "GlobalAveragePool":
            return self.emit(
                f"{y} = GlobalAveragePool ({x.name})",
                [x.name],
                [Val(y, (*x.shape[:2], *[1] * nd), x.positive)],
            )
        k = 2
        if kind == "MaxPool":
            # Non-overlapping windows: the validation checks each has a unique maximum.
            out = tuple(s // k for s in spatial)
            return self.emit(
                f"{y} = MaxPool <kernel_shape = {_ints([k] * nd)}, strides = {_ints([k] * nd)}> ({x.name})",
                [x.name],
                [Val(y, (*x.shape[:2], *out), x.positive)],
                [Kink("pool", (x.name,), (k,))],
            )
        pad = int(self.rng.integers(0, 2))
        stride = int(self.rng.integers(1, 3))
        out = tuple((s + 2 * pad - k) // stride + 1 for s in spatial)
        attrs = f"kernel_shape = {_ints([k] * nd)}, pads = {_ints([pad] * 2 * nd)}, strides = {_ints([stride] * nd)}"
        if kind == "AveragePool":
            inc = int(self.rng.integers(0, 2))
            return self.emit(
                f"{y} = AveragePool <{attrs}, count_include_pad = {inc}> ({x.name})",
                [x.name],
                [Val(y, (*x.shape[:2], *out), x.positive)],
            )
        group = c if c > 1 and self.rng.random() < 0.3 else 1
        m = group * int(self.rng.integers(1, 3))
        w = self.weight([m, c // group, *[k] * nd])
        b = self.weight([m])
        return self.emit(
            f"{y} = Conv <{attrs}, group = {group}> ({x.name}, {w}, {b})",
            [x.name, w, b],
            [Val(y, (x.shape[0], m, *out))],
        )

    def where(self) -> Val | None:
        a = self.pick()
        if a is None:
            return None
        b, bshape, bpos = self.partner(a.shape)
        out = broadcast(a.shape, bshape)
        if out is None:
            return None
        cshape = [1 if d == BATCH else int(d) for d in out]
        cond = self.const(self.rng.integers(0, 2, cshape).astype(bool), "bool")
        y = self.fresh("v")
        return self.emit(
            f"{y} = Where ({cond}, {a.name}, {b})",
            [cond, a.name, b],
            [Val(y, out, a.positive and bpos)],
        )

    def control(self) -> Val | None:
        kind = str(self.rng.choice(["If", "Scan", "Loop"]))
        return getattr(self, "_" + kind.lower())()

    def _branch(self, x: Val, cap: str | None, out: str) -> str:
        op = str(self.rng.choice(["Tanh", "Sin", "Sigmoid", "Neg"]))
        if cap is None:
            return f"{out} = {op} ({x.name})"
        t = self.fresh("b")
        return f"{t} = Mul ({x.name}, {cap})\n      {out} = {op} ({t})"

    def _if(self) -> Val | None:
        x = self.pick()
        if x is None:
            return None
        c = self.fresh("flag")
        self.flags.append(c)
        other, oshape, _ = self.partner(x.shape)
        if broadcast(x.shape, oshape) != x.shape:
            other = None  # type: ignore[assignment]
        y = self.fresh("v")
        ta, ea = self.fresh("t"), self.fresh("e")
        outs = typed("{T}", Val(ta, x.shape)), typed("{T}", Val(ea, x.shape))
        text = (
            f"{y} = If ({c}) <then_branch = {self.fresh('g')} () => ({outs[0]}) {{\n      "
            f"{self._branch(x, other, ta)}\n    }}, else_branch = {self.fresh('g')} () => ({outs[1]}) {{\n      "
            f"{self._branch(x, None, ea)}\n    }}>"
        )
        reads = [c, x.name] + ([other] if other else [])
        return self.emit(text, reads, [Val(y, x.shape)])

    def _scan(self) -> Val | None:
        xs = self.pick(lambda v: len(v.shape) >= 1 and v.shape[0] != BATCH and int(v.shape[0]) >= 2)
        if xs is None:
            return None
        rest = xs.shape[1:]
        init = self.pick(lambda v: v.shape == rest and v.name != xs.name) or self.new_input(rest)
        cap, cshape, _ = self.partner(rest)
        if broadcast(rest, cshape) != rest:
            return None
        s, xt, t, u, s2, yt = (self.fresh(p) for p in ("s", "xt", "t", "u", "s", "yt"))
        fin, ys = self.fresh("v"), self.fresh("v")
        body = (
            f"{self.fresh('g')} ({typed('{T}', Val(s, rest))}, {typed('{T}', Val(xt, rest))}) => "
            f"({typed('{T}', Val(s2, rest))}, {typed('{T}', Val(yt, rest))}) {{\n      "
            f"{t} = Mul ({s}, {cap})\n      {u} = Add ({t}, {xt})\n      {s2} = Tanh ({u})\n      "
            f"{yt} = Sin ({s2})\n    }}"
        )
        text = f"{fin}, {ys} = Scan <num_scan_inputs = 1, body = {body}> ({init.name}, {xs.name})"
        return self.emit(text, [init.name, xs.name, cap], [Val(fin, rest), Val(ys, xs.shape)])

    def _loop(self) -> Val | None:
        x = self.pick()
        if x is None:
            return None
        trips = int(self.rng.integers(1, 4))
        m = self.const(np.array(trips, np.int64), "int64")
        cap, cshape, _ = self.partner(x.shape)
        if broadcast(x.shape, cshape) != x.shape:
            return None
        i, c, st, t, st2, c2, sc = (
            self.fresh(p) for p in ("i", "cond", "st", "t", "st", "cond", "sc")
        )
        fin, scan = self.fresh("v"), self.fresh("v")
        body = (
            f"{self.fresh('g')} (int64 {i}, bool {c}, {typed('{T}', Val(st, x.shape))}) => "
            f"(bool {c2}, {typed('{T}', Val(st2, x.shape))}, {typed('{T}', Val(sc, x.shape))}) {{\n      "
            f"{t} = Add ({st}, {cap})\n      {st2} = Tanh ({t})\n      {sc} = Sin ({st})\n      "
            f"{c2} = Identity ({c})\n    }}"
        )
        text = f'{fin}, {scan} = Loop ({m}, "", {x.name}) <body = {body}>'
        return self.emit(text, [m, x.name, cap], [Val(fin, x.shape), Val(scan, (trips, *x.shape))])

    # --- the whole graph ------------------------------------------------------------------
    FAMILIES: ClassVar[dict[str, float]] = {
        "unary": 5,
        "binary": 5,
        "matmul": 2,
        "reduce": 2,
        "shape_op": 5,
        "norm": 1.5,
        "conv": 1,
        "where": 1,
        "control": 1,
        "more": 3,
    }

    def build(self, nodes: int | None = None) -> Spec:
        # A family adds up to three nodes (a helper making a value positive, Pow's bounded
        # exponent), so a target of at most 23 keeps the graph within 25 nodes, the loss included.
        target = nodes if nodes is not None else int(self.rng.integers(2, 24))
        for _ in range(int(self.rng.integers(1, 3))):
            self.new_input(self.random_shape(), positive=self.rng.random() < 0.3)
        names = list(self.FAMILIES)
        w = np.array([self.FAMILIES[n] for n in names])
        tries = 0
        while len(self.ops) < target - 1 and tries < 200:
            tries += 1
            getattr(self, str(self.rng.choice(names, p=w / w.sum())))()
        last = self.pool[-1]
        sinks = [v.name for v in self.pool if v.name not in self.consumed and v != last]
        outputs = [last.name] + [
            s for s in sinks if s not in {i.name for i in self.inputs} and self.rng.random() < 0.3
        ]
        if self.rng.random() < 0.8 or len(self.ops) < 2:
            loss = Val("loss", ())
            self.emit(f"loss = ReduceSum <keepdims = 0> ({last.name})", [last.name], [loss])
            outputs.insert(0, "loss")
        batch = int(self.rng.choice([1, 2, 3]))
        return Spec(
            self.seed,
            self.opset,
            self.dtype,
            batch,
            self.inputs,
            self.flags,
            self.consts,
            self.ops,
            outputs,
            constant_nodes=bool(self.rng.random() < 0.3),
        )
