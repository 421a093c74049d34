"""The emitter of vmap batch rules and the helpers most batch rules share.

Every batched value carries its batch dimension at axis 0; unbatched values are the original
ones. A rule therefore only needs the unbatched shapes (from the original node) to place axes.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Protocol

import onnx_ir as ir

from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.errors import UnsupportedOperatorError

__all__ = [
    "BatchedBody",
    "Batcher",
    "RandomnessPolicy",
    "Walker",
    "detach",
    "input_name",
    "is_sequence",
    "refuse_batched",
    "shift_axes",
]

RandomnessPolicy = str
"""``"error"``, ``"different"`` or ``"same"``."""


class Walker(Protocol):
    """The pass's batching walk, for rules that batch subgraphs (If, Loop, Scan).

    One map from original values to their replacements serves the graph and all its subgraphs,
    so a body that reads a batched value of an enclosing graph reads its batched replacement.
    """

    def lookup(self, value: ir.Value) -> tuple[ir.Value, bool]:
        """The replacement of an original value and whether it is batched (batch axis at 0)."""
        ...

    def bind(self, original: ir.Value, new: ir.Value, batched: bool) -> None:
        """Records ``new`` as the replacement of ``original``."""
        ...

    def batch_nodes(self, bx: Batcher, nodes: Sequence[ir.Node]) -> None:
        """Batches ``nodes`` (placed in a graph, in order) with ``bx``, emitting next to them."""
        ...


class Batcher(Emitter):
    """An :class:`Emitter` that also knows the batch size.

    Args:
        opset: The default-domain opset to emit for.
        batch_size: A 1-D int64 value of one element holding the batch size (static or run time).
        randomness: How random operators behave under vmap.
        batch_dim: The batch dimension for declared shapes (an int or a symbolic dimension).
        walker: The pass's walk, needed by rules that batch subgraphs.
    """

    def __init__(
        self,
        opset: int,
        batch_size: ir.Value,
        randomness: RandomnessPolicy = "error",
        batch_dim: int | ir.SymbolicDim | None = None,
        walker: Walker | None = None,
    ) -> None:
        super().__init__(opset)
        self.batch_size = batch_size
        self.randomness = randomness
        self.batch_dim = batch_dim
        self.walker = walker
        # Numbers the sequence loops of one transform (shared with the child batchers): a
        # module-wide counter would name a model's loops after how many ran before it, so the
        # same model would not give the same bytes twice. Cleanup makes names unique.
        self._sequence_loops = itertools.count()

    # ------------------------------------------------------------------ subgraphs
    def child(self) -> Batcher:
        """A batcher for a subgraph: same batch size and walk, its own constant cache.

        Constants are cached per graph: one emitted inside a body is out of scope elsewhere.
        """
        child = Batcher(self.opset, self.batch_size, self.randomness, self.batch_dim, self.walker)
        child._sequence_loops = self._sequence_loops
        return child

    def _walk(self) -> Walker:
        if self.walker is None:
            raise RuntimeError("this Batcher has no walker: subgraphs need VmapPass")
        return self.walker

    def lookup(self, value: ir.Value) -> tuple[ir.Value, bool]:
        """The replacement of an original value and whether it is batched."""
        return self._walk().lookup(value)

    def batch_nodes(self, nodes: Sequence[ir.Node]) -> None:
        """Batches nodes already placed in this batcher's graph (before the current node)."""
        self._walk().batch_nodes(self, nodes)

    def batched_value_shape(self, original: ir.Value) -> ir.Shape | None:
        """The declared shape of the batched replacement of ``original`` (None if unknown)."""
        if original.shape is None or self.batch_dim is None:
            return None
        return ir.Shape([self.batch_dim, *original.shape.dims])

    def batch_body(self, graph: ir.Graph, batched_inputs: Sequence[bool]) -> BatchedBody:
        """Batches a subgraph in place (pass a clone): flagged inputs carry the batch at axis 0.

        The body's nodes are batched by the pass's walk with a child batcher; values the body
        reads from enclosing graphs are found through the shared map. The outputs are not
        rewritten yet: see :meth:`BatchedBody.finish`.
        """
        walker = self._walk()
        for i, (x, flag) in enumerate(zip(graph.inputs, batched_inputs, strict=True)):
            if flag:
                new = ir.Value(name=x.name, type=x.type, shape=self.batched_value_shape(x))
                # The original leaves the body with its consumers, which the walk replaces.
                graph.inputs[i] = new
                walker.bind(x, new, True)
        child = self.child()
        walker.batch_nodes(child, list(graph))
        originals = list(graph.outputs)
        looked = [walker.lookup(y) for y in originals]
        return BatchedBody(
            graph=graph,
            bx=child,
            originals=originals,
            outputs=[v for v, _ in looked],
            batched=[b for _, b in looked],
        )

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
        """``arg`` with a batch dimension at 0: broadcast along it when it is not batched.

        A sequence is batched element by element (every element gets the batch axis at 0).
        """
        if batched:
            return arg
        if is_sequence(original) or is_sequence(arg):
            return self._materialize_sequence(arg, original)
        shape = self.op(
            "Concat", [self.batch_size, self.unbatched_shape(arg, False, original)], {"axis": 0}
        )
        return self.op("Expand", [self.unsqueeze(arg, [0]), shape])

    def _materialize_sequence(self, arg: ir.Value, original: ir.Value) -> ir.Value:
        # An empty sequence is batched as it is: it has no element to broadcast.
        producer = arg.producer()
        if producer is not None and producer.op_type == "SequenceEmpty" and producer.domain == "":
            return arg

        def broadcast(bx: Batcher, x: ir.Value) -> ir.Value:
            shape = bx.op("Concat", [bx.batch_size, bx.op("Shape", [x])], {"axis": 0})
            return bx.op("Expand", [bx.unsqueeze(x, [0]), shape])

        return self.map_sequence(arg, original, broadcast, "broadcast along the batch axis")

    def map_sequence(
        self,
        seq: ir.Value,
        original: ir.Value,
        fn: Callable[[Batcher, ir.Value], ir.Value],
        why: str,
    ) -> ir.Value:
        """A sequence holding ``fn`` of every element of ``seq``: a ``Loop`` over its elements.

        ``fn`` emits through the batcher it gets (the loop body's). Elements may differ in shape,
        so no tensor formulation serves every sequence; the loop needs sequence-valued
        loop-carried values, which ``Loop`` has from opset 13 on.

        Args:
            seq: The sequence value to map over.
            original: The original (unbatched) value, for its type and messages.
            fn: ``(body batcher, element) -> new element``.
            why: What the mapping is for, for messages ("to {why} the sequence 'name'").
        """
        if self.opset < 13:
            raise UnsupportedOperatorError(
                f"vmap: to {why} the sequence {original.name!r}, every element is rewritten in "
                "a Loop carrying a sequence, which ONNX allows from opset "
                f"13 on (the model has opset {self.opset}). Remedy: convert the model to opset 13 "
                "or newer (onnx.version_converter.convert_version)."
            )
        seq_type = _sequence_type(original) or _sequence_type(seq)
        if seq_type is None:
            raise UnsupportedOperatorError(
                f"vmap: to {why} the sequence {original.name!r}, its element type must be known, "
                "and shape inference could not find it. Remedy: declare the types of the graph's "
                "inputs and outputs."
            )
        elem = seq_type.elem_type
        body = self.child()
        k = next(self._sequence_loops)
        i = ir.Value(
            name=f"vmap_seqloop{k}_i", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([])
        )
        cond = ir.Value(
            name=f"vmap_seqloop{k}_cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([])
        )
        acc = ir.Value(name=f"vmap_seqloop{k}_acc", type=seq_type)
        y = fn(body, body.op("SequenceAt", [seq, i]))
        out = body.op("SequenceInsert", [acc, y])
        cond_out = body.op("Identity", [cond])
        nodes = body.take()
        cond_out.type, out.type = cond.type, seq_type
        graph = ir.Graph(
            [i, cond, acc],
            [cond_out, out],
            nodes=nodes,
            opset_imports={"": self.opset},
            name=f"vmap_seqloop{k}",
        )
        # onnx_ir numbers a new graph's values from val_0, which the outer graph hands out too.
        for j, v in enumerate(v for n in nodes for v in n.outputs):
            v.name = f"vmap_seqloop{k}_{j}"
        empty = self.op("SequenceEmpty", [], {"dtype": int(elem.dtype)})
        length = self.op("SequenceLength", [seq])
        return self.op("Loop", [length, None, empty], {"body": graph})

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


