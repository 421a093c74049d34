"""Pooling: MaxPool, AveragePool, LpPool, their global forms, and MaxUnpool.

* **MaxPool** passes on the tangent of the element each window selected. The selection is read
  from the operator's own ``Indices`` output (the node's, when it has one in row-major storage
  order, else a second MaxPool emitted for it), so ties are broken exactly as the runtime broke
  them. Indices are flat over the whole input; within one ``(n, c)`` plane they are the index
  modulo the plane size, so the tangent is a ``GatherElements`` along the flattened spatial axis
  of ``[N, C, H*W...]``. Its transpose (from the indexing rules) is a ``ScatterElements`` with
  ``reduction="add"`` from opset 16 (overlapping windows can select an element twice) and a
  one-hot contraction per plane before.
* **AveragePool** is linear: the tangent is AveragePool of the tangent. Its transpose writes the
  average as ``r * WindowSum(X)`` with a per-position factor ``r = 1 / count`` that does not depend
  on the data, so ``r = AveragePool(ones) / WindowSum(ones)`` over one ``[1, 1, spatial]`` plane
  of ones is exact for ``count_include_pad`` 0 and 1, ``ceil_mode`` and every padding mode without
  re-deriving how the runtime counts. ``WindowSum`` is a depthwise Conv (``group = C``) with a
  kernel of ones (or, when the channel count is symbolic, a Conv of the channels folded into the
  batch), and its transpose the matching ConvTranspose (the window geometry with tight pads
  comes from :mod:`onnax.rules._windows`).
* **LpPool** ``y = (sum |x|^p)^(1/p)`` over each window: ``dy = y^(1-p) WindowSum(sign(x)
  |x|^(p-1) dx)``; where ``y == 0`` (an all-zero window, a kink for p = 1 and a singular point
  otherwise) the tangent is 0.
* **GlobalAveragePool** is a ``ReduceMean`` over the spatial axes (kept), **GlobalMaxPool** a
  ``ReduceMax``, whose tangent is split equally between tied maxima (as the ReduceMax rule does),
  **GlobalLpPool** the global form of LpPool.
* **MaxUnpool** is linear in ``X``: the tangent is MaxUnpool of the tangent (same indices), and the
  transpose gathers the cotangent at the indices (``Gather`` on the flattened cotangent).

Batch rules (vmap) fold the batch axis into ``N`` (``[B, N, C, ...]`` -> ``[B*N, C, ...]``), apply
the operator and unfold the outputs. Flat indices over a folded tensor are offset by ``b`` times
the size of one example, so MaxPool's ``Indices`` get that offset subtracted and MaxUnpool's added
(with the output shape of one example passed explicitly, scaled along ``N``).

Onnxruntime has double kernels for MaxPool only; the other pooling operators are float-only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints, int_attr, ints_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, linear_unary_jvp
from onnax.rules._windows import (
    Param,
    Window,
    correlate,
    correlate_adjoint,
    dims_of,
    example_dims,
    fold_batch,
    int_vector,
    pool_window,
    rank_of,
    spatial_dims,
    unfold_batch,
)

__all__: list[str] = []


def _dtype(node: ir.Node, value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the element type of {value.name!r} is "
            "unknown after shape inference. Remedy: declare the types of the graph inputs."
        )
    return value.dtype


def _io(node: ir.Node) -> tuple[ir.Value, ir.Value, int]:
    x, y = node.inputs[0], node.outputs[0]
    assert x is not None
    return x, y, rank_of(node, x, "input 'X'")


# ------------------------------------------------------------------ batching (shared)
def _batch_offsets(bx: Batcher, size: ir.Value, rank: int) -> ir.Value:
    """``b * size`` for every example ``b``, shaped ``[B, 1, ..., 1]`` (``rank`` + 1 axes)."""
    zero = bx.const(np.array(0, dtype=np.int64))
    one = bx.const(np.array(1, dtype=np.int64))
    count = bx.squeeze(bx.batch_size, [0])
    examples = bx.op("Range", [zero, count, one])
    shaped = bx.op("Reshape", [examples, bx.ints([-1] + [1] * rank)])
    return bx.op("Mul", [shaped, size])


def _example_size(bx: Batcher, arg: ir.Value, original: ir.Value) -> ir.Value:
    """The number of elements of one example of a batched ``arg`` (1-element int64)."""
    dims = original.shape.dims if original.shape is not None else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        return bx.ints([int(np.prod([d for d in dims if isinstance(d, int)]))])
    return bx.op("Div", [bx.op("Size", [arg]), bx.batch_size])


def _pool_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Every pooling operator: fold the batch into N; MaxPool's flat indices get unshifted."""
    x, x0 = args[0], node.inputs[0]
    assert x is not None and x0 is not None
    rank = bx.rank(x0)
    folded = fold_batch(bx, x, x0, rank)
    outs = bx.op_multi(node.op_type, [folded], attributes_of(node), num_outputs=len(node.outputs))
    results: list[ir.Value | None] = [
        unfold_batch(bx, o, orig) for o, orig in zip(outs, node.outputs, strict=True)
    ]
    if node.op_type == "MaxPool" and len(results) > 1 and results[1] is not None:
        offsets = _batch_offsets(bx, _example_size(bx, x, x0), rank)
        results[1] = bx.op("Sub", [results[1], offsets])
    return results, [True] * len(results)


