"""Conv weight gradients in the forms onnxruntime's CPU kernels run fastest.

The weight gradient of a correlation (:class:`~onnax.rules._windows.Window`) is
``dW[m, c, q] = sum_{n, o} g[n, m, o] * x_pad[n, group(m) * Cg + c, o * s + q * d]`` for the
input ``x [N, C, D]`` and the cotangent ``g [N, M, O]``. The classic spelling is one Conv of
``x`` (batch and channels exchanged) with ``g`` as the kernel; onnxruntime's Conv then runs
``C`` GEMMs whose inner dimension is the tiny kernel size (a matrix-vector product per channel
for a 1x1 kernel), far from the machine's speed. The forms here, chosen per case by measurement
(``tests/benchmarks/bench_conv_grad.py``: onnxruntime 1.32 at one thread, static shapes,
resnet/mobilenet sizes 56x56x64 ... 7x7x512 at batch 1 and 8, on a shared two-core machine
where single figures scatter by 2x; ratios are the classic form's time over the form's):

* **Pointwise** (every kernel size 1, no begin pad, any stride, any groups): the positions a
  window reads are ``x[..., ::s]`` (a Slice where ``s > 1`` or the tail is unread), and the
  product over the batch and the positions is a batched ``MatMul`` ``g [N, (g,) M, P] @ xᵀ
  [N, (g,) P, C]`` summed over ``N`` (a small ``[N, M, C]``). Stride 1: 1.7-5.6x at batch 8,
  10-60x at batch 1 (the classic Conv is a matrix-vector product per channel there); strided
  1.0-11x. Moving the batch next to the positions first (``[M, N*P] @ [N*P, C]``, one Gemm)
  measured alike, better at 7x7 and worse at 56x56, at the price of two transposes of full
  tensors.
* **Depthwise** (``group == C == M``, kernels of at most 16 elements, static pads, where the banded
  GEMM below does not fit: one example, few rows; strided ones of a batch take the classic Conv,
  see Banded): one ``Mul`` + ``ReduceSum`` over ``(N, O)`` per kernel offset, of the input's
  shifted strided slice with ``g``; nothing of size ``K * x`` is ever materialised. 1.8-2.8x at
  batch 8 from 14x14 up, 1.5-19x at batch 1, 1.0x at 7x7. The im2col below followed by per-channel
  matrix-vector products measured 0.9-1.6x, and 0.7-2.5x as the per-group MatMul. Strided
  (shufflenet's 3x3 stride-2 downsamples at batch 8): alone 0.6-0.9x (the strided Slices are slow),
  yet the classic Conv for them measured equal inside shufflenet's whole gradient (kernel time:
  Slice -9 ms, Conv +11 ms), and 5 % faster in the measurement under Banded; one broadcasting Mul
  over a one-hot im2col ``[N, C, K, P]`` and one ReduceSum measured 0.8-1.1x (``bench_conv_grad.py
  --kinds dw3x3,dw3x3_s2``).
* **Banded** (depthwise, static pads, last stride 1, a batch not statically 1, at least 24
  rows ``N * O'``): :mod:`onnax.rules._conv_grad_depthwise`, one broadcasting MatMul over the
  batch and the rows per channel, the kernel band read by a Gather. convnext's 7x7 at batch 8:
  1.2-2.4x, where the im2col measured 0.24-0.64x (``tests/benchmarks/bench_depthwise_grad.py``);
  other large depthwise kernels take the classic Conv, never the im2col. Small kernels (3x3)
  take it too where it fits: alone it measured 1.1-1.6x against the shifts' 1.2-2.4x, but in
  whole gradients at batch 8 (weights only, interleaved, on a loaded two-core machine) it was
  as fast or faster with 10 nodes instead of about 30 per Conv: mobilenetv3-small 10.2 -> 9.8
  and 9.8 -> 9.1 times the primal, efficientnet-b0 7.6 -> 7.5 and 8.0 -> 7.1, shufflenet 6.2
  -> 6.2 and 6.7 -> 6.3 (2317 -> 1962 nodes). There the strided depthwise Convs of a batch
  take the classic Conv (part of those figures); the shifts stay for one example (shufflenet
  at batch 1: the classic Conv 9 % slower overall) and too few rows.
* **Toeplitz** (depthwise 2-D, a static batch of 1, stride and dilation 1, more than 16 kernel
  elements, at least 64 output positions): :func:`~onnax.rules._conv_grad_depthwise.toeplitz`,
  one GEMM per channel ``[kh, O'*Wp] @ [O'*Wp, kw]`` of the input's rows shifted by each
  kernel row and the cotangent's columns shifted by each kernel column (built by block copies),
  with no wasted product. At batch 1 both the banded GEMM (``Wp / kw`` times the work, thin)
  and the classic Conv (a matrix-vector product per channel) were slow: convnext's 7x7 at
  56x56x96 / 28x28x192 / 14x14x384 1.96x / 1.73x / 1.35x the classic form, where the banded
  GEMM measured 0.79x / 0.79x / 0.61x (``bench_depthwise_grad.py --batches 1``); 7x7 maps stay
  with the classic Conv (0.92x).
* **im2col** (1-D and 3-D static kernels where the output has at least 128 positions per example,
  or run-time spatial sizes): a Conv with a one-hot kernel ``[K, 1, k]`` over every channel on
  its own (``[N*C, 1, D] -> [N*C, K, O]``: the node's own strides, dilations and pads; for 2-D
  Convs a 3-D Conv over an added unit axis, which onnxruntime leaves out of its blocked NCHWc
  layout: there the K output channels were padded to 16 and reordered back, which cost as much
  as the extraction itself) extracts the window elements, and the same batched MatMul per group
  contracts them with ``g`` (``[N, g, Mg, P] @ [N, g, P, Cg*K]``): each group multiplies only
  its own channels. 3x3 stride 1 at batch 8: 1.3-2.1x from 14x14 up; stride 2: 1.2-1.4x at
  56x56 and 28x28; grouped 1.2-2.1x. K strided Slices instead of the one-hot Conv measured
  about the same for stride 1 and slower strided, with K times the nodes. It costs K times
  the input's memory.
* **Channels-major im2col** (2-D kernels, replacing the im2col above there, at any number of
  output positions): ``x`` goes channels first, ``[C, 1, N, H, W]``, and the same one-hot 3-D
  Conv, now with the batch on its unit-kernel axis, writes ``[C, K, N, P]``, which is already
  the ``[C*K, N*P]`` matrix of one GEMM with ``g`` as ``[M, N*P]`` (per group a batched
  ``MatMul`` ``[g, Mg, N*P] @ [g, N*P, Cg*K]``): the batch sums inside the GEMM's inner
  dimension instead of in thin per-example products (``[N, M, C*K]``, 75 MB at 7x7x512 and
  batch 8) reduced afterwards, so 7x7 maps need no classic Conv any more. Measured (these
  graphs alone, onnxruntime at one thread, batch 8, medians of 11 on the loaded machine;
  classic / per-example im2col / channels-major): 7x7x512 38-64 / 52-56 / 21-24 ms;
  14x14x256 -> 512 stride 2: 35-39 / 29-39 / 15-19; 28x28x128: 41-63 / 26-51 / 30-33;
  56x56x64: 57-86 / 31-53 / 36-54 (alike). At batch 1: 7x7x512 11.5 / 14.0 / 4.7 ms.
  resnet18 at batch 8, gradient w.r.t. every weight and the image: 1283 -> 1187 ms (primal
  289 ms). The GEMMs then run at about the forward Convs' speed; transposing ``x`` and ``g``
  costs one pass of each. With at most 64 output channels (an ungrouped Conv) the GEMM is
  ``cols [C*K, N*P] @ gᵀ`` instead (the small result transposed): the big columns are then
  read in place rather than packed: 56x56x64 stride 1 at batch 8 37.8 -> 33.8 ms, at batch 1
  4.9 -> 4.3; resnet's 7x7 stride-2 stem (3 -> 64) 75 -> 60 ms; with 128 channels a tie, from
  256 on slower (7x7x512: 22 -> 33). ``g`` enters that Gemm as the transposed right operand
  ``[M, N*P]`` (the batch and channel axes exchanged, whole planes moving), not channels last
  (a Transpose of every plane): resnet18's stem at batch 8, in the whole gradient (kernel
  profile, one thread): Transpose 7.8 -> 5.4 ms and the product 27.5 -> 21.0 ms; layer1's
  56x56x64 alike. With a static batch of one, ``x`` and ``g`` go channels first by Reshapes,
  which move no data.
* **Windows that tile the input** (stride == kernel, no pads, one group: patch embeddings) with
  more than 16 kernel elements take the classic Conv: ViT's 16x16 patches 1.6x (batch 8) and
  3.7x (batch 1) faster than the im2col, 8x8 1.1x and 3.8x; convnext's 4x4 stem and 2x2
  downsamples keep the im2col (1.6-3.4x the classic). A space-to-depth Reshape + Transpose and
  one batched MatMul measured 1.1-1.8x slower than the im2col there
  (``tests/benchmarks/bench_depthwise_grad.py``).
* **Large ungrouped 2-D kernels** (resnet's 7x7 stems) keep the channels-major im2col, though
  alone the classic Conv ran faster there (its ``Cin`` GEMMs ``[M, N*P] @ [N*P, K]`` are wide
  enough at ``K >= 49``; batch 8 / 1, one thread, medians of 11, im2col / classic: resnet's stem
  3 -> 64 at 224x224 stride 2 29.4 / 22.1 ms and 3.4 / 2.6 ms, 7x7 64 -> 64 at 28x28 29.2 /
  23.9; a tie at 5x5 and 6x6, the im2col faster at 3x3): resnet18's whole gradient gained only
  0.5 % at batch 8 (519.6 -> 516.8 ms), and per-example gradients, vmap of the batch-1
  gradient, ran 14x slower (536 ms -> 7.5 s at batch 8), the classic Conv's cotangent kernel
  becoming one group per example.
* **Otherwise** (1-D and 3-D kernels with fewer output positions, where the GEMM's inner
  dimension ``N * O`` is small and the per-example im2col measured 0.7-1.0x; symbolic kernel
  sizes; a padded 1x1 outside 2-D): the classic Conv with ``g`` as the kernel.

Every form has the kernel's exact shape ``[M, Cg, k]`` (tight end pads) and works with run-time
batch and spatial sizes (Reshapes with ``0``/``-1`` and run-time dims); only the dimensions of
the weight, which are static in practice, are read for the group layout.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.rules._conv_grad_depthwise import (
    banded,
    banded_fits,
    tiles_input,
    toeplitz,
    toeplitz_fits,
)
from onnax.rules._windows import (
    Param,
    Window,
    correlate,
    dims_of,
    int_vector,
    size_add,
    size_mul,
    size_sub,
    spatial_dims,
)

__all__ = ["is_depthwise", "weight_gradient"]

_IM2COL_MIN_POSITIONS = 128
"""Below this many output positions per example the im2col's GEMM is too thin (module doc)."""

