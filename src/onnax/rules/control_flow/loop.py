"""Loop: jvp, transpose and batch rules.

Forward mode carries the tangents as extra states and scan outputs of one Loop. Reverse mode
replaces the primal Loop by one that also counts its iterations and records the state every
iteration starts from (:data:`RECORDS`); the linear Loop runs exactly that many iterations and
reads the records, and its transpose is a Loop running the iterations backwards.

Under vmap the body is batched as Scan's is when the trip count and the condition are shared.
When they are batched (the examples stop after different numbers of iterations), the loop runs
until every example is done and freezes the finished ones with an extra per-example mask state.
Its scan outputs would differ in length per example and are refused, except the records reverse
mode adds to a primal Loop: those are padded (a finished example's rows repeat its frozen
state), which is sound because the backward Loop of each example reads only the rows of the
iterations it ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import BatchedBody, Batcher, detach
from onnax.core.diagnostics import node_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.selection import is_float
from onnax.core.subgraphs import (
    TAKEN,
    ScopedEmitter,
    captured_linear,
    discard_graph,
    new_value_like,
    redirect_outputs,
)
from onnax.errors import UnsupportedOperatorError
from onnax.rules.control_flow._batching import (
    along,
    graph_attr,
    initial_state,
    is_tensor,
    per_example,
    select,
    state_fixpoint,
    vmap_label,
)
from onnax.rules.control_flow._common import (
    LINEAR_META,
    LinearInfo,
    active_states,
    body_emitter,
    copy_type,
    emit_node,
    flush,
    linear_info,
    new_inputs,
    outer_seeds,
    place_tangents,
    primal_in_body,
    scoped,
    set_inputs,
    set_outputs,
    tangent_or_zero,
)

__all__ = ["RECORDS", "record_outputs"]

RECORDS = "onnax.loop_records"
"""``node.metadata_props`` key of a Loop whose scan outputs include reverse-mode records: their
output indices, comma-separated. A record is read only for the iterations its run went through
(the backward Loop runs as often as the loop-carried count says), so vmap may pad it for the
examples that finish early. A node property rather than ``meta``, so that it stays in the model
and a derivative model can be batched later."""


def record_outputs(node: ir.Node) -> set[int]:
    """The output indices of ``node`` marked as reverse-mode records (:data:`RECORDS`)."""
    text = node.metadata_props.get(RECORDS, "")
    return {int(p) for p in text.split(",") if p.strip().isdigit()}


def _mark_records(node: ir.Node, indices: Iterable[int]) -> None:
    marked = sorted(set(indices))
    if marked:
        node.metadata_props[RECORDS] = ",".join(str(i) for i in marked)
    else:
        node.metadata_props.pop(RECORDS, None)


# Every schema version: the changes (sequence/optional states, new element types) do not touch
# how tensors flow through the body.
loop = OpRules("Loop", since=1)


# ------------------------------------------------------------------------- jvp and transpose
@loop.jvp
def _loop_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> Tangents:
    sem = scoped(em)
    body = node.attributes["body"].as_graph()
    n = len(node.inputs) - 2
    k = len(node.outputs) - n
    outer = outer_seeds(sem, node)
    act_s = active_states(
        body,
        body.inputs[2:],
        body.outputs[1 : 1 + n],
        [j for j in range(n) if tangents[2 + j] is not None],
        outer,
    )
    if not act_s and not outer:
        return [None] * (n + k)
    forward = sem.hooks.mode == "forward"
    if not forward:
        _check_fixed_shapes(sem, node, body, n)
    g = body if forward else body.clone(allow_outer_scope_values=True)
    it, cond_in, v_in = g.inputs[0], g.inputs[1], list(g.inputs[2:])
    bem = body_emitter(sem)
    records: list[ir.Value] = []
    count: ir.Value | None = None
    if forward:
        state_values = v_in
    else:
        records, count = _record_loop_states(sem, node, body, n, k)
        # The recomputation reads the state iteration `it` started from.
        state_values = []
        for v, rec in zip(v_in, records, strict=True):
            got = bem.op("Gather", [rec, it], {"axis": 0})
            copy_type(got, v)
            v.replace_all_uses_with(got, replace_graph_outputs=True)
            state_values.append(got)
        # Every recorded iteration ran, so the condition it started from was true.
        cond_in.replace_all_uses_with(bem.const(np.array(True)), replace_graph_outputs=True)
        flush(bem, g, front=True)
    t_v_in = new_inputs([v_in[j] for j in act_s])
    seeds = dict(sem.tangent)
    seeds.update(zip([state_values[j] for j in act_s], t_v_in, strict=True))
    lin = sem.hooks.linearize_body(g, seeds)
    tmap = lin.tangent
    cond_out, v_out, scans = g.outputs[0], list(g.outputs[1 : 1 + n]), list(g.outputs[1 + n :])
    act_y = [i for i in range(k) if is_float(scans[i]) and scans[i] in tmap]
    if not act_s and not act_y:
        if not forward:
            discard_graph(g)
        return [None] * (n + k)
    t_v_out = [tangent_or_zero(bem, tmap.get(v_out[j]), v_out[j]) for j in act_s]
    t_y = [tmap[scans[i]] for i in act_y]
    t_init = [tangent_or_zero(em, tangents[2 + j], node.inputs[2 + j]) for j in act_s]
    a = len(act_s)
    result: list[ir.Value | None] = [None] * (n + k)
    attrs: dict[str, object] = {"body": g}
    if forward:
        set_inputs(g, [it, cond_in, *v_in, *t_v_in])
        refs = [cond_out, *v_out, *(v_out[j] for j in act_s), *scans, *(scans[i] for i in act_y)]
        set_outputs(g, bem, [cond_out, *v_out, *t_v_out, *scans, *t_y], refs)
        inputs = [*node.inputs[:2], *node.inputs[2:], *t_init]
        new = emit_node(em, "Loop", inputs, attrs, n + a + k + len(act_y))
        new.name = node.name
        new.metadata_props.update(node.metadata_props)
        # A record's tangent is read for the same iterations as the record.
        marked = record_outputs(node)
        moved = [n + a + (r - n) for r in marked if r >= n]
        of_records = [n + a + k + p for p, i in enumerate(act_y) if n + i in marked]
        _mark_records(new, [*moved, *of_records])
        redirect_outputs(node.outputs, [*new.outputs[:n], *new.outputs[n + a : n + a + k]])
        sem.replaced.update(zip(node.outputs[:n], new.outputs[:n], strict=True))
        sem.replaced.update(zip(node.outputs[n:], new.outputs[n + a : n + a + k], strict=True))
        t_states, t_scans = new.outputs[n : n + a], new.outputs[n + a + k :]
    else:
        assert count is not None
        set_inputs(g, [it, cond_in, *t_v_in])
        true = bem.const(np.array(True))
        refs = [true, *(v_out[j] for j in act_s), *(scans[i] for i in act_y)]
        set_outputs(g, bem, [true, *t_v_out, *t_y], refs, lin)
        # An explicit true condition: the loop runs exactly as often as the primal one did.
        true = em.const(np.array(True))
        new = emit_node(em, "Loop", [count, true, *t_init], attrs, a + len(act_y))
        new.meta[LINEAR_META] = LinearInfo([lin], {"n": n, "a": a, "y": len(act_y)})
        t_states, t_scans = new.outputs[:a], new.outputs[a:]
    place_tangents(em, node, result, [*act_s, *(n + i for i in act_y)], [*t_states, *t_scans])
    return result


def _check_fixed_shapes(em: ScopedEmitter, node: ir.Node, body: ir.Graph, n: int) -> None:
    """Refuses loop-carried values whose shape provably changes between iterations.

    The state an iteration starts from is recorded as a Loop scan output, which must have one
    shape in every iteration. Inference proves a change when the body reads and writes a state
    with different ranks or different static dimensions. Where it cannot tell (symbolic
    dimensions), the state is recorded, and a shape that does change fails at run time.
    """
    for j in range(n):
        a, b = body.inputs[2 + j].shape, body.outputs[1 + j].shape
        if a is None or b is None:
            continue
        differ = a.rank() != b.rank() or any(
            isinstance(x, int) and isinstance(y, int) and x != y
            for x, y in zip(a.dims, b.dims, strict=True)
        )
        if differ:
            raise UnsupportedOperatorError(
                f"{em.hooks.transform}: ai.onnx::Loop ({node_label(node)}): the shape of "
                f"loop-carried value {j} ({_name(node.inputs[2 + j])}) changes between "
                f"iterations (it enters the body with shape {a} and leaves with shape {b}). "
                "Reverse mode records the state every iteration starts from as a Loop scan "
                "output, which needs one shape for all iterations. Remedy: carry a fixed-shape "
                "value (pad to the final size), or produce a growing value as a Loop scan "
                "output instead."
            )


def _name(value: ir.Value | None) -> str:
    return repr(value.name) if value is not None else "absent"


def _record_loop_states(
    em: ScopedEmitter, node: ir.Node, body: ir.Graph, n: int, k: int
) -> tuple[list[ir.Value], ir.Value]:
    """Replaces the primal Loop by one that also counts its iterations and records its states.

    The new Loop carries one more state, the number of iterations run (a loop-carried counter
    rather than the length of a record: under vmap, finished examples keep their count while the
    others go on, see :data:`RECORDS`), and outputs the state each iteration starts from as
    extra scan outputs. Returns the records and the count.
    """
    bem = Emitter(0)
    count_in = ir.Value(name=None, type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    count_out = bem.op("Add", [count_in, bem.const(np.array(1, dtype=np.int64))])
    copy_type(count_out, count_in)
    states_in = list(body.inputs[2:])
    recs = [bem.op("Identity", [v]) for v in states_in]
    for r, v in zip(recs, states_in, strict=True):
        copy_type(r, v)
    body.extend(bem.take())
    outs = list(body.outputs)
    body.inputs.append(count_in)
    body.outputs.clear()
    body.outputs.extend([*outs[: 1 + n], count_out, *outs[1 + n :], *recs])
    zero = em.const(np.array(0, dtype=np.int64))
    new = emit_node(em, "Loop", [*node.inputs, zero], {"body": body}, n + 1 + k + n)
    new.name = node.name
    new.metadata_props.update(node.metadata_props)
    # Records of an earlier reverse mode are scan outputs here: they move past the counter.
    earlier = [r + 1 for r in record_outputs(node) if r >= n]
    _mark_records(new, [*earlier, *range(n + 1 + k, n + 1 + k + n)])
    replacement = [*new.outputs[:n], *new.outputs[n + 1 : n + 1 + k]]
    redirect_outputs(node.outputs, replacement)
    em.replaced.update(zip(node.outputs, replacement, strict=True))
    count = new.outputs[n]
    count.type, count.shape = count_in.type, ir.Shape([])
    records = list(new.outputs[n + 1 + k :])
    for r, v in zip(records, states_in, strict=True):
        r.type = v.type
        if v.shape is not None:
            r.shape = ir.Shape([None, *v.shape.dims])
    return records, count


@loop.transpose
def _loop_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> Tangents:
    sem = scoped(em)
    info = linear_info(node)
    a, ny = info.counts["a"], info.counts["y"]
    (lin,) = info.lins
    captured = captured_linear(node, em.linear)
    g = node.attributes["body"].as_graph()
    trips = node.inputs[0]
    assert trips is not None
    it, cond_in, t_v_in = g.inputs[0], g.inputs[1], list(g.inputs[2:])
    t_v_out, t_y = list(g.outputs[1 : 1 + a]), list(g.outputs[1 + a :])
    bem = body_emitter(sem)
    # Backward iteration j replays forward iteration trips-1-j.
    step = new_value_like(it)
    last = bem.op("Sub", [trips, bem.const(np.array(1, dtype=np.int64))])
    index = bem.op("Sub", [last, step])
    copy_type(index, it)
    it.replace_all_uses_with(index)
    seeds: list[tuple[ir.Value, ir.Value]] = []
    ct_v = new_inputs(t_v_in)
    seeds += list(zip(t_v_out, ct_v, strict=True))
    for i in range(ny):
        ct = cts[a + i]
        if ct is not None:
            seeds.append((t_y[i], bem.op("Gather", [ct, index], {"axis": 0})))
    acc = new_inputs(captured)
    flush(bem, g, front=True)
    got = sem.hooks.transpose_body(g, lin, seeds, [*t_v_in, *captured])
    new_v = [
        c if c is not None else bem.zeros_like(primal_in_body(lin, t, g))
        for c, t in zip(got[:a], t_v_in, strict=True)
    ]
    new_acc = [
        bem.op("Add", [s, c]) if c is not None else s for s, c in zip(acc, got[a:], strict=True)
    ]
    set_inputs(g, [step, cond_in, *ct_v, *acc])
    true = bem.const(np.array(True))
    set_outputs(g, bem, [true, *new_v, *new_acc], [true, *ct_v, *acc])
    node.meta[TAKEN] = True
    init_v = [tangent_or_zero(em, cts[j], node.outputs[j]) for j in range(a)]
    init_acc = [em.zeros_like(c) for c in captured]
    true = em.const(np.array(True))
    new = emit_node(em, "Loop", [trips, true, *init_v, *init_acc], {"body": g}, a + len(captured))
    outs = list(new.outputs)
    for o, v in zip(outs, [*node.inputs[2:], *captured], strict=True):
        copy_type(o, v)
    return [None, None, *outs[:a], *outs[a:]]


# -------------------------------------------------------------------------------------- vmap
def _any(bx: Batcher, flags: ir.Value) -> ir.Value:
    """True when some element of a boolean vector is (a rank-0 bool)."""
    count = bx.reduce(
        "ReduceMax", bx.op("Cast", [flags], {"to": int(ir.DataType.INT64)}), None, keepdims=False
    )
    return bx.op("Cast", [count], {"to": int(ir.DataType.BOOL)})


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


@loop.batch
def _loop_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    body = graph_attr(node, "body")
    n = len(node.inputs) - 2
    states = [(2 + i, 1 + i) for i in range(n)]
    if not batched[0] and not batched[1]:
        result, flags = state_fixpoint(bx, body, [False, False, *batched[2:]], states)
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
        inputs.append(initial_state(bx, arg, batched[2 + i], original, flags[2 + i]))
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


def _masked_loop(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """The examples stop after different numbers of iterations.

    The loop runs while some example is active; a per-example mask state ``active`` (the
    example's condition and, for a batched trip count, ``i < M``) freezes the finished ones:
    every state is updated with ``Where(active, new, old)``.
    """
    where = vmap_label(bx, node)
    body = graph_attr(node, "body")
    n = len(node.inputs) - 2
    k = len(node.outputs) - n
    why = "trip count" if batched[0] else "condition"
    # Reverse mode's records of the states (RECORDS) may be padded: each example
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
        if state is not None and not is_tensor(state):
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
    result, flags = state_fixpoint(bx, body, start, states)
    cond_in = body.inputs[1]
    cond_shape = (
        list(cond_in.shape.numpy())
        if cond_in.shape is not None and cond_in.shape.is_static()
        else []
    )

    # Outside: per-example trip counts and the initial mask.
    trip, cond = args[0], args[1]
    trips = per_example(bx, trip, True) if batched[0] and trip is not None else None
    if cond is None:
        first = bx.op("Expand", [bx.const(np.array([True])), bx.batch_size])
    else:
        first = per_example(bx, cond, batched[1])
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
        inputs.append(initial_state(bx, arg, batched[2 + i], original, flags[2 + i]))

    # Inside: the body's condition input is the mask (true for the examples that run).
    graph, cbx = result.graph, result.bx
    iteration, mask_in = graph.inputs[0], graph.inputs[1]
    running = ir.Value(name="any_active", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    graph.inputs.insert(1, running)
    active = per_example(cbx, mask_in, True)
    going = cbx.op("And", [active, per_example(cbx, result.outputs[0], result.batched[0])])
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
            mask = along(cbx, active, bx.rank(original))
            new = select(cbx, mask, new, old, original.dtype)
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