# ------------------------------------------------------------------------ window sums
def _ones_kernel(win: Window, dtype: ir.DataType, channels: int = 1) -> np.ndarray:
    kernel = [k for k in win.kernel if isinstance(k, int)]
    return np.ones((channels, 1, *kernel), dtype=dtype.numpy())


def _channels(x: ir.Value) -> int | None:
    d = x.shape.dims[1] if x.shape is not None else None
    return d if isinstance(d, int) else None


def _window_sum(
    em: Emitter, z: ir.Value, x: ir.Value, y: ir.Value, win: Window, rank: int
) -> ir.Value:
    """The sum of ``z`` (shaped like ``x``) over each window, shaped like ``y``.

    A depthwise Conv (``group = C``) with a kernel of ones. With a symbolic channel count the
    channels are folded into the batch instead (one ``[1, 1, k]`` kernel serves them all); the
    folded shape then has no name that reverse mode could find, so a primal value of the same
    shape (``y`` folded alike) is emitted as its shape witness.
    """
    dtype = x.dtype
    assert dtype is not None
    channels = _channels(x)
    if channels is not None:
        kernel = em.const(_ones_kernel(win, dtype, channels))
        return correlate(em, z, kernel, win, channels, rank)
    single = em.op("Reshape", [z, int_vector(em, [-1, 1, *win.size_in])])
    summed = correlate(em, single, em.const(_ones_kernel(win, dtype)), win, 1, rank)
    em.op("Reshape", [y, int_vector(em, [-1, 1, *win.size_out])])  # the shape witness
    return em.op("Reshape", [summed, em.shape(y)])


# ---------------------------------------------------------------------------- MaxPool
def _static_plane(value: ir.Value) -> int | None:
    dims = value.shape.dims[2:] if value.shape is not None else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        return int(np.prod([d for d in dims if isinstance(d, int)]))
    return None


def _flat_target(em: Emitter, value: ir.Value) -> ir.Value:
    """The Reshape target ``[N, C, plane]`` of ``value``."""
    plane = _static_plane(value)
    return em.ints([0, 0, plane if plane is not None else -1])


def _plane_size(em: Emitter, x: ir.Value) -> ir.Value:
    """The number of elements of one ``(n, c)`` plane of ``x``, as a 1-element int64 vector."""
    plane = _static_plane(x)
    if plane is not None:
        return em.ints([plane])
    flat = em.op("Reshape", [x, em.ints([0, 0, -1])])
    return em.slice(em.op("Shape", [flat]), [2], [3], [0])


def _static(params: Sequence[Param]) -> list[int] | None:
    ints = [p for p in params if isinstance(p, int)]
    return ints if len(ints) == len(params) else None


def _tap_kernel(kernel: Sequence[int], channels: int, dtype: ir.DataType) -> np.ndarray:
    """Depthwise one-hot kernels ``[C*K, 1, *kernel]``.

    Output channel ``c*K + q`` of a Conv with ``group = C`` reads tap ``q`` (row-major) of each
    window of channel ``c``.
    """
    taps = int(np.prod(kernel))
    eye = np.eye(taps, dtype=dtype.numpy()).reshape(taps, 1, *kernel)
    return np.tile(eye, (channels, 1, *([1] * len(kernel))))


