"""Convolutions: Conv and ConvTranspose.

Both operators are bilinear in the data ``X`` and the weight ``W`` and affine in the bias ``B``,
so each jvp is the operator applied with one operand replaced by its tangent (the bias tangent
rides along in the ``X`` term, or is broadcast to the output on its own), and the transposes are
the classic convolution backward passes, written with the two operators themselves:

* A Conv is a *correlation*: output position ``o`` reads the (zero-)padded input at
  ``o * s + q * d - b`` for the kernel offsets ``q`` (stride ``s``, dilation ``d``, begin pad
  ``b``). Its transpose with respect to ``X`` is a ``ConvTranspose`` of the cotangent with the
  same weight (Conv's weight layout ``[M, C/g, k]`` is ConvTranspose's ``[C_in, C_out/g, k]``
  with the roles of the channel counts swapped; with unit strides and static pads, a Conv with
  the weight flipped along the spatial axes instead, which onnxruntime runs 1.1-2.1x faster;
  for strides above 1 the ConvTranspose stays: zeros inserted between the cotangent's
  elements and a stride-1 flipped Conv measured 3-9x slower, ``bench_conv_grad.py``), and
  with respect to ``W`` ``sum_{n,o} ct[n, m, o] x_pad[n, c, o s + q d]``, emitted by
  :mod:`onnax.rules._conv_grad` in the form onnxruntime runs fastest for the kind of Conv
  (a MatMul for 1x1 kernels, Mul + ReduceSum per kernel offset for depthwise ones, for other
  2-D kernels an im2col channels first and one GEMM over the batch and the positions, for
  1-D and 3-D ones with large outputs an im2col + MatMul per example, otherwise a Conv of the
  input with the cotangent as kernel). The bias gets the cotangent summed over the batch and spatial axes.
* A ConvTranspose is the transpose of a correlation from its output to its input, so its
  transposes are a Conv of the cotangent with the same weight (for ``X``) and the same weight
  gradient with input and cotangent exchanging roles (for ``W``).

Everything is derived from one description of the correlation along each spatial axis, a
:class:`~onnax.rules._windows.Window` with tight end pads, which :mod:`onnax.rules._windows`
computes from the attributes (``auto_pad``, ``output_shape``, ``output_padding`` included) and
the input shapes, static or symbolic.

Batch rules (vmap) fold the batch axis into ``N`` when only ``X`` is batched. When both ``X``
and the weight are batched and the batch size ``B`` is static, the examples become groups: ``X``
folded to ``[N, B*C, D]``, the weight to ``[B*M, Cg, k]`` and one operator with ``group = B * g``
(per-example gradients, where the weight gradient of a batch-1 depthwise Conv is the classic
Conv with the cotangent as kernel, both batched: convnext-tiny's at batch 8 ran 9.8x its primal
through the im2col below, 4.7x with groups). With a run-time batch size, which an attribute
cannot hold, such a depthwise Conv of one example whose kernel is at least its output is the
banded GEMM of :mod:`onnax.rules._conv_grad_depthwise` over the ``B*C`` channels (that model:
5.1x). Any other batched weight (or an unbatched ``X``) uses an explicit im2col: a Conv with a
one-hot kernel ``[K, 1, k]`` (K = prod(k)) extracts the K window elements of every position of
every channel (``X`` folded to ``[B*N*C, 1, D]``, so the channel count need not be static), a
broadcasting ``MatMul`` contracts them with each example's weight per group, and a Reshape
restores the layout. Where the kernel has more offsets than the output has positions (unit strides, static
output: the weight-gradient Conv of a batch-1 gradient, whose kernel is a cotangent), the same
window elements are extracted by output offset instead, a one-hot kernel of the output's size
on the padded input. ConvTranspose with a batched weight is the mirror image: a MatMul produces the K
contributions of every input position, and a ConvTranspose with the one-hot kernel (col2im)
scatters them with the node's own geometry. This costs K times the memory of the input, but
neither loops nor a static batch size. A batched bias is added after the operator.

Onnxruntime implements Conv and ConvTranspose for float only (no double kernels); the rules emit
the same operators for both types.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import int_attr, ints_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._conv_grad import is_depthwise, weight_gradient
from onnax.rules._conv_grad_depthwise import banded
from onnax.rules._patterns import attributes_of
from onnax.rules._windows import (
    Param,
    Window,
    conv_transpose_window,
    conv_window,
    correlate,
    correlate_adjoint,
    dims_of,
    example_dims,
    fold_batch,
    int_vector,
    rank_of,
    shape_tail,
    size_floordiv,
    size_mul,
    size_vector,
    spatial_dims,
    unfold_batch,
)

__all__: list[str] = []


# ------------------------------------------------------------------------ backward passes
def _bias_broadcast(em: Emitter, tb: ir.Value, y: ir.Value, rank: int) -> ir.Value:
    """A bias tangent ``[M]`` broadcast to the output ``[N, M, ...]``."""
    return em.op("Expand", [em.unsqueeze(tb, [0, *range(2, rank)]), em.shape(y)])


def _inputs(node: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value | None]:
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    b = node.inputs[2] if len(node.inputs) > 2 else None
    return x, w, b


def _bias_cotangent(em: Emitter, ct: ir.Value, rank: int) -> ir.Value:
    return em.reduce_sum(ct, [0, *range(2, rank)], keepdims=False)


def _from_constants(value: ir.Value, budget: int = 32) -> bool:
    """Whether ``value`` is computed from constants and initializers only.

    Within ``budget`` producers; the runtime then folds it once when the session loads.
    """
    seen: set[ir.Value] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if len(seen) > budget:
            return False
        if v.const_value is not None or v.is_initializer():
            continue
        node = v.producer()
        if (
            node is None
            or node.op_type in ("If", "Loop", "Scan")
            or any(node.op_type.startswith(r) for r in ("Random", "Bernoulli", "Multinomial"))
        ):
            return False
        stack.extend(i for i in node.inputs if i is not None)
    return True


def _fold_channel_scale(em: Emitter, ct: ir.Value, w: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``(a, w * c)`` when ``ct = a * c`` with ``c`` one constant factor per output channel.

    Reverse mode through ``Conv -> BatchNormalization`` (inference) scales the cotangent by
    the normalisation's per-channel factor before the Conv's transpose; the factor moves into
    the weight (``sum_m a[m] c[m] w[m] = sum_m a[m] (c[m] w[m])``), which onnxruntime folds
    once when the session loads, and a pass over the whole cotangent disappears (it fuses a
    ``Mul`` after a Conv itself, not before). Otherwise ``(ct, w)``.
    """
    mul = ct.producer()
    w_dims = w.shape.dims if w.shape is not None else None
    if ct.uses():
        # Something already reads the scaled cotangent (the weight's gradient: the linear
        # graph has one Conv per tangent, transposed separately), so it is computed anyway
        # and folding would only add a Reshape and a Mul.
        return ct, w
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") or not w_dims:
        return ct, w
    channels = w_dims[0]
    if not isinstance(channels, int):
        return ct, w
    for i in (0, 1):
        c, a = mul.inputs[i], mul.inputs[1 - i]
        if c is None or a is None or c.shape is None:
            continue
        dims = list(c.shape.dims)
        if len(dims) == len(w_dims):
            dims = dims[1:] if dims[:1] == [1] else []
        if len(dims) != len(w_dims) - 1 or dims[0] != channels or any(d != 1 for d in dims[1:]):
            continue
        if not (_from_constants(c) and _from_constants(w)):
            continue
        factor = em.op("Reshape", [c, em.ints([channels, *[1] * (len(w_dims) - 1)])])
        weight = em.op("Mul", [w, factor])
        if w.dtype is not None and w.shape is not None:
            weight.dtype, weight.shape = w.dtype, w.shape.copy()
        return a, weight
    return ct, w


