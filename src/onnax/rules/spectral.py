"""Spectral operators: DFT and STFT.

* **DFT** (17: ``axis`` attribute; 20: ``axis`` input) is linear in its input: the tangent is the
  same DFT of the tangent. Its transpose is the adjoint of the real-linear map
  ``(re, im) -> (re, im)`` it computes, built from DFT operators (no matrices, so lengths may be
  dynamic). With ``n`` the transform length (``dft_length``, else the axis size) and ``F`` the
  complex DFT matrix (symmetric), the forward transform is ``F`` and its adjoint
  ``conj(F) = n * IDFT``; the inverse transform is ``conj(F) / n`` and its adjoint ``F / n``. The
  remaining pieces are adjoints of simple maps: ``onesided`` keeps the first ``n // 2 + 1`` rows
  (adjoint: zero-pad the cotangent to ``n``), a real input is embedded as ``(x, 0)`` (adjoint:
  take the real part), and ``dft_length`` zero-pads or truncates the signal (adjoint: truncate or
  zero-pad the cotangent back to the axis size). The inverse real FFT (``inverse=1,
  onesided=1``: a one-sided spectrum of ``m`` bins in, a real signal of ``n = 2 (m - 1)`` out)
  reads each bin but the DC and Nyquist ones twice (itself and its mirror image): its adjoint is
  ``c_k / n`` times the one-sided forward transform of the cotangent (``c_k`` 1 or 2). Its
  ``dft_length`` other than ``n`` is refused (onnxruntime and numpy disagree on it). A run-time
  axis (opset 20) is normalised in the graph and pads and slices through ``Range``/``Equal``.
  onnxruntime's double inverse DFT of lengths that are not powers of two is accurate to about
  1e-8 only, so the derivatives of the full inverse transform spell it with the forward one.
* **STFT** (17) is bilinear in the signal and the window. Its jvp spells out the transform on the
  tangents with primitives (frames gathered by ``Gather``, windowed by ``Mul``, transformed by
  ``DFT`` along the frame axis), whose own transpose rules then serve reverse mode; STFT itself
  needs no transpose rule.

Batch rules keep the batch axis at 0. DFT's axis is shifted past it (a constant axis input is
replaced, a run-time one is normalised and shifted in the graph). STFT folds the vmap axis into
its own batch axis when only the signal is batched, and uses the primitive formulation when the
window is batched. ``dft_length``, the axis, ``frame_step`` and ``frame_length`` decide shapes:
batched, they are refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints
from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

Length = int | ir.Value
"""A length known statically (int) or at run time (a 1-D int64 value of one element)."""
Axis = int | ir.Value
"""A non-negative axis, static (int) or run-time (a normalised 1-D int64 value of one element)."""

# The opset at which DFT's axis moved from an attribute to an input (default -2 instead of 1).
_AXIS_INPUT_OPSET = 20


# ------------------------------------------------------------------------------ helpers
def _rank(node: ir.Node, value: ir.Value) -> int:
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}): the rank of input {value.name!r} is unknown, "
            "and the derivative needs it to place the transform axis. Remedy: give the model's "
            "inputs static ranks so that shape inference can find it."
        )
    return value.shape.rank()


def _dim(em: Emitter, value: ir.Value, axis: Axis) -> Length:
    """Size of ``value`` along ``axis``: an int when static, else a 1-D int64 value."""
    if isinstance(axis, ir.Value):
        return em.op("Gather", [em.shape(value), axis])
    if value.shape is not None:
        d = value.shape.dims[axis]
        if isinstance(d, int):
            return d
    return em.slice(em.shape(value), [axis], [axis + 1], [0])


def _axes(em: Emitter, axis: Axis) -> ir.Value:
    """``axis`` as a Slice ``axes`` input."""
    return em.ints([axis]) if isinstance(axis, int) else axis


def _as_vector(em: Emitter, n: Length) -> ir.Value:
    return em.ints([n]) if isinstance(n, int) else n


def _dft_axis(em: Emitter, node: ir.Node, rank: int) -> Axis:
    """The normalised transform axis of a DFT node: an int, or a value when given at run time."""
    if em.opset >= _AXIS_INPUT_OPSET:
        axis_value = node.inputs[2] if len(node.inputs) > 2 else None
        if axis_value is None:
            axis = -2
        else:
            got = const_ints(axis_value)
            if got is None:
                int64 = ir.DataType.INT64
                a = em.op("Reshape", [axis_value, em.ints([1])])
                wrapped = em.op("Add", [a, em.ints([rank])])
                return em.op("Where", [em.op("Less", [a, em.scalar(0, int64)]), wrapped, a])
            axis = got[0]
    else:
        axis = node.attributes.get_int("axis", 1)
    return axis + rank if axis < 0 else axis


def _length_input(em: Emitter, node: ir.Node, index: int) -> Length | None:
    """A scalar length input as an int or a 1-D int64 value; None when absent.

    ``dft_length`` of DFT and STFT, STFT's ``frame_step`` and ``frame_length``.
    """
    value = node.inputs[index] if len(node.inputs) > index else None
    if value is None:
        return None
    got = const_ints(value)
    if got is not None:
        return got[0]
    as_int64 = em.op("Cast", [value], {"to": ir.DataType.INT64})
    return em.op("Reshape", [as_int64, em.ints([1])])


def _dft_length(em: Emitter, node: ir.Node, signal_len: Length) -> Length:
    """The transform length: ``dft_length`` when given, else the signal's size along the axis."""
    given = _length_input(em, node, 1)
    return signal_len if given is None else given


