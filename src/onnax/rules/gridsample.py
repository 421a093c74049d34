"""GridSample and AffineGrid: jvp, transpose and batch rules.

GridSample is linear in X for a fixed grid: the tangent in X is GridSample of the tangent (the
runtime's own kernel). Its transpose and the derivative with respect to the grid need the
sampling taps, which are built in the graph following onnxruntime's CPU kernel (grid_sample.cc):
the grid is denormalised per axis (``((g + 1) / 2) (L - 1)`` with align_corners, else
``((g + 1) L - 1) / 2``); 'nearest' rounds half to even, 'linear' interpolates between
``floor(c)`` and ``floor(c) + 1``, 'cubic' uses Keys' coefficients (a = -0.75) at
``floor(c) - 1 .. floor(c) + 2``; padding acts on the integer tap indices (zeros: the tap
contributes nothing outside, border: the index is clamped, reflection: the index is reflected
about the borders). The taps of all spatial axes combine into ``T`` (flat index, weight) pairs
per output position, so that

* the transpose in X is one ScatterElements (reduction 'add') of the weighted cotangent;
* the derivative in the grid is ``dY = sum_d G_d dc_d/dg_d dg_d``, where ``G_d`` gathers X at
  the taps with the weights differentiated along axis ``d`` (zero for 'nearest', whose output is
  piecewise constant in the grid).

AffineGrid is linear in theta: the tangent is AffineGrid of the tangent, and the transpose
contracts the cotangent with the base grid, which AffineGrid itself generates from a basis of
thetas (so align_corners and the coordinate conventions are the runtime's own).

vmap folds the batch into N when both inputs are batched, into C when only X is (GridSample acts
per channel), and into the first output axis when only the grid is.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import TypedOps, attributes_of

__all__: list[str] = []

Tap = tuple[ir.Value, ir.Value, ir.Value]  # (index as float, weight, dweight/dcoordinate)

_BIG = 2**62
_CUBIC_A = -0.75


def _mode(node: ir.Node) -> str:
    """The interpolation mode in the opset-20 spelling (linear, nearest, cubic)."""
    mode = node.attributes.get_string("mode", "bilinear")
    return {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)


def _rank(node: ir.Node) -> int:
    x = node.inputs[0]
    if x is None or x.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the rank of X is unknown. Remedy: give the "
            "model's inputs static ranks."
        )
    return x.shape.rank()


def _cubic_coefficients(f: TypedOps, t: ir.Value) -> tuple[list[ir.Value], list[ir.Value]]:
    """Keys' four coefficients of ``t`` in [0, 1) and their derivatives in ``t``."""
    a = _CUBIC_A

    def p(u: ir.Value) -> ir.Value:  # ((a u - 5a) u + 8a) u - 4a
        inner = f("Sub", f("Mul", f.c(a), u), f.c(5 * a))
        return f("Sub", f("Mul", f("Add", f("Mul", inner, u), f.c(8 * a)), u), f.c(4 * a))

    def dp(u: ir.Value) -> ir.Value:
        return f("Add", f("Mul", f("Sub", f("Mul", f.c(3 * a), u), f.c(10 * a)), u), f.c(8 * a))

    def q(u: ir.Value) -> ir.Value:  # ((a + 2) u - (a + 3)) u^2 + 1
        inner = f("Sub", f("Mul", f.c(a + 2), u), f.c(a + 3))
        return f("Add", f("Mul", f("Mul", inner, u), u), f.c(1.0))

    def dq(u: ir.Value) -> ir.Value:
        return f("Mul", f("Sub", f("Mul", f.c(3 * (a + 2)), u), f.c(2 * (a + 3))), u)

    one, two = f.c(1.0), f.c(2.0)
    tp1, om, tm = f("Add", t, one), f("Sub", one, t), f("Sub", two, t)
    return [p(tp1), q(t), q(om), p(tm)], [dp(tp1), dq(t), f("Neg", dq(om)), f("Neg", dp(tm))]