# ----------------------------------------------------------------- Conv and ConvTranspose
conv = OpRules("Conv")
conv_transpose = OpRules("ConvTranspose")
# Both are bilinear in (X, W) with the same jvp and batch rules; their transposes differ.


@conv.jvp
@conv_transpose.jvp
def _conv_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, w, b = _inputs(node)
    tx, tw = tangents[0], tangents[1]
    tb = tangents[2] if len(tangents) > 2 and b is not None else None
    attrs = attributes_of(node)
    terms: list[ir.Value] = []
    # Conv(tX, W, tB) is linear in (tX, tB) jointly, and Conv(X, tW, tB) in (tW, tB): the bias
    # tangent rides along in the first term there is.
    if tx is not None:
        terms.append(em.op(node.op_type, [tx, w] + ([tb] if tb is not None else []), attrs))
        tb = None
    if tw is not None:
        terms.append(em.op(node.op_type, [x, tw] + ([tb] if tb is not None else []), attrs))
        tb = None
    if tb is not None:
        terms.append(_bias_broadcast(em, tb, node.outputs[0], rank_of(node, x, "input 'X'")))
    # Each term has exactly the output's shape, but inference may give two terms unrelated
    # symbols (a symbolic kernel size), and transposing their Add would then need run-time
    # shapes of tangents. Inference keeps shapes that are already set.
    y = node.outputs[0]
    for term in terms:
        if y.shape is not None:
            term.shape = y.shape.copy()
        if y.type is not None:
            term.type = y.type
    return [em.add_all(terms)]


