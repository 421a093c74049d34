"""Shape queries, index-valued and quantized operators: zero derivatives, and OneHot.

Shape Size ArgMax ArgMin Hardmax NonZero NonMaxSuppression EyeLike OneHot BitCast QLinearMatMul
QLinearConv MelWeightMatrix, ai.onnx.ml::Binarizer and ai.onnx.ml::TreeEnsemble.

Shape queries and index-valued operators (ArgMax, NonZero, ...) have integer results, and
Hardmax and EyeLike are piecewise constant or independent of the values: their tangent is a
symbolic zero, which lets a derivative flow past them. A float output of such an operator that
is a graph output gets a materialised zero tangent. (Comparisons, logic and the rounding family
live in :mod:`onnax.rules.logic`, QuantizeLinear in :mod:`onnax.rules.quant`.)

Also zero: BitCast (from FLOAT/DOUBLE it yields integers), QLinearMatMul and QLinearConv
(integer results; their float inputs are scales), MelWeightMatrix (its filters sit at integer
bins computed from the band edges), and ai.onnx.ml::Binarizer and ai.onnx.ml::TreeEnsemble
(piecewise constant in their input); vmap applies BitCast and Binarizer elementwise, folds
the batch into TreeEnsemble's rows, and builds one MelWeightMatrix per example from batched band
edges (its filters written out with Where, as onnxruntime's kernel places them).

OneHot is piecewise constant in its indices and depth but linear in its ``values`` input (the
off/on pair), so it has a real rule here.

Batch rules (vmap): axis-taking operators (ArgMax ArgMin Hardmax OneHot) shift their axis past
the batch axis. Shape producers (Shape, Size) and EyeLike return the *unbatched* result, the
same for every example. NonZero and NonMaxSuppression are refused on batched inputs: their
output sizes depend on each example's values (a ragged result).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, BatchRule, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, original_input, vectorized_batch


# ------------------------------------------------------------------------------ helpers
def required_arg(args: Args, index: int) -> ir.Value:
    """A batch rule's input ``index``, which must be present (an internal error otherwise)."""
    value = args[index] if index < len(args) else None
    if value is None:
        raise InternalRuleError(f"batch rule: input {index} is missing")
    return value


def optional_arg(args: Args, index: int) -> ir.Value | None:
    """A batch rule's input ``index``, or None when absent."""
    return args[index] if index < len(args) else None


def original_name(node: ir.Node, index: int) -> str:
    """The name of input ``index`` for messages (vmap leaves the originals their names)."""
    value = node.inputs[index] if index < len(node.inputs) else None
    return value.name if value is not None and value.name else f"#{index}"


def _shift_axis(axis: int) -> int:
    """An axis of an unbatched value, for the batched one.

    Negative axes count from the back and stay; the others move past the batch axis. The axis is
    valid for the unbatched rank (the model passed onnx.checker), so no rank is needed; before
    Hardmax-13 the flattening point moves the same way.
    """
    return axis if axis < 0 else axis + 1


def _clamp_axis(axis: int, rank: int) -> int:
    """Shape's start/end: negative counts from the back, then clamped to ``[0, rank]``."""
    return min(max(axis + rank if axis < 0 else axis, 0), rank)


# ----------------------------------------------------------------------------------- Shape
shape_query = OpRules("Shape", since=1)
shape_query.zero()


