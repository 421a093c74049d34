"""Depthwise Conv weight gradients for large kernels (banded and Toeplitz GEMMs), patch windows.

For a depthwise correlation (``group == C == M``) the weight gradient is, per channel ``c``,
``dW[c, q] = sum_{n, o} g[n, c, o] * x_pad[n, c, o * s + q * d]``. With the last spatial axis
written apart (``o = (o', w)``, ``q = (q', j)``), every leading kernel offset ``q'`` gives one
matrix product per channel over the batch and the leading output positions,

``B[c, q', w, v] = sum_{n, o'} g[n, c, o', w] * x_pad[n, c, o' * s' + q' * d', v]``,

all ``T = prod(k')`` of them one broadcasting ``MatMul`` ``[C, 1, Wo, O' * N] @ [C, T, O' * N,
Wp]`` (the rows each offset reads picked by one ``Gather`` from the padded input laid out
``[C, D', N, Wp]``, where a row of every example is one contiguous run), and the weight
gradient is the band ``dW[c, q', j] = sum_w B[c, q', w, w * s + j * d]``: one ``Gather`` of a
constant index ``[1, k', Wo, kw]`` and a ``ReduceSum`` over ``w``. The product does ``Wp / kw`` times the useful
work (about 9x for convnext's 7x7 kernels on 56x56 maps), but at the speed of a GEMM; the
one-hot im2col of :mod:`onnax.rules._conv_grad` does ``K = prod(k)`` times the work (49x) in a
Conv, the per-offset ``Mul`` + ``ReduceSum`` costs ``3 K`` nodes, and the classic Conv runs a
matrix-vector product per channel. The picked rows cost ``T`` times the input's memory.

Measured by ``tests/benchmarks/bench_depthwise_grad.py`` (onnxruntime 1.32, one thread, on a
shared two-core machine where single figures scatter by 2x; ratios are the classic Conv's time
over the form's). convnext-tiny's 7x7 (pads 3) at batch 8, maps 56/28/14/7 with 96...768
channels: banded 1.2-2.4x, the im2col (the form before) 0.24-0.64x, the per-offset shifts
0.5-0.9x, the im2col with the matrix-vector product the other way round (``[N*C, K, P] @
[N*C, P, 1]``, no Transpose) 0.3-0.6x. 5x5 at batch 8: 1.6-1.7x. Ten nodes in all: ``T`` row
Slices + Concat instead of the Gather measured alike with ``T + 9`` nodes more, one MatMul per
offset up to 1.3x faster with ``3 T`` more; a one-hot Conv extracting the row shifts measured
slower (0.5-1.4x), the cotangent transposed less and the MatMul with ``transA`` alike (within
7 %). Batch and rows in the order ``(N, O')`` instead (both operands moved by block copies, or
a 2-D transpose of convnext's channels-last cotangent; ``transA``) measured alike alone but
10 % slower on convnext-tiny's whole gradient -- measured with the channels-first cotangent; on
convnext's own channels-last one the ``(O', N)`` order reads the cotangent fully reversed
(``[N, H, W, C] -> [C, W, H, N]``), which onnxruntime's Transpose runs about 20x slower than a
single axis move (172 ms of Transpose in the batch-8 gradient, 115 ms of it those). So a static
batch takes the rows ``(N, O')`` (:func:`_batch_major`: the channel axis moved alone, the
cotangent entering the MatMul transposed, which onnxruntime folds into its kernel; 62 ms of
Transpose left); a run-time batch keeps ``(O', N)``, whose row index needs no batch size.

:func:`banded_fits` keeps the classic Conv where the GEMMs get thin or wasteful: a static batch
of 1 (7x7: 0.5-0.9x; the per-offset shifts 0.8-1.2x, at ``3 K`` nodes; there :func:`toeplitz`
does one GEMM per channel without the band's waste, 1.3-2.0x), fewer than 24 rows
``N * O'``, and strides along the last axis (the band wastes ``s`` times more; 5x5 stride 2:
0.9-1.2x). Kernels of at most 16 elements take it too where it fits: alone the per-offset shifts
measured faster (3x3 at batch 8: 1.2-2.4x, the banded 1.1-1.6x), but in whole gradients the
banded GEMM was as fast or faster, with a third of the nodes (module doc of
:mod:`onnax.rules._conv_grad`).

:func:`tiles_input` recognises windows that tile the input (module doc of
:mod:`onnax.rules._conv_grad`).
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.rules._windows import Window

__all__ = ["banded", "banded_fits", "tiles_input", "toeplitz", "toeplitz_fits"]

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
    if batch == 1:
        return False  # one example: the classic Conv measured 1.2-2x faster
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
    # The padded leading sizes: the windows' span, and the unread rows not cropped.
    lead_p = [
        (o - 1) * s + (k - 1) * d + 1 + max(-e, 0)
        for o, k, s, d, e in zip(lead_o, lead_k, lead_s, lead_d, end[:-1], strict=True)
    ]
    index = np.zeros((1, 1), np.int64)  # [T, O']: one offset, one row along a single axis
    if lead_k:
        # Row o' of offset q' is the padded row o' * s' + q' * d' (flattened leading axes).
        offsets = np.array(list(itertools.product(*(range(k) for k in lead_k))))
        positions = np.array(list(itertools.product(*(range(o) for o in lead_o))))
        rows = offsets[:, None, :] * np.array(lead_d) + positions[None] * np.array(lead_s)
        index = np.ravel_multi_index(tuple(np.moveaxis(rows, -1, 0)), lead_p)
    taps = index.shape[0]
    x = _pad_or_crop(em, inp, begin, end)
    dims = inp.shape.dims if inp.shape is not None else []
    batch = dims[0] if dims and isinstance(dims[0], int) else None
    if batch is not None:
        left, right = _batch_major(em, x, grad, index, batch, int(np.prod(lead_p)), wo, wp, rank)
    else:
        left, right = _row_major(em, x, grad, index, lead_p, wo, wp, rank)
    product = em.op("MatMul", [left, right])  # [C, T, Wo, Wp]
    flat = em.op("Reshape", [product, em.ints([0, -1])])  # [C, T*Wo*Wp]
    # B[c, t, w, w*s + j*d] sits at t*Wo*Wp + w*Wp + w*s + j*d of the flattened product; the
    # index shaped [1, k', Wo, kw] gives the weight's layout once w is summed.
    t_ = np.arange(taps).reshape(taps, 1, 1)
    w_ = np.arange(wo).reshape(1, wo, 1)
    j_ = np.arange(kw).reshape(1, 1, kw)
    band_index = (t_ * wo * wp + w_ * (wp + sw) + j_ * dw).reshape(1, *lead_k, wo, kw)
    band = em.op("Gather", [flat, em.const(band_index.astype(np.int64))], {"axis": 1})
    return em.reduce_sum(band, [rank - 1], keepdims=False)  # [C, 1, k', kw]


def _batch_major(
    em: Emitter,
    x: ir.Value,
    grad: ir.Value,
    index: np.ndarray,
    batch: int,
    plane: int,
    wo: int,
    wp: int,
    rank: int,
) -> tuple[ir.Value, ir.Value]:
    """The product's operands with rows ``(N, O')``, for a static batch.

    Both operands move the channel axis alone to the front (onnxruntime copies that fast: on
    convnext's channels-last cotangent it composes into a channels-last to channels-first
    move), and the cotangent enters the product transposed (``[C, 1, Wo, N*O']``, a
    transposed operand onnxruntime folds into its MatMul). The ``(O', N)`` order instead reads
    the channels-last cotangent fully reversed, a transpose onnxruntime runs 20x slower than
    a single axis move (20 ms of convnext-tiny's batch-8 gradient per block of stage 0).
    """
    perm = [1, 0, *range(2, rank)]
    g = em.op("Reshape", [em.transpose(grad, perm), em.ints([0, 1, -1, wo])])  # [C,1,N*O',Wo]
    left = em.transpose(g, [0, 1, 3, 2])  # [C, 1, Wo, N*O']
    x = em.transpose(x, perm)  # [C, N, P', Wp]
    if rank == 3:
        return left, em.unsqueeze(x, [1])  # [C, 1, N, Wp]
    flat_x = em.op("Reshape", [x, em.ints([0, -1, wp])])  # [C, N*P', Wp]
    rows = np.arange(batch).reshape(1, batch, 1) * plane + index[:, None, :]  # [T, N, O']
    rows = rows.reshape(index.shape[0], -1).astype(np.int64)
    return left, em.op("Gather", [flat_x, em.const(rows)], {"axis": 1})  # [C, T, N*O', Wp]


def _row_major(
    em: Emitter,
    x: ir.Value,
    grad: ir.Value,
    index: np.ndarray,
    lead_p: list[int],
    wo: int,
    wp: int,
    rank: int,
) -> tuple[ir.Value, ir.Value]:
    """The product's operands with rows ``(O', N)``: no index depends on a run-time batch."""
    n = rank - 2
    # x as [C, D', N, Wp]: the batch next to the width, so that every (row, example) is one
    # contiguous run of the rows the Gather below picks.
    x = em.transpose(x, [1, *range(2, rank - 1), 0, rank - 1])
    g = em.transpose(grad, [1, rank - 1, *range(2, rank - 1), 0])  # [C, Wo, O', N]
    left = em.op("Reshape", [g, em.ints([0, 1, wo, -1])])  # [C, 1, Wo, O'*N]
    if n == 1:
        return left, em.unsqueeze(x, [1])  # [C, 1, N, Wp]
    taps = index.shape[0]
    flat_x = x if n == 2 else em.op("Reshape", [x, em.ints([0, int(np.prod(lead_p)), -1, wp])])
    picked = em.op("Gather", [flat_x, em.const(index.astype(np.int64))], {"axis": 1})
    return left, em.op("Reshape", [picked, em.ints([0, taps, -1, wp])])  # [C, T, O'*N, Wp]


_TOEPLITZ_MIN_TAPS = 17
"""Smaller kernels of one example keep the per-offset shifts of :mod:`onnax.rules._conv_grad`."""

_TOEPLITZ_MIN_POSITIONS = 64
"""Smaller maps keep the classic Conv (7x7 maps: alike, 1.5 against 1.6 ms at 768 channels)."""


def toeplitz_fits(win: Window, inp_like: ir.Value, kernel: list[int], rank: int) -> bool:
    """Whether a depthwise 2-D Conv of one example takes :func:`toeplitz` (module doc).

    Stride and dilation 1, a static batch of 1, static sizes, more kernel elements than the
    per-offset shifts take and at least :data:`_TOEPLITZ_MIN_POSITIONS` output positions.
    """
    dims = inp_like.shape.dims if inp_like.shape is not None else []
    sizes = [*win.size_out, *win.begin, *win.end]
    return (
        rank == 4
        and len(kernel) == 2
        and int(np.prod(kernel)) >= _TOEPLITZ_MIN_TAPS
        and bool(dims)
        and dims[0] == 1
        and all(isinstance(v, int) for v in sizes)
        and int(np.prod([o for o in win.size_out if isinstance(o, int)])) >= _TOEPLITZ_MIN_POSITIONS
        and all(s == 1 for s in win.strides)
        and all(d == 1 for d in win.dilations)
    )


def toeplitz(
    em: Emitter, inp: ir.Value, grad: ir.Value, win: Window, kernel: list[int]
) -> ir.Value:
    """The depthwise weight gradient ``[C, 1, kh, kw]`` of one example as one GEMM per channel.

    ``dW[c, a, b] = sum_{i, v} x_pad[c, i + a, v] * g[c, i, v - b]`` (stride 1): the input's
    rows shifted by each kernel row (one ``Gather`` of whole rows), and the cotangent's columns
    shifted by each kernel column (a Toeplitz matrix, built by block copies only: the
    cotangent repeated ``kw`` times with one element more per copy, so that copy ``b`` read at
    the width of the rest is shifted by ``b``). The product ``[C, kh, O'*Wp] @ [C, O'*Wp, kw]``
    does the useful work alone, where the banded GEMM does ``Wp / kw`` times as much and the
    classic Conv a matrix-vector product per channel. Measured at batch 1 (onnxruntime at one
    thread, medians of 11; the gradient model w.r.t. the weight, its forward Conv included;
    classic / this / banded): convnext's 7x7 on 56x56x96 9.4 / 5.2 / 11.7 ms, 28x28x192 5.2 /
    3.2 / 5.4, 14x14x384 2.5 / 1.9 / 4.3, 7x7x768 1.5 / 1.6 / 4.8 (left to the classic Conv);
    efficientnet's 5x5 on 112x112x32 8.8 / 4.7 / 12.3, 14x14x240 2.0 / 1.2 / 2.1. In
    convnext-tiny's whole gradient w.r.t. every weight at batch 1 (interleaved, two runs of
    15 and 21 rounds): 4.26 -> 3.95 and 4.06 -> 3.77 times the primal.

    Args:
        em: The emitter.
        inp: The correlation's input ``[1, C, H, W]``.
        grad: The cotangent of its output ``[1, C, O', Wo]``.
        win: The correlation, stride and dilation 1, with static tight pads.
        kernel: The static kernel sizes ``[kh, kw]``.

    Returns:
        The weight gradient.
    """
    kh, kw = kernel
    begin = [b for b in win.begin if isinstance(b, int)]
    end = [e for e in win.end if isinstance(e, int)]
    oh, ow = (o for o in win.size_out if isinstance(o, int))
    wp = ow + kw - 1  # the padded width the windows read (tight pads, stride 1)
    x = _pad_or_crop(em, inp, begin, end)  # [1, C, >= oh + kh - 1, wp]
    rows = np.arange(kh).reshape(kh, 1) + np.arange(oh).reshape(1, oh)  # row i + a
    shifted_x = em.op("Gather", [x, em.const(rows.astype(np.int64))], {"axis": 2})
    left = em.op("Reshape", [shifted_x, em.ints([0, 0, kh, oh * wp])])  # [1, C, kh, O'*Wp]
    # The cotangent zero-padded to rows of Wp and flattened with one zero more (S elements):
    # kw copies of that read in rows of S - 1 put copy b shifted right by b, so that row b
    # holds g[c, i, v - b] at (i, v); where v < b it reads the zero tail of the row (or copy)
    # before.
    g = em.op("Pad", [grad, em.ints([0, 0, 0, 0, 0, 0, 0, kw - 1])])  # [1, C, O', Wp]
    copy = em.op("Pad", [em.op("Reshape", [g, em.ints([0, 0, 1, -1])]), em.ints([0] * 7 + [1])])
    copies = em.op("Expand", [copy, em.ints([1, 1, kw, 1])])  # [1, C, kw, O'*Wp + 1]
    flat = em.op("Reshape", [copies, em.ints([0, 0, -1])])
    flat = em.slice(flat, [0], [kw * oh * wp], [2])
    right = em.op("Reshape", [flat, em.ints([0, 0, kw, oh * wp])])  # [1, C, kw, O'*Wp]
    # onnxruntime folds the Transpose of the last two axes into the MatMul (FusedMatMul).
    product = em.op("MatMul", [left, em.transpose(right, [0, 1, 3, 2])])  # [1, C, kh, kw]
    return em.op("Reshape", [product, em.ints([-1, 1, kh, kw])])


def _pad_or_crop(em: Emitter, x: ir.Value, begin: list[int], end: list[int]) -> ir.Value:
    """``x [N, C, D]`` zero-padded by ``begin``/``end``.

    A negative end of the last axis (input no window reads) is cropped by a Slice, not a
    negative Pad, which onnx's reference evaluator refuses; along the leading axes the row
    Gather picks only rows that windows read.
    """
    grow = [max(e, 0) for e in end]
    if any(begin) or any(grow):
        x = em.op("Pad", [x, em.ints([0, 0, *begin, 0, 0, *grow])])
    if end[-1] < 0:
        x = em.slice(x, [0], [end[-1]], [len(end) + 1])
    return x


def tiles_input(win: Window, group: int) -> bool:
    """Whether the windows tile the input.

    Stride == kernel, no pads, dilation 1 (or a unit kernel), one group, static sizes:
    convnext's stem and downsamples, ViT's patch embedding.
    """
    sizes = [*win.kernel, *win.size_out, *win.begin, *win.end]
    if group != 1 or not all(isinstance(k, int) for k in sizes):
        return False
    return all(
        k == s and b == 0 and isinstance(e, int) and e <= 0 and (d == 1 or k == 1)
        for k, s, d, b, e in zip(
            win.kernel, win.strides, win.dilations, win.begin, win.end, strict=True
        )
    )
