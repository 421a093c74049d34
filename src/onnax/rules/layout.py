"""Layout operators: Reshape Flatten Transpose Squeeze Unsqueeze Expand Tile.

Every operator here is linear in its data input, so the tangent is the operator applied to the
tangent (:func:`~onnax.rules._shape_helpers.same_op_jvp`) and the transpose undoes the layout
change:

* pure relayouts (Reshape, Flatten, Squeeze, Unsqueeze) reshape the cotangent back, or apply the
  inverse operator when its parameters are known, which needs no run-time shape;
* Transpose transposes back by the inverse permutation;
* Expand sums the cotangent over the broadcast axes;
* Tile sums the repeats out of an interleaved reshape of the cotangent.

Parameters that are only known at run time (shapes, axes, repeats) are handled with shape
arithmetic on primal values, so a dynamic dimension survives into the derivative model.

Batch rules (vmap) keep the batch axis first and rewrite each operator's parameters for one more
leading axis: axes are shifted past it (also at run time, for axes given as inputs), Transpose's
perm gains a leading 0, Tile a repeat of 1, and the shape consumers (Reshape, Expand, Flatten)
get the batch size prepended to the shape of one example, which vmap keeps unbatched (``Shape``
returns one example's shape). A shape-like input (target shape, axes, repeats) that is itself
batched could give each example a different output shape: it is refused, naming the node and
the input.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import const_ints, int_attr, ints_attr, ints_param
from onnax.core.batching import Batcher, refuse_batched, shift_axes
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.shapes import unbroadcast
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, batch_data, original_input
from onnax.rules._shape_helpers import (
    norm_axis,
    rank_of,
    reshape_like,
    same_op_jvp,
    shift_runtime_axes,
    vector_length,
)

__all__: list[str] = []


# ------------------------------------------------------------------------------ Expand
expand = OpRules("Expand", since=8)


def _expand_tangent(em: Emitter, node: ir.Node, t: ir.Value) -> ir.Value:
    return em.op("Expand", [t, node.inputs[1]])


expand.defjvp(_expand_tangent)


@expand.transpose
def _expand_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    return [unbroadcast(em, ct, x, node.outputs[0]), None]


@expand.batch
def _expand_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Expand of batched data to ``[B, 1 ... 1, *shape]``, the data aligned to the result rank.

    Expand broadcasts right-aligned, so one example of rank ``r`` against a shape of length
    ``s`` gives rank ``R = max(r, s)``. The data gets size-1 axes after the batch axis up to
    ``1 + R`` dimensions and the target is the shape padded with leading ones to ``R``, so the
    batch axis meets the batch size and every other axis lines up as in one example.
    """
    refuse_batched(bx, node, args, batched, {1: "target shape"})
    x, shape = batch_data(args), args[1]
    assert shape is not None
    r = bx.rank(original_input(node))
    s = vector_length(shape)
    if s is None:
        # The length of the shape is only known at run time; the rank of the result may be.
        y = node.outputs[0]
        if y.shape is None or y.shape.rank() < r:
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}): the length of "
                f"its shape input {shape.name!r} and the rank of its result are unknown after "
                "shape inference, and batching needs the rank to line the batch axis up. Remedy: "
                "give the shape input a static length (e.g. build it with Concat of 1-D pieces)."
            )
        rank_out = y.shape.rank()
        ones = bx.op(
            "Expand", [bx.ints([1]), bx.op("Sub", [bx.ints([rank_out]), bx.op("Shape", [shape])])]
        )
        target = bx.op("Concat", [bx.batch_size, ones, shape], {"axis": 0})
    else:
        rank_out = max(r, s)
        lead = [bx.batch_size] + ([bx.ints([1] * (rank_out - s))] if rank_out > s else [])
        target = bx.op("Concat", [*lead, shape], {"axis": 0})
    aligned = bx.align(x, True, original_input(node), rank_out)
    return [bx.op("Expand", [aligned, target])], [True]