"""Numbers the bodies of :meth:`Batcher.map_sequence` (their value names must be unique)."""


_SEQUENCE_MAKERS = frozenset(
    {
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceInsert",
        "SequenceErase",
        "SplitToSequence",
        "SequenceMap",
    }
)


def is_sequence(value: ir.Value) -> bool:
    """Whether ``value`` is sequence-typed (a batched sequence batches each element at 0).

    A value that shape inference left untyped is recognised by the operator producing it.
    """
    if value.type is not None:
        return isinstance(value.type, ir.SequenceType)
    producer = value.producer()
    return producer is not None and producer.domain == "" and producer.op_type in _SEQUENCE_MAKERS


def _sequence_type(value: ir.Value) -> ir.SequenceType | None:
    """The sequence type of ``value``, from its type or, when untyped, from its producer."""
    if isinstance(value.type, ir.SequenceType):
        return value.type
    producer = value.producer()
    if value.type is not None or producer is None or producer.domain != "":
        return None
    if producer.op_type == "SequenceEmpty":
        dtype = producer.attributes.get_int("dtype", int(ir.DataType.FLOAT))
        return ir.SequenceType(ir.TensorType(ir.DataType(dtype)))
    element = {"SequenceConstruct": 0, "SequenceInsert": 1, "SplitToSequence": 0}.get(
        producer.op_type
    )
    source = producer.inputs[element] if element is not None else None
    if source is None or source.dtype is None:
        return None
    return ir.SequenceType(ir.TensorType(source.dtype))


