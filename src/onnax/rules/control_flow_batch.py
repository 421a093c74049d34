"""Batch rules of control flow: If, Scan and Loop.

Their subgraphs are batched by the pass's own walk (:meth:`Batcher.batch_body`), with one map
from original values to replacements shared by every graph: a body that reads a batched value of
an enclosing graph (implicit capture) reads its batched replacement, and nesting is recursion.
Bodies are batched on copies; the original node dies and its bodies are detached by the pass.

* **If** with a shared condition becomes an If whose branches are batched (an output batched in
  one branch is materialised in the other). With a batched condition both branches run for every
  example, inlined into the enclosing graph, and ``Where`` picks per example.
* **Scan** batches its body: batched scan inputs keep the batch at axis 0, so their scan axis
  shifts by one; batched scan outputs are stacked one axis further out. A state is batched when
  its initial value is or its update depends on batched values (a fixpoint over the body).
* **Loop** batches its body in the same way when the trip count and the condition are shared.
  When they are batched (the examples stop after different numbers of iterations), the loop runs
  until every example is done and freezes the finished ones with an extra per-example mask state.
  Its scan outputs would differ in length per example and are refused, except the records
  reverse mode adds to a primal Loop (:data:`~onnax.rules.control_flow.RECORDS`): those are
  padded (a finished example's rows repeat its frozen state), which is sound because the
  backward Loop of each example reads only the rows of the iterations it ran.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import BatchedBody, Batcher, detach
from onnax.core.diagnostics import RANDOM_OPS, node_label, op_label
from onnax.core.registry import batch_rules
from onnax.errors import UnsupportedOperatorError
from onnax.rules.control_flow import record_outputs

__all__: list[str] = []

BatchResult = tuple[list[ir.Value | None], list[bool]]


def _where(bx: Batcher, node: ir.Node) -> str:
    return f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)})"


def _graph(node: ir.Node, name: str) -> ir.Graph:
    return node.attributes[name].as_graph()


def _copy(graph: ir.Graph) -> ir.Graph:
    return graph.clone(allow_outer_scope_values=True)


def _is_tensor(value: ir.Value) -> bool:
    return value.type is None or isinstance(value.type, ir.TensorType)


def _flat(bx: Batcher, value: ir.Value, batched: bool) -> ir.Value:
    """A one-element-per-example value as ``[B]`` (batched) or ``[1]`` (shared, broadcasts)."""
    return bx.op("Reshape", [value, bx.batch_size if batched else bx.ints([1])])


def _along(bx: Batcher, flat: ir.Value, rank: int) -> ir.Value:
    """A ``[B]`` value with ``rank`` trailing size-1 axes, to broadcast against ``[B, ...]``."""
    return bx.unsqueeze(flat, list(range(1, rank + 1)))


# Element types onnxruntime's Where kernel serves; others go through And/Or or a wider type.
_WHERE_TYPES = frozenset(
    {
        ir.DataType.FLOAT,
        ir.DataType.DOUBLE,
        ir.DataType.FLOAT16,
        ir.DataType.INT8,
        ir.DataType.UINT8,
        ir.DataType.INT32,
        ir.DataType.INT64,
        ir.DataType.STRING,
    }
)
_WIDER = {
    ir.DataType.INT16: ir.DataType.INT32,
    ir.DataType.UINT16: ir.DataType.INT32,
    ir.DataType.UINT32: ir.DataType.INT64,
    ir.DataType.UINT64: ir.DataType.INT64,
    ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}


def _select(
    bx: Batcher, cond: ir.Value, a: ir.Value, b: ir.Value, dtype: ir.DataType | None
) -> ir.Value:
    """``Where(cond, a, b)``, spelled so that onnxruntime has a kernel for the element type."""
    if dtype is None or dtype in _WHERE_TYPES:
        return bx.op("Where", [cond, a, b])
    if dtype == ir.DataType.BOOL:
        keep = bx.op("And", [bx.op("Not", [cond]), b])
        return bx.op("Or", [bx.op("And", [cond, a]), keep])
    wide = _WIDER.get(dtype)
    if wide is None:
        return bx.op("Where", [cond, a, b])
    cast = [bx.op("Cast", [v], {"to": int(wide)}) for v in (a, b)]
    return bx.op("Cast", [bx.op("Where", [cond, *cast])], {"to": int(dtype)})


def _any(bx: Batcher, flags: ir.Value) -> ir.Value:
    """True when some element of a boolean vector is (a rank-0 bool)."""
    count = bx.reduce(
        "ReduceMax", bx.op("Cast", [flags], {"to": int(ir.DataType.INT64)}), None, keepdims=False
    )
    return bx.op("Cast", [count], {"to": int(ir.DataType.BOOL)})


def _state_fixpoint(
    bx: Batcher,
    body: ir.Graph,
    flags: list[bool],
    states: Sequence[tuple[int, int]],
) -> tuple[BatchedBody, list[bool]]:
    """Batches copies of ``body`` until the batched states are stable.

    Args:
        bx: The batcher of the graph holding the loop.
        body: The original body (copies are batched, it is left alone).
        flags: Which body inputs start batched.
        states: ``(body input index, body output index)`` of each loop-carried state: a state is
            batched when its input is or its update turns out batched.

    Returns:
        The batched copy (outputs not yet written) and the final input flags.
    """
    while True:
        copy = _copy(body)
        result = bx.batch_body(copy, flags)
        grown = list(flags)
        for i, o in states:
            grown[i] = flags[i] or result.batched[o]
        if grown == flags:
            return result, flags
        # A trial copy is dropped: it must not keep the values it read alive.
        detach(copy)
        flags = grown


def _initial(bx: Batcher, arg: ir.Value, batched: bool, original: ir.Value, want: bool) -> ir.Value:
    return bx.materialize(arg, batched, original) if want and not batched else arg


# ----------------------------------------------------------------------------------- If
def _random_in(graph: ir.Graph) -> ir.Node | None:
    return next((n for n in graph.all_nodes() if n.domain == "" and n.op_type in RANDOM_OPS), None)


def _same_shape(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    if a is None or b is None or a.rank() != b.rank():
        return False
    for x, y in zip(a.dims, b.dims, strict=True):
        if isinstance(x, int) and isinstance(y, int):
            if x != y:
                return False
        elif isinstance(x, int) or isinstance(y, int) or x.value is None or x.value != y.value:
            return False
    return True


def _may_differ(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    """Whether two known shapes are not the same (unknown shapes and dimensions match anything)."""
    if a is None or b is None:
        return False
    if a.rank() != b.rank():
        return True
    for x, y in zip(a.dims, b.dims, strict=True):
        unknown = any(isinstance(d, ir.SymbolicDim) and d.value is None for d in (x, y))
        if not unknown and x != y:
            return True
    return False


def _differ_statically(a: ir.Shape, b: ir.Shape) -> bool:
    """Whether two shapes differ in rank or in a static dimension."""
    if a.rank() != b.rank():
        return True
    pairs = zip(a.dims, b.dims, strict=True)
    return any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in pairs)


def _check_selectable(bx: Batcher, node: ir.Node, then_g: ir.Graph, else_g: ir.Graph) -> None:
    """Refuses what a per-example ``Where`` between both branches cannot express."""
    where = _where(bx, node)
    if bx.randomness == "error":
        for name, g in (("then_branch", then_g), ("else_branch", else_g)):
            draw = _random_in(g)
            if draw is not None:
                raise UnsupportedOperatorError(
                    f"{where} has a batched condition, so both branches run for every example "
                    f"and Where picks one per example; its {name} draws random numbers "
                    f"({op_label(draw)}, {node_label(draw)}). Remedy: choose how random draws "
                    "behave, vmap(..., randomness='different') or randomness='same', or give the "
                    "inputs the condition is computed from in_axes None."
                )
    for k, (t, e) in enumerate(zip(then_g.outputs, else_g.outputs, strict=True)):
        label = f"output {k} {node.outputs[k].name!r}"
        if not (_is_tensor(t) and _is_tensor(e)):
            raise UnsupportedOperatorError(
                f"{where} has a batched condition, so both branches run for every example and "
                f"Where picks one per example, but {label} is not a tensor ({t.type} / {e.type}). "
                "Remedy: give the inputs the condition is computed from in_axes None."
            )
        if t.shape is None or e.shape is None or _differ_statically(t.shape, e.shape):
            raise UnsupportedOperatorError(
                f"{where} has a batched condition, so both branches run for every example and "
                f"Where picks one per example, which needs both branches to give {label} the same "
                f"shape; they give {t.shape} and {e.shape}. Remedy: make the branch outputs agree "
                "in shape (pad or reshape them), or give the inputs the condition is computed "
                "from in_axes None."
            )


def _inline(node: ir.Node, branch: ir.Graph) -> list[ir.Node]:
    """Moves the nodes of a branch into the node's graph, right before the node.

    The branch is left without outputs: its results, now values of the enclosing graph, would
    otherwise still count as outputs of a graph nobody holds, and passes that keep graph outputs
    (common-subexpression elimination) refuse to replace them.
    """
    graph = node.graph
    assert graph is not None
    nodes = list(branch)
    branch.outputs.clear()
    for n in nodes:
        branch.remove(n)
    graph.insert_before(node, nodes)
    return nodes


@batch_rules.register("If", since_version=1)
def _if_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    then_g, else_g = _graph(node, "then_branch"), _graph(node, "else_branch")
    cond = args[0]
    assert cond is not None
    if not batched[0]:
        bodies = [bx.batch_body(_copy(g), []) for g in (then_g, else_g)]
        flags = [a or b for a, b in zip(bodies[0].batched, bodies[1].batched, strict=True)]
        for body in bodies:
            body.finish(flags)
        outs = bx.op_multi(
            "If",
            [cond],
            {"then_branch": bodies[0].graph, "else_branch": bodies[1].graph},
            num_outputs=len(node.outputs),
        )
        return list(outs), flags
    _check_selectable(bx, node, then_g, else_g)
    chosen = [list(then_g.outputs), list(else_g.outputs)]
    for branch in (then_g, else_g):
        bx.batch_nodes(_inline(node, branch))
    flat = _flat(bx, cond, True)
    picked: list[ir.Value | None] = []
    for k in range(len(node.outputs)):
        then_y, else_y = chosen[0][k], chosen[1][k]
        t, t_batched = bx.lookup(then_y)
        e, e_batched = bx.lookup(else_y)
        if not _same_shape(then_y.shape, else_y.shape):
            # Dimensions only known at run time: reshaping one branch's result to the other's
            # shape fails there when they differ in size, instead of broadcasting silently.
            target = bx.unbatched_shape(t, t_batched, then_y)
            e = bx.op("Reshape", [e, bx.batched_shape(target) if e_batched else target])
        mask = _along(bx, flat, bx.rank(then_y))
        picked.append(_select(bx, mask, t, e, then_y.dtype))
    return picked, [True] * len(picked)


# --------------------------------------------------------------------------------- Scan
def _axis(axis: int, value: ir.Value, bx: Batcher, extra: int = 0) -> int:
    """A non-negative axis of ``value`` (of rank ``rank(value) + extra``)."""
    return axis if axis >= 0 else axis + bx.rank(value) + extra


@batch_rules.register("Scan", since_version=9)
def _scan_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    body = _graph(node, "body")
    m = node.attributes.get_int("num_scan_inputs", 0)
    n = len(node.inputs) - m
    k = len(node.outputs) - n
    in_axes = list(node.attributes.get_ints("scan_input_axes", [0] * m))
    out_axes = list(node.attributes.get_ints("scan_output_axes", [0] * k))
    result, flags = _state_fixpoint(bx, body, list(batched), [(i, i) for i in range(n)])
    out_flags = result.finish([*flags[:n], *([False] * k)])
    inputs: list[ir.Value | None] = []
    for i in range(n):
        arg, original = args[i], node.inputs[i]
        assert arg is not None and original is not None
        inputs.append(_initial(bx, arg, batched[i], original, flags[i]))
    inputs.extend(args[n:])
    # A batched scan input carries the batch at 0: its scan axis moves one further out, and
    # the body's slice keeps the batch at 0. Batched scan outputs stack one axis further out.
    for j in range(m):
        x = node.inputs[n + j]
        if batched[n + j] and x is not None:
            in_axes[j] = _axis(in_axes[j], x, bx) + 1
    for j in range(k):
        if out_flags[n + j]:
            out_axes[j] = _axis(out_axes[j], result.originals[n + j], bx, extra=1) + 1
    attrs = {a.name: a.value for a in node.attributes.values()}
    attrs.update(body=result.graph, scan_input_axes=in_axes, scan_output_axes=out_axes)
    if not m:
        attrs.pop("scan_input_axes")
    if not k:
        attrs.pop("scan_output_axes")
    outs = bx.op_multi("Scan", inputs, attrs, num_outputs=n + k)
    return list(outs), out_flags


# --------------------------------------------------------------------------------- Loop
def _passes_through(body: ir.Graph, state: int) -> bool:
    """Whether the body hands loop-carried value ``state`` on unchanged."""
    value: ir.Value | None = body.outputs[1 + state]
    while value is not None and value.producer() is not None:
        producer = value.producer()
        assert producer is not None
        if producer.op_type != "Identity" or producer.domain != "":
            return False
        value = producer.inputs[0]
    return value is body.inputs[2 + state]


@batch_rules.register("Loop", since_version=1)
def _loop_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    body = _graph(node, "body")
    n = len(node.inputs) - 2
    states = [(2 + i, 1 + i) for i in range(n)]
    if not batched[0] and not batched[1]:
        result, flags = _state_fixpoint(bx, body, [False, False, *batched[2:]], states)
        if not result.batched[0]:
            return _plain_loop(bx, node, args, batched, result, flags)
        detach(result.graph)
    return _masked_loop(bx, node, args, batched)


def _plain_loop(
    bx: Batcher,
    node: ir.Node,
    args: Sequence[ir.Value | None],
    batched: Sequence[bool],
    result: BatchedBody,
    flags: list[bool],
) -> BatchResult:
    """Every example runs the same iterations: batch the body, keep the loop."""
    n = len(node.inputs) - 2
    k = len(node.outputs) - n
    out_flags = result.finish([False, *flags[2:], *([False] * k)])
    inputs = list(args[:2])
    for i in range(n):
        arg, original = args[2 + i], node.inputs[2 + i]
        assert arg is not None and original is not None
        inputs.append(_initial(bx, arg, batched[2 + i], original, flags[2 + i]))
    outs = list(bx.op_multi("Loop", inputs, {"body": result.graph}, num_outputs=n + k))
    new: list[ir.Value | None] = list(outs[:n])
    for j in range(k):
        scanned = outs[n + j]
        if out_flags[1 + n + j]:
            scanned = _batch_first(bx, scanned, result.originals[1 + n + j])
        new.append(scanned)
    return new, out_flags[1:]


def _batch_first(bx: Batcher, scanned: ir.Value, original: ir.Value) -> ir.Value:
    """A batched Loop scan output: iterations stack at axis 0, ``[T, B, ...]`` -> ``[B, T, ...]``."""
    rank = bx.rank(original) + 2
    # After zero iterations onnxruntime sizes the result from the body's declared output
    # shape, where the batch dimension is symbolic (0): put it back.
    shape = bx.op("Shape", [scanned])
    steps = bx.slice(shape, [0], [1], [0])
    static = original.shape is not None and original.shape.is_static()
    per_step = (
        bx.ints(list(original.shape.numpy()))
        if static and original.shape is not None
        else bx.slice(shape, [2], [rank], [0])
    )
    sizes = bx.op("Concat", [steps, bx.batch_size, per_step], {"axis": 0})
    scanned = bx.op("Reshape", [scanned, sizes])
    return bx.transpose(scanned, [1, 0, *range(2, rank)])


def _masked_loop(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    """The examples stop after different numbers of iterations.

    The loop runs while some example is active; a per-example mask state ``active`` (the
    example's condition and, for a batched trip count, ``i < M``) freezes the finished ones:
    every state is updated with ``Where(active, new, old)``.
    """
    where = _where(bx, node)
    body = _graph(node, "body")
    n = len(node.inputs) - 2
    k = len(node.outputs) - n
    why = "trip count" if batched[0] else "condition"
    # Reverse mode's records of the states (control_flow.RECORDS) may be padded: each example
    # reads only the rows of the iterations it ran. A user's scan output has no such reader.
    records = record_outputs(node)
    unpadded = [j for j in range(k) if n + j not in records]
    if unpadded:
        j = unpadded[0]
        raise UnsupportedOperatorError(
            f"{where} has a batched {why}, so the examples run different numbers of iterations "
            f"and its scan output {j} ({node.outputs[n + j].name!r}, output {n + j} of the "
            "Loop) would have a different length per example, which one tensor cannot hold. "
            "Remedy: carry the per-iteration values in a loop-carried state of fixed size, or "
            "give the inputs the trip count and the condition are computed from in_axes None."
        )
    for i in range(n):
        state, before, after = node.inputs[2 + i], body.inputs[2 + i], body.outputs[1 + i]
        label = f"loop-carried value {state.name if state is not None else i!r}"
        if state is not None and not _is_tensor(state):
            raise UnsupportedOperatorError(
                f"{where} has a batched {why}, so finished examples are frozen with Where, but "
                f"its {label} is not a tensor ({state.type}). Remedy: give the inputs the trip "
                "count and the condition are computed from in_axes None."
            )
        if _may_differ(before.shape, after.shape):
            raise UnsupportedOperatorError(
                f"{where} has a batched {why}, so finished examples keep their loop-carried "
                f"values (Where(active, new, old)) while the others go on, but its {label} "
                f"changes shape from {before.shape} to {after.shape} in an iteration. Remedy: "
                "keep its shape fixed (pad it), or give the inputs the trip count and the "
                "condition are computed from in_axes None."
            )
    through = [_passes_through(body, i) for i in range(n)]
    start = [False, True, *(batched[2 + i] or not through[i] for i in range(n))]
    states = [(2 + i, 1 + i) for i in range(n)]
    result, flags = _state_fixpoint(bx, body, start, states)
    cond_in = body.inputs[1]
    cond_shape = (
        list(cond_in.shape.numpy())
        if cond_in.shape is not None and cond_in.shape.is_static()
        else []
    )

    # Outside: per-example trip counts and the initial mask.
    trip, cond = args[0], args[1]
    trips = _flat(bx, trip, True) if batched[0] and trip is not None else None
    if cond is None:
        first = bx.op("Expand", [bx.const(np.array([True])), bx.batch_size])
    else:
        first = _flat(bx, cond, batched[1])
        if not batched[1]:
            first = bx.op("Expand", [first, bx.batch_size])
    if trips is not None:
        first = bx.op("And", [first, bx.op("Less", [bx.const(np.array(0, np.int64)), trips])])
        trip = bx.reduce("ReduceMax", trips, None, keepdims=False)
    mask_shape = bx.batched_shape(bx.ints(cond_shape))
    inputs: list[ir.Value | None] = [trip, _any(bx, first), bx.op("Reshape", [first, mask_shape])]
    for i in range(n):
        arg, original = args[2 + i], node.inputs[2 + i]
        assert arg is not None and original is not None
        inputs.append(_initial(bx, arg, batched[2 + i], original, flags[2 + i]))

    # Inside: the body's condition input is the mask (true for the examples that run).
    graph, cbx = result.graph, result.bx
    iteration, mask_in = graph.inputs[0], graph.inputs[1]
    running = ir.Value(name="any_active", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    graph.inputs.insert(1, running)
    active = _flat(cbx, mask_in, True)
    going = cbx.op("And", [active, _flat(cbx, result.outputs[0], result.batched[0])])
    if trips is not None:
        after = cbx.op("Add", [iteration, cbx.const(np.array(1, np.int64))])
        going = cbx.op("And", [going, cbx.op("Less", [after, trips])])
    bool_type = ir.TensorType(ir.DataType.BOOL)
    outputs: list[tuple[ir.Value, ir.TypeProtocol | None, ir.Shape | None]] = [
        (_any(cbx, going), bool_type, ir.Shape([])),
        (
            cbx.op("Reshape", [going, cbx.batched_shape(cbx.ints(cond_shape))]),
            bool_type,
            mask_in.shape,
        ),
    ]
    for i in range(n):
        new, original = result.outputs[1 + i], result.originals[1 + i]
        if flags[2 + i] and not through[i]:
            old = graph.inputs[3 + i]
            mask = _along(cbx, active, bx.rank(original))
            new = _select(cbx, mask, new, old, original.dtype)
        shape = cbx.batched_value_shape(original) if flags[2 + i] else original.shape
        outputs.append((new, original.type, shape))
    # Records of reverse mode: a finished example's rows repeat its frozen state, and its
    # backward Loop never reads them.
    scanned = [result.batched[1 + n + j] for j in range(k)]
    for j in range(k):
        original = result.originals[1 + n + j]
        shape = cbx.batched_value_shape(original) if scanned[j] else original.shape
        outputs.append((result.outputs[1 + n + j], original.type, shape))
    result.set_outputs(outputs)
    attrs: dict[str, object] = {"body": graph}
    outs = bx.op_multi("Loop", inputs, attrs, num_outputs=1 + n + k)
    scans = [
        _batch_first(bx, outs[1 + n + j], result.originals[1 + n + j])
        if scanned[j]
        else outs[1 + n + j]
        for j in range(k)
    ]
    return [*outs[1 : 1 + n], *scans], [*flags[2:], *scanned]