def emit_dft(
    em: Emitter,
    x: ir.Value,
    axis: Axis,
    *,
    inverse: int = 0,
    onesided: int = 0,
    dft_length: ir.Value | None = None,
) -> ir.Value:
    """A DFT along (non-negative) ``axis``, spelled for the emitter's opset (17 or later)."""
    attrs: dict[str, object] = {"inverse": inverse or None, "onesided": onesided or None}
    if em.opset >= _AXIS_INPUT_OPSET:
        if isinstance(axis, int):
            axis_value = em.const(np.array(axis, dtype=np.int64))
        else:
            axis_value = em.squeeze(axis, [0])
        return em.op("DFT", [x, dft_length if dft_length is not None else None, axis_value], attrs)
    if not isinstance(axis, int):
        raise InternalRuleError("DFT with a run-time axis needs opset 20")
    attrs["axis"] = axis
    return em.op("DFT", [x] if dft_length is None else [x, dft_length], attrs)


def _pad_axis(em: Emitter, x: ir.Value, axis: Axis, rank: int, amount: Length) -> ir.Value:
    """Zero-pads ``x`` at the end of ``axis`` by ``amount`` (>= 0) elements."""
    if isinstance(amount, int) and amount == 0:
        return x
    if isinstance(axis, ir.Value):
        # The end pads: ``amount`` where Range(rank) equals the axis, 0 elsewhere.
        int64 = ir.DataType.INT64
        positions = em.op(
            "Range", [em.scalar(0, int64), em.scalar(rank, int64), em.scalar(1, int64)]
        )
        hit = em.op("Cast", [em.op("Equal", [positions, axis])], {"to": int64})
        ends = em.op("Mul", [hit, _as_vector(em, amount)])
        pads = em.op("Concat", [em.ints([0] * rank), ends], {"axis": 0})
    elif isinstance(amount, int):
        pads = em.ints([0] * (rank + axis) + [amount] + [0] * (rank - axis - 1))
    else:
        pads = em.op(
            "Concat",
            [em.ints([0] * (rank + axis)), amount, em.ints([0] * (rank - axis - 1))]
            if rank - axis - 1
            else [em.ints([0] * (rank + axis)), amount],
            {"axis": 0},
        )
    return em.op("Pad", [x, pads])


