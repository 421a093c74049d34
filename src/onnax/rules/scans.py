"""Scans and selections along an axis: CumSum, CumProd, Trilu, TopK, ReverseSequence, Compress.

* **CumSum** (11, 14) is linear in ``x``: the tangent is the same CumSum of the tangent. Its
  transpose is a CumSum of the cotangent with ``reverse`` flipped and ``exclusive`` kept (an
  inclusive prefix sum is a lower-triangular all-ones matrix along the axis, its transpose the
  upper-triangular one, i.e. the suffix sum; the exclusive variant drops the diagonal on both).
* **CumProd** (26) has an exact tangent also where ``x`` has zeros (no ``y / x``): the
  products of the scanned elements without ``x_j`` come from a CumProd of ``n`` copies of ``x``
  with ``x_j`` set to 1 (``n`` times the memory of ``x``). An axis known only at run time (a
  model input, as in the ONNX node tests) is placed by comparing each element's position along
  it (``CumSum`` of ones, exclusive) with the copy index, instead of a static reshape.
* **Trilu** (14) masks ``x`` by a fixed triangle: it is linear and its own transpose.
* **TopK** (10, 11, 24): the values output is a gather of ``X`` at the indices output, so its
  tangent is ``GatherElements(t, Indices, axis)``; the indices output has no tangent. Ties
  between elements make TopK non-differentiable; the tangent follows the chosen indices.
* **ReverseSequence** (10, 28) permutes elements by fixed lengths: linear, and its own
  transpose (reversing a prefix twice is the identity, so the permutation is an involution).
* **Compress** (9, 11, 28) with a fixed condition is a ``Gather`` of ``NonZero(condition)``
  (of the flattened input when there is no axis); the jvp emits that Gather, whose transpose
  (a scatter-add) serves reverse mode, so Compress itself needs no transpose rule.

Batch rules keep the batch axis at 0. CumSum's and CumProd's axis (an input) is shifted at run
time (``Where(a < 0, a + rank, a) + 1``, rank known from inference); Trilu works on the last two
axes and applies as is; TopK's and Compress's axis attributes are shifted, and Compress without
an axis reads each example flattened (``Reshape`` to ``[B, -1]``, then ``axis=1``).
ReverseSequence folds the vmap axis into its own batch axis (moved next to it and merged by a
Reshape), so the lengths become one vector of ``B * batch`` entries. Inputs that are parameters
(the axis of the scans, Trilu's k, TopK's K, Compress's condition) must not be batched: they
would give each example its own axis or output shape; such a case is refused, naming the node
and input.

Each operator is registered once, from its first version: the later ones added element types
or attributes that the rules read from the node.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints
from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, batch_data, linear_unary_jvp, original_input

__all__: list[str] = []


# ------------------------------------------------------------------------------ helpers
def _same_op_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Transpose of a self-adjoint linear operator: the same operator on the cotangent."""
    ct = cts[0]
    assert ct is not None
    out = em.op(node.op_type, [ct, *node.inputs[1:]], attributes_of(node))
    return [out, *[None] * (len(node.inputs) - 1)]


_PER_EXAMPLE = (
    "each example could use a different {role}, which one batched operator cannot express"
)


# ------------------------------------------------------------------------------ CumSum
# Linear in x: the tangent is the same CumSum of the tangent. 14 added element types only.
cumsum = OpRules("CumSum", since=11)
cumsum.jvp(linear_unary_jvp)


@cumsum.transpose
def _cumsum_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    assert ct is not None
    reverse = node.attributes.get_int("reverse", 0)
    attrs = attributes_of(node, reverse=1 - reverse)
    return [em.op("CumSum", [ct, node.inputs[1]], attrs), None]


@cumsum.batch
def _cumsum_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """CumSum with its run-time axis normalised and shifted past the batch axis."""
    refuse_batched(bx, node, args, batched, {1: "axis"}, _PER_EXAMPLE)
    x, axis = batch_data(args), args[1]
    assert axis is not None
    rank = bx.rank(original_input(node))
    dtype = axis.dtype if axis.dtype is not None else ir.DataType.INT64
    np_dtype = dtype.numpy()
    zero = bx.const(np.array(0, np_dtype))
    negative = bx.op("Less", [axis, zero])
    wrapped = bx.op("Add", [axis, bx.const(np.array(rank, np_dtype))])
    normalized = bx.op("Where", [negative, wrapped, axis])
    shifted = bx.op("Add", [normalized, bx.const(np.array(1, np_dtype))])
    return [bx.op(node.op_type, [x, shifted], attributes_of(node))], [True]


# ------------------------------------------------------------------------------- Trilu
trilu = OpRules("Trilu", since=14)
trilu.jvp(linear_unary_jvp)
trilu.transpose(_same_op_transpose)