# ---------------------------------------------------------------------- Reshape / Flatten
def _reshape_back_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """Transpose of a relayout that keeps the element order (Reshape, Flatten, Squeeze...)."""
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    return [reshape_like(em, ct, x), *[None] * (len(node.inputs) - 1)]


reshape = OpRules("Reshape", since=5)
reshape.jvp(same_op_jvp)
reshape.transpose(_reshape_back_transpose)


@reshape.batch
def _reshape_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Reshape of batched data to ``Concat(batch size, shape)``.

    The shape input is the one of a single example (a constant, or Shape arithmetic, which vmap
    keeps unbatched). A 0 copies the input dimension at the same position (allowzero=0): with
    the batch axis prepended to both, position ``i`` becomes ``i + 1`` on both sides, so the
    copy still reads the right dimension; -1 still absorbs what remains of one example.
    """
    refuse_batched(bx, node, args, batched, {1: "target shape"})
    x, shape = batch_data(args), args[1]
    assert shape is not None
    target = bx.op("Concat", [bx.batch_size, shape], {"axis": 0})
    return [bx.op("Reshape", [x, target], attributes_of(node))], [True]


flatten = OpRules("Flatten", since=9)
flatten.jvp(same_op_jvp)
flatten.transpose(_reshape_back_transpose)


@flatten.batch
def _flatten_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Reshape to ``[B, prod(dims[:axis]), prod(dims[axis:])]``, one example's Flatten.

    The products are computed at run time when a dimension is symbolic.
    """
    x, original = batch_data(args), original_input(node)
    r = bx.rank(original)
    axis = norm_axis(int_attr(node, "axis", 1), r)
    assert original.shape is not None
    dims = list(original.shape.dims)
    static = [d for d in dims if isinstance(d, int)]
    if len(static) == r:
        front = int(np.prod(static[:axis], dtype=np.int64))
        back = int(np.prod(static[axis:], dtype=np.int64))
        if front > 0 and back > 0:
            # Reshape's 0 copies the batch dimension: no run-time batch size needed.
            return [bx.op("Reshape", [x, bx.ints([0, front, back])])], [True]
    shape = bx.unbatched_shape(x, True, original)

    def product(start: int, end: int) -> ir.Value:
        if start == end:
            return bx.ints([1])
        part = bx.slice(shape, [start], [end], [0])
        return bx.reduce("ReduceProd", part, None, keepdims=True)

    target = bx.op("Concat", [bx.batch_size, product(0, axis), product(axis, r)], {"axis": 0})
    return [bx.op("Reshape", [x, target])], [True]


# ------------------------------------------------------------------------------ Transpose
transpose = OpRules("Transpose")
transpose.jvp(same_op_jvp)


@transpose.transpose
def _transpose_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct = cts[0]
    assert ct is not None
    perm = ints_attr(node, "perm")
    if perm is None:
        # The default reverses the axes, which is its own inverse.
        return [em.op("Transpose", [ct])]
    return [em.transpose(ct, [int(i) for i in np.argsort(perm)])]


@transpose.batch
def _transpose_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """The batch axis stays first: ``perm' = [0] + [p + 1 for p in perm]``."""
    perm = ints_attr(node, "perm")
    if perm is None:
        r = bx.rank(original_input(node))
        perm = list(range(r - 1, -1, -1))
    # perm lists every axis, so its length is the rank (unknown after a Squeeze without axes).
    new_perm = [0, *shift_axes(perm, len(perm))]
    return [bx.op("Transpose", [batch_data(args)], {"perm": new_perm})], [True]


# --------------------------------------------------------------------- Squeeze / Unsqueeze
def _squeeze_like(em: Emitter, op_type: str, ct: ir.Value, axes: list[int] | ir.Value) -> ir.Value:
    if isinstance(axes, ir.Value):
        return em.op(op_type, [ct, axes])
    return em.squeeze(ct, axes) if op_type == "Squeeze" else em.unsqueeze(ct, axes)


