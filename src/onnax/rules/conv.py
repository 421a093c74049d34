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
  the weight flipped along the spatial axes instead, which onnxruntime runs faster), and with
  respect to ``W`` a Conv of the input (batch and channel axes swapped, groups moved next to
  the batch) with the cotangent as kernel, the stride and dilation exchanging places. The bias gets the cotangent summed over the batch
  and spatial axes.
* A ConvTranspose is the transpose of a correlation from its output to its input, so its
  transposes are a Conv of the cotangent with the same weight (for ``X``) and the same weight
  gradient with input and cotangent exchanging roles (for ``W``).

Everything is derived from one description of the correlation along each spatial axis (a
:class:`Window`): input size, output size, kernel size, stride, dilation and the begin pad, with
the end pad chosen *tight*, ``size_in + begin + end == (size_out - 1) * s + (k - 1) * d + 1``.
With tight pads the weight gradient comes out with exactly the kernel's shape and the
ConvTranspose with exactly the input's shape, so no crop or ``output_padding`` guesswork is
needed: a negative tight end pad (trailing input not covered by any window) becomes an
``output_padding``, or a cropping ``Pad`` where it cannot. ``auto_pad`` (SAME_UPPER, SAME_LOWER,
VALID) and ConvTranspose's ``output_shape``/``output_padding`` are resolved into that description
with the formulas onnxruntime implements (checked against it: SAME_UPPER puts the odd padding
element at the end, SAME_LOWER at the beginning; ConvTranspose with ``output_shape`` splits the
total padding like SAME_LOWER unless ``auto_pad`` is SAME_UPPER). Sizes are Python ints where
the shapes are static and 1-element int64 tensors computed at run time otherwise, so symbolic
spatial dimensions are supported too: the pads then go into an explicit ``Pad`` (which also
crops with negative pads) in front of a Conv with zero pads.

Batch rules (vmap) fold the batch axis into ``N`` when only ``X`` is batched. A batched weight
would need ``group = B * g``, which is an attribute and the batch size is usually only known at
run time, so batched weights use an explicit im2col instead: a Conv with a one-hot kernel
``[K, 1, k]`` (K = prod(k)) extracts the K window elements of every position of every channel
(``X`` folded to ``[B*N*C, 1, D]``, so the channel count need not be static), a broadcasting
``MatMul`` contracts them with each example's weight per group, and a Reshape restores the
layout. ConvTranspose with a batched weight is the mirror image: a MatMul produces the K
contributions of every input position, and a ConvTranspose with the one-hot kernel (col2im)
scatters them with the node's own geometry. This costs K times the memory of the input, but
neither loops nor a static batch size. A batched bias is added after the operator.

Onnxruntime implements Conv and ConvTranspose for float only (no double kernels); the rules emit
the same operators for both types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import int_attr, ints_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import batch_rules, jvp_rules, transpose_rules
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

__all__: list[str] = []

Tangents = Sequence[ir.Value | None]
Args = Sequence[ir.Value | None]
BatchResult = tuple[list[ir.Value | None], list[bool]]
Param = int | ir.Value
"""A size along one axis: a Python int when static, else a 1-D int64 Value of one element."""

_VERSIONS = (1, 11, 22)


# --------------------------------------------------------------------- integer arithmetic
def _vec(em: Emitter, p: Param) -> ir.Value:
    return em.ints([p]) if isinstance(p, int) else p


def int_vector(em: Emitter, params: Sequence[Param]) -> ir.Value:
    """A 1-D int64 value holding ``params`` (a constant when they are all static)."""
    if all(isinstance(p, int) for p in params):
        return em.ints([p for p in params if isinstance(p, int)])
    pieces: list[ir.Value] = []
    run: list[int] = []
    for p in params:
        if isinstance(p, int):
            run.append(p)
            continue
        if run:
            pieces.append(em.ints(run))
            run = []
        pieces.append(p)
    if run:
        pieces.append(em.ints(run))
    return pieces[0] if len(pieces) == 1 else em.op("Concat", pieces, {"axis": 0})


def _add(em: Emitter, a: Param, b: Param) -> Param:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and a == 0:
        return b
    return em.op("Add", [_vec(em, a), _vec(em, b)])


def _sub(em: Emitter, a: Param, b: Param) -> Param:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if isinstance(b, int) and b == 0:
        return a
    return em.op("Sub", [_vec(em, a), _vec(em, b)])