def detach(graph: ir.Graph) -> None:
    """Makes every node of ``graph`` (subgraphs included) stop using values.

    Liveness is read off ``uses()``: a discarded body (a dead node's, or a trial copy) would
    otherwise keep the unbatched computation of the values it reads alive.
    """
    for node in graph.all_nodes():
        for i in range(len(node.inputs)):
            if node.inputs[i] is not None:
                node.replace_input_with(i, None)


@dataclasses.dataclass
class BatchedBody:
    """A subgraph whose nodes have been batched, before its outputs are rewritten.

    Attributes:
        graph: The (copied) subgraph, batched in place.
        bx: The batcher of the subgraph: nodes for its outputs are emitted through it.
        originals: The original outputs (unbatched shapes, for materialising).
        outputs: The replacement of each output.
        batched: Which replacements carry the batch axis at 0.
    """

    graph: ir.Graph
    bx: Batcher
    originals: list[ir.Value]
    outputs: list[ir.Value]
    batched: list[bool]

    def finish(self, force: Sequence[bool] | None = None) -> list[bool]:
        """Writes the outputs, materialising those ``force`` asks to be batched.

        Returns:
            Which outputs are batched.
        """
        flags = [b or bool(force and force[i]) for i, b in enumerate(self.batched)]
        values = []
        for y, new, was, flag in zip(
            self.originals, self.outputs, self.batched, flags, strict=True
        ):
            if flag and not was:
                new = self.bx.materialize(new, False, y)
            values.append(new)
        self.set_outputs(
            [
                (v, y.type, self.bx.batched_value_shape(y) if f else y.shape)
                for v, y, f in zip(values, self.originals, flags, strict=True)
            ]
        )
        self.batched = flags
        return flags

    def set_outputs(
        self, outputs: Sequence[tuple[ir.Value, ir.TypeProtocol | None, ir.Shape | None]]
    ) -> None:
        """Makes ``(value, type, shape)`` the outputs of the body, in order.

        A value that is not computed by a node of the body (an input, an outer value) or that is
        already an output goes through an ``Identity``, so that every output is its own value.
        """
        graph = self.graph
        placed: set[ir.Value] = set()
        # Nodes emitted for the outputs (materialising ones) join the body below.
        pending = set(self.bx.nodes)
        new_values = []
        for value, vtype, shape in outputs:
            producer = value.producer()
            inside = producer is not None and (producer.graph is graph or producer in pending)
            if not inside or value in placed:
                value = self.bx.op("Identity", [value])
            placed.add(value)
            if vtype is not None:
                value.type = vtype
            value.shape = shape
            new_values.append(value)
        graph.extend(self.bx.take())
        graph.outputs.clear()
        graph.outputs.extend(new_values)


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