def _fit_axis(
    em: Emitter, x: ir.Value, axis: Axis, rank: int, have: Length, want: Length
) -> ir.Value:
    """Truncates or zero-pads ``x`` along ``axis`` from ``have`` to ``want`` elements."""
    if isinstance(have, int) and isinstance(want, int):
        if want < have:
            return em.slice(x, [0], [want], _axes(em, axis))
        return _pad_axis(em, x, axis, rank, want - have)
    # Run-time lengths: pad by max(want - have, 0), then cut to want (one of the two is a no-op).
    diff = em.op("Sub", [_as_vector(em, want), _as_vector(em, have)])
    amount = em.op("Max", [diff, em.ints([0])])
    padded = _pad_axis(em, x, axis, rank, amount)
    return em.slice(padded, em.ints([0]), _as_vector(em, want), _axes(em, axis))


def _length_scalar(em: Emitter, n: Length, dtype: ir.DataType) -> ir.Value:
    """``n`` as a rank-0 value of element type ``dtype``."""
    if isinstance(n, int):
        return em.scalar(float(n), dtype)
    return em.op("Cast", [em.squeeze(n, [0])], {"to": dtype})


def _conj(em: Emitter, x: ir.Value, dtype: ir.DataType, real: bool) -> ir.Value:
    """The complex conjugate of ``[..., 2]`` pairs (a ``real`` ``[..., 1]`` input is its own)."""
    if real:
        return x
    return em.op("Mul", [x, em.const(np.array([1.0, -1.0], dtype=dtype.numpy()))])


def _dtype(node: ir.Node) -> ir.DataType:
    dtype = node.outputs[0].dtype
    if dtype is None:
        raise InternalRuleError(f"{op_label(node)}: the output has no inferred element type")
    return dtype


def forward_dft(
    em: Emitter,
    x: ir.Value,
    axis: Axis,
    *,
    inverse: int,
    onesided: int,
    n: Length,
    dft_length: ir.Value | None,
    dtype: ir.DataType,
    real: bool,
) -> ir.Value:
    """A DFT spelled with the forward transform only: ``IDFT(z) = conj(DFT(conj(z))) / n``.

    onnxruntime's double inverse DFT of lengths that are not powers of two is only accurate to
    about 1e-8, its forward transform to rounding; the derivatives use the forward one.
    """
    if not inverse:
        return emit_dft(em, x, axis, onesided=onesided, dft_length=dft_length)
    y = emit_dft(em, _conj(em, x, dtype, real), axis, onesided=onesided, dft_length=dft_length)
    return em.op("Div", [_conj(em, y, dtype, False), _length_scalar(em, n, dtype)])


# ---------------------------------------------------------------------------------- DFT
# One rule set serves both versions: the rules read the axis from the attribute (17) or the
# input (20) at the model's opset.
dft = OpRules("DFT", since=17)


def _is_irfft(node: ir.Node) -> bool:
    """``inverse=1, onesided=1``: one-sided complex spectrum in, real signal out."""
    return bool(node.attributes.get_int("inverse", 0) and node.attributes.get_int("onesided", 0))


@dft.jvp
def _dft_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    x = node.inputs[0]
    if t is None:
        return [None]
    assert x is not None
    inverse = node.attributes.get_int("inverse", 0)
    if not inverse or _is_irfft(node):
        return [em.op("DFT", [t, *node.inputs[1:]], attributes_of(node))]
    rank = _rank(node, x)
    axis = _dft_axis(em, node, rank)
    n = _dft_length(em, node, _dim(em, x, axis))
    length = node.inputs[1] if len(node.inputs) > 1 else None
    real = x.shape is not None and x.shape.dims[-1] == 1
    return [
        forward_dft(
            em,
            t,
            axis,
            inverse=1,
            onesided=0,
            n=n,
            dft_length=length,
            dtype=_dtype(node),
            real=real,
        )
    ]