@trilu.batch
def _trilu_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Trilu acts on the last two axes: a leading batch axis is one more matrix of the stack."""
    refuse_batched(bx, node, args, batched, {1: "diagonal offset k"}, _PER_EXAMPLE)
    inputs = [batch_data(args), *args[1:]]
    return [bx.op("Trilu", inputs, attributes_of(node))], [True]


# -------------------------------------------------------------------------------- TopK
# Later versions (11, 24) are served by the same rules, which read the attributes they need.
topk = OpRules("TopK", since=10)


@topk.jvp
def _topk_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    if t is None:
        return [None, None]
    axis = node.attributes.get_int("axis", -1)
    return [em.op("GatherElements", [t, node.outputs[1]], {"axis": axis}), None]


@topk.batch
def _topk_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """TopK with its axis attribute normalised and shifted past the batch axis."""
    refuse_batched(bx, node, args, batched, {1: "K"}, _PER_EXAMPLE)
    rank = bx.rank(original_input(node))
    axis = node.attributes.get_int("axis", -1)
    axis = (axis + rank if axis < 0 else axis) + 1
    values, indices = bx.op_multi(
        "TopK", [batch_data(args), *args[1:]], attributes_of(node, axis=axis), num_outputs=2
    )
    return [values, indices], [True, True]


# --------------------------------------------------------------------- ReverseSequence
reverse_sequence = OpRules("ReverseSequence", since=10)
reverse_sequence.jvp(linear_unary_jvp)
reverse_sequence.transpose(_same_op_transpose)


@reverse_sequence.batch
def _reverse_sequence_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Folds the vmap axis into the operator's batch axis.

    The vmap axis is moved right before the (shifted) batch axis and the two are merged by a
    Reshape: the result has the unbatched layout with a batch axis of ``B * batch`` entries, so
    the attributes are kept and the lengths are materialized to ``[B, batch]`` and flattened
    in the same (vmap-major) order. The result is reshaped and moved back.
    """
    x, lens = batch_data(args), args[1]
    assert lens is not None
    rank = bx.rank(original_input(node))
    b = node.attributes.get_int("batch_axis", 1)
    x = bx.materialize(x, batched[0], original_input(node))
    # The vmap axis goes to position b, the operator's batch axis follows at b + 1.
    moved = bx.move_axis(x, 0, b, rank + 1)
    shape = bx.op("Shape", [moved])
    pieces = []
    if b > 0:
        pieces.append(bx.slice(shape, [0], [b], [0]))
    pieces.append(bx.ints([-1]))
    if b + 2 < rank + 1:
        pieces.append(bx.slice(shape, [b + 2], [rank + 1], [0]))
    merged = bx.op("Reshape", [moved, bx.op("Concat", pieces, {"axis": 0})])
    flat_lens = bx.op(
        "Reshape",
        [bx.materialize(lens, batched[1], original_input(node, 1)), bx.ints([-1])],
    )
    out = bx.op("ReverseSequence", [merged, flat_lens], attributes_of(node))
    restored = bx.op("Reshape", [out, shape])
    return [bx.move_axis(restored, b, 0, rank + 1)], [True]


# ---------------------------------------------------------------------------- Compress
compress = OpRules("Compress", since=9)


@compress.jvp
def _compress_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """Compress is a Gather of the positions where the condition holds.

    ``Reshape(NonZero(condition), [-1])`` lists them (a condition shorter than the axis leaves
    the rest out, as Compress does); without an axis Compress reads the flattened input.
    Emitting Gather rather than Compress reuses Gather's transpose (a scatter-add).
    """
    t = tangents[0]
    if t is None:
        return [None]
    positions = em.op("Reshape", [em.op("NonZero", [node.inputs[1]]), em.ints([-1])])
    axis = node.attributes.get_int("axis", None) if "axis" in node.attributes else None
    if axis is None:
        return [em.op("Gather", [em.op("Reshape", [t, em.ints([-1])]), positions], {"axis": 0})]
    return [em.op("Gather", [t, positions], {"axis": axis})]