def _reflect(f: TypedOps, i: ir.Value, low: ir.Value, high: ir.Value) -> ir.Value:
    """The GsReflect of onnxruntime applied to the integer index ``i``, truncated to an integer."""
    span = f("Sub", high, low)
    below, above = f("Less", i, low), f("Greater", i, high)
    dx = f("Where", below, f("Sub", low, i), f("Sub", i, high))
    n = f("Floor", f("Div", dx, span))
    r = f("Sub", dx, f("Mul", n, span))
    even = f("Equal", f.em.op("Mod", [n, f.c(2.0)], {"fmod": 1}), f.c(0.0))
    from_below = f("Where", even, f("Add", low, r), f("Sub", high, r))
    from_above = f("Where", even, f("Sub", high, r), f("Add", low, r))
    v = f("Where", below, from_below, f("Where", above, from_above, i))
    return f("Where", f("Less", v, f.c(0.0)), f("Ceil", v), f("Floor", v))


def _axis_taps(
    f: TypedOps, c: ir.Value, length: ir.Value, mode: str, padding: str, align: bool
) -> list[Tap]:
    """The taps along one axis for pixel coordinates ``c``, padding applied to their indices."""
    if mode == "nearest":
        raw = [(f("Round", c), f("Add", f("Mul", c, f.c(0.0)), f.c(1.0)), f("Mul", c, f.c(0.0)))]
    elif mode == "linear":
        x1 = f("Floor", c)
        x2 = f("Add", x1, f.c(1.0))
        ones = f("Add", f("Mul", c, f.c(0.0)), f.c(1.0))
        raw = [(x1, f("Sub", x2, c), f("Neg", ones)), (x2, f("Sub", c, x1), ones)]
    else:
        x0 = f("Sub", f("Floor", c), f.c(1.0))
        t = f("Sub", f("Sub", c, x0), f.c(1.0))
        coeffs, slopes = _cubic_coefficients(f, t)
        raw = [(f("Add", x0, f.c(float(j))), coeffs[j], slopes[j]) for j in range(4)]
    last = f("Sub", length, f.c(1.0))
    taps: list[Tap] = []
    for i, w, dw in raw:
        if padding == "zeros":
            inside = f.mask(f("And", f("Not", f("Less", i, f.c(0.0))), f("Less", i, length)))
            w, dw = f("Mul", w, inside), f("Mul", dw, inside)
            i = f("Max", f("Min", i, last), f.c(0.0))
        elif padding == "border":
            i = f("Max", f("Min", i, last), f.c(0.0))
        else:
            low, high = (f.c(0.0), last) if align else (f.c(-0.5), f("Sub", length, f.c(0.5)))
            i = _reflect(f, i, low, high)
        taps.append((i, w, dw))
    return taps


