"""Vectorizing map: ``VmapPass``.

The pass walks the graph once. A node none of whose inputs is batched stays as it is (shared
work is done once). A node with a batched input is handed to its batch rule, which emits the
batched computation right after it; the original node then becomes dead and is removed. Batched
values keep their batch dimension at axis 0 inside the graph; inputs and outputs are moved to
and from the requested axes at the boundary.

Control flow (If, Loop, Scan; :mod:`onnax.rules.control_flow`) batches its subgraphs
through the same walk and the same map from original values to replacements, so a body that
reads a batched value of an enclosing graph (implicit capture) reads its batched replacement. A
node whose subgraph reads a batched value, or draws random numbers under ``randomness`` other
than ``"same"``, is batched even when none of its own inputs is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher, RandomnessPolicy, detach, is_sequence
from onnax.core.diagnostics import RANDOM_OPS, node_label, op_label
from onnax.core.gcpause import gc_paused
from onnax.core.produced import remember
from onnax.core.registry import batch_rules
from onnax.core.selection import format_shape
from onnax.core.subgraphs import graph_attributes, subgraph_reads
from onnax.core.traverse import all_nodes, model_graphs
from onnax.errors import SelectionError, UnsupportedOperatorError
from onnax.passes.cleanup import cleanup
from onnax.passes.expand import expand
from onnax.passes.prepare import prepare
from onnax.rules import collect
from onnax.rules.sequence import element_shapes

__all__ = ["AxisSpec", "VmapPass"]

AxisSpec = int | None | Sequence[int | None] | Mapping[str, int | None]

RANDOMNESS = ("error", "different", "same")


def _resolve_axes(spec: AxisSpec, values: Sequence[ir.Value], what: str) -> list[int | None]:
    names = [v.name for v in values]
    noun = "input" if what == "in_axes" else "output"
    if spec is None or isinstance(spec, int):
        return [spec] * len(values)
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in names]
        if unknown:
            raise SelectionError(
                f"vmap: {what} names {unknown}, which are not graph {noun}s. Graph {noun}s: {names}"
            )
        return [spec.get(n) if n is not None else None for n in names]
    axes = list(spec)
    if len(axes) != len(values):
        raise SelectionError(
            f"vmap: {what} has {len(axes)} entries, but the model has {len(values)} {noun}s "
            f"{names}. Give one entry per {noun} (None for shared ones), or a dict by name."
        )
    return axes


def _check_axis(axis: int | None, value: ir.Value, what: str, extra: int = 0) -> int | None:
    if axis is None:
        return None
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise SelectionError(
            f"vmap: the {what} axis of {value.name!r} must be an int or None, got {axis!r}"
        )
    rank = value.shape.rank() if value.shape is not None else None
    if rank is None and axis == 0:
        # Axis 0 needs no rank: a sequence of tensors of unknown shape, say.
        return 0
    if rank is None:
        raise SelectionError(
            f"vmap: the rank of {what} {value.name!r} is unknown; give the model a typed {what}"
        )
    size = rank + 1  # the batched value has one more dimension
    if not -size <= axis < size:
        raise SelectionError(
            f"vmap: {what} axis {axis} is out of range for {what} {value.name!r} of rank {rank} "
            f"(shape {format_shape(value.shape)}); the batched {what} has rank {size}, so the axis "
            f"must be in [{-size}, {size - 1}]."
        )
    return axis % size


def _move_axis(
    bx: Batcher, value: ir.Value, original: ir.Value, source: int, destination: int, rank: int
) -> ir.Value:
    """Moves an axis of a tensor, or of every element of a sequence (in a Loop)."""
    if source == destination or not is_sequence(original):
        return bx.move_axis(value, source, destination, rank)
    return bx.map_sequence(
        value,
        original,
        lambda body, element: body.move_axis(element, source, destination, rank),
        f"move the batch axis ({source} -> {destination}) of every element of",
    )


def _batch_dim_name(model: ir.Model) -> str:
    used = {
        str(d)
        for g in model_graphs(model)
        for v in (*g.inputs, *g.outputs, *(o for n in g for o in n.outputs))
        if v.shape is not None
        for d in v.shape.dims
        if not isinstance(d, int)
    }
    name, k = "batch", 1
    while name in used:
        k += 1
        name = f"batch{k}"
    return name


def _fresh(used: set[str], base: str) -> str:
    name, k = base, 1
    while name in used:
        k += 1
        name = f"{base}{k}"
    used.add(name)
    return name


class VmapPass(ir.passes.FunctionalPass):
    """Maps a model over a new batch dimension of some of its inputs.

    Args:
        in_axes: Per graph input, the axis of the batch dimension in the batched input, or None
            for a shared (unbatched) input: one int for all inputs, a sequence in graph-input
            order, or a dict from input name to axis (missing names are shared). Initializers
            are always shared.
        out_axes: The same per graph output. Outputs that do not depend on a batched input are
            broadcast along the batch dimension.
        axis_size: The batch size, or None for a symbolic dimension.
        randomness: Random operators: ``"error"`` (default) refuses them, ``"different"`` draws
            independent samples per example, ``"same"`` one sample shared by all examples.
    """

    def __init__(
        self,
        in_axes: AxisSpec = 0,
        out_axes: AxisSpec = 0,
        axis_size: int | None = None,
        randomness: RandomnessPolicy = "error",
    ) -> None:
        super().__init__()
        if randomness not in RANDOMNESS:
            raise SelectionError(
                f"vmap: randomness={randomness!r} is not a policy for random operators; expected "
                "one of 'error' (refuse them, the default), 'different' (independent samples per "
                "example) or 'same' (one sample shared by every example). Pass one of these."
            )
        if axis_size is not None and (
            not isinstance(axis_size, int) or isinstance(axis_size, bool) or axis_size < 1
        ):
            raise SelectionError(
                f"vmap: axis_size must be a positive int or None (symbolic), got {axis_size!r}. "
                "Pass the batch size, or None to keep it symbolic."
            )
        self.in_axes = in_axes
        self.out_axes = out_axes
        self.axis_size = axis_size
        self.randomness = randomness

    @gc_paused
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the batched model; the argument is left untouched."""
        collect()
        model = prepare(model, "vmap")
        graph = model.graph
        inputs = list(graph.inputs)
        in_axes = [
            _check_axis(a, v, "input") if v.name not in graph.initializers else None
            for a, v in zip(_resolve_axes(self.in_axes, inputs, "in_axes"), inputs, strict=True)
        ]
        if all(a is None for a in in_axes):
            raise SelectionError(
                f"vmap: no input is batched (in_axes resolves to None for every input of {[v.name for v in inputs]}). "
                "Give at least one input a batch axis."
            )
        mapped = [v for v, a in zip(inputs, in_axes, strict=True) if a is not None]
        expand(model, mapped, batch_rules, "vmap")  # operators without a batch rule
        element_shapes(model)  # ranks that shape inference leaves out, for the batch rules
        outputs = list(graph.outputs)
        out_axes = _resolve_axes(self.out_axes, outputs, "out_axes")
        opset = model.opset_imports[""]
        dim: int | ir.SymbolicDim = (
            self.axis_size if self.axis_size is not None else ir.SymbolicDim(_batch_dim_name(model))
        )
        walk = _Walk(self.randomness)
        env, batched = walk.env, walk.batched
        bx = Batcher(opset, batch_size=None, randomness=self.randomness, batch_dim=dim, walker=walk)  # type: ignore[arg-type]
        entry: list[ir.Node] = []
        first_batched: tuple[ir.Value, int] | None = None
        for i, (x, axis) in enumerate(zip(inputs, in_axes, strict=True)):
            if axis is None:
                continue
            in_dims = list(x.shape.dims) if x.shape is not None else []
            in_dims.insert(axis, dim)
            # An input of unknown rank (axis 0 only) stays of unknown shape.
            in_shape = ir.Shape(in_dims) if x.shape is not None else None
            new = ir.Value(name=x.name, type=x.type, shape=in_shape)
            # The original keeps its name for messages; it leaves the graph with its consumers.
            graph.inputs[i] = new
            # The batch size is read off a tensor input when there is one: a sequence has it
            # in every element, and has none when it is empty.
            if first_batched is None or (is_sequence(first_batched[0]) and not is_sequence(new)):
                first_batched = (new, axis)
            moved = _move_axis(bx, new, x, axis, 0, len(in_dims))
            env[x] = moved
            batched.add(moved)
        assert first_batched is not None
        if self.axis_size is not None:
            bx.batch_size = bx.ints([self.axis_size])
        else:
            source, axis = first_batched
            if is_sequence(source):
                source = bx.op("SequenceAt", [source, bx.const(np.array(0, np.int64))])
            bx.batch_size = bx.slice(bx.op("Shape", [source]), [axis], [axis + 1], [0])
        entry = bx.take()
        if entry:
            graph.insert_before(graph[0], entry) if len(graph) else graph.extend(entry)
        walk.batch_nodes(bx, [n for n in graph if n not in entry])
        used = {v.name for g in model_graphs(model) for n in g for v in n.outputs if v.name}
        used.update(v.name for v in graph.inputs if v.name)
        for i, (y, axis) in enumerate(zip(outputs, out_axes, strict=True)):
            new = env.get(y, y)
            is_batched = new in batched
            dims: list[int | ir.SymbolicDim] | None
            if axis is None:
                if is_batched:
                    raise SelectionError(
                        f"vmap: output {y.name!r} depends on a batched input, but out_axes gives "
                        "it None. Give it a batch axis."
                    )
                if new is y:
                    continue
                dims = list(y.shape.dims) if y.shape is not None else None
            else:
                rank = (y.shape.rank() if y.shape is not None else 0) + 1
                axis = _check_axis(axis, y, "output")
                assert axis is not None
                if not is_batched:
                    new = bx.materialize(new, False, y)
                new = _move_axis(bx, new, y, 0, axis, rank)
                dims = list(y.shape.dims) if y.shape is not None else None
                if dims is not None:
                    dims.insert(axis, dim)
            if new.is_graph_input() and new.name == y.name:
                # An input passed through as an output (``(x) => (x)``) stays so, under its name.
                graph.extend(bx.take())
                graph.outputs[i] = new
                continue
            if new is y or new.is_graph_input() or new.is_graph_output():
                new = bx.op("Identity", [new])
            graph.extend(bx.take())
            # The public name moves to the new value. The original may live on (an unbatched node
            # with several outputs still produces it), so it gets a fresh name, never none: an
            # unnamed output reads as an omitted optional output.
            name = y.name
            y.name = _fresh(used, f"{name}_unbatched")
            new.name = name
            new.type = y.type
            new.shape = ir.Shape(dims) if dims is not None else None
            graph.outputs[i] = new
        return ir.passes.PassResult(remember(cleanup(model)), modified=True)