@conv.transpose
def _conv_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    results: list[ir.Value | None] = [None] * len(node.inputs)
    if ct is None:
        return results
    x, w, _ = _inputs(node)
    rank = rank_of(node, x, "input 'X'")
    group = int_attr(node, "group", 1)
    if linear[0] or linear[1]:
        win = conv_window(em, node)
        if linear[0]:
            scaled, weight = _fold_channel_scale(em, ct, w)
            results[0] = correlate_adjoint(em, scaled, weight, win, group, rank)
        if linear[1]:
            results[1] = weight_gradient(em, x, x, ct, w, win, group, rank)
    if len(linear) > 2 and linear[2]:
        results[2] = _bias_cotangent(em, ct, rank)
    return results


@conv_transpose.transpose
def _conv_transpose_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    results: list[ir.Value | None] = [None] * len(node.inputs)
    if ct is None:
        return results
    x, w, _ = _inputs(node)
    rank = rank_of(node, x, "input 'X'")
    group = int_attr(node, "group", 1)
    if linear[0] or linear[1]:
        win = conv_transpose_window(em, node)
        if linear[0]:
            results[0] = correlate(em, ct, w, win, group, rank)
        if linear[1]:
            results[1] = weight_gradient(em, ct, node.outputs[0], x, w, win, group, rank)
    if len(linear) > 2 and linear[2]:
        results[2] = _bias_cotangent(em, ct, rank)
    return results