class _Sampling:
    """The combined taps of a GridSample node: flat indices, weights and their slopes.

    Attributes:
        index: ``[N, C, T*P]`` int64 flat spatial indices into X viewed as ``[N, C, S]``.
        weights: ``[N, T*P]`` weights.
        slopes: Per grid component d, ``[N, T*P]`` derivatives of the weights in the grid.
        taps: T, the taps per output position.
    """

    def __init__(self, em: Emitter, node: ir.Node, x: ir.Value, grid: ir.Value) -> None:
        rank = _rank(node)
        dims = rank - 2
        dtype = grid.dtype
        if dtype is None:
            raise InternalRuleError(f"{op_label(node)}: grid has no dtype")
        f = TypedOps(em, dtype)
        self.em = em
        self.dims = dims
        mode = _mode(node)
        padding = node.attributes.get_string("padding_mode", "zeros")
        align = bool(node.attributes.get_int("align_corners", 0))
        self.shape_x = em.shape(x)
        self.lead = em.slice(self.shape_x, [0], [2], [0])  # [N, C]
        n = em.slice(self.shape_x, [0], [1], [0])
        flat_grid = em.op("Reshape", [grid, em.op("Concat", [n, em.ints([-1, dims])], {"axis": 0})])
        per_axis: list[list[Tap]] = []
        scales: list[ir.Value] = []
        strides: list[ir.Value] = []
        for d in range(dims):
            axis = 2 + dims - 1 - d  # grid component 0 is x, along the last axis
            length_int = em.slice(self.shape_x, [axis], [axis + 1], [0])
            length = em.op("Cast", [em.squeeze(length_int, [0])], {"to": dtype})
            g = em.op("Gather", [flat_grid, em.const(np.array(d, np.int64))], {"axis": 2})
            if align:
                c = f("Mul", f("Div", f("Add", g, f.c(1.0)), f.c(2.0)), f("Sub", length, f.c(1.0)))
                scales.append(f("Div", f("Sub", length, f.c(1.0)), f.c(2.0)))
            else:
                c = f("Div", f("Sub", f("Mul", f("Add", g, f.c(1.0)), length), f.c(1.0)), f.c(2.0))
                scales.append(f("Div", length, f.c(2.0)))
            per_axis.append(_axis_taps(f, c, length, mode, padding, align))
            later = em.slice(self.shape_x, [axis + 1], [_BIG], [0])
            strides.append(em.reduce("ReduceProd", later, None, keepdims=False))
        indices, weights = [], []
        slopes: list[list[ir.Value]] = [[] for _ in range(dims)]
        for combo in itertools.product(*per_axis):
            flat = None
            for d, (i, _, _) in enumerate(combo):
                term = em.op("Mul", [em.op("Cast", [i], {"to": ir.DataType.INT64}), strides[d]])
                flat = term if flat is None else em.op("Add", [flat, term])
            assert flat is not None
            indices.append(flat)
            weights.append(_product(em, [w for _, w, _ in combo]))
            for d in range(dims):
                factors = [dw if e == d else w for e, (_, w, dw) in enumerate(combo)]
                slopes[d].append(f("Mul", _product(em, factors), scales[d]))
        self.taps = len(indices)
        joined = em.op("Concat", indices, {"axis": 1}) if len(indices) > 1 else indices[0]
        count = em.slice(em.op("Shape", [joined]), [1], [2], [0])
        self.index = em.op(
            "Expand",
            [em.unsqueeze(joined, [1]), em.op("Concat", [self.lead, count], {"axis": 0})],
        )
        self.weights = _concat(em, weights)
        self.slopes = [_concat(em, s) for s in slopes]
        self.mode = mode

    def flat_shape(self, size: ir.Value) -> ir.Value:
        """``[N, C, size]``."""
        return self.em.op("Concat", [self.lead, size], {"axis": 0})


def _product(em: Emitter, factors: list[ir.Value]) -> ir.Value:
    out = factors[0]
    for v in factors[1:]:
        out = em.op("Mul", [out, v])
    return out


def _concat(em: Emitter, values: list[ir.Value]) -> ir.Value:
    return em.op("Concat", values, {"axis": 1}) if len(values) > 1 else values[0]


def _cast_like(em: Emitter, v: ir.Value, like: ir.Value) -> ir.Value:
    if like.dtype is None or v.dtype == like.dtype:
        return v
    return em.op("Cast", [v], {"to": like.dtype})


# ------------------------------------------------------------------------------ GridSample
# One set of rules for every version from 16: 20 added N-d grids and renamed the modes, which
# the rules read from the node.
grid_sample = OpRules("GridSample", since=16)


@grid_sample.jvp
def _grid_sample_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """GridSample of the tangent of X, plus the moves of the sampling points."""
    t_x, t_grid = tangents[0], tangents[1]
    x, grid, y = node.inputs[0], node.inputs[1], node.outputs[0]
    if x is None or grid is None:
        raise InternalRuleError(f"{op_label(node)} jvp: missing input")
    x_term = None
    if t_x is not None:
        x_term = em.op("GridSample", [t_x, grid], attributes_of(node))
    if t_grid is None or _mode(node) == "nearest":
        # Nearest sampling is piecewise constant in the grid.
        return [x_term]
    s = _Sampling(em, node, x, grid)
    flat_x = em.op("Reshape", [x, s.flat_shape(em.ints([-1]))])
    gathered = em.op("GatherElements", [flat_x, s.index], {"axis": 2})
    gathered = em.op("Reshape", [gathered, s.flat_shape(em.ints([s.taps, -1]))])  # [N, C, T, P]
    n = em.slice(s.shape_x, [0], [1], [0])
    n_p = em.op("Concat", [n, em.ints([-1])], {"axis": 0})
    n_1_t_p = em.op("Concat", [n, em.ints([1, s.taps, -1])], {"axis": 0})
    rank_grid = _rank(node)
    grid_terms: list[ir.Value | None] = []
    for d in range(s.dims):
        slope = em.op("Reshape", [_cast_like(em, s.slopes[d], x), n_1_t_p])
        coefficient = em.reduce_sum(em.op("Mul", [gathered, slope]), [2], keepdims=False)
        component = em.op(
            "Gather", [t_grid, em.const(np.array(d, np.int64))], {"axis": rank_grid - 1}
        )
        flat_t = em.unsqueeze(em.op("Reshape", [component, n_p]), [1])  # [N, 1, P]
        grid_terms.append(em.op("Mul", [coefficient, _cast_like(em, flat_t, x)]))
    total = em.add_all(grid_terms)
    assert total is not None
    return [em.add_all([x_term, em.op("Reshape", [total, em.shape(y)])])]