@dataclasses.dataclass
class _Taps:
    """Static geometry of a MaxPool whose windows are read tap by tap."""

    win: Window
    channels: int
    size_in: list[int]
    size_out: list[int]
    kernel: list[int]
    begin: list[int]
    end: list[int]
    rank: int

    @property
    def count(self) -> int:
        return int(np.prod(self.kernel))

    def read(self, em: Emitter, z: ir.Value, weights: ir.Value, padded: bool) -> ir.Value:
        """The taps of every window of ``z``, ``[N, C, K, outputs]``.

        ``padded``: ``z`` already carries the window's padding.
        """
        win = self.win
        if padded:
            zero: list[Param] = [0] * (self.rank - 2)
            win = dataclasses.replace(win, begin=zero, end=list(zero))
        taps = correlate(em, z, weights, win, self.channels, self.rank)
        plane = int(np.prod(self.size_out))
        return em.op("Reshape", [taps, em.ints([0, self.channels, self.count, plane])])


_EXACT = float(2**24)
"""Integers up to this are exact in float32: the flat indices computed in float stay below."""


def _taps_geometry(em: Emitter, node: ir.Node, x: ir.Value) -> _Taps | None:
    channels = _channels(x)
    # FLOAT only: onnxruntime has no double Conv (the taps are read by one).
    if channels is None or em.opset < 11 or x.dtype != ir.DataType.FLOAT:
        return None
    rank = rank_of(node, x, "input 'X'")
    win = pool_window(em, node)
    parts = [_static(p) for p in (win.size_in, win.size_out, win.kernel, win.begin, win.end)]
    if any(p is None for p in parts):
        return None
    size_in, size_out, kernel, begin, end = (p or [] for p in parts)
    if int(np.prod(size_in)) >= _EXACT:
        return None
    return _Taps(win, channels, size_in, size_out, kernel, begin, end, rank)


def _max_pool_taps_jvp(em: Emitter, x: ir.Value, y: ir.Value, t: ir.Value, geo: _Taps) -> ir.Value:
    """MaxPool's tangent from the taps of its windows: see :func:`_max_pool_tangent`."""
    dtype = x.dtype
    assert dtype is not None
    weights = em.const(_tap_kernel(geo.kernel, geo.channels, dtype))
    padded = x
    if any(geo.begin) or any(geo.end):
        # The runtime pads with -inf: a tap in the padding must lose to every real element.
        vector = em.ints([0, 0, *geo.begin, 0, 0, *geo.end])
        lowest = em.scalar(float(np.finfo(dtype.numpy()).min), dtype)
        padded = em.op("Pad", [x, vector, lowest])
    values = geo.read(em, padded, weights, padded=True)
    if em.opset < 16:
        # The selected tap as a mask; the transpose is then a ConvTranspose (a gather's
        # transpose before ScatterElements had ``reduction`` is a dense one-hot over the plane).
        first = em.op("ArgMax", [values], {"axis": 2, "keepdims": 1})
        positions = em.const(np.arange(geo.count, dtype=np.int64).reshape(geo.count, 1))
        mask = em.op("Cast", [em.op("Equal", [first, positions])], {"to": dtype})
        spread = geo.read(em, t, weights, padded=False)
        picked = em.reduce_sum(em.op("Mul", [spread, mask]), [2], keepdims=False)
        return em.op("Reshape", [picked, em.shape(y)])
    # The flat index (within one plane) of tap q of window o: base(o) + offset(q). Among the
    # taps equal to the window's maximum (the primal output), the runtime picks the first in
    # row-major order, which for the taps inside the input is the one of least flat index.
    # Computed in float, exact below 2**24: min_q eq_q * (offset_q - 2**24) + 2**24 + base, with
    # vectorised Equal/Mul/ReduceMin (measured: onnxruntime's ArgMax over the taps and a
    # Gather of the offsets cost twice as much).
    strides_in = [int(np.prod(geo.size_in[i + 1 :])) for i in range(len(geo.size_in))]
    taps = np.indices(geo.kernel).reshape(len(geo.kernel), -1)
    offsets = sum(
        taps[i] * d * st
        for i, (d, st) in enumerate(zip(geo.win.dilations, strides_in, strict=True))
    )
    outs = np.indices(geo.size_out).reshape(len(geo.size_out), -1)
    base = sum(
        (outs[i] * s - b) * st
        for i, (s, b, st) in enumerate(zip(geo.win.strides, geo.begin, strides_in, strict=True))
    )
    np_dtype = dtype.numpy()
    plane = int(np.prod(geo.size_in))
    shifted = (np.asarray(offsets, np.float64) - _EXACT).reshape(geo.count, 1).astype(np_dtype)
    maximum = em.op("Reshape", [y, em.ints([0, geo.channels, 1, int(np.prod(geo.size_out))])])
    hits = em.op("Cast", [em.op("Equal", [values, maximum])], {"to": dtype})
    least = em.reduce("ReduceMin", em.op("Mul", [hits, em.const(shifted)]), [2], keepdims=False)
    # Two additions: base + 2**24 would round (odd integers above 2**24 are not float32).
    first = em.op("Add", [least, em.scalar(_EXACT, dtype)])
    where = em.op("Add", [first, em.const(np.asarray(base, np.float64).astype(np_dtype))])
    # A window of NaN has no tap equal to its maximum: keep its index in range.
    where = em.op("Max", [em.op("Min", [where, em.scalar(plane - 1, dtype)]), em.scalar(0, dtype)])
    index = em.op("Cast", [where], {"to": ir.DataType.INT64})
    index.meta["onnax.nonnegative"] = True
    flat = em.op("Reshape", [t, em.ints([0, 0, int(np.prod(geo.size_in))])])
    picked = em.op("GatherElements", [flat, index], {"axis": 2})
    return em.op("Reshape", [picked, em.shape(y)])