@compress.batch
def _compress_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Compress along the shifted axis; without an axis, along the flattened example."""
    refuse_batched(bx, node, args, batched, {1: "condition"}, _PER_EXAMPLE)
    x, condition = batch_data(args), args[1]
    assert condition is not None
    if "axis" not in node.attributes:
        flat = bx.op("Reshape", [x, bx.op("Concat", [bx.batch_size, bx.ints([-1])], {"axis": 0})])
        return [bx.op("Compress", [flat, condition], {"axis": 1})], [True]
    rank = bx.rank(original_input(node))
    axis = node.attributes.get_int("axis", 0)
    axis = (axis + rank if axis < 0 else axis) + 1
    return [bx.op("Compress", [x, condition], {"axis": axis})], [True]


# ----------------------------------------------------------------------------- CumProd
cumprod = OpRules("CumProd", since=26)
# Its axis is an input as CumSum's: the same shift past the batch axis.
cumprod.batch(_cumsum_batch)


@cumprod.jvp
def _cumprod_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """Exact tangent of CumProd, also where ``x`` has zeros (no ``y / x``).

    ``dy_i = sum_j t_j * [j in scan(i)] * prod_{k in scan(i), k != j} x_k``. A new leading axis
    ``j`` of length ``n`` (the scanned dimension) holds copies of ``x`` with ``x_j`` replaced by 1;
    their CumProd (the node's own attributes) gives the products without ``x_j``, and the CumSum
    of the one-hot ``j == i`` (same attributes) is the indicator of ``j`` in the scanned set.
    This costs ``n`` times the memory of ``x``. The axis must be static to place the one-hot.
    """
    t = tangents[0]
    if t is None:
        return [None]
    x = node.inputs[0]
    assert x is not None
    axes = const_ints(node.inputs[1])
    if x.shape is None or (axes is not None and len(axes) != 1):
        raise UnsupportedOperatorError(
            f"jvp: {op_label(node)} at opset {em.opset} ({node_label(node)}): the derivative "
            f"needs an input of known rank (input 0 {x.name!r} has none) and one axis. Remedy: "
            "declare the rank of that value in the model's value_info."
        )
    if axes is None:
        return [_cumprod_jvp_runtime_axis(em, node, x, t)]
    rank = x.shape.rank()
    a = axes[0] + rank if axes[0] < 0 else axes[0]
    n = em.slice(em.shape(x), [a], [a + 1], [0])
    zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
    ar = em.op("Range", [zero, em.squeeze(n, [0]), one])
    rows = em.unsqueeze(ar, list(range(1, rank + 1)))
    col_shape = [1] * (rank + 1)
    col_shape[a + 1] = -1
    cols = em.op("Reshape", [ar, em.ints(col_shape)])
    eye = em.op("Equal", [rows, cols])
    copies = em.op("Where", [eye, em.scalar(1.0, like=x), em.unsqueeze(x, [0])])
    axis_v = em.const(np.array(a + 1, np.int64))
    attrs = attributes_of(node)
    products = em.op("CumProd", [copies, axis_v], attrs)
    one_hot = em.op("Cast", [eye], {"to": x.dtype})
    inside = em.op("CumSum", [one_hot, axis_v], attrs)
    coefficient = em.op("Mul", [products, inside])
    # t_j on copy j, broadcast along the scanned axis: pick position j of t with the one-hot.
    t_j = em.reduce_sum(em.op("Mul", [one_hot, em.unsqueeze(t, [0])]), [a + 1], keepdims=True)
    terms = em.op("Mul", [coefficient, t_j])
    return [em.reduce_sum(terms, [0], keepdims=False)]


def _cumprod_jvp_runtime_axis(em: Emitter, node: ir.Node, x: ir.Value, t: ir.Value) -> ir.Value:
    """:func:`_cumprod_jvp` for an axis known at run time only (an input of the model).

    The one-hot ``j == i`` compares the copy index ``j`` (leading axis) with each element's
    position along the axis, which ``CumSum(ones, axis, exclusive=1)`` computes without knowing
    where the axis is; on the copies (one leading axis more) a non-negative axis moves by one.
    """
    assert x.shape is not None and x.dtype is not None
    rank = x.shape.rank()
    axis_in = node.inputs[1]
    assert axis_in is not None
    axis = em.op(
        "Cast", [em.op("Reshape", [axis_in, em.ints([1])])], {"to": int(ir.DataType.INT64)}
    )
    zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
    negative = em.op("Less", [axis, zero])
    normalized = em.op("Where", [negative, em.op("Add", [axis, em.ints([rank])]), axis])
    n = em.op("Gather", [em.shape(x), normalized], {"axis": 0})
    rows = em.unsqueeze(em.op("Range", [zero, em.squeeze(n, [0]), one]), list(range(1, rank + 1)))
    ones = em.op("Expand", [em.scalar(1.0, like=x), em.shape(x)])
    position = em.op("CumSum", [ones, axis], {"exclusive": 1})
    eye = em.op("Equal", [em.op("Cast", [rows], {"to": int(x.dtype)}), em.unsqueeze(position, [0])])
    copies = em.op("Where", [eye, em.scalar(1.0, like=x), em.unsqueeze(x, [0])])
    axis_v = em.op("Where", [negative, axis, em.op("Add", [axis, em.ints([1])])])
    attrs = attributes_of(node)
    products = em.op("CumProd", [copies, axis_v], attrs)
    one_hot = em.op("Cast", [eye], {"to": int(x.dtype)})
    inside = em.op("CumSum", [one_hot, axis_v], attrs)
    coefficient = em.op("Mul", [products, inside])
    t_j = em.op(
        "ReduceSum", [em.op("Mul", [one_hot, em.unsqueeze(t, [0])]), axis_v], {"keepdims": 1}
    )
    t_j.shape, t_j.dtype = ir.Shape([None] * (rank + 1)), x.dtype
    terms = em.op("Mul", [coefficient, t_j])
    return em.reduce_sum(terms, [0], keepdims=False)