_IM2COL_2D_MIN_POSITIONS = 1
"""2-D kernels: the channels-major im2col (its GEMM runs over ``N * P``) wins at 7x7 too."""

_COLUMNS_LEFT_MAX_ROWS = 64
"""Up to this many output channels the channels-major im2col's columns are the left operand."""

_PATCH_IM2COL_MAX_TAPS = 16
"""Windows that tile the input with more elements than this: the classic Conv (module doc)."""

_DEPTHWISE_MAX_TAPS = 16
"""The depthwise form emits three nodes per kernel element: small kernels only."""


def weight_gradient(
    em: Emitter,
    inp: ir.Value,
    inp_like: ir.Value,
    grad: ir.Value,
    weight: ir.Value,
    win: Window,
    group: int,
    rank: int,
) -> ir.Value:
    """``dW [M, Cin/g, kernel]`` of the correlation ``win`` of ``inp`` with cotangent ``grad``.

    Args:
        em: The emitter.
        inp: The correlation's input ``[N, Cin, size_in]``.
        inp_like: A primal value with the shape of ``inp`` (``inp`` itself when primal).
        grad: The cotangent of the correlation's output ``[N, M, size_out]``.
        weight: The primal weight (its static dims give the group layout).
        win: The correlation, with tight end pads.
        group: The number of groups.
        rank: The rank of ``inp``.

    Returns:
        The weight gradient, in the fastest form for the case (module doc).
    """
    form = choose_form(win, weight, inp_like, group, rank)
    kernel = [k for k in win.kernel if isinstance(k, int)]
    if form == "pointwise":
        return _pointwise(em, inp, inp_like, grad, weight, win, group, rank)
    if form == "depthwise":
        return _depthwise_shifts(em, inp, grad, win, kernel, rank)
    if form == "banded":
        return banded(em, inp, grad, win, kernel, rank)
    if form == "toeplitz":
        return toeplitz(em, inp, grad, win, kernel)
    if form == "im2col":
        return _im2col(em, inp, inp_like, grad, weight, win, kernel, group, rank)
    return _classic(em, inp, inp_like, grad, win, group, rank)