def _mul(em: Emitter, a: Param, c: int) -> Param:
    if isinstance(a, int):
        return a * c
    return a if c == 1 else em.op("Mul", [a, em.ints([c])])


def _floordiv(em: Emitter, a: Param, c: int) -> Param:
    """``a // c`` for ``a >= 0`` (int64 Div truncates, which is the floor there)."""
    if isinstance(a, int):
        return a // c
    return a if c == 1 else em.op("Div", [a, em.ints([c])])


def _relu(em: Emitter, a: Param) -> Param:
    """``max(a, 0)``, spelled with Where (integer Max needs opset 12, integer Relu 14)."""
    if isinstance(a, int):
        return max(a, 0)
    zero = em.ints([0])
    return em.op("Where", [em.op("Less", [a, zero]), zero, a])


def _neg(em: Emitter, a: Param) -> Param:
    return -a if isinstance(a, int) else em.op("Neg", [a])


# ---------------------------------------------------------------------------- shapes
def rank_of(node: ir.Node, value: ir.Value | None, what: str) -> int:
    """The rank of an input of ``node``; a user-facing error when inference left it unknown."""
    if value is None or value.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the rank of its {what} "
            f"{getattr(value, 'name', None)!r} is unknown after shape inference, and the "
            "derivative of this operator needs it to lay out the spatial axes. Remedy: declare "
            "the shapes (symbolic dimensions are fine) of the graph inputs that feed this node."
        )
    return value.shape.rank()


def dims_of(em: Emitter, value: ir.Value, axes: Sequence[int]) -> list[Param]:
    """Dimensions ``axes`` of ``value``: ints where static, slices of its run-time shape else."""
    dims = value.shape.dims if value.shape is not None else None
    out: list[Param] = []
    shape: ir.Value | None = None
    for a in axes:
        d = dims[a] if dims is not None and a < len(dims) else None
        if isinstance(d, int):
            out.append(d)
            continue
        if shape is None:
            shape = em.shape(value)
        out.append(em.slice(shape, [a], [a + 1], [0]))
    return out


def spatial_dims(em: Emitter, value: ir.Value, rank: int) -> list[Param]:
    """Dimensions ``2..rank-1`` of ``value`` (see :func:`dims_of`)."""
    return dims_of(em, value, range(2, rank))


def shape_tail(em: Emitter, value: ir.Value, start: int) -> ir.Value:
    """``Shape(value)[start:]`` of an emitted (shape-less) value."""
    if em.opset >= 15:
        return em.op("Shape", [value], {"start": start})
    return em.slice(em.op("Shape", [value]), [start], [2**62], [0])


# ---------------------------------------------------------------------------- windows
@dataclasses.dataclass
class Window:
    """A correlation along the spatial axes, with the end pads chosen tight.

    Output position ``o`` reads the zero-padded input at ``o * strides + q * dilations`` (in
    padded coordinates) for ``q < kernel``; the input occupies ``[begin, begin + size_in)``.
    The invariant ``size_in + begin + end == (size_out - 1) * strides + (kernel - 1) *
    dilations + 1`` holds per axis; ``end`` may be negative (input not read by any window).
    """

    size_in: list[Param]
    size_out: list[Param]
    kernel: list[Param]
    strides: list[int]
    dilations: list[int]
    begin: list[Param]
    end: list[Param]

    def swapped(self) -> Window:
        """The correlation of the weight gradient: the stride and the dilation trade places."""
        return dataclasses.replace(self, strides=self.dilations, dilations=self.strides)


def _span(em: Emitter, size_out: Param, k: Param, s: int, d: int) -> Param:
    """``(size_out - 1) * s + (k - 1) * d + 1``: the padded length the windows cover."""
    return _add(em, _mul(em, _sub(em, size_out, 1), s), _add(em, _mul(em, _sub(em, k, 1), d), 1))


def _auto_pad(node: ir.Node) -> str:
    mode = node.attributes.get_string("auto_pad", "NOTSET")
    return mode or "NOTSET"


def _same_begin(em: Emitter, total: Param, mode: str) -> Param:
    """SAME_UPPER puts the odd padding element at the end, SAME_LOWER at the beginning."""
    half = _floordiv(em, total, 2)
    return half if mode == "SAME_UPPER" else _sub(em, total, half)