@dft.transpose
def _dft_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    x = node.inputs[0]
    assert ct is not None and x is not None
    rank = _rank(node, x)
    axis = _dft_axis(em, node, rank)
    inverse = node.attributes.get_int("inverse", 0)
    onesided = node.attributes.get_int("onesided", 0)
    signal_len = _dim(em, x, axis)
    dtype = _dtype(node)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    if _is_irfft(node):
        return [_irfft_transpose(em, node, ct, axis, rank, signal_len, dtype), *rest]
    n = _dft_length(em, node, signal_len)
    full = ct
    if onesided:
        if isinstance(n, int):
            full = _pad_axis(em, ct, axis, rank, n - (n // 2 + 1))
        else:
            half = em.op("Add", [em.op("Div", [n, em.ints([2])]), em.ints([1])])
            full = _pad_axis(em, ct, axis, rank, em.op("Sub", [n, half]))
    # The adjoint of F is conj(F) = n * IDFT; that of IDFT = conj(F) / n is F / n.
    if inverse:
        back = em.op("Div", [emit_dft(em, full, axis), _length_scalar(em, n, dtype)])
    else:
        back = forward_dft(
            em, full, axis, inverse=1, onesided=0, n=n, dft_length=None, dtype=dtype, real=False
        )
        back = em.op("Mul", [back, _length_scalar(em, n, dtype)])
    if x.shape is not None and x.shape.dims[-1] == 1:
        back = em.slice(back, [0], [1], [rank - 1])
    return [_fit_axis(em, back, axis, rank, n, signal_len), *rest]


def _irfft_transpose(
    em: Emitter,
    node: ir.Node,
    ct: ir.Value,
    axis: Axis,
    rank: int,
    bins: Length,
    dtype: ir.DataType,
) -> ir.Value:
    """The adjoint of the inverse real FFT ``y = Re(IDFT(hermitian extension of x))``.

    With ``n = 2 * (bins - 1)``, ``y[j] = Re(sum_k c_k x[k] exp(2 pi i j k / n)) / n`` where
    ``c_k`` is 1 for the DC and Nyquist bins and 2 for the others (their mirror images); so the
    adjoint is ``c_k / n`` times the one-sided forward transform of the (real) cotangent. The
    imaginary parts of the DC and Nyquist bins, which the transform drops, get zero cotangent
    (the forward transform of a real signal is real there).
    """
    length = node.inputs[1] if len(node.inputs) > 1 else None
    if length is not None:
        got = const_ints(length)
        default = 2 * (bins - 1) if isinstance(bins, int) else None
        if got is None or default is None or got[0] != default:
            raise UnsupportedOperatorError(
                f"vjp: {op_label(node)} at opset {em.opset} ({node_label(node)}) is an inverse "
                f"real FFT (inverse=1, onesided=1) with a dft_length (input 1 {length.name!r}) "
                "other than 2 * (bins - 1): onnxruntime and numpy disagree on which bins such a "
                "transform reads, so onnax has no transpose for it. Remedy: drop dft_length, or "
                "pad or slice the spectrum to n // 2 + 1 bins before the DFT."
            )
    spectrum = emit_dft(em, ct, axis, onesided=1)  # [..., bins, ..., 2]
    if isinstance(bins, int):
        n = 2 * (bins - 1)
        c = np.full(bins, 2.0 / n)
        c[0] = c[-1] = 1.0 / n
        weights = em.const(c.astype(dtype.numpy()))
    else:
        int64 = ir.DataType.INT64
        k = em.op("Range", [em.scalar(0, int64), em.squeeze(bins, [0]), em.scalar(1, int64)])
        last = em.op("Sub", [bins, em.ints([1])])
        edge = em.op("Or", [em.op("Equal", [k, em.ints([0])]), em.op("Equal", [k, last])])
        two = em.op("Where", [edge, em.scalar(1.0, dtype), em.scalar(2.0, dtype)])
        n_value = em.op("Mul", [last, em.ints([2])])
        weights = em.op("Div", [two, _length_scalar(em, n_value, dtype)])
    if isinstance(axis, int):
        weights = em.unsqueeze(weights, list(range(1, rank - axis)))
    else:
        int64 = ir.DataType.INT64
        positions = em.op(
            "Range", [em.scalar(0, int64), em.scalar(rank, int64), em.scalar(1, int64)]
        )
        at_axis = em.op("Equal", [positions, axis])
        shape = em.op("Where", [at_axis, _as_vector(em, bins), em.ints([1])])
        weights = em.op("Reshape", [weights, shape])
    return em.op("Mul", [spectrum, weights])


@dft.batch
def _dft_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    refuse_batched(bx, node, args, batched, {1: "dft_length", 2: "axis"})
    x = args[0]
    original = node.inputs[0]
    assert x is not None and original is not None
    rank = bx.rank(original)
    attrs = attributes_of(node)
    if bx.opset >= _AXIS_INPUT_OPSET:
        axis_value = node.inputs[2] if len(node.inputs) > 2 else None
        static = const_ints(axis_value) if axis_value is not None else [-2]
        if static is not None:
            axis = static[0] + rank if static[0] < 0 else static[0]
            shifted = bx.const(np.array(axis + 1, dtype=np.int64))
        else:
            axis_arg = args[2]
            assert axis_arg is not None
            negative = bx.op("Less", [axis_arg, bx.const(np.array(0, np.int64))])
            wrapped = bx.op("Add", [axis_arg, bx.const(np.array(rank, np.int64))])
            shifted = bx.op(
                "Add",
                [bx.op("Where", [negative, wrapped, axis_arg]), bx.const(np.array(1, np.int64))],
            )
        return [bx.op("DFT", [x, args[1] if len(args) > 1 else None, shifted], attrs)], [True]
    axis = node.attributes.get_int("axis", 1)
    attrs["axis"] = (axis + rank if axis < 0 else axis) + 1
    return [bx.op("DFT", [x, *args[1:]], attrs)], [True]


# --------------------------------------------------------------------------------- STFT
stft = OpRules("STFT", since=17)


def _frame_length(em: Emitter, node: ir.Node, window_length: Length | None) -> Length:
    """The frame length: the frame_length input, else ``window_length`` (the window's size)."""
    from_input = _length_input(em, node, 3)
    if from_input is not None:
        return from_input
    if window_length is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}) has neither a window nor a frame_length, "
            "so the frame length is undefined. Remedy: pass a window or a frame_length input."
        )
    return window_length