def choose_form(win: Window, weight: ir.Value, inp_like: ir.Value, group: int, rank: int) -> str:
    """The form of the weight gradient (module doc).

    One of ``pointwise``, ``depthwise``, ``banded``, ``toeplitz``, ``im2col`` or ``classic``.
    The benchmark patches it to time the classic form in the same process.
    """
    kernel = [k for k in win.kernel if isinstance(k, int)]
    if len(kernel) < rank - 2:
        return "classic"  # a symbolic kernel size
    begin = [b for b in win.begin if isinstance(b, int)]
    if all(k == 1 for k in kernel) and begin == [0] * (rank - 2):
        return "pointwise"
    if tiles_input(win, group) and int(np.prod(kernel)) > _PATCH_IM2COL_MAX_TAPS:
        return "classic"
    if is_depthwise(weight, inp_like, group) and _static_pads(win):
        if banded_fits(win, inp_like):
            return "banded"
        if toeplitz_fits(win, inp_like, kernel, rank):
            return "toeplitz"
        # Small kernels of one example or of few rows keep the shifts (shufflenet at batch 1:
        # the classic Conv 9 % slower overall); strided ones of a batch take the classic Conv
        # (the shifts' strided Slices are slow). Larger kernels: the im2col measured slowest of
        # all (bench_depthwise_grad.py).
        small = int(np.prod(kernel)) <= _DEPTHWISE_MAX_TAPS
        if small and (win.strides[-1] == 1 or _single_example(inp_like)):
            return "depthwise"
        return "classic"
    out = [o for o in win.size_out if isinstance(o, int)]
    least = _IM2COL_2D_MIN_POSITIONS if rank == 4 else _IM2COL_MIN_POSITIONS
    if len(out) < rank - 2 or int(np.prod(out)) >= least:
        return "im2col"
    return "classic"