@shape_query.batch
def _shape_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """The shape of one example (not batched): the batched shape past the batch axis.

    ``start``/``end`` (Shape-15) are normalised against the unbatched rank and shifted by one, so
    that clamping happens as it would for one example (a negative start must never reach back
    into the batch axis). Of an input of unknown rank, the example's shape is sliced instead
    (Slice clamps its bounds exactly as Shape does).
    """
    x, original = required_arg(args, 0), original_input(node, 0)
    start_attr, end_attr = node.attributes.get_int("start", 0), node.attributes.get("end")
    if original.shape is None:
        shape = bx.unbatched_shape(x, True, original)
        if start_attr == 0 and end_attr is None:
            return [shape], [False]
        end_bound = 2**62 if end_attr is None else end_attr.as_int()
        return [bx.slice(shape, [start_attr], [end_bound], [0])], [False]
    rank = original.shape.rank()
    start = _clamp_axis(start_attr, rank)
    end = rank if end_attr is None else _clamp_axis(end_attr.as_int(), rank)
    if original.shape.is_static():
        out = bx.ints(list(original.shape.numpy())[start:end])
    elif start == 0 and end == rank:
        out = bx.unbatched_shape(x, True, original)
    elif end <= start:
        out = bx.ints([])
    elif bx.opset >= 15:
        out = bx.op("Shape", [x], {"start": start + 1, "end": end + 1})
    else:
        out = bx.slice(bx.op("Shape", [x]), [start + 1], [end + 1], [0])
    return [out], [False]


# ------------------------------------------------------------------------------------ Size
size_query = OpRules("Size", since=1)
size_query.zero()


@size_query.batch
def _size_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """The size of one example (not batched): the product of its shape.

    Computed from the unbatched shape rather than ``Size / batch_size``, which would divide by
    zero for an empty batch.
    """
    x, original = required_arg(args, 0), original_input(node, 0)
    if original.shape is not None and original.shape.is_static():
        size = int(np.prod(original.shape.numpy(), dtype=np.int64))
        out = bx.const(np.array(size, dtype=np.int64))
    else:
        shape = bx.unbatched_shape(x, True, original)
        out = bx.reduce("ReduceProd", shape, None, keepdims=False)
    return [out], [False]


# --------------------------------------------------------------- ArgMax / ArgMin / Hardmax
def _axis_batch(default_axis: int) -> BatchRule:
    """The operator along its axis shifted past the batch axis.

    Before Hardmax-13, Hardmax flattens its input to 2-D at ``axis``; with the shifted axis the
    batch axis joins the leading (row) part, so every row still belongs to one example.
    """

    def rule(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
        x = required_arg(args, 0)
        axis = node.attributes.get_int("axis", default_axis)
        shifted = _shift_axis(axis)
        return [bx.op(node.op_type, [x], attributes_of(node, axis=shifted))], [True]

    return rule


arg_max_min = OpRules(("ArgMax", "ArgMin"), since=1)
arg_max_min.zero()
arg_max_min.batch(_axis_batch(0))

# Hardmax-13 changed the default axis from 1 to -1 (and stopped flattening).
hardmax = OpRules("Hardmax", since=(1, 13))
hardmax.zero()
hardmax.batch(_axis_batch(1))
hardmax.batch(_axis_batch(-1), since=13)


# ---------------------------------------------------------------------------------- OneHot
onehot = OpRules("OneHot", since=9)


@onehot.jvp
def _onehot_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # y = off + mask * (on - off) with mask = OneHot(indices, depth, [0, 1]): the same node with
    # unit values (same types, so the runtime kernel the model already uses serves it).
    tv = tangents[2] if len(tangents) > 2 else None
    if tv is None:
        return [None]
    indices, depth, values = node.inputs
    assert indices is not None and depth is not None and values is not None
    if values.dtype is None:
        raise InternalRuleError(f"OneHot: the element type of {values.name!r} is unknown")
    unit = em.const(np.array([0, 1], dtype=values.dtype.numpy()))
    axis = node.attributes.get_int("axis", -1)
    mask = em.op("OneHot", [indices, depth, unit], {"axis": axis})
    # The mask has exactly the output's shape; say so, since inference cannot see a run-time depth
    # and a symbolic one-hot axis would otherwise make the transposes fall back to run-time axes.
    mask.shape = node.outputs[0].shape.copy() if node.outputs[0].shape is not None else None
    off = em.op("Gather", [tv, em.const(np.array(0, dtype=np.int64))], {"axis": 0})
    on = em.op("Gather", [tv, em.const(np.array(1, dtype=np.int64))], {"axis": 0})
    return [em.op("Add", [em.op("Mul", [mask, em.op("Sub", [on, off])]), off])]


@onehot.batch
def _onehot_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """OneHot with batched indices (the one-hot axis shifted) and/or batched values.

    A batched depth would give each example its own output size: refused. Batched values (one
    off/on pair per example) select through ``Where`` on the one-hot mask, which is exact for any
    element type.
    """
    indices, depth, values = required_arg(args, 0), required_arg(args, 1), required_arg(args, 2)
    indices_orig, values_orig = original_input(node, 0), original_input(node, 2)
    if batched[1]:
        name = original_name(node, 1)
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) takes its depth "
            f"from input 1 {name!r}, which depends on a batched input: each example "
            "could have a different depth, and the results would have different shapes. Remedy: "
            f"make the depth a constant, or give the inputs {name!r} is computed "
            "from in_axes None (shared)."
        )
    out_rank = bx.rank(indices_orig) + 1
    axis = node.attributes.get_int("axis", -1)
    # The output axis the one-hot dimension lands on, for batched or shared indices.
    new_axis = _shift_axis(axis) if batched[0] else axis
    if not batched[2]:
        return [bx.op("OneHot", [indices, depth, values], {"axis": new_axis})], [True]
    dtype = values_orig.dtype
    if dtype is None:
        raise InternalRuleError(f"OneHot: the element type of {values_orig.name!r} is unknown")
    # A 0/1 mask in the values' own type (the kernel the model already uses) when it is numeric.
    unit_type = dtype.numpy() if dtype.is_floating_point() or dtype.is_integer() else np.int64
    unit = bx.const(np.array([0, 1], dtype=unit_type))
    mask = bx.op("OneHot", [indices, depth, unit], {"axis": new_axis})
    chosen = bx.op("Cast", [mask], {"to": int(ir.DataType.BOOL)})
    # values is [B, 2]: off/on of each example, as [B, 1, ..., 1] to line up with the output.
    off, on = (
        bx.unsqueeze(
            bx.op("Gather", [values, bx.const(np.array(i, dtype=np.int64))], {"axis": 1}),
            list(range(1, out_rank + 1)),
        )
        for i in (0, 1)
    )
    return [bx.op("Where", [chosen, on, off])], [True]