@conv.batch
@conv_transpose.batch
def _conv_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Conv/ConvTranspose: fold the batch into N, or im2col for a batched weight (module doc)."""
    x, w = args[0], args[1]
    assert x is not None and w is not None
    b = args[2] if len(args) > 2 else None
    fx, fw = batched[0], batched[1]
    fb = len(batched) > 2 and batched[2] and b is not None
    x0, w0, y0 = node.inputs[0], node.inputs[1], node.outputs[0]
    assert x0 is not None and w0 is not None
    rank = bx.rank(x0)
    attrs = attributes_of(node)
    shared_bias = b if b is not None and not fb else None
    if not fw:
        if fx:
            folded = fold_batch(bx, x, x0, rank)
            inputs = [folded, w] + ([shared_bias] if shared_bias is not None else [])
            y = unfold_batch(bx, bx.op(node.op_type, inputs, attrs), y0)
        else:
            y = bx.op(node.op_type, [x, w], attrs)  # only the bias is batched
        if fb:
            assert b is not None
            y = _add_bias(bx, y, b, True, rank)
        return [y], [True]
    if fx and isinstance(bx.batch_dim, int):
        y = _examples_as_groups(bx, node, x, w, rank, bx.batch_dim)
    elif fx and (band := _banded_kernel_window(bx, node, rank)) is not None:
        y = _depthwise_batched_kernel(bx, x, w, band, rank)
    elif node.op_type == "Conv":
        y = _conv_batched_weight(bx, node, x, fx, w, rank)
    else:
        y = _conv_transpose_batched_weight(bx, node, x, fx, w, rank)
    if b is not None:
        y = _add_bias(bx, y, b, fb, rank)
    return [y], [True]


# ------------------------------------------------------ batched weights: examples as groups
def _examples_as_groups(
    bx: Batcher, node: ir.Node, x: ir.Value, w: ir.Value, rank: int, batch: int
) -> ir.Value:
    """Conv/ConvTranspose of a batched ``X`` with a batched weight, the batch ``B`` static.

    The examples become groups (module doc): ``X [B, N, C, D]`` goes to ``[N, B*C, D]`` (a
    Reshape when ``N`` is statically 1, as in a per-example gradient), the weight ``[B, M, Cg,
    k]`` (ConvTranspose: ``[B, C, Mg, k]``) to ``[B*M, Cg, k]`` (a Reshape), and one operator
    with ``group = B * g`` gives ``[N, B*M, O]``, whose ``B`` goes back in front.
    """
    x0, w0 = node.inputs[0], node.inputs[1]
    assert x0 is not None and w0 is not None
    n = example_dims(bx, x, x0, [0])[0]
    one = isinstance(n, int) and n == 1
    spatial = example_dims(bx, x, x0, range(2, rank))
    if one:  # [B, 1, C, D] is [1, B*C, D] already
        grouped = bx.op("Reshape", [x, int_vector(bx, [1, -1, *spatial])])
    else:
        moved = bx.transpose(x, [1, 0, *range(2, rank + 1)])  # [N, B, C, D]
        grouped = bx.op("Reshape", [moved, int_vector(bx, [0, -1, *spatial])])
    kernel = bx.op("Reshape", [w, int_vector(bx, [-1, *example_dims(bx, w, w0, range(1, rank))])])
    attrs = attributes_of(node, group=batch * int_attr(node, "group", 1))
    y = bx.op(node.op_type, [grouped, kernel], attrs)  # [N, B*M, O]
    tail = shape_tail(bx, y, 2)
    if one:  # [1, B*M, O] is [B, 1, M, O]
        return bx.op("Reshape", [y, bx.op("Concat", [bx.ints([batch, 1, -1]), tail], {"axis": 0})])
    split = bx.op("Reshape", [y, bx.op("Concat", [bx.ints([0, batch, -1]), tail], {"axis": 0})])
    return bx.transpose(split, [1, 0, *range(2, rank + 1)])  # [B, N, M, O]


def _banded_kernel_window(bx: Batcher, node: ir.Node, rank: int) -> Window | None:
    """The banded GEMM's window for a depthwise Conv with a kernel at least its output, or None.

    The Conv has one example: the classic weight-gradient Conv of a batch-1 gradient. Such a
    Conv, ``out[c, p] = sum_k w[c, k] x_pad[c, p + k]``, is the weight gradient that
    :func:`~onnax.rules._conv_grad_depthwise.banded` computes, with the roles of kernel and
    output exchanged: ``w`` is its cotangent, the output positions its kernel offsets.
    """
    x0, w0 = node.inputs[0], node.inputs[1]
    if node.op_type != "Conv" or x0 is None or w0 is None or x0.shape is None:
        return None
    if x0.shape.dims[0] != 1 or not is_depthwise(w0, x0, int_attr(node, "group", 1)):
        return None
    n = rank - 2
    units = [*(ints_attr(node, "strides") or [1] * n), *(ints_attr(node, "dilations") or [1] * n)]
    if any(u != 1 for u in units):
        return None
    win = conv_window(bx, node)
    sizes = [*win.size_in, *win.size_out, *win.kernel, *win.begin, *win.end]
    if not all(isinstance(p, int) for p in sizes):
        return None
    if int(np.prod(win.size_out)) > int(np.prod(win.kernel)):  # type: ignore[arg-type]
        return None  # a kernel smaller than the output: the im2col
    # Unit strides and dilations, so exchanging them is a no-op.
    return Window(
        win.size_in, win.kernel, win.size_out, win.strides, win.dilations, win.begin, win.end
    )


def _depthwise_batched_kernel(
    bx: Batcher, x: ir.Value, w: ir.Value, win: Window, rank: int
) -> ir.Value:
    """A depthwise Conv of batched ``X`` and kernel as one banded GEMM over ``B*C`` channels.

    ``X [B, 1, C, D]``, the kernel ``[B, C, 1, K]`` at least the output; the batch size may
    be known only at run time. The im2col by output offset ran convnext-tiny's 7x7 depthwise
    weight gradients of a batch-1 gradient, vmapped over 8 examples, at 560 ms a node (a
    ``[49, 768, 3136]`` window tensor and matrix-vector products).
    """
    spatial_in = [int(p) for p in win.size_in]  # type: ignore[arg-type]
    spatial_k = [int(p) for p in win.size_out]  # type: ignore[arg-type]
    out = [int(p) for p in win.kernel]  # type: ignore[arg-type]
    channels = bx.op("Reshape", [x, bx.ints([1, -1, *spatial_in])])  # [1, B*C, D]
    kernel = bx.op("Reshape", [w, bx.ints([1, -1, *spatial_k])])  # [1, B*C, K]
    y = banded(bx, channels, kernel, win, out, rank)  # [B*C, 1, O]
    batch = bx.batch_size
    target = bx.op("Concat", [batch, bx.ints([1, -1, *out])], {"axis": 0})
    return bx.op("Reshape", [y, target])  # [B, 1, C, O]


# --------------------------------------------------------------- batched weights (im2col)
def _static_kernel(node: ir.Node, w: ir.Value, n: int) -> list[int]:
    shape = ints_attr(node, "kernel_shape")
    if shape is not None:
        return list(shape[-n:])
    dims = w.shape.dims[2:] if w.shape is not None else None
    if dims is None or not all(isinstance(d, int) for d in dims):
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} ({node_label(node)}): batching its weight "
            f"{w.name!r} needs the kernel's spatial size, which is not static (shape "
            f"{w.shape}). Remedy: set the kernel_shape attribute, or give the weight a static "
            "spatial shape, or give the weight in_axes None."
        )
    return [d for d in dims if isinstance(d, int)]


def _one_hot_kernel(kernel: Sequence[int], dtype: ir.DataType) -> np.ndarray:
    size = int(np.prod(kernel))
    return np.eye(size, dtype=dtype.numpy()).reshape(size, 1, *kernel)


def _by_output_offset(node: ir.Node, kernel: Sequence[int], n: int) -> list[int] | None:
    """The static output size of a Conv whose kernel outnumbers its output positions, or None.

    Only for unit strides, no dilation and explicit (or no) pads. A one-hot im2col costs a Conv of K = prod(kernel) taps: for the weight-gradient Conv of
    a batch-1 gradient (the kernel a 56x56 cotangent, the output the 7x7 weight) that was
    3136 taps, and vmap of such a gradient ran 60x its primal.
    """
    if any(s != 1 for s in ints_attr(node, "strides") or [1] * n):
        return None
    if any(d != 1 for d in ints_attr(node, "dilations") or [1] * n):
        return None
    if node.attributes.get_string("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    y0 = node.outputs[0]
    dims = y0.shape.dims[2:] if y0.shape is not None else None
    if dims is None or len(dims) != n or not all(isinstance(d, int) for d in dims):
        return None
    out = [int(d) for d in dims]  # type: ignore[arg-type]
    return out if int(np.prod(out)) < int(np.prod(kernel)) else None


def _geometry_attrs(node: ir.Node) -> dict[str, object]:
    """The node's attributes without the channel structure (group)."""
    return attributes_of(node, group=None)