@grid_sample.transpose
def _grid_sample_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Scatter-add of the weighted cotangent into the taps (X linear, grid constant)."""
    ct, x, grid = cts[0], node.inputs[0], node.inputs[1]
    if ct is None or x is None or grid is None or x.dtype is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    s = _Sampling(em, node, x, grid)
    flat_ct = em.op("Reshape", [ct, s.flat_shape(em.ints([-1]))])  # [N, C, P]
    repeated = em.op("Concat", [flat_ct] * s.taps, {"axis": 2}) if s.taps > 1 else flat_ct
    updates = em.op("Mul", [repeated, em.unsqueeze(_cast_like(em, s.weights, x), [1])])
    size = em.reduce("ReduceProd", em.slice(s.shape_x, [2], [_BIG], [0]), None, keepdims=True)
    zeros = em.op("Expand", [em.scalar(0.0, x.dtype), s.flat_shape(size)])
    flat = em.op("ScatterElements", [zeros, s.index, updates], {"axis": 2, "reduction": "add"})
    return [em.op("Reshape", [flat, s.shape_x]), None]


@grid_sample.batch
def _grid_sample_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Folds the batch into N (both batched), C (X only) or the first output axis (grid only)."""
    x, grid = args[0], args[1]
    if x is None or grid is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    rank = _rank(node)
    attrs = attributes_of(node)
    if batched[0] and batched[1]:
        fold_x = bx.op("Reshape", [x, _merged(bx, x, node.inputs[0], 0)])
        fold_g = bx.op("Reshape", [grid, _merged(bx, grid, node.inputs[1], 0)])
        out = bx.op("GridSample", [fold_x, fold_g], attrs)
        return [_split_axis(bx, out, 0, rank)], [True]
    if batched[0]:
        # [B, N, C, ...] -> [N, B*C, ...]: every channel is sampled alike.
        moved = bx.move_axis(x, 0, 1, rank + 1)
        fold_x = bx.op("Reshape", [moved, _merged(bx, moved, None, 1)])
        out = bx.op("GridSample", [fold_x, grid], attrs)  # [N, B*C, ...]
        split = _split_axis(bx, out, 1, rank)  # [N, B, C, ...]
        return [bx.move_axis(split, 1, 0, rank + 1)], [True]
    # grid only: [B, N, H, ..., D] -> [N, B*H, ..., D]; the output's axis 2 is B*H.
    moved = bx.move_axis(grid, 0, 1, rank + 1)
    fold_g = bx.op("Reshape", [moved, _merged(bx, moved, None, 1)])
    out = bx.op("GridSample", [x, fold_g], attrs)  # [N, C, B*H, ...]
    split = _split_axis(bx, out, 2, rank)  # [N, C, B, H, ...]
    return [bx.move_axis(split, 2, 0, rank + 1)], [True]


def _merged(bx: Batcher, v: ir.Value, original: ir.Value | None, axis: int) -> ir.Value:
    """The shape of ``v`` with axes ``axis`` and ``axis + 1`` merged."""
    shape = bx.op("Shape", [v])
    head = bx.slice(shape, [0], [axis], [0])
    return bx.op(
        "Concat", [head, bx.ints([-1]), bx.slice(shape, [axis + 2], [_BIG], [0])], {"axis": 0}
    )