def _squeeze_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    # Squeeze and Unsqueeze with the same axes are inverse (negative axes refer to the rank of
    # the larger tensor in both). Without axes Squeeze drops every size-1 dimension, which only
    # the input's shape tells: reshape back to it.
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    axes = ints_param(node, "axes", 1)
    rest: list[ir.Value | None] = [None] * (len(node.inputs) - 1)
    if axes is None:
        return [reshape_like(em, ct, x), *rest]
    if node.op_type == "Unsqueeze" and isinstance(axes, list):
        folded = _fold_into_sum(em, ct, axes, node.outputs[0])
        if folded is not None:
            return [folded, *rest]
    inverse = "Unsqueeze" if node.op_type == "Squeeze" else "Squeeze"
    return [_squeeze_like(em, inverse, ct, axes), *rest]


def _fold_into_sum(em: Emitter, ct: ir.Value, axes: list[int], out: ir.Value) -> ir.Value | None:
    """``ReduceSum(s, axes, keepdims=0)`` when ``ct`` is ``ReduceSum(s, some of axes, keepdims=1)``.

    A per-channel tangent broadcast over the data (``Unsqueeze`` then a broadcasting ``Mul`` or
    ``Add``: BatchNorm's and the affine parameters') has as cotangent the sum over the broadcast
    axes with kept dimensions; squeezing them again is one ReduceSum that drops them. The kept
    sum is left without uses, for dead-code elimination. None when ``ct`` is anything else.
    """
    sums = ct.producer()
    if (
        sums is None
        or sums.op_type != "ReduceSum"
        or sums.domain != ""
        or ct.uses()
        or ct.is_graph_output()
        or out.shape is None
        or sums.attributes.get_int("keepdims", 1) != 1
        or sums.attributes.get_int("noop_with_empty_axes", 0) != 0
    ):
        return None
    summed = (
        const_ints(sums.inputs[1]) if len(sums.inputs) > 1 else sums.attributes.get_ints("axes")
    )
    rank = out.shape.rank()
    # The squeezed axes are 1 in ``ct``: those the sum kept from ``s`` were 1 there already, and
    # summing over them too changes nothing.
    if summed is None or not {a % rank for a in summed} <= {a % rank for a in axes}:
        return None
    source = sums.inputs[0]
    assert source is not None
    return em.reduce_sum(source, sorted(a % rank for a in axes), keepdims=False)


squeeze = OpRules("Squeeze", since=11)
squeeze.jvp(same_op_jvp)
squeeze.transpose(_squeeze_transpose)