def frame_indices(
    em: Emitter, node: ir.Node, total: Length, window_length: Length | None
) -> ir.Value:
    """``[frames, frame_length]`` int64 positions ``f * frame_step + j`` into the signal.

    ``total`` is the signal's length, ``window_length`` the window's (None without a window).
    """
    step = _length_input(em, node, 1)
    if step is None:
        raise InternalRuleError(f"{op_label(node)}: frame_step is missing")
    length = _frame_length(em, node, window_length)
    if isinstance(step, int) and isinstance(length, int) and isinstance(total, int):
        frames = 1 + (total - length) // step
        idx = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
        return em.const(idx.astype(np.int64))
    int64 = ir.DataType.INT64
    zero, one = em.scalar(0, int64), em.scalar(1, int64)
    step_v, length_v, total_v = (_as_vector(em, v) for v in (step, length, total))
    count = em.op("Add", [em.op("Div", [em.op("Sub", [total_v, length_v]), step_v]), em.ints([1])])
    starts = em.op("Mul", [em.op("Range", [zero, em.squeeze(count, [0]), one]), step_v])
    offsets = em.op("Range", [zero, em.squeeze(length_v, [0]), one])
    return em.op("Add", [em.unsqueeze(starts, [1]), em.unsqueeze(offsets, [0])])