def _max_pool_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    """MaxPool passes on the tangent of the element each window selected.

    With static sizes (planes below 2**24 elements) and channel count, the taps of every
    window are read by one depthwise Conv with one-hot kernels from the input padded with the
    lowest float, which is several times faster in onnxruntime than a MaxPool with
    ``Indices`` (a scalar loop). From opset 16 the selected element is the tap equal to the
    output of least flat index (the first of tied maxima in row-major order, as the runtime's
    MaxPool picks), found with Equal/Mul/ReduceMin in float, and the tangent is a
    ``GatherElements`` there (its transpose a ``ScatterElements`` with ``reduction="add"``).
    Before 16, an ``ArgMax`` over the taps gives a mask, and the tangent is the masked taps of
    the tangent summed (its transpose a ConvTranspose: a gather's transpose is a dense one-hot
    over the plane before ScatterElements had ``reduction``). When the node computes row-major
    ``Indices`` anyway, or sizes are symbolic, or the type is double, the selection is read
    from the ``Indices`` output (the node's, else a second MaxPool's).

    Measured against this form (squeezenet's 3x3 stride-2 pools at batch 8, alone and in its
    whole gradient, onnxruntime at one thread): the mask form above (before 16) with its
    ConvTranspose, grad_all 1.11x and grad_in 1.14x slower; the taps by one ungrouped Conv of
    ``[N*C, 1, H, W]``, equal; an ``ArgMax`` over the taps plus the offsets by a ``Gather``
    or by integer arithmetic, equal; the first hit as a ``MatMul`` of the hits with powers of
    two and a table ``Gather``, equal; a ``Where`` in place of ``Cast`` and ``Mul``, slower.
    """
    x, y, _ = _io(node)
    own = len(node.outputs) > 1 and int_attr(node, "storage_order", 0) == 0
    geo = None if own else _taps_geometry(em, node, x)
    if geo is not None:
        return _max_pool_taps_jvp(em, x, y, t, geo)
    if own:
        indices = node.outputs[1]
    else:
        attrs = attributes_of(node, storage_order=None)
        indices = em.op_multi("MaxPool", [x], attrs, num_outputs=2)[1]
    # Static plane sizes are spelled out: inference turns a -1 into the symbol "16", not the
    # int 16, and the transposes would then find no shape for the flattened values.
    plane = _plane_size(em, x)
    local = em.op("Mod", [em.op("Reshape", [indices, _flat_target(em, y)]), plane])
    flat = em.op("Reshape", [t, _flat_target(em, x)])
    picked = em.op("GatherElements", [flat, local], {"axis": 2})
    return em.op("Reshape", [picked, em.shape(y)])


max_pool = OpRules("MaxPool", since=8)
max_pool.defjvp(_max_pool_tangent)  # the Indices output gets no tangent
max_pool.batch(_pool_batch)


