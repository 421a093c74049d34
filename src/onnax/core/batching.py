"""The emitter of vmap batch rules and the helpers most batch rules share.

Every batched value carries its batch dimension at axis 0; unbatched values are the original
ones. A rule therefore only needs the unbatched shapes (from the original node) to place axes.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.errors import UnsupportedOperatorError

__all__ = ["Batcher", "RandomnessPolicy", "input_name", "refuse_batched", "shift_axes"]

RandomnessPolicy = str
"""``"error"``, ``"different"`` or ``"same"``."""


class Batcher(Emitter):
    """An :class:`Emitter` that also knows the batch size.

    Args:
        opset: The default-domain opset to emit for.
        batch_size: A 1-D int64 value of one element holding the batch size (static or run time).
        randomness: How random operators behave under vmap.
    """

    def __init__(
        self, opset: int, batch_size: ir.Value, randomness: RandomnessPolicy = "error"
    ) -> None:
        super().__init__(opset)
        self.batch_size = batch_size
        self.randomness = randomness

    def rank(self, value: ir.Value) -> int:
        """The unbatched rank of an original value (its inferred shape must be known)."""
        if value.shape is None:
            raise UnsupportedOperatorError(
                f"vmap: the rank of {value.name!r} is unknown, and batching the operator that "
                "reads it needs the rank. Remedy: give the model's inputs static ranks (shape "
                "inference then finds the rest), or compute shapes from constants."
            )
        return value.shape.rank()

    def unbatched_shape(self, arg: ir.Value, batched: bool, original: ir.Value) -> ir.Value:
        """The run-time shape of one example of ``arg`` (``original`` is the unbatched value).

        Never call ``shape()`` on the original of a batched value: the original computation is
        removed after batching, so its values must not be read.
        """
        if original.shape is not None and original.shape.is_static():
            return self.ints(list(original.shape.numpy()))
        if not batched:
            return self.op("Shape", [arg])
        return (
            self.op("Shape", [arg], {"start": 1})
            if self.opset >= 15
            else self.slice(self.op("Shape", [arg]), [1], [2**62], [0])
        )

    def materialize(self, arg: ir.Value, batched: bool, original: ir.Value) -> ir.Value:
        """``arg`` with a batch dimension at 0: broadcast along it when it is not batched."""
        if batched:
            return arg
        shape = self.op(
            "Concat", [self.batch_size, self.unbatched_shape(arg, False, original)], {"axis": 0}
        )
        return self.op("Expand", [self.unsqueeze(arg, [0]), shape])

    def align(self, arg: ir.Value, batched: bool, original: ir.Value, rank: int) -> ir.Value:
        """A batched ``arg`` reshaped to ``1 + rank`` dimensions for right-aligned broadcasting.

        Unbatched values broadcast as they are; a batched one gets size-1 axes after the batch
        axis so that its own dimensions line up with the result's trailing dimensions.
        """
        if not batched:
            return arg
        missing = rank - self.rank(original)
        return self.unsqueeze(arg, list(range(1, 1 + missing))) if missing > 0 else arg

    def move_axis(self, value: ir.Value, source: int, destination: int, rank: int) -> ir.Value:
        """Moves axis ``source`` to ``destination`` in a value of rank ``rank``."""
        if source == destination:
            return value
        perm = [i for i in range(rank) if i != source]
        perm.insert(destination, source)
        return self.transpose(value, perm)

    def batched_shape(self, shape: ir.Value) -> ir.Value:
        """Prepends the batch size to a 1-D int64 shape value."""
        return self.op("Concat", [self.batch_size, shape], {"axis": 0})


def shift_axes(axes: Sequence[int], rank: int) -> list[int]:
    """Normalises axes of an unbatched rank-``rank`` value and shifts them past the batch axis."""
    return [(a + rank if a < 0 else a) + 1 for a in axes]


SHAPE_DECIDING = (
    "its value decides the shape of the result, so each example could get a different shape, "
    "which one batched tensor cannot hold"
)


def input_name(node: ir.Node, args: Sequence[ir.Value | None], index: int) -> str:
    """The user-facing name of input ``index`` of ``node``, for messages.

    vmap hands the name of a batched graph input over to the new input, which reaches a rule
    directly or through the Transpose moving its batch axis to 0.
    """
    original = node.inputs[index] if index < len(node.inputs) else None
    if original is not None and original.name:
        return original.name
    arg = args[index] if index < len(args) else None
    if arg is not None and arg.name and arg.is_graph_input():
        return arg.name
    producer = arg.producer() if arg is not None else None
    if producer is not None and producer.op_type == "Transpose" and producer.inputs:
        source = producer.inputs[0]
        if source is not None and source.name and source.is_graph_input():
            return source.name
    return f"#{index}"


def refuse_batched(
    bx: Batcher,
    node: ir.Node,
    args: Sequence[ir.Value | None],
    batched: Sequence[bool],
    roles: dict[int, str],
    why: str = SHAPE_DECIDING,
) -> None:
    """Raises when a parameter input listed in ``roles`` (index: what it is) is batched.

    ``why`` may name the parameter as ``{role}``.

    Raises:
        UnsupportedOperatorError: Naming the operator, node, input and the remedy.
    """
    for index, role in roles.items():
        if index < len(batched) and batched[index]:
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets a batched "
                f"{role} (input {index} {input_name(node, args, index)!r}): "
                f"{why.format(role=role)}. Remedy: give the inputs it is computed from in_axes "
                f"None (shared), so that every example uses the same {role}."
            )