def _kernel(em: Emitter, node: ir.Node, w: ir.Value | None, n: int) -> list[Param]:
    shape = ints_attr(node, "kernel_shape")
    if shape is not None:
        return list(shape[-n:])
    if w is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the 'kernel_shape' attribute is missing. "
            "Remedy: set kernel_shape."
        )
    return dims_of(em, w, range(2, 2 + n))


def _stride_dilation(node: ir.Node, n: int) -> tuple[list[int], list[int]]:
    strides = ints_attr(node, "strides") or [1] * n
    dilations = ints_attr(node, "dilations") or [1] * n
    return list(strides), list(dilations)


def conv_window(em: Emitter, node: ir.Node) -> Window:
    """The correlation a Conv node computes (from its attributes and input shapes)."""
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    rank = rank_of(node, x, "input 'X'")
    n = rank - 2
    size_in = spatial_dims(em, x, rank)
    kernel = _kernel(em, node, w, n)
    strides, dilations = _stride_dilation(node, n)
    mode = _auto_pad(node)
    pads = ints_attr(node, "pads") or [0] * (2 * n)
    begin: list[Param] = []
    size_out: list[Param] = []
    for i in range(n):
        D, k, s, d = size_in[i], kernel[i], strides[i], dilations[i]
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            out = _floordiv(em, _add(em, D, s - 1), s)
            total = _relu(em, _sub(em, _span(em, out, k, s, d), D))
            b = _same_begin(em, total, mode)
        else:
            b, e = (0, 0) if mode == "VALID" else (pads[i], pads[n + i])
            reach = _sub(em, _add(em, D, b + e), _add(em, _mul(em, _sub(em, k, 1), d), 1))
            out = _add(em, _floordiv(em, reach, s), 1)
        begin.append(b)
        size_out.append(out)
    return _tight(em, size_in, size_out, kernel, strides, dilations, begin)


def _tight(
    em: Emitter,
    size_in: list[Param],
    size_out: list[Param],
    kernel: list[Param],
    strides: list[int],
    dilations: list[int],
    begin: list[Param],
) -> Window:
    end = [
        _sub(em, _span(em, o, k, s, d), _add(em, D, b))
        for D, o, k, s, d, b in zip(
            size_in, size_out, kernel, strides, dilations, begin, strict=True
        )
    ]
    return Window(size_in, size_out, kernel, strides, dilations, begin, end)


def conv_transpose_window(em: Emitter, node: ir.Node) -> Window:
    """The correlation whose transpose a ConvTranspose node computes: from its output to its input.

    The full (uncropped) output has length ``L = s (D - 1) + (k - 1) d + 1`` (plus
    ``output_padding`` zeros); the node's output is that from the begin pad on.
    """
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    rank = rank_of(node, x, "input 'X'")
    n = rank - 2
    D_in = spatial_dims(em, x, rank)
    kernel = _kernel(em, node, w, n)
    strides, dilations = _stride_dilation(node, n)
    mode = _auto_pad(node)
    pads = ints_attr(node, "pads") or [0] * (2 * n)
    extra = ints_attr(node, "output_padding") or [0] * n
    output_shape = ints_attr(node, "output_shape")
    begin: list[Param] = []
    size_out: list[Param] = []
    for i in range(n):
        D, k, s, d, a = D_in[i], kernel[i], strides[i], dilations[i], extra[i]
        full = _add(em, _span(em, D, k, s, d), a)
        out: Param
        if output_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            out = output_shape[-n:][i] if output_shape is not None else _mul(em, D, s)
            total = _relu(em, _sub(em, full, out))
            b = _same_begin(em, total, "SAME_UPPER" if mode == "SAME_UPPER" else "SAME_LOWER")
        else:
            b, e = (0, 0) if mode == "VALID" else (pads[i], pads[n + i])
            out = _sub(em, full, b + e)
        begin.append(b)
        size_out.append(out)
    # Seen from the cotangent: a correlation from the output (size_out) back to X (D_in).
    return _tight(em, size_out, D_in, kernel, strides, dilations, begin)


