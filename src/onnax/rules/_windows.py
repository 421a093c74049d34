"""Window arithmetic of the convolution and pooling rules: sizes, pads, strides and dilations.

Every rule of :mod:`onnax.rules.conv` and :mod:`onnax.rules.pool` is derived from one
description of a correlation along each spatial axis (a :class:`Window`): input size, output
size, kernel size, stride, dilation and the begin pad, with the end pad chosen *tight*,
``size_in + begin + end == (size_out - 1) * s + (k - 1) * d + 1``. With tight pads the weight
gradient comes out with exactly the kernel's shape and the ConvTranspose with exactly the input's
shape, so no crop or ``output_padding`` guesswork is needed: a negative tight end pad (trailing
input not covered by any window) becomes an ``output_padding``, or a cropping ``Pad`` where it
cannot. ``auto_pad`` (SAME_UPPER, SAME_LOWER, VALID) and ConvTranspose's
``output_shape``/``output_padding`` are resolved into that description with the formulas
onnxruntime implements (checked against it: SAME_UPPER puts the odd padding element at the end,
SAME_LOWER at the beginning; ConvTranspose with ``output_shape`` splits the total padding like
SAME_LOWER unless ``auto_pad`` is SAME_UPPER). Sizes are Python ints where the shapes are static
and 1-element int64 tensors computed at run time otherwise (a :data:`Param`), so symbolic
spatial dimensions are supported too: the pads then go into an explicit ``Pad`` (which also
crops with negative pads) in front of a Conv with zero pads.

Besides the windows, this module emits the correlation over a window and its transpose in the
input (:func:`correlate`, :func:`correlate_adjoint`), and folds a vmap batch axis into ``N``
and back (:func:`fold_batch`, :func:`unfold_batch`), which the batch rules of Conv, the pooling
operators and Col2Im share. It registers no rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.attrs import ints_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.errors import UnsupportedOperatorError

__all__ = [
    "Param",
    "Window",
    "conv_transpose_window",
    "conv_window",
    "correlate",
    "correlate_adjoint",
    "dims_of",
    "example_dims",
    "fold_batch",
    "int_vector",
    "pool_window",
    "rank_of",
    "shape_tail",
    "size_add",
    "size_floordiv",
    "size_mul",
    "size_neg",
    "size_relu",
    "size_sub",
    "size_vector",
    "spatial_dims",
    "unfold_batch",
]

Param = int | ir.Value
"""A size along one axis: a Python int when static, else a 1-D int64 Value of one element."""


# --------------------------------------------------------------------- integer arithmetic
def size_vector(em: Emitter, p: Param) -> ir.Value:
    """``p`` as a 1-element int64 vector (a constant when static)."""
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


def size_add(em: Emitter, a: Param, b: Param) -> Param:
    """``a + b``, folded where static."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(b, int) and b == 0:
        return a
    if isinstance(a, int) and a == 0:
        return b
    return em.op("Add", [size_vector(em, a), size_vector(em, b)])


def size_sub(em: Emitter, a: Param, b: Param) -> Param:
    """``a - b``, folded where static."""
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if isinstance(b, int) and b == 0:
        return a
    return em.op("Sub", [size_vector(em, a), size_vector(em, b)])


def size_mul(em: Emitter, a: Param, c: int) -> Param:
    """``a * c`` for a static factor ``c``."""
    if isinstance(a, int):
        return a * c
    return a if c == 1 else em.op("Mul", [a, em.ints([c])])


def size_floordiv(em: Emitter, a: Param, c: int) -> Param:
    """``a // c`` for ``a >= 0`` (int64 Div truncates, which is the floor there)."""
    if isinstance(a, int):
        return a // c
    return a if c == 1 else em.op("Div", [a, em.ints([c])])


def size_relu(em: Emitter, a: Param) -> Param:
    """``max(a, 0)``, spelled with Where (integer Max needs opset 12, integer Relu 14)."""
    if isinstance(a, int):
        return max(a, 0)
    zero = em.ints([0])
    return em.op("Where", [em.op("Less", [a, zero]), zero, a])


def size_neg(em: Emitter, a: Param) -> Param:
    """``-a``."""
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
    return size_add(
        em,
        size_mul(em, size_sub(em, size_out, 1), s),
        size_add(em, size_mul(em, size_sub(em, k, 1), d), 1),
    )


def _auto_pad(node: ir.Node) -> str:
    mode = node.attributes.get_string("auto_pad", "NOTSET")
    return mode or "NOTSET"


def _same_begin(em: Emitter, total: Param, mode: str) -> Param:
    """SAME_UPPER puts the odd padding element at the end, SAME_LOWER at the beginning."""
    half = size_floordiv(em, total, 2)
    return half if mode == "SAME_UPPER" else size_sub(em, total, half)


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
            out = size_floordiv(em, size_add(em, D, s - 1), s)
            total = size_relu(em, size_sub(em, _span(em, out, k, s, d), D))
            b = _same_begin(em, total, mode)
        else:
            b, e = (0, 0) if mode == "VALID" else (pads[i], pads[n + i])
            reach = size_sub(
                em, size_add(em, D, b + e), size_add(em, size_mul(em, size_sub(em, k, 1), d), 1)
            )
            out = size_add(em, size_floordiv(em, reach, s), 1)
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
        size_sub(em, _span(em, o, k, s, d), size_add(em, D, b))
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
        full = size_add(em, _span(em, D, k, s, d), a)
        out: Param
        if output_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            out = output_shape[-n:][i] if output_shape is not None else size_mul(em, D, s)
            total = size_relu(em, size_sub(em, full, out))
            b = _same_begin(em, total, "SAME_UPPER" if mode == "SAME_UPPER" else "SAME_LOWER")
        else:
            b, e = (0, 0) if mode == "VALID" else (pads[i], pads[n + i])
            out = size_sub(em, full, b + e)
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
            begin.append(_same_begin(em, size_relu(em, size_sub(em, span, size_in[i])), mode))
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
    crop = [
        size_neg(em, size_sub(em, b, sb)) for b, sb in zip(win.begin, static_begin, strict=True)
    ]
    fill = [size_neg(em, e) for e in ends]
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
        whole = size_mul(em, cg, group)
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


# ----------------------------------------------------------------------- batch folding
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