# ------------------------------------------------------------------------ AveragePool
average_pool = OpRules("AveragePool", since=7)
average_pool.jvp(linear_unary_jvp)  # linear: AveragePool of the tangent
average_pool.batch(_pool_batch)


@average_pool.transpose
def _average_pool_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    if ct is None or not linear[0]:
        return [None]
    x, _, rank = _io(node)
    dtype = _dtype(node, x)
    win = pool_window(em, node)
    ones = em.op("Expand", [em.scalar(1.0, dtype), int_vector(em, [1, 1, *win.size_in])])
    kernel = em.const(_ones_kernel(win, dtype))
    # 1 / count per output position, however the runtime counts (see module doc).
    averaged = em.op("AveragePool", [ones], attributes_of(node))
    ratio = em.op("Div", [averaged, correlate(em, ones, kernel, win, 1, rank)])
    scaled = em.op("Mul", [ct, ratio])
    channels = _channels(x)
    if channels is not None:
        depthwise = em.const(_ones_kernel(win, dtype, channels))
        return [correlate_adjoint(em, scaled, depthwise, win, channels, rank)]
    single = em.op("Reshape", [scaled, int_vector(em, [-1, 1, *win.size_out])])
    spread = correlate_adjoint(em, single, kernel, win, 1, rank)
    return [em.op("Reshape", [spread, em.shape(x)])]


# ----------------------------------------------------------------------------- LpPool
def _p(node: ir.Node) -> int:
    return int_attr(node, "p", 2)


def _lp_coefficients(
    em: Emitter, x: ir.Value, y: ir.Value, p: int, dtype: ir.DataType
) -> tuple[ir.Value, ir.Value | None]:
    """``sign(x) |x|^(p-1)`` and ``y^(1-p)`` (0 where y == 0; None when p == 1)."""
    if p == 1:
        return em.op("Sign", [x]), None
    if p == 2:
        coef_x = x
    else:
        magnitude = em.op("Pow", [em.op("Abs", [x]), em.scalar(float(p - 1), dtype)])
        coef_x = em.op("Mul", [em.op("Sign", [x]), magnitude])
    zero = em.scalar(0.0, dtype)
    power = y if p == 2 else em.op("Pow", [y, em.scalar(float(p - 1), dtype)])
    is_zero = em.op("Equal", [y, zero])
    # Divide by 1 where y == 0 so that no inf is formed, then select 0 there.
    safe = em.op("Where", [is_zero, em.scalar(1.0, dtype), power])
    inv = em.op("Where", [is_zero, zero, em.op("Div", [em.scalar(1.0, dtype), safe])])
    return coef_x, inv


def _lp_pool_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    x, y, rank = _io(node)
    dtype = _dtype(node, x)
    coef_x, inv = _lp_coefficients(em, x, y, _p(node), dtype)
    summed = _window_sum(em, em.op("Mul", [t, coef_x]), x, y, pool_window(em, node), rank)
    return summed if inv is None else em.op("Mul", [summed, inv])


lp_pool = OpRules("LpPool", since=2)
lp_pool.defjvp(_lp_pool_tangent)
lp_pool.batch(_pool_batch)


# ------------------------------------------------------------------------ global pools
def _global_average_pool_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    _, _, rank = _io(node)
    return em.reduce("ReduceMean", t, list(range(2, rank)), keepdims=True)


global_average_pool = OpRules("GlobalAveragePool")
global_average_pool.defjvp(_global_average_pool_tangent)
global_average_pool.batch(_pool_batch)


def _global_max_pool_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    x, y, rank = _io(node)
    dtype = _dtype(node, x)
    axes = list(range(2, rank))
    mask = em.op("Cast", [em.op("Equal", [x, y])], {"to": dtype})
    share = em.op("Div", [mask, em.reduce_sum(mask, axes, keepdims=True)])
    return em.reduce_sum(em.op("Mul", [t, share]), axes, keepdims=True)


global_max_pool = OpRules("GlobalMaxPool")
global_max_pool.defjvp(_global_max_pool_tangent)
global_max_pool.batch(_pool_batch)