def _static_pads(win: Window) -> bool:
    return all(isinstance(p, int) for p in [*win.begin, *win.end, *win.size_out])


def is_depthwise(weight: ir.Value, inp_like: ir.Value, group: int) -> bool:
    """One input and one output channel per group, statically."""
    w = weight.shape.dims if weight.shape is not None else None
    x = inp_like.shape.dims if inp_like.shape is not None else None
    if w is None or x is None or len(x) < 2:
        return False
    return group > 1 and w[0] == group and w[1] == 1 and x[1] == group


def _group_dims(em: Emitter, weight: ir.Value, group: int) -> tuple[Param, Param]:
    """``(M / g, Cin / g)`` from the weight ``[M, Cin/g, k]``."""
    m, cg = dims_of(em, weight, [0, 1])
    mg = m // group if isinstance(m, int) else em.op("Div", [m, em.ints([group])])
    return mg, cg


def _contract(
    em: Emitter,
    cols: ir.Value,
    layout: list[Param],
    grad: ir.Value,
    weight: ir.Value,
    group: int,
    tail: list[int],
    single: bool,
) -> ir.Value:
    """``sum_n g[n] @ cols[n]ᵀ`` per group, reshaped to ``[M, Cg, *tail]``.

    ``cols`` is reshaped to ``layout``: ``[N, Cg * T, P]`` (one group) or ``[N, g, Cg * T,
    P]``, with ``T = prod(tail)`` columns per input channel; ``grad`` is ``[N, M, O]``.
    ``single``: the batch is statically 1.
    """
    mg, cg = _group_dims(em, weight, group)
    if single:
        # One example: the sum over the batch has one term, so no ReduceSum over a unit axis;
        # one group is one Gemm, the transposed right operand read in place.
        width = size_mul(em, cg, int(np.prod(tail)))
        if group == 1:
            rows = em.op("Reshape", [grad, int_vector(em, [mg, -1])])  # [M, P]
            columns = em.op("Reshape", [cols, int_vector(em, [width, -1])])  # [Cg*T, P]
            product = em.op("Gemm", [rows, columns], {"transB": 1})  # [M, Cg*T]
        else:
            rows = em.op("Reshape", [grad, int_vector(em, [group, mg, -1])])  # [g, Mg, P]
            columns = em.op("Reshape", [cols, int_vector(em, [group, width, -1])])
            # onnxruntime fuses the Transpose of the last two axes into the MatMul.
            product = em.op("MatMul", [rows, em.transpose(columns, [0, 2, 1])])
        return em.op("Reshape", [product, int_vector(em, [-1, cg, *tail])])
    columns = em.op("Reshape", [cols, int_vector(em, layout)])
    if group == 1:
        rows = em.op("Reshape", [grad, em.ints([0, 0, -1])])  # [N, M, P]
    else:
        rows = em.op("Reshape", [grad, int_vector(em, [0, group, mg, -1])])  # [N, g, Mg, P]
    last = 3 if group == 1 else 4
    swap = [*range(last - 2), last - 1, last - 2]
    # onnxruntime fuses the Transpose of the last two axes into the MatMul (FusedMatMul).
    product = em.op("MatMul", [rows, em.transpose(columns, swap)])  # [N, (g,) Mg, Cg*T]
    summed = em.reduce_sum(product, [0], keepdims=False)
    return em.op("Reshape", [summed, int_vector(em, [-1, cg, *tail])])