def _split_axis(bx: Batcher, v: ir.Value, axis: int, rank: int) -> ir.Value:
    """``v`` with its axis ``axis`` (of size B*k) split into ``[B, k]``."""
    shape = bx.op("Shape", [v])
    parts = [
        bx.slice(shape, [0], [axis], [0]),
        bx.batch_size,
        bx.ints([-1]),
        bx.slice(shape, [axis + 1], [_BIG], [0]),
    ]
    return bx.op("Reshape", [v, bx.op("Concat", parts, {"axis": 0})])


# ------------------------------------------------------------------------------ AffineGrid
affine_grid = OpRules("AffineGrid", since=20)


def _affine_grid_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    """AffineGrid is linear in theta (size is integer)."""
    return em.op("AffineGrid", [t, node.inputs[1]], attributes_of(node))


affine_grid.defjvp(_affine_grid_tangent)


@affine_grid.transpose
def _affine_grid_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """``ct_theta[n, i, j] = sum_s ct[n, s, i] base[s, j]``, base from AffineGrid itself."""
    ct, theta, size = cts[0], node.inputs[0], node.inputs[1]
    if ct is None or theta is None or size is None or theta.dtype is None:
        raise InternalRuleError(f"{op_label(node)} transpose: missing cotangent or input")
    k = _affine_dims(node)
    # Basis thetas: theta_j has a single 1 at [0, j], so its grid's component 0 is base[:, j].
    basis = np.zeros((k + 1, k, k + 1), dtype=theta.dtype.numpy())
    for j in range(k + 1):
        basis[j, 0, j] = 1.0
    basis_size = em.op("Concat", [em.ints([k + 1]), em.slice(size, [1], [_BIG], [0])], {"axis": 0})
    grids = em.op("AffineGrid", [em.const(basis), basis_size], attributes_of(node))
    base = em.op("Gather", [grids, em.const(np.array(0, np.int64))], {"axis": k + 1})
    base = em.op("Reshape", [base, em.ints([k + 1, -1])])  # [k + 1, S]
    n = em.slice(em.shape(theta), [0], [1], [0])
    flat = em.op("Reshape", [ct, em.op("Concat", [n, em.ints([-1, k])], {"axis": 0})])
    moved = em.transpose(flat, [0, 2, 1])  # [N, k, S]
    return [em.op("MatMul", [moved, em.transpose(base, [1, 0])]), None]


def _affine_dims(node: ir.Node) -> int:
    """2 or 3: the spatial dimensions, from theta's or size's static shape."""
    theta, size = node.inputs[0], node.inputs[1]
    dims = theta.shape.dims if theta is not None and theta.shape is not None else None
    if dims is not None and len(dims) == 3 and isinstance(dims[1], int):
        return dims[1]
    length = size.shape.dims if size is not None and size.shape is not None else None
    if length is not None and len(length) == 1 and isinstance(length[0], int):
        return length[0] - 2
    raise UnsupportedOperatorError(
        f"{op_label(node)} ({node_label(node)}): the derivative needs the number of spatial "
        "dimensions (2 or 3), from theta's shape [N, 2, 3] / [N, 3, 4] or size's length. "
        "Remedy: give theta or size a static shape."
    )


@affine_grid.batch
def _affine_grid_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Folds the batch into N: theta ``[B*N, k, k+1]``, size ``[B*N, ...]``."""
    refuse_batched(bx, node, args, batched, {1: "size"})
    theta, size = args[0], args[1]
    if theta is None or size is None:
        raise InternalRuleError(f"{op_label(node)} batch: missing input")
    folded = bx.op("Reshape", [theta, bx.ints([-1, *_static_tail(node)])])
    n = bx.slice(size, [0], [1], [0])
    new_size = bx.op(
        "Concat", [bx.op("Mul", [n, bx.batch_size]), bx.slice(size, [1], [_BIG], [0])], {"axis": 0}
    )
    out = bx.op("AffineGrid", [folded, new_size], attributes_of(node))
    shape = bx.op("Shape", [out])
    target = bx.op(
        "Concat", [bx.batch_size, bx.ints([-1]), bx.slice(shape, [1], [_BIG], [0])], {"axis": 0}
    )
    return [bx.op("Reshape", [out, target])], [True]


def _static_tail(node: ir.Node) -> list[int]:
    k = _affine_dims(node)
    return [k, k + 1]