@squeeze.batch
def _squeeze_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Squeeze with its axes shifted past the batch axis.

    Negative axes count from the back of one example (its rank ``r``). Run-time axes are shifted
    at run time. Without axes every size-1 dimension of an example goes, never the batch axis
    (whose size may be 1): the axes are listed explicitly, from the static shape, or at run time
    as the positions where the example's shape is 1 (which needs axes as an input, opset 13).
    """
    refuse_batched(bx, node, args, batched, {1: "axes"})
    x, original = batch_data(args), original_input(node)
    r = bx.rank(original)
    axes = ints_param(node, "axes", 1)
    if isinstance(axes, ir.Value):
        return [bx.op("Squeeze", [x, shift_runtime_axes(bx, axes, r)])], [True]
    if axes:
        return [bx.squeeze(x, shift_axes(axes, r))], [True]
    assert original.shape is not None
    dims = list(original.shape.dims)
    if all(isinstance(d, int) for d in dims):
        ones = [i + 1 for i, d in enumerate(dims) if d == 1]
        return [bx.squeeze(x, ones) if ones else bx.op("Identity", [x])], [True]
    if bx.opset < 13:
        unknown = [str(d) for d in dims if not isinstance(d, int)]
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) has no axes and "
            f"its input {original.name!r} has symbolic dimensions {unknown}: which of them are 1 "
            "is only known at run time, and before opset 13 Squeeze takes its axes as a static "
            "attribute (the batch axis, which may have size 1 too, must never be squeezed). "
            "Remedy: give the Squeeze explicit axes, or convert the model to opset 13 or newer."
        )
    shape = bx.unbatched_shape(x, True, original)
    where_one = bx.op("NonZero", [bx.op("Equal", [shape, bx.ints([1])])])
    positions = bx.op("Reshape", [where_one, bx.ints([-1])])
    return [bx.op("Squeeze", [x, bx.op("Add", [positions, bx.ints([1])])])], [True]


unsqueeze = OpRules("Unsqueeze", since=11)
unsqueeze.jvp(same_op_jvp)
unsqueeze.transpose(_squeeze_transpose)


@unsqueeze.batch
def _unsqueeze_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Unsqueeze with its axes shifted past the batch axis.

    Unsqueeze's axes refer to the *output* of one example, of rank ``r + len(axes)``, which is
    what negative axes are normalised against.
    """
    refuse_batched(bx, node, args, batched, {1: "axes"})
    x, original = batch_data(args), original_input(node)
    axes = ints_param(node, "axes", 1)
    if axes is None:
        raise InternalRuleError(f"{op_label(node)} ({node_label(node)}) has no axes")
    if not isinstance(axes, ir.Value) and all(a >= 0 for a in axes):
        # Non-negative axes shift without the rank (unknown after a Squeeze without axes).
        return [bx.unsqueeze(x, [a + 1 for a in axes])], [True]
    r = bx.rank(original)
    if not isinstance(axes, ir.Value):
        return [bx.unsqueeze(x, shift_axes(axes, r + len(axes)))], [True]
    n = vector_length(axes)
    out_rank: int | ir.Value = (
        r + n if n is not None else bx.op("Add", [bx.ints([r]), bx.op("Shape", [axes])])
    )
    return [bx.op("Unsqueeze", [x, shift_runtime_axes(bx, axes, out_rank)])], [True]


# ---------------------------------------------------------------------------------- Tile
tile = OpRules("Tile", since=6)
tile.jvp(same_op_jvp)


@tile.transpose
def _tile_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    # Tile's output along axis i is [reps_i, d_i] flattened: split every axis that way and sum
    # over the repeats.
    ct, x, repeats = cts[0], node.inputs[0], node.inputs[1]
    assert ct is not None and x is not None and repeats is not None
    rank = rank_of(node, x)
    reps = const_ints(repeats)
    dims = [d for d in x.shape.dims if isinstance(d, int)] if x.shape is not None else []
    if reps is not None and len(dims) == rank:
        split_shape = em.ints([v for pair in zip(reps, dims, strict=True) for v in pair])
    else:
        reps_v = em.ints(reps) if reps is not None else repeats
        pairs = em.op(
            "Concat", [em.unsqueeze(reps_v, [1]), em.unsqueeze(em.shape(x), [1])], {"axis": 1}
        )
        split_shape = em.op("Reshape", [pairs, em.ints([-1])])
    split = em.op("Reshape", [ct, split_shape])
    return [em.reduce_sum(split, list(range(0, 2 * rank, 2)), keepdims=False), None]


@tile.batch
def _tile_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Tile with one repeat for the batch axis: ``repeats' = [1, *repeats]``."""
    refuse_batched(bx, node, args, batched, {1: "repeats"})
    x, repeats = batch_data(args), args[1]
    assert repeats is not None
    static = const_ints(repeats)
    new = (
        bx.ints([1, *static])
        if static is not None
        else bx.op("Concat", [bx.ints([1]), repeats], {"axis": 0})
    )
    return [bx.op("Tile", [x, new])], [True]