def _pointwise(
    em: Emitter,
    inp: ir.Value,
    inp_like: ir.Value,
    grad: ir.Value,
    weight: ir.Value,
    win: Window,
    group: int,
    rank: int,
) -> ir.Value:
    """1x1 kernels: a batched MatMul over the positions the windows read (module doc)."""
    n = rank - 2
    x = inp
    cropping = all(isinstance(e, int) and e <= 0 for e in win.end)
    if cropping and (any(s != 1 for s in win.strides) or any(win.end)):
        stops = [
            size_add(em, size_mul(em, size_sub(em, o, 1), s), 1)
            for o, s in zip(win.size_out, win.strides, strict=True)
        ]
        x = em.slice(x, [0] * n, int_vector(em, stops), list(range(2, rank)), win.strides)
    elif not cropping:
        # A window may reach past the input's end (a ConvTranspose whose pads crop its
        # output; sizes only known at run time): the tight end pad, zeros or a crop, makes
        # the length exactly (size_out - 1) * s + 1, so the strided Slice reads size_out.
        x = em.op("Pad", [x, int_vector(em, [0, 0, *[0] * n, 0, 0, *win.end])])
        if any(s != 1 for s in win.strides):
            x = em.slice(x, [0] * n, [2**62] * n, list(range(2, rank)), win.strides)
    if group == 1:
        layout: list[Param] = [0, 0, -1]  # [N, C, P]
    else:
        layout = [0, group, _group_dims(em, weight, group)[1], -1]  # [N, g, Cg, P]
    return _contract(em, x, layout, grad, weight, group, [1] * n, _single_example(inp_like))