def pool_window(em: Emitter, node: ir.Node) -> Window:
    """The window a pooling node (MaxPool, AveragePool, LpPool) slides.

    The output size is read from the output (inferred, or at run time) rather than recomputed:
    with ``ceil_mode`` onnxruntime drops a last window that would start in the end padding, and
    the inferred shapes follow it.
    """
    x, y = node.inputs[0], node.outputs[0]
    assert x is not None
    rank = rank_of(node, x, "input 'X'")
    n = rank - 2
    size_in = spatial_dims(em, x, rank)
    size_out = spatial_dims(em, y, rank)
    kernel = _kernel(em, node, None, n)
    strides, dilations = _stride_dilation(node, n)
    mode = _auto_pad(node)
    pads = ints_attr(node, "pads") or [0] * (2 * n)
    begin: list[Param] = []
    for i in range(n):
        if mode in ("SAME_UPPER", "SAME_LOWER"):
            span = _span(em, size_out[i], kernel[i], strides[i], dilations[i])
            begin.append(_same_begin(em, _relu(em, _sub(em, span, size_in[i])), mode))
        else:
            begin.append(0 if mode == "VALID" else pads[i])
    return _tight(em, size_in, size_out, kernel, strides, dilations, begin)


# ------------------------------------------------------------------ emitted operators
def _padded(em: Emitter, x: ir.Value, win: Window, rank: int) -> tuple[ir.Value, list[int]]:
    """``x`` and the Conv ``pads`` attribute that realise the window's padding.

    Static non-negative pads go into the attribute; otherwise an explicit ``Pad`` (run-time
    sizes, or negative pads that crop) precedes a Conv with zero pads.
    """
    pads = [*win.begin, *win.end]
    if all(isinstance(p, int) and p >= 0 for p in pads):
        return x, [p for p in pads if isinstance(p, int)]
    vector = int_vector(em, [0, 0, *win.begin, 0, 0, *win.end])
    return em.op("Pad", [x, vector]), [0] * (2 * (rank - 2))


def correlate(
    em: Emitter, x: ir.Value, w: ir.Value, win: Window, group: int, rank: int
) -> ir.Value:
    """``Conv(x, w)`` over the window (x: ``[N, C, size_in]`` -> ``[N, M, size_out]``)."""
    x, pads = _padded(em, x, win, rank)
    attrs = {
        "strides": win.strides,
        "dilations": win.dilations,
        "group": group if group != 1 else None,
        "pads": pads if any(pads) else None,
    }
    return em.op("Conv", [x, w], attrs)


def correlate_adjoint(
    em: Emitter, y: ir.Value, w: ir.Value, win: Window, group: int, rank: int
) -> ir.Value:
    """The transpose of :func:`correlate` in ``x``: ``[N, M, size_out]`` -> ``[N, C, size_in]``.

    With unit strides and static sizes, a Conv with the flipped weight
    (:func:`_flipped_correlation`: onnxruntime runs it several times faster, a depthwise one
    in its blocked layout). Otherwise a ConvTranspose with the same weight, strides, dilations
    and group. Its uncropped output covers the padded input exactly (tight pads), so the begin
    pad and the end pad crop it to the input; a negative end pad (trailing input no window
    reads, which gets a zero cotangent) is an ``output_padding`` of that many zeros. Otherwise
    (run-time sizes) the crop and the zero fill are an explicit ``Pad`` after a ConvTranspose
    without pads.
    """
    flipped = _flipped_correlation(em, y, w, win, group, rank)
    if flipped is not None:
        return flipped
    n = rank - 2
    base = {
        "strides": win.strides,
        "dilations": win.dilations,
        "group": group if group != 1 else None,
    }
    ends = win.end
    if all(isinstance(b, int) and b >= 0 for b in win.begin) and all(
        isinstance(e, int) and -s < e for e, s in zip(ends, win.strides, strict=True)
    ):
        begin = [b for b in win.begin if isinstance(b, int)]
        end = [e for e in ends if isinstance(e, int)]
        pads = [*begin, *(max(e, 0) for e in end)]
        extra = [max(-e, 0) for e in end]
        attrs = {
            **base,
            "pads": pads if any(pads) else None,
            "output_padding": extra if any(extra) else None,
        }
        return em.op("ConvTranspose", [y, w], attrs)
    static_begin = [b if isinstance(b, int) and b >= 0 else 0 for b in win.begin]
    attrs = {**base, "pads": [*static_begin, *([0] * n)] if any(static_begin) else None}
    out = em.op("ConvTranspose", [y, w], attrs)
    crop = [_neg(em, _sub(em, b, sb)) for b, sb in zip(win.begin, static_begin, strict=True)]
    fill = [_neg(em, e) for e in ends]
    return em.op("Pad", [out, int_vector(em, [0, 0, *crop, 0, 0, *fill])])