# --------------------------------------------------------------------------------- EyeLike
# The identity of the input's shape: independent of its values.
eyelike = OpRules("EyeLike", since=9)
eyelike.zero()


@eyelike.batch
def _eyelike_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """The identity of one example's shape (not batched): EyeLike only reads its input's shape.

    The batched input is never read as such; a zero tensor of the unbatched shape and type stands
    in for it, so every example shares one result.
    """
    x, original = required_arg(args, 0), original_input(node, 0)
    dtype = original.dtype
    if dtype is None:
        raise InternalRuleError(f"EyeLike: the element type of {original.name!r} is unknown")
    zero = bx.scalar(0.0, like=dtype)
    stand_in = bx.op("Expand", [zero, bx.unbatched_shape(x, True, original)])
    return [bx.op("EyeLike", [stand_in], attributes_of(node))], [False]


# ------------------------------------------------------------------ NonZero / NonMaxSuppression
def _ragged_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Refused: the number of results depends on each example's values."""
    index = next(i for i, b in enumerate(batched) if b)
    name = original_name(node, index)
    what = (
        "the number of nonzero elements"
        if node.op_type == "NonZero"
        else "the number of selected boxes"
    )
    raise UnsupportedOperatorError(
        f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets a batched input "
        f"(input {index} {name!r}): its output size is "
        f"{what}, which differs from example to example, so the batched result would be ragged. "
        "Remedy: give the inputs it is computed from in_axes None (shared), or replace it with a "
        "fixed-size formulation (a boolean mask with Where, or TopK with a fixed k)."
    )


for _ragged in (OpRules("NonZero", since=9), OpRules("NonMaxSuppression", since=10)):
    _ragged.zero()
    _ragged.batch(_ragged_batch)