def _draws_inside(graphs: Sequence[ir.Graph]) -> bool:
    return any(n.domain == "" and n.op_type in RANDOM_OPS for g in graphs for n in all_nodes(g))


def _refuse_random(node: ir.Node) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(
        f"vmap: {op_label(node)} ({node_label(node)}) draws random numbers inside the mapped "
        "function. Choose how: vmap(..., randomness='different') for an independent sample "
        "per example, or randomness='same' for one sample shared by all examples."
    )


class _Walk:
    """The batching walk: one map from original values to replacements for all graphs.

    Implements :class:`onnax.core.batching.Walker`, through which the rules of If, Loop and
    Scan batch their subgraphs with the same map, so that a body reading a batched value of an
    enclosing graph (implicit capture) reads its batched replacement.
    """

    def __init__(self, randomness: RandomnessPolicy) -> None:
        self.randomness = randomness
        self.env: dict[ir.Value, ir.Value] = {}
        self.batched: set[ir.Value] = set()

    def lookup(self, value: ir.Value) -> tuple[ir.Value, bool]:
        new = self.env.get(value, value)
        return new, new in self.batched

    def bind(self, original: ir.Value, new: ir.Value, batched: bool) -> None:
        self.env[original] = new
        if batched:
            self.batched.add(new)

    def batch_nodes(self, bx: Batcher, nodes: Sequence[ir.Node]) -> None:
        # A rule may call back here (If inlines its branches) with nodes of its own pending.
        pending = bx.take()
        for node in nodes:
            self._batch_node(bx, node)
        bx.nodes[:0] = pending

    def _batch_node(self, bx: Batcher, node: ir.Node) -> None:
        env, batched = self.env, self.batched
        args = [env.get(v, v) if v is not None else None for v in node.inputs]
        flags = [a is not None and a in batched for a in args]
        inner = subgraph_reads(node)
        captured = [v for v in inner if env.get(v, v) in batched]
        graphs = graph_attributes(node)
        # Random draws in a body make its results differ per example ('different') or must be
        # refused ('error'): either way the body is walked.
        draws = bool(graphs) and self.randomness != "same" and _draws_inside(graphs)
        random = node.domain == "" and node.op_type in RANDOM_OPS
        if random and self.randomness == "different" and node.inputs and not any(flags):
            # A fresh sample per example even when its parameters are shared.
            first = node.inputs[0]
            if first is not None and args[0] is not None:
                args[0] = bx.materialize(args[0], False, first)
                flags[0] = True
                node.prepend(bx.take())
        if not any(flags) and not captured and not draws:
            # An unbatched input may still have been replaced (a batch rule of Shape returns a
            # new, unbatched value); the original computation is deleted, so rewire to it.
            for i, (original, arg) in enumerate(zip(node.inputs, args, strict=True)):
                if arg is not original:
                    node.replace_input_with(i, arg)
            for value in inner:
                if env.get(value, value) is not value:
                    for use in list(value.uses()):
                        if use.node.graph is not node.graph:
                            use.node.replace_input_with(use.idx, env[value])
            if random and node.op_type in ("RandomNormal", "RandomUniform"):
                self._random_without_input(bx, node)
            return
        rule = batch_rules.lookup(node.domain, node.op_type, bx.opset)
        if random and self.randomness == "error":
            raise _refuse_random(node)
        if rule is None:
            index = next((i for i, f in enumerate(flags) if f), None)
            if index is None:
                via = (
                    f"the value {captured[0].name!r} that a subgraph reads"
                    if captured
                    else "random draws in a subgraph"
                )
            else:
                read = node.inputs[index]
                name = read.name if read is not None else None
                via = f"input {index}" + (f" {name!r}" if name else "")
            raise UnsupportedOperatorError(
                f"vmap: no batch rule for {op_label(node)} at opset {bx.opset} ({node_label(node)}); "
                f"the batch dimension reaches it through {via}. Remedy: give that input in_axes None "
                "if it should be shared, or register a batch rule: "
                f"onnax.rules.register({node.domain!r}, {node.op_type!r}, batch=...) "
                "(docs/writing-rules.md)."
            )
        try:
            outs, out_flags = rule(bx, node, args, flags)
        except UnsupportedOperatorError as err:
            if op_label(node) in str(err):
                raise
            message = str(err).removeprefix("vmap: ")
            raise UnsupportedOperatorError(
                f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}): {message}"
            ) from err
        emitted = bx.take()
        if emitted:
            node.append(emitted)
        for graph in graphs:
            # The node is dead; its bodies must not keep the unbatched values they read alive.
            detach(graph)
        for old, new, flag in zip(node.outputs, outs, out_flags, strict=False):
            if new is None:
                continue
            env[old] = new
            if flag:
                batched.add(new)

    def _random_without_input(self, bx: Batcher, node: ir.Node) -> None:
        """RandomNormal/RandomUniform have no inputs: batched only under 'different'."""
        if self.randomness == "error":
            raise _refuse_random(node)
        if self.randomness == "same":
            return
        out = node.outputs[0]
        zeros = bx.materialize(bx.zeros_like(out), False, out)
        attrs = {k: a.value for k, a in node.attributes.items() if k != "shape"}
        new = bx.op(node.op_type + "Like", [zeros], attrs)
        node.append(bx.take())
        self.env[out] = new
        self.batched.add(new)