def _im2col(
    em: Emitter,
    inp: ir.Value,
    inp_like: ir.Value,
    grad: ir.Value,
    weight: ir.Value,
    win: Window,
    kernel: list[int],
    group: int,
    rank: int,
) -> ir.Value:
    """One-hot Conv im2col and a batched MatMul per group (module doc)."""
    if rank == 4:
        return _im2col_channels_major(em, inp, inp_like, grad, weight, win, kernel, group)
    size = int(np.prod(kernel))
    dtype = weight.dtype or inp_like.dtype
    assert dtype is not None
    spatial = spatial_dims(em, inp_like, rank)
    one_hot = np.eye(size, dtype=dtype.numpy()).reshape(size, 1, *kernel)
    single = em.op("Reshape", [inp, int_vector(em, [-1, 1, *spatial])])  # [N*C, 1, D]
    cols = correlate(em, single, em.const(one_hot), win, 1, rank)  # [N*C, K, O]
    n, c = dims_of(em, inp_like, [0, 1])
    if group == 1:
        layout: list[Param] = [n, size_mul(em, c, size), -1]  # [N, C*K, P]
    else:
        cg = _group_dims(em, weight, group)[1]
        layout = [n, group, size_mul(em, cg, size), -1]  # [N, g, Cg*K, P]
    return _contract(em, cols, layout, grad, weight, group, list(kernel), _single_example(inp_like))


def _im2col_channels_major(
    em: Emitter,
    inp: ir.Value,
    inp_like: ir.Value,
    grad: ir.Value,
    weight: ir.Value,
    win: Window,
    kernel: list[int],
    group: int,
) -> ir.Value:
    """2-D kernels: the im2col of ``x`` channels first, and one GEMM over ``N * P`` (module doc).

    ``x [N, C, H, W]`` goes channels first, ``[C, 1, N, H, W]``, so that the one-hot 3-D
    Conv (the batch on its unit-kernel axis) writes the columns ``[C, K, N, P]``, which are
    already the ``[C * K, N * P]`` matrix the GEMM reads; with ``g`` as ``[M, N * P]`` the
    batch joins the GEMM's inner dimension (no thin per-example products summed afterwards).
    With few output channels the product is ``cols @ gᵀ`` instead, transposed after.
    """
    size = int(np.prod(kernel))
    dtype = weight.dtype or inp_like.dtype
    assert dtype is not None
    one_hot = np.eye(size, dtype=dtype.numpy()).reshape(size, 1, 1, *kernel)
    single = _single_example(inp_like)
    if single:
        # One example: channels first is a Reshape (no copy in onnxruntime), not a Transpose.
        target = int_vector(em, [-1, 1, 1, *spatial_dims(em, inp_like, 4)])
        by_channel = em.op("Reshape", [inp, target])  # [C, 1, 1, H, W]
    else:
        by_channel = em.unsqueeze(em.transpose(inp, [1, 0, 2, 3]), [1])  # [C, 1, N, H, W]
    # The batch axis: kernel 1, stride 1, no pads; its sizes only describe the window.
    lifted = Window(
        [1, *win.size_in],
        [1, *win.size_out],
        [1, *win.kernel],
        [1, *win.strides],
        [1, *win.dilations],
        [0, *win.begin],
        [0, *win.end],
    )
    cols = correlate(em, by_channel, em.const(one_hot), lifted, 1, 5)  # [C, K, N, Ho, Wo]
    mg, cg = _group_dims(em, weight, group)
    # ``g`` as rows ``[M, N*P]``: batch and channels exchanged (whole planes move), or with one
    # example a Reshape.
    rows = em.transpose(grad, [1, 0, 2, 3]) if not single else grad  # [M, N, Ho, Wo]
    if group == 1:
        columns = em.op("Reshape", [cols, int_vector(em, [size_mul(em, cg, size), -1])])
        matrix = em.op("Reshape", [rows, int_vector(em, [mg if single else 0, -1])])  # [M, N*P]
        if isinstance(mg, int) and mg <= _COLUMNS_LEFT_MAX_ROWS:
            # Few output channels: the big columns as the GEMM's left operand, read in place,
            # and ``g`` as the small transposed right one, which the GEMM packs. (``g``
            # channels last as a plain right operand needed a Transpose of every plane:
            # resnet's stem at batch 8 7.3 ms there against 2 ms for the rows.) The small
            # ``[C*K, M]`` result goes to ``[M, C, k]`` through a 4-D Transpose: a 2-D one right
            # after the Gemm, onnxruntime folds into it by swapping the operands, the order
            # measured 1.2-1.5x slower here.
            product = em.op("Gemm", [columns, matrix], {"transB": 1})  # [C*K, M]
            split = em.op("Reshape", [product, int_vector(em, [cg, *kernel, -1])])
            return em.transpose(split, [3, 0, 1, 2])
        else:
            product = em.op("Gemm", [matrix, columns], {"transB": 1})  # [M, C*K]
    else:
        columns = em.op(
            "Reshape", [cols, int_vector(em, [group, size_mul(em, cg, size), -1])]
        )  # [g, Cg*K, N*P]
        matrix = em.op("Reshape", [rows, int_vector(em, [group, mg, -1])])  # [g, Mg, N*P]
        # onnxruntime fuses the Transpose of the last two axes into the MatMul (FusedMatMul).
        product = em.op("MatMul", [matrix, em.transpose(columns, [0, 2, 1])])  # [g, Mg, Cg*K]
    return em.op("Reshape", [product, int_vector(em, [-1, cg, *kernel])])