# ------------------------------------------------- integer results, piecewise-constant results
# BitCast reinterprets bits: from FLOAT/DOUBLE (the only values carrying a derivative) it gives
# an integer of the same width, never a FLOAT/DOUBLE. QLinearMatMul/QLinearConv produce integers.
# Binarizer (0/1) and TreeEnsemble (leaf sums) are piecewise constant in their input. All have a
# zero derivative (the schemas mark these inputs non-differentiable or leave them unknown).
bitcast = OpRules("BitCast", since=26)
bitcast.zero()
bitcast.batch(vectorized_batch)
binarizer = OpRules("Binarizer", since=1, domain="ai.onnx.ml")
binarizer.zero()
tree_ensemble = OpRules("TreeEnsemble", since=5, domain="ai.onnx.ml")
tree_ensemble.zero()


@binarizer.batch
def _binarizer_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Binarizer is elementwise: it applies to the batched value as it is."""
    x = required_arg(args, 0)
    return [bx.op("Binarizer", [x], attributes_of(node), domain="ai.onnx.ml")], [True]


@tree_ensemble.batch
def _tree_ensemble_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """TreeEnsemble scores each row of ``X [N, F]`` on its own: fold the batch into the rows.

    ``[B, N, F] -> [B * N, F]``, and the scores ``[B * N, T]`` unfolded to ``[B, N, T]``.
    """
    x = required_arg(args, 0)
    if bx.rank(original_input(node, 0)) != 2:
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}): input 0 "
            f"{original_name(node, 0)!r} is not of rank 2 ([N, F]), which the operator requires. "
            "Remedy: reshape the input to [N, F] before the node."
        )
    shape = bx.op("Shape", [x])
    rows = bx.op("Concat", [bx.ints([-1]), bx.slice(shape, [2], [3], [0])], {"axis": 0})
    scores = bx.op(
        "TreeEnsemble", [bx.op("Reshape", [x, rows])], attributes_of(node), domain="ai.onnx.ml"
    )
    back = bx.op("Concat", [bx.slice(shape, [0], [2], [0]), bx.ints([-1])], {"axis": 0})
    return [bx.op("Reshape", [scores, back])], [True]


# ------------------------------------------------------- QLinearMatMul, QLinearConv, MelWeightMatrix
def _refuse_batched_parameters(
    bx: Batcher, node: ir.Node, batched: Sequence[bool], data: Sequence[int], why: str
) -> None:
    """Refuses a batched input other than the data inputs ``data`` (scales, zero points...)."""
    for index, flag in enumerate(batched):
        if flag and index not in data:
            name = original_name(node, index)
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets a batched "
                f"input {index} {name!r}: {why}. Remedy: give the inputs {name!r} is computed "
                "from in_axes None (shared by every example)."
            )


qlinear_matmul = OpRules("QLinearMatMul", since=10)
qlinear_matmul.zero()


@qlinear_matmul.batch
def _qlinear_matmul_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """QLinearMatMul broadcasts its leading dimensions like MatMul.

    A batched operand gets size-1 axes after its batch axis so both line up. Matrices (rank >= 2)
    and shared quantization parameters only.
    """
    why = "each example would have its own quantization parameters, which the operator cannot take"
    _refuse_batched_parameters(bx, node, batched, (0, 3), why)
    a_orig, b_orig = original_input(node, 0), original_input(node, 3)
    ra, rb = bx.rank(a_orig), bx.rank(b_orig)
    if min(ra, rb) < 2:
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}): a batched "
            "1-D operand would put the batch axis into the matrix dimensions. Remedy: reshape "
            "the vector operand to a matrix (Unsqueeze) before the node."
        )
    rank = max(ra, rb)
    new = list(args)
    for index in (0, 3):
        if batched[index]:
            new[index] = bx.align(
                required_arg(args, index), True, original_input(node, index), rank
            )
    return [bx.op("QLinearMatMul", new)], [True]


qlinear_conv = OpRules("QLinearConv", since=10)
qlinear_conv.zero()


@qlinear_conv.batch
def _qlinear_conv_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """QLinearConv of a batched input: the vmap axis is folded into the image batch axis N."""
    why = "each example would have its own weights or quantization parameters"
    _refuse_batched_parameters(bx, node, batched, (0,), why)
    x = required_arg(args, 0)
    shape = bx.op("Shape", [x])
    folded = bx.op(
        "Reshape",
        [x, bx.op("Concat", [bx.ints([-1]), bx.slice(shape, [2], [2**62], [0])], {"axis": 0})],
    )
    out = bx.op("QLinearConv", [folded, *args[1:]], attributes_of(node))
    back = bx.op(
        "Concat",
        [bx.slice(shape, [0], [2], [0]), bx.slice(bx.op("Shape", [out]), [1], [2**62], [0])],
        {"axis": 0},
    )
    return [bx.op("Reshape", [out, back])], [True]


# MelWeightMatrix places its triangular filters at integer DFT bins computed from the band edges
# (floor), so the weights are piecewise constant in lower/upper_edge_hertz (its float inputs).
mel_weight_matrix = OpRules("MelWeightMatrix", since=17)
mel_weight_matrix.zero()


@mel_weight_matrix.batch
def _mel_weight_matrix_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """MelWeightMatrix with batched band edges or sample rate: one matrix per example.

    ``num_mel_bins`` and ``dft_length`` set the matrix's shape and must be shared. The other
    inputs only move the filters, so the matrices of all examples are built at once, following
    onnxruntime's kernel step by step (:func:`_mel_bins`, :func:`_mel_filters`). The kernel's
    range checks of the band edges are not repeated.
    """
    why = (
        "it sets the shape of the weight matrix ([dft_length / 2 + 1, num_mel_bins]), so each "
        "example could get a matrix of a different shape"
    )
    _refuse_batched_parameters(bx, node, batched, (2, 3, 4), why)
    i64 = int(ir.DataType.INT64)
    n_mel, dft, rate, lower, upper = (
        bx.op("Reshape", [bx.op("Cast", [required_arg(args, i)], {"to": i64}), bx.ints([])])
        if i < 2
        else required_arg(args, i)
        for i in range(5)
    )
    bins = _mel_bins(bx, n_mel, dft, rate, lower, upper)
    out_type = ir.DataType(node.attributes.get_int("output_datatype", int(ir.DataType.FLOAT)))
    return [_mel_filters(bx, bins, n_mel, dft, out_type)], [True]


def _mel_bins(
    bx: Batcher, n_mel: ir.Value, dft: ir.Value, rate: ir.Value, lower: ir.Value, upper: ir.Value
) -> ir.Value:
    """The DFT bins ``[B, num_mel_bins + 2]`` of the filters' corners, as the kernel finds them.

    The kernel reads the edges as float and computes in double: ``num_mel_bins + 2`` points
    evenly spaced on the mel scale (``2595 log10(1 + hz / 700)``) from the lower edge, by
    ``(high - low) / (num_mel_bins + 2)``, back to hertz and to the bin
    ``floor((dft_length + 1) * hz / sample_rate)``.
    """
    f64 = ir.DataType.DOUBLE

    def num(v: float) -> ir.Value:
        return bx.scalar(v, f64)

    def per_example(value: ir.Value, through: ir.DataType | None = None) -> ir.Value:
        # [B, 1] when batched, [1, 1] when shared: broadcasts against the points [M + 2].
        if through is not None:
            value = bx.op("Cast", [value], {"to": int(through)})
        return bx.op("Reshape", [bx.op("Cast", [value], {"to": int(f64)}), bx.ints([-1, 1])])

    def to_mel(hz: ir.Value) -> ir.Value:
        ratio = bx.op("Add", [num(1.0), bx.op("Div", [hz, num(700.0)])])
        log10 = bx.op("Div", [bx.op("Log", [ratio]), num(float(np.log(10.0)))])
        return bx.op("Mul", [num(2595.0), log10])

    low = to_mel(per_example(lower, ir.DataType.FLOAT))
    high = to_mel(per_example(upper, ir.DataType.FLOAT))
    count = bx.op("Add", [n_mel, bx.const(np.array(2, np.int64))])
    step = bx.op("Div", [bx.op("Sub", [high, low]), bx.op("Cast", [count], {"to": int(f64)})])
    points = bx.op("Cast", [_arange(bx, count)], {"to": int(f64)})
    mel = bx.op("Add", [low, bx.op("Mul", [step, points])])
    power = bx.op("Pow", [num(10.0), bx.op("Div", [mel, num(2595.0)])])
    hz = bx.op("Mul", [num(700.0), bx.op("Sub", [power, num(1.0)])])
    size = bx.op("Cast", [bx.op("Add", [dft, bx.const(np.array(1, np.int64))])], {"to": int(f64)})
    position = bx.op("Div", [bx.op("Mul", [size, hz]), per_example(rate)])
    return bx.op("Cast", [bx.op("Floor", [position])], {"to": int(ir.DataType.INT64)})


def _arange(bx: Batcher, stop: ir.Value) -> ir.Value:
    """``Range(0, stop, 1)`` for a rank-0 int64 ``stop``."""
    zero, one = bx.const(np.array(0, np.int64)), bx.const(np.array(1, np.int64))
    return bx.op("Range", [zero, stop, one])


def _mel_filters(
    bx: Batcher, bins: ir.Value, n_mel: ir.Value, dft: ir.Value, out_type: ir.DataType
) -> ir.Value:
    """The weights ``[B, dft_length / 2 + 1, num_mel_bins]`` of the filters with corners ``bins``.

    Filter ``m`` rises from bin ``m`` to bin ``m + 1`` ((j - left) / (center - left), a single 1
    when they coincide) and falls to bin ``m + 2`` ((right - j) / (right - center), written
    last, as the kernel does), in the output type (integer division for integer outputs).
    """
    stop = bx.op("Reshape", [n_mel, bx.ints([1])])

    def corner(offset: int) -> ir.Value:
        end = bx.op("Add", [stop, bx.ints([offset])])
        return bx.unsqueeze(bx.slice(bins, bx.ints([offset]), end, [1]), [1])  # [B, 1, M]

    left, center, right = corner(0), corner(1), corner(2)
    width = bx.op("Add", [bx.op("Div", [dft, bx.const(np.array(2, np.int64))]), bx.ints([1])])
    j = bx.op("Reshape", [_arange(bx, bx.squeeze(width, [0])), bx.ints([1, -1, 1])])
    floating = out_type in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
    compute = out_type if floating else ir.DataType.INT64
    zero = bx.const(np.array(0, np.int64))
    rise, fall = bx.op("Sub", [center, left]), bx.op("Sub", [right, center])

    def ratio(numerator: ir.Value, denominator: ir.Value) -> ir.Value:
        # A zero denominator only where the mask discards the ratio.
        safe = bx.op("Max", [denominator, bx.const(np.array(1, np.int64))])
        if not floating:
            return bx.op("Div", [numerator, safe])
        return bx.op("Div", [bx.op("Cast", [v], {"to": int(compute)}) for v in (numerator, safe)])

    def all_of(*conditions: ir.Value) -> ir.Value:
        out = conditions[0]
        for c in conditions[1:]:
            out = bx.op("And", [out, c])
        return out

    rising = all_of(
        bx.op("Greater", [rise, zero]),
        bx.op("LessOrEqual", [left, j]),
        bx.op("LessOrEqual", [j, center]),
    )
    peak = all_of(bx.op("Equal", [rise, zero]), bx.op("Equal", [j, center]))
    falling = all_of(
        bx.op("Greater", [fall, zero]), bx.op("LessOrEqual", [center, j]), bx.op("Less", [j, right])
    )
    kind = compute.numpy()
    out = bx.op("Where", [peak, bx.const(np.array(1, kind)), bx.const(np.array(0, kind))])
    out = bx.op("Where", [rising, ratio(bx.op("Sub", [j, left]), rise), out])
    out = bx.op("Where", [falling, ratio(bx.op("Sub", [right, j]), fall), out])
    return out if out_type == compute else bx.op("Cast", [out], {"to": int(out_type)})