def _flipped_correlation(
    em: Emitter, y: ir.Value, w: ir.Value, win: Window, group: int, rank: int
) -> ir.Value | None:
    """:func:`correlate_adjoint` for unit strides as a Conv with the flipped weight, if possible.

    With stride 1, ``x_bar[i] = sum_q y[i + b - q d] w[q]`` is a correlation of ``y`` with the
    kernel reversed along every spatial axis and the channel roles exchanged per group
    (``[M, C/g, k]`` -> ``[C, M/g, k]``), padded by ``d (k - 1) - b`` at the begin and
    ``d (k - 1) - e`` at the end (``e`` the tight end pad), which gives exactly the input's
    size. onnxruntime runs such a Conv markedly faster than the equivalent ConvTranspose, and
    the flipped weight depends on primal values only, so reverse mode computes it in the
    forward sweep. None (use the ConvTranspose) for strides other than 1, run-time sizes, or
    begin/end pads beyond the dilated kernel's reach (negative flipped pads).
    """
    if any(s != 1 for s in win.strides):
        return None
    kernel = [k for k in win.kernel if isinstance(k, int)]
    begin = [b for b in win.begin if isinstance(b, int)]
    end = [e for e in win.end if isinstance(e, int)]
    n = rank - 2
    if not len(kernel) == len(begin) == len(end) == n:
        return None
    reach = [d * (k - 1) for k, d in zip(kernel, win.dilations, strict=True)]
    pads = [r - b for r, b in zip(reach, begin, strict=True)]
    pads += [r - e for r, e in zip(reach, end, strict=True)]
    if any(p < 0 for p in pads):
        return None
    if group == 1:
        swapped = em.transpose(w, [1, 0, *range(2, rank)])  # [C, M, k]
    else:
        cg = dims_of(em, w, [1])[0]
        split = em.op("Reshape", [w, int_vector(em, [group, -1, cg, *kernel])])  # [g, Mg, Cg, k]
        grouped = em.transpose(split, [0, 2, 1, *range(3, rank + 1)])  # [g, Cg, Mg, k]
        whole = _mul(em, cg, group)
        swapped = em.op("Reshape", [grouped, int_vector(em, [whole, -1, *kernel])])
    axes = [2 + i for i in range(n) if kernel[i] != 1]
    flipped = (
        em.slice(swapped, [-1] * len(axes), [-(2**62)] * len(axes), axes, [-1] * len(axes))
        if axes
        else swapped
    )
    attrs = {
        "dilations": win.dilations if any(d != 1 for d in win.dilations) else None,
        "group": group if group != 1 else None,
        "pads": pads if any(pads) else None,
    }
    return em.op("Conv", [y, flipped], attrs)


