"""Batch rules of the sequence operators.

A *batched sequence* is a sequence whose every element carries the batch axis at 0; its length
is shared by all examples. That is the layout a batched ``seq(tensor)`` graph input or output
declares (the element type gains the batch dimension), and it keeps every sequence operator a
single operator on the batch: ``SequenceAt`` of a batched sequence is a batched tensor,
``SequenceLength`` is shared, ``SplitToSequence`` and ``ConcatFromSequence`` shift their axis.

An unbatched sequence meeting a batched one (``SequenceInsert`` of a batched tensor into a
shared sequence, a Loop's sequence state that becomes batched) is broadcast element by element
(:meth:`Batcher.materialize`, a Loop over the elements; an empty sequence stays as it is).

What one batched sequence cannot hold is refused: a batched position (``SequenceAt``,
``SequenceInsert``, ``SequenceErase``) or a batched ``split`` of ``SplitToSequence`` makes the
examples' sequences differ in order, length or element shapes.

``SequenceMap`` batches its body like Scan's (:meth:`Batcher.batch_body`): a batched input
sequence or tensor is a batched body input, and the body's batched outputs make batched output
sequences. ``SequenceEmpty`` has no input, so it is never batched. Only batch rules live here:
jvp and vjp refuse sequences on a path that carries a derivative
(:func:`onnax.core.diagnostics.check_active_node`).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.registry import Args, BatchResult, OpRules
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, batch_data, original_input

__all__ = ["element_shapes"]

_POSITION = (
    "each example would pick, insert or erase a different element, so the examples' "
    "sequences would differ in order and element shapes, while one batched sequence holds "
    "the same positions for all"
)
_SPLIT = (
    "its value decides how many pieces there are and their sizes, so each example could get "
    "a sequence of a different length or with different element shapes, while one batched "
    "sequence has one length and one shape per element"
)


def _materialized(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> list[ir.Value]:
    """Every present argument with the batch axis at 0 (shared ones broadcast)."""
    out: list[ir.Value] = []
    for i, (arg, flag) in enumerate(zip(args, batched, strict=True)):
        if arg is None:
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} ({node_label(node)}) has no input {i}"
            )
        out.append(bx.materialize(arg, flag, original_input(node, i)))
    return out


def _shifted_axis(bx: Batcher, node: ir.Node, axis: int, rank_of: ir.Value, extra: int = 0) -> int:
    """``axis`` of one example (of rank ``rank(rank_of) + extra``) shifted past the batch axis."""
    if axis >= 0:
        return axis + 1
    return axis + bx.rank(rank_of) + extra + 1


# ------------------------------------------------------------------ construct, insert, at
sequence_construct = OpRules("SequenceConstruct", since=11)


@sequence_construct.batch
def _construct_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    return [bx.op("SequenceConstruct", _materialized(bx, node, args, batched))], [True]


sequence_insert = OpRules("SequenceInsert", since=11)


@sequence_insert.batch
def _insert_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    refuse_batched(bx, node, args, batched, {2: "position"}, _POSITION)
    seq, tensor = _materialized(bx, node, args[:2], batched[:2])
    return [bx.op("SequenceInsert", [seq, tensor, *args[2:]])], [True]


sequence_at = OpRules("SequenceAt", since=11)


@sequence_at.batch
def _at_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    refuse_batched(bx, node, args, batched, {1: "position"}, _POSITION)
    return [bx.op("SequenceAt", list(args))], [True]


def element_shapes(model: ir.Model) -> None:
    """Gives elements taken out of a sequence (``SequenceAt``) the shape its type declares.

    Shape inference leaves them unknown inside loop bodies (the SequenceMap function's
    expansion reads the outer sequence there), and batch rules need ranks. Symbolic dimensions
    are not copied: elements of one sequence may differ in them.
    """
    for node in model.graph.all_nodes():
        if node.op_type != "SequenceAt" or node.domain != "" or not node.inputs:
            continue
        seq, element = node.inputs[0], node.outputs[0]
        if element.shape is not None or seq is None or seq.shape is None:
            continue
        dims = [d if isinstance(d, int) else ir.SymbolicDim(None) for d in seq.shape.dims]
        element.shape = ir.Shape(dims)


sequence_erase = OpRules("SequenceErase", since=11)


@sequence_erase.batch
def _erase_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    refuse_batched(bx, node, args, batched, {1: "position"}, _POSITION)
    return [bx.op("SequenceErase", list(args))], [True]


sequence_length = OpRules("SequenceLength", since=11)


@sequence_length.batch
def _length_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    # Every example's sequence has the batched sequence's length: the result is shared.
    return [bx.op("SequenceLength", [batch_data(args)])], [False]


# ------------------------------------------------------------------ split, concat
# Opset 24 only widens the element types.
split_to_sequence = OpRules("SplitToSequence", since=11)


@split_to_sequence.batch
def _split_to_sequence_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """SplitToSequence along the shifted axis; a batched ``split`` is refused."""
    refuse_batched(bx, node, args, batched, {1: "split"}, _SPLIT)
    axis = node.attributes.get_int("axis", 0)
    shifted = _shifted_axis(bx, node, axis, original_input(node))
    attrs = attributes_of(node, axis=shifted)
    return [bx.op("SplitToSequence", list(args), attrs)], [True]


concat_from_sequence = OpRules("ConcatFromSequence", since=11)


@concat_from_sequence.batch
def _concat_from_sequence_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """ConcatFromSequence along the shifted axis.

    With ``new_axis=1`` the axis counts in the result, one dimension more than an element,
    which is what a negative axis is normalised against.
    """
    axis = node.attributes.get_int("axis", 0)
    new_axis = node.attributes.get_int("new_axis", 0)
    out = node.outputs[0]
    if out.shape is not None:
        shifted = _shifted_axis(bx, node, axis, out)
    else:
        shifted = _shifted_axis(bx, node, axis, original_input(node), extra=new_axis)
    attrs = attributes_of(node, axis=shifted)
    return [bx.op("ConcatFromSequence", [batch_data(args)], attrs)], [True]


# ------------------------------------------------------------------ SequenceMap
sequence_map = OpRules("SequenceMap", since=17)


@sequence_map.batch
def _sequence_map_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """SequenceMap with a batched body.

    The body gets one element of each input sequence (and each additional tensor as it is):
    a batched sequence or tensor is a batched body input, and the output sequences are batched
    where the body's outputs are. The body may also read batched values of enclosing graphs,
    which the shared walk finds.
    """
    body = node.attributes["body"].as_graph().clone(allow_outer_scope_values=True)
    result = bx.batch_body(body, list(batched))
    flags = result.finish()
    outs = bx.op_multi(
        "SequenceMap", list(args), {"body": result.graph}, num_outputs=len(node.outputs)
    )
    return list(outs), flags