def _add_bias(bx: Batcher, y: ir.Value, b: ir.Value, b_batched: bool, rank: int) -> ir.Value:
    """``y`` (``[B, N, M, ...]``, or unbatched) plus a bias ``[M]`` or batched ``[B, M]``."""
    if b_batched:
        bias = bx.unsqueeze(b, [1, *range(3, rank + 1)])  # [B, 1, M, 1...]
    else:
        bias = bx.unsqueeze(b, [0, *range(2, rank)])  # [1, M, 1...]
    return bx.op("Add", [y, bias])


def _conv_batched_weight(
    bx: Batcher, node: ir.Node, x: ir.Value, fx: bool, w: ir.Value, rank: int
) -> ir.Value:
    """Conv with a batched weight ``[B, M, Cg, k]`` as im2col + MatMul (see module doc)."""
    x0, w0 = node.inputs[0], node.inputs[1]
    assert x0 is not None and w0 is not None
    n = rank - 2
    g = int_attr(node, "group", 1)
    kernel = _static_kernel(node, w0, n)
    dtype = w0.dtype or x0.dtype
    assert dtype is not None
    # Every channel of every example on its own: [(B)*N*C, 1, D] -> [(B)*N*C, K, O].
    spatial = example_dims(bx, x, x0, range(2, rank)) if fx else spatial_dims(bx, x, rank)
    single = bx.op("Reshape", [x, int_vector(bx, [-1, 1, *spatial])])
    by_output = _by_output_offset(node, kernel, n)
    if by_output is None:
        attrs = {**_geometry_attrs(node), "kernel_shape": kernel}
        patches = bx.op("Conv", [single, bx.const(_one_hot_kernel(kernel, dtype))], attrs)
        out_spatial = shape_tail(bx, patches, 2)
        flat = bx.op("Reshape", [patches, bx.ints([0, 0, -1])])  # [BNC, K, Of]
        flat = bx.transpose(flat, [2, 0, 1])  # [Of, BNC, K]
    else:
        # A kernel larger than its output (the classic weight-gradient Conv, whose kernel is a
        # cotangent): x_pad[o + q] read by output offset o instead, a one-hot kernel of Of
        # taps (not K) whose output positions are the kernel offsets q.
        pads = ints_attr(node, "pads") or [0] * (2 * n)
        if any(pads):
            single = bx.op("Pad", [single, bx.ints([0, 0, *pads[:n], 0, 0, *pads[n:]])])
        windows = bx.op("Conv", [single, bx.const(_one_hot_kernel(by_output, dtype))])
        flat = bx.op("Reshape", [windows, bx.ints([0, 0, -1])])  # [BNC, Of, K]
        flat = bx.transpose(flat, [1, 0, 2])  # [Of, BNC, K]
        out_spatial = bx.ints(by_output)
    lead = example_dims(bx, x, x0, [0]) if fx else dims_of(bx, x, [0])
    batch: list[Param] = [bx.batch_size] if fx else [1]
    p = bx.op("Reshape", [flat, int_vector(bx, [0, *batch, *lead, g, -1])])  # [Of, B|1, N, g, CgK]
    p = bx.unsqueeze(p, [4])  # [Of, B|1, N, g, 1, CgK]
    # The weight as [B, 1, g, CgK, Mg].
    m = example_dims(bx, w, w0, [0])[0]
    mg = size_floordiv(bx, m, g)
    wr = bx.op("Reshape", [w, int_vector(bx, [0, g, mg, -1])])  # [B, g, Mg, CgK]
    wr = bx.unsqueeze(bx.transpose(wr, [0, 1, 3, 2]), [1])
    y = bx.op("MatMul", [p, wr])  # [Of, B, N, g, 1, Mg]
    y = bx.squeeze(y, [4])
    y = bx.transpose(y, [1, 2, 3, 4, 0])  # [B, N, g, Mg, Of]
    return bx.op("Reshape", [y, bx.op("Concat", [bx.ints([0, 0, -1]), out_spatial], {"axis": 0})])