def _global_lp_pool_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    x, y, rank = _io(node)
    dtype = _dtype(node, x)
    coef_x, inv = _lp_coefficients(em, x, y, _p(node), dtype)
    coef = coef_x if inv is None else em.op("Mul", [coef_x, inv])
    return em.reduce_sum(em.op("Mul", [t, coef]), list(range(2, rank)), keepdims=True)


global_lp_pool = OpRules("GlobalLpPool", since=2)
global_lp_pool.defjvp(_global_lp_pool_tangent)
global_lp_pool.batch(_pool_batch)


# -------------------------------------------------------------------------- MaxUnpool
max_unpool = OpRules("MaxUnpool", since=9)
max_unpool.jvp(linear_unary_jvp)  # linear in X: MaxUnpool of the tangent, same indices


@max_unpool.transpose
def _max_unpool_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    results: list[ir.Value | None] = [None] * len(node.inputs)
    if ct is None or not linear[0]:
        return results
    indices = node.inputs[1]
    assert indices is not None
    flat = em.op("Reshape", [ct, em.ints([-1])])
    # Gather along a 1-D tensor returns the indices' shape, which is X's.
    results[0] = em.op("Gather", [flat, indices], {"axis": 0})
    return results


def _unpool_example_shape(
    bx: Batcher, node: ir.Node, x: ir.Value, x_batched: bool, rank: int
) -> ir.Value:
    """The output shape of one example of MaxUnpool, as a 1-D int64 value."""
    x0, y0 = node.inputs[0], node.outputs[0]
    assert x0 is not None
    dims = y0.shape.dims if y0.shape is not None else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        return bx.ints([d for d in dims if isinstance(d, int)])
    # The default output size: (D - 1) * s + k - pad_begin - pad_end per spatial axis.
    n = rank - 2
    kernel = ints_attr(node, "kernel_shape") or [1] * n
    strides = ints_attr(node, "strides") or [1] * n
    pads = ints_attr(node, "pads") or [0] * (2 * n)
    lead = example_dims(bx, x, x0, [0, 1]) if x_batched else dims_of(bx, x, [0, 1])
    spatial = example_dims(bx, x, x0, range(2, rank)) if x_batched else spatial_dims(bx, x, rank)
    sizes: list[Param] = []
    for i, d in enumerate(spatial):
        offset = kernel[i] - strides[i] - pads[i] - pads[n + i]
        if isinstance(d, int):
            sizes.append(d * strides[i] + offset)
        else:
            sizes.append(
                bx.op("Add", [bx.op("Mul", [d, bx.ints([strides[i]])]), bx.ints([offset])])
            )
    return int_vector(bx, [*lead, *sizes])


@max_unpool.batch
def _max_unpool_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """MaxUnpool with the batch folded into N and the flat indices offset per example."""
    x, indices = args[0], args[1]
    x0, i0 = node.inputs[0], node.inputs[1]
    assert x is not None and indices is not None and x0 is not None and i0 is not None
    shape = args[2] if len(args) > 2 else None
    if shape is not None and len(batched) > 2 and batched[2]:
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} ({node_label(node)}): its input 2 'output_shape' "
            f"{node.inputs[2].name if node.inputs[2] is not None else None!r} depends on a "
            "batched input, so each example could have a different output shape. Remedy: give "
            "the inputs that output_shape is computed from in_axes None, or make it a constant."
        )
    rank = bx.rank(x0)
    if shape is None:
        example = _unpool_example_shape(bx, node, x, batched[0], rank)
    else:
        static = const_ints(shape)
        example = bx.ints(static) if static is not None else shape
    static_example = const_ints(example)
    size = (
        bx.ints([int(np.prod(static_example))])
        if static_example is not None
        else bx.reduce("ReduceProd", example, None, keepdims=True)
    )
    x = bx.materialize(x, batched[0], x0)
    indices = bx.materialize(indices, batched[1], i0)
    shifted = bx.op("Add", [indices, _batch_offsets(bx, size, rank)])
    n_folded = bx.op("Mul", [bx.batch_size, bx.slice(example, [0], [1], [0])])
    folded_shape = bx.op("Concat", [n_folded, bx.slice(example, [1], [rank], [0])], {"axis": 0})
    out = bx.op(
        "MaxUnpool",
        [fold_batch(bx, x, x0, rank), fold_batch(bx, shifted, i0, rank), folded_shape],
        attributes_of(node),
    )
    return [unfold_batch(bx, out, node.outputs[0])], [True]