def stft_primitive(
    em: Emitter, node: ir.Node, signal: ir.Value, window: ir.Value | None, original: ir.Value
) -> ir.Value:
    """STFT spelled with Gather, Mul and DFT (linear in ``signal`` and in ``window``).

    Args:
        em: The emitter.
        node: The STFT node (attributes, frame_step, frame_length).
        signal: ``[batch, length, c]``.
        window: ``[frame_length]`` or None (a rectangular window).
        original: The node's signal, read for its length.
    """
    window0 = node.inputs[2] if len(node.inputs) > 2 else None
    window_length = _dim(em, window0, 0) if window0 is not None else None
    idx = frame_indices(em, node, _dim(em, original, 1), window_length)
    frames = em.op("Gather", [signal, idx], {"axis": 1})  # [batch, frames, frame_length, c]
    if window is not None:
        frames = em.op("Mul", [frames, em.unsqueeze(window, [1])])
    return emit_dft(em, frames, 2, onesided=node.attributes.get_int("onesided", 1))


@stft.jvp
def _stft_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t_signal = tangents[0]
    t_window = tangents[2] if len(tangents) > 2 else None
    signal = node.inputs[0]
    window = node.inputs[2] if len(node.inputs) > 2 else None
    assert signal is not None
    terms: list[ir.Value | None] = []
    if t_signal is not None:
        terms.append(stft_primitive(em, node, t_signal, window, signal))
    if t_window is not None:
        terms.append(stft_primitive(em, node, signal, t_window, signal))
    return [em.add_all(terms)]


@stft.batch
def _stft_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    refuse_batched(bx, node, args, batched, {1: "frame_step", 3: "frame_length"})
    signal, original = args[0], node.inputs[0]
    assert signal is not None and original is not None
    window_batched = len(batched) > 2 and batched[2]
    if not window_batched:
        # Fold the vmap axis into STFT's own batch axis.
        tail = bx.unbatched_shape(signal, True, original)
        folded = bx.op(
            "Reshape",
            [signal, bx.op("Concat", [bx.ints([-1]), em_slice(bx, tail, 1)], {"axis": 0})],
        )
        # onesided spelled out: onnx's STFT shape inference ignores its default of 1.
        onesided = node.attributes.get_int("onesided", 1)
        y = bx.op("STFT", [folded, *args[1:]], attributes_of(node, onesided=onesided))
        # The output's shape is read off y: onnx infers STFT's frequency axis wrongly when
        # onesided is left to its default.
        out_tail = em_slice(bx, bx.op("Shape", [y]), 1)
        batch = em_slice(bx, tail, 0, 1)
        shape = bx.op("Concat", [bx.batch_size, batch, out_tail], {"axis": 0})
        return [bx.op("Reshape", [y, shape])], [True]
    window, window0 = args[2], node.inputs[2]
    assert window is not None and window0 is not None
    total = _dim(bx, original, 1) if not batched[0] else _example_dim(bx, signal, original, 1)
    idx = frame_indices(bx, node, total, _example_dim(bx, window, window0, 0))
    signal = bx.materialize(signal, batched[0], original)
    w = bx.unsqueeze(window, [1, 2, 4])  # [B, 1, 1, fl, 1]
    frames = bx.op("Gather", [signal, idx], {"axis": 2})
    frames = bx.op("Mul", [frames, w])
    onesided = node.attributes.get_int("onesided", 1)
    return [emit_dft(bx, frames, 3, onesided=onesided)], [True]


def _example_dim(bx: Batcher, arg: ir.Value, original: ir.Value, axis: int) -> Length:
    """Dimension ``axis`` of one example of the batched ``arg`` (never reading ``original``)."""
    if original.shape is not None and isinstance(original.shape.dims[axis], int):
        return int(original.shape.dims[axis])  # type: ignore[arg-type]
    return em_slice(bx, bx.unbatched_shape(arg, True, original), axis, axis + 1)


def em_slice(em: Emitter, vector: ir.Value, start: int, end: int | None = None) -> ir.Value:
    """``vector[start:end]`` of a 1-D value."""
    return em.slice(vector, [start], [end if end is not None else 2**62], [0])