def _single_example(inp_like: ir.Value) -> bool:
    """Whether the batch of ``inp_like`` is statically 1."""
    dims = inp_like.shape.dims if inp_like.shape is not None else None
    return dims is not None and len(dims) > 0 and dims[0] == 1


def _depthwise_shifts(
    em: Emitter,
    inp: ir.Value,
    grad: ir.Value,
    win: Window,
    kernel: list[int],
    rank: int,
) -> ir.Value:
    """Depthwise: ``sum_{n,o} g * x_q`` per kernel offset ``q`` (module doc)."""
    begin = [b for b in win.begin if isinstance(b, int)]
    end = [e for e in win.end if isinstance(e, int)]
    out = [o for o in win.size_out if isinstance(o, int)]
    x = inp
    if any(begin) or any(end):
        # Negative end pads (trailing input no window reads) crop.
        x = em.op("Pad", [x, em.ints([0, 0, *begin, 0, 0, *end])])
    axes = list(range(2, rank))
    taps: list[ir.Value] = []
    for q in itertools.product(*(range(k) for k in kernel)):
        starts = [qi * d for qi, d in zip(q, win.dilations, strict=True)]
        stops = [a + (o - 1) * s + 1 for a, o, s in zip(starts, out, win.strides, strict=True)]
        shifted = em.slice(x, starts, stops, axes, win.strides)  # [N, C, O]
        prod = em.op("Mul", [grad, shifted])
        taps.append(em.reduce_sum(prod, [0, *axes], keepdims=False))  # [C]
    stacked = em.op("Concat", taps, {"axis": 0}) if len(taps) > 1 else taps[0]  # [K*C]
    by_tap = em.op("Reshape", [stacked, em.ints([len(taps), -1])])  # [K, C]
    return em.op("Reshape", [em.transpose(by_tap, [1, 0]), em.ints([-1, 1, *kernel])])


def _classic(
    em: Emitter,
    inp: ir.Value,
    inp_like: ir.Value,
    grad: ir.Value,
    win: Window,
    group: int,
    rank: int,
) -> ir.Value:
    """One Conv of ``inp`` (batch and channels exchanged) with ``grad`` as the kernel.

    ``sum_{n,o} grad[n, m, o] * inp_padded[n, group(m) * Cg + c, o * s + q * d]``: ``inp``
    with its batch and channel axes exchanged (channels of group ``j`` batched as
    ``[Cin/g, g * N]``) and ``grad`` (likewise ``[Cout, N, size_out]``) as the kernel, with
    ``group = g`` and the stride and dilation swapped. With tight pads its spatial size is
    exactly the kernel's.
    """
    swap = [1, 0, *range(2, rank)]
    if group == 1:
        xt = em.transpose(inp, swap)  # [Cin, N, D]
    else:
        lead, spatial = dims_of(em, inp_like, [0]), spatial_dims(em, inp_like, rank)
        split = em.op("Reshape", [inp, int_vector(em, [*lead, group, -1, *spatial])])
        grouped = em.transpose(split, [2, 1, 0, *range(3, rank + 1)])  # [Cg, g, N, D]
        xt = em.op("Reshape", [grouped, int_vector(em, [0, -1, *spatial])])  # [Cg, g*N, D]
    kernel = em.transpose(grad, swap)  # [Cout, N, O]
    out = correlate(em, xt, kernel, win.swapped(), group, rank)  # [Cg, Cout, k]
    return em.transpose(out, swap)
