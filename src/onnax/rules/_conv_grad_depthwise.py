"""Depthwise Conv weight gradients for large kernels: the banded GEMM.

For a depthwise correlation (``group == C == M``) the weight gradient is, per channel ``c``,
``dW[c, q] = sum_{n, o} g[n, c, o] * x_pad[n, c, o * s + q * d]``. With the last spatial axis
written apart (``o = (o', w)``, ``q = (q', j)``) every leading offset ``q'`` gives one matrix
product per channel over the batch and the leading output positions,

``B[c, w, q', v] = sum_{n, o'} g[n, c, o', w] * x_pad[n, c, o' * s' + q' * d', v]``,

``[C, Wo, N * O'] @ [C, N * O', T * Wp]`` for all ``T = prod(k')`` leading offsets at once (the
``T`` row-shifted slices of the padded input concatenated along its last axis), and the weight
gradient is the band ``dW[c, q', j] = sum_w B[c, w, q', w * s + j * d]``: one ``Gather`` of a
constant index ``[T, Wo, kw]`` and a ``ReduceSum`` over ``w``. The product does ``Wp / kw``
times the useful work (about 9x for convnext's 7x7 kernels on 56x56 maps), but at the speed of
a GEMM, where the one-hot im2col of :mod:`onnax.rules._conv_grad` does ``K`` times the work
(49x) in a Conv, and the per-offset ``Mul`` + ``ReduceSum`` costs ``3 K`` nodes.

Measured by ``tests/benchmarks/bench_depthwise_grad.py`` (see :func:`banded_wins` for the
region where it is chosen).
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.rules._windows import Window

__all__ = ["banded", "banded_fits"]

_BANDED_MIN_ROWS = 24
"""Fewer rows ``N * prod(O')`` make the per-channel GEMMs too thin: the classic Conv wins."""


def banded_fits(win: Window, inp_like: ir.Value) -> bool:
    """Whether the banded GEMM beats the classic Conv for a depthwise Conv (module doc).

    A run-time batch counts as large: training batches are.
    """
    if win.strides[-1] != 1:
        return False  # the band's waste grows with the stride: the classic Conv wins
    dims = inp_like.shape.dims if inp_like.shape is not None else []
    batch = dims[0] if dims and isinstance(dims[0], int) else _BANDED_MIN_ROWS
    lead = [o for o in win.size_out[:-1] if isinstance(o, int)]
    return batch * int(np.prod(lead)) >= _BANDED_MIN_ROWS


def banded(
    em: Emitter,
    inp: ir.Value,
    grad: ir.Value,
    win: Window,
    kernel: list[int],
    rank: int,
) -> ir.Value:
    """The depthwise weight gradient ``[C, 1, *kernel]`` as one banded GEMM (module doc).

    Args:
        em: The emitter.
        inp: The correlation's input ``[N, C, size_in]``.
        grad: The cotangent of its output ``[N, C, size_out]``.
        win: The correlation, with static pads and output sizes.
        kernel: The static kernel sizes.
        rank: The rank of ``inp``.

    Returns:
        The weight gradient.
    """
    begin = [b for b in win.begin if isinstance(b, int)]
    end = [e for e in win.end if isinstance(e, int)]
    out = [o for o in win.size_out if isinstance(o, int)]
    *lead_k, kw = kernel
    *lead_o, wo = out
    *lead_s, sw = win.strides
    *lead_d, dw = win.dilations
    wp = (wo - 1) * sw + (kw - 1) * dw + 1  # the padded width the windows cover (tight pads)
    x = em.transpose(inp, [1, 0, *range(2, rank)])  # [C, N, D]
    grow = [max(e, 0) for e in end]
    if any(begin) or any(grow):
        x = em.op("Pad", [x, em.ints([0, 0, *begin, 0, 0, *grow])])
    if end[-1] < 0:
        # Trailing input no window reads: a Slice, not a negative Pad (which onnx's reference
        # evaluator refuses); along the leading axes the row slices below stop short anyway.
        x = em.slice(x, [0], [wp], [rank - 1])
    g = em.transpose(grad, [1, rank - 1, 0, *range(2, rank - 1)])  # [C, Wo, N, O']
    left = em.op("Reshape", [g, em.ints([0, 0, -1])])  # [C, Wo, N*O']
    axes = list(range(2, rank - 1))
    products: list[ir.Value] = []
    for q in itertools.product(*(range(k) for k in lead_k)):
        starts = [qi * d for qi, d in zip(q, lead_d, strict=True)]
        stops = [a + (o - 1) * s + 1 for a, o, s in zip(starts, lead_o, lead_s, strict=True)]
        # The input rows offset q' reads, [C, N, O', Wp]; a 1-D Conv has one, x itself.
        rows = em.slice(x, starts, stops, axes, lead_s) if axes else x
        right = em.op("Reshape", [rows, em.ints([0, -1, wp])])  # [C, N*O', Wp]
        # One product per offset: concatenating the T slices first (one batched MatMul)
        # copied T times the input once more, and measured slower.
        products.append(em.op("MatMul", [left, right]))  # [C, Wo, Wp]
    taps = len(products)
    stacked = em.op("Concat", products, {"axis": 1}) if taps > 1 else products[0]
    flat = em.op("Reshape", [stacked, em.ints([0, -1])])  # [C, T*Wo*Wp]
    # B[c, t, w, w*s + j*d] sits at t*Wo*Wp + w*Wp + w*s + j*d of the flattened products.
    t_ = np.arange(taps).reshape(taps, 1, 1)
    w_ = np.arange(wo).reshape(1, wo, 1)
    j_ = np.arange(kw).reshape(1, 1, kw)
    index = (t_ * wo * wp + w_ * (wp + sw) + j_ * dw).astype(np.int64)
    band = em.op("Gather", [flat, em.const(index)], {"axis": 1})  # [C, T, Wo, kw]
    summed = em.reduce_sum(band, [2], keepdims=False)  # [C, T, kw]
    return em.op("Reshape", [summed, em.ints([-1, 1, *kernel])])