def _conv_transpose_batched_weight(
    bx: Batcher, node: ir.Node, x: ir.Value, fx: bool, w: ir.Value, rank: int
) -> ir.Value:
    """ConvTranspose with a batched weight ``[B, C, Mg, k]``: MatMul + col2im (see module doc)."""
    x0, w0 = node.inputs[0], node.inputs[1]
    assert x0 is not None and w0 is not None
    n = rank - 2
    g = int_attr(node, "group", 1)
    kernel = _static_kernel(node, w0, n)
    size = int(np.prod(kernel))
    dtype = w0.dtype or x0.dtype
    assert dtype is not None
    spatial = example_dims(bx, x, x0, range(2, rank)) if fx else spatial_dims(bx, x, rank)
    c = example_dims(bx, w, w0, [0])[0]
    cg = size_floordiv(bx, c, g)
    # X as [B|1, N, g, Cg, Df].
    lead: list[Param] = [0, 0] if fx else [1, *dims_of(bx, x, [0])]
    xr = bx.op("Reshape", [x, int_vector(bx, [*lead, g, cg, -1])])
    # W [B, C, Mg, k] -> [B, g, Cg, Mg*K] -> [B, 1, g, Mg*K, Cg].
    wr = bx.op("Reshape", [w, int_vector(bx, [0, g, cg, -1])])
    wr = bx.unsqueeze(bx.transpose(wr, [0, 1, 3, 2]), [1])
    z = bx.op("MatMul", [wr, xr])  # [B, N, g, Mg*K, Df]
    z = bx.op("Reshape", [z, int_vector(bx, [-1, size, *spatial])])  # [B*N*M, K, D]
    attrs = {**_geometry_attrs(node), "kernel_shape": kernel}
    y = bx.op("ConvTranspose", [z, bx.const(_one_hot_kernel(kernel, dtype))], attrs)
    m = size_mul(bx, example_dims(bx, w, w0, [1])[0], g)  # M = g * Mg
    tail = shape_tail(bx, y, 2)
    target = bx.op("Concat", [bx.batch_size, bx.ints([-1]), size_vector(bx, m), tail], {"axis": 0})
    return bx.op("Reshape", [y, target])