def weight_gradient(
    em: Emitter,
    inp: ir.Value,
    inp_like: ir.Value,
    grad: ir.Value,
    win: Window,
    group: int,
    rank: int,
) -> ir.Value:
    """``sum_{n,o} grad[n, m, o] * inp_padded[n, group(m) * Cg + c, o * s + q * d]``.

    ``inp`` is ``[N, Cin, size_in]`` (with the shape of ``inp_like``), ``grad`` is
    ``[N, Cout, size_out]``; the result ``[Cout, Cin/g, kernel]`` is one Conv of ``inp`` with
    its batch and channel axes exchanged (channels of group ``j`` batched as ``[Cin/g, g * N]``)
    and ``grad`` (likewise ``[Cout, N, size_out]``) as the kernel, with ``group = g`` and the
    stride and dilation swapped. With tight pads its spatial size is exactly the kernel's.
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


def _bias_broadcast(em: Emitter, tb: ir.Value, y: ir.Value, rank: int) -> ir.Value:
    """A bias tangent ``[M]`` broadcast to the output ``[N, M, ...]``."""
    return em.op("Expand", [em.unsqueeze(tb, [0, *range(2, rank)]), em.shape(y)])


# ------------------------------------------------------------------------- jvp rules
def _inputs(node: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value | None]:
    x, w = node.inputs[0], node.inputs[1]
    assert x is not None and w is not None
    b = node.inputs[2] if len(node.inputs) > 2 else None
    return x, w, b


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
            results[1] = weight_gradient(em, x, x, ct, win, group, rank)
    if len(linear) > 2 and linear[2]:
        results[2] = _bias_cotangent(em, ct, rank)
    return results


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
            results[1] = weight_gradient(em, ct, node.outputs[0], x, win, group, rank)
    if len(linear) > 2 and linear[2]:
        results[2] = _bias_cotangent(em, ct, rank)
    return results


for _v in _VERSIONS:
    jvp_rules.add("Conv", _conv_jvp, since_version=_v)
    transpose_rules.add("Conv", _conv_transpose, since_version=_v)
    jvp_rules.add("ConvTranspose", _conv_jvp, since_version=_v)
    transpose_rules.add("ConvTranspose", _conv_transpose_transpose, since_version=_v)


# ----------------------------------------------------------------------- batch rules
def fold_batch(bx: Batcher, x: ir.Value, original: ir.Value, rank: int) -> ir.Value:
    """``[B, N, C, ...]`` -> ``[B*N, C, ...]`` (one example has rank ``rank``)."""
    tail = example_dims(bx, x, original, range(1, rank))
    return bx.op("Reshape", [x, int_vector(bx, [-1, *tail])])


def unfold_batch(bx: Batcher, y: ir.Value, original: ir.Value) -> ir.Value:
    """``[B*N, M, ...]`` -> ``[B, N, M, ...]``, the per-example dims read off ``y`` or ``original``."""
    dims = original.shape.dims[1:] if original.shape is not None else None
    if dims is not None and all(isinstance(d, int) for d in dims):
        tail: ir.Value = bx.ints([d for d in dims if isinstance(d, int)])
    else:
        tail = shape_tail(bx, y, 1)
    return bx.op("Reshape", [y, bx.op("Concat", [bx.batch_size, bx.ints([-1]), tail], {"axis": 0})])


def example_dims(
    bx: Batcher, arg: ir.Value, original: ir.Value, axes: Sequence[int]
) -> list[Param]:
    """Dimensions ``axes`` of one example of a batched ``arg``."""
    dims = original.shape.dims if original.shape is not None else None
    out: list[Param] = []
    shape: ir.Value | None = None
    for a in axes:
        d = dims[a] if dims is not None else None
        if isinstance(d, int):
            out.append(d)
            continue
        if shape is None:
            shape = bx.unbatched_shape(arg, True, original)
        out.append(bx.slice(shape, [a], [a + 1], [0]))
    return out


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
    if node.op_type == "Conv":
        y = _conv_batched_weight(bx, node, x, fx, w, rank)
    else:
        y = _conv_transpose_batched_weight(bx, node, x, fx, w, rank)
    if b is not None:
        y = _add_bias(bx, y, b, fb, rank)
    return [y], [True]


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
    attrs = {**_geometry_attrs(node), "kernel_shape": kernel}
    patches = bx.op("Conv", [single, bx.const(_one_hot_kernel(kernel, dtype))], attrs)
    out_spatial = shape_tail(bx, patches, 2)
    flat = bx.op("Reshape", [patches, bx.ints([0, 0, -1])])  # [BNC, K, Of]
    flat = bx.transpose(flat, [2, 0, 1])  # [Of, BNC, K]
    lead = example_dims(bx, x, x0, [0]) if fx else dims_of(bx, x, [0])
    batch: list[Param] = [bx.batch_size] if fx else [1]
    p = bx.op("Reshape", [flat, int_vector(bx, [0, *batch, *lead, g, -1])])  # [Of, B|1, N, g, CgK]
    p = bx.unsqueeze(p, [4])  # [Of, B|1, N, g, 1, CgK]
    # The weight as [B, 1, g, CgK, Mg].
    m = example_dims(bx, w, w0, [0])[0]
    mg = _floordiv(bx, m, g)
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
    cg = _floordiv(bx, c, g)
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
    m = _mul(bx, example_dims(bx, w, w0, [1])[0], g)  # M = g * Mg
    tail = shape_tail(bx, y, 2)
    target = bx.op("Concat", [bx.batch_size, bx.ints([-1]), _vec(bx, m), tail], {"axis": 0})
    return bx.op("Reshape", [y, target])


for _v in _VERSIONS:
    batch_rules.add("Conv", _conv_batch, since_version=_v)
    batch_rules.add("ConvTranspose", _conv_batch, since_version=_v)
