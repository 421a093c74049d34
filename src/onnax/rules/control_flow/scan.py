"""Scan: jvp, transpose and batch rules.

Forward mode carries the tangents as extra states, scan inputs and scan outputs of one Scan.
Reverse mode makes the primal Scan also output the state every iteration starts from; the linear
Scan reads those records, and its transpose is a Scan running the iterations backwards.

Under vmap the body is batched: batched scan inputs keep the batch at axis 0, so their scan axis
shifts by one; batched scan outputs are stacked one axis further out. A state is batched when
its initial value is or its update depends on batched values (a fixpoint over the body).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.selection import is_float
from onnax.core.subgraphs import TAKEN, captured_linear, discard_graph, redirect_outputs
from onnax.rules.control_flow._batching import graph_attr, initial_state, state_fixpoint
from onnax.rules.control_flow._common import (
    LINEAR_META,
    LinearInfo,
    active_states,
    body_emitter,
    copy_type,
    emit_node,
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

__all__: list[str] = []

# Every schema version from 9: the changes (sequence states, new element types) do not touch
# how tensors flow through the body.
scan = OpRules("Scan", since=9)


# ------------------------------------------------------------------------- jvp and transpose
def _ints(node: ir.Node, name: str, count: int) -> list[int]:
    got = node.attributes.get_ints(name, None)
    return list(got) if got is not None else [0] * count


def _flip(directions: Sequence[int]) -> list[int]:
    return [1 - d for d in directions]


def _scan_layout(node: ir.Node) -> tuple[int, int, int]:
    """``(states N, scan inputs M, scan outputs K)``."""
    m = node.attributes.get_int("num_scan_inputs", 0)
    n = len(node.inputs) - m
    return n, m, len(node.outputs) - n


def _scan_attrs(node: ir.Node, body: ir.Graph, **ints: list[int]) -> dict[str, object]:
    attrs: dict[str, object] = {k: a.value for k, a in node.attributes.items() if k != "body"}
    attrs["body"] = body
    attrs["num_scan_inputs"] = len(ints["scan_input_directions"])
    for name, values in ints.items():
        # An empty list has no attribute type; absent means empty for these attributes.
        attrs.pop(name, None)
        if values:
            attrs[name] = values
    return attrs


@scan.jvp
def _scan_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> Tangents:
    sem = scoped(em)
    n, m, k = _scan_layout(node)
    body = node.attributes["body"].as_graph()
    in_dirs, in_axes = _ints(node, "scan_input_directions", m), _ints(node, "scan_input_axes", m)
    out_dirs = _ints(node, "scan_output_directions", k)
    out_axes = _ints(node, "scan_output_axes", k)
    act_x = [i for i in range(m) if tangents[n + i] is not None]
    outer = outer_seeds(sem, node)
    act_s = active_states(
        body,
        body.inputs[:n],
        body.outputs[:n],
        [j for j in range(n) if tangents[j] is not None],
        [*outer, *(body.inputs[n + i] for i in act_x)],
    )
    if not act_s and not act_x and not outer:
        return [None] * (n + k)
    forward = sem.hooks.mode == "forward"
    g = body if forward else body.clone(allow_outer_scope_values=True)
    s_in, x_in = list(g.inputs[:n]), list(g.inputs[n:])
    t_s_in = new_inputs([s_in[j] for j in act_s])
    t_x_in = new_inputs([x_in[i] for i in act_x])
    seeds = dict(sem.tangent)
    seeds.update(zip([s_in[j] for j in act_s], t_s_in, strict=True))
    seeds.update(zip([x_in[i] for i in act_x], t_x_in, strict=True))
    lin = sem.hooks.linearize_body(g, seeds)
    tmap = lin.tangent
    s_out, y = list(g.outputs[:n]), list(g.outputs[n:])
    act_y = [i for i in range(k) if is_float(y[i]) and y[i] in tmap]
    if not act_s and not act_y:
        if not forward:
            discard_graph(g)
        return [None] * (n + k)
    bem = body_emitter(sem)
    t_s_out = [tangent_or_zero(bem, tmap.get(s_out[j]), s_out[j]) for j in act_s]
    t_y = [tmap[y[i]] for i in act_y]
    t_init = [tangent_or_zero(em, tangents[j], node.inputs[j]) for j in act_s]
    t_xs = [tangents[n + i] for i in act_x]
    pick = lambda values, idx: [values[i] for i in idx]  # noqa: E731
    result: list[ir.Value | None] = [None] * (n + k)
    if forward:
        set_inputs(g, [*s_in, *t_s_in, *x_in, *t_x_in])
        refs = [*s_out, *(s_out[j] for j in act_s), *y, *(y[i] for i in act_y)]
        set_outputs(g, bem, [*s_out, *t_s_out, *y, *t_y], refs)
        attrs = _scan_attrs(
            node,
            g,
            scan_input_directions=in_dirs + pick(in_dirs, act_x),
            scan_input_axes=in_axes + pick(in_axes, act_x),
            scan_output_directions=out_dirs + pick(out_dirs, act_y),
            scan_output_axes=out_axes + pick(out_axes, act_y),
        )
        inputs = [*node.inputs[:n], *t_init, *node.inputs[n:], *t_xs]
        new = emit_node(em, "Scan", inputs, attrs, n + len(act_s) + k + len(act_y))
        new.name = node.name  # messages keep naming the user's node
        a = len(act_s)
        redirect_outputs(node.outputs, [*new.outputs[:n], *new.outputs[n + a : n + a + k]])
        sem.replaced.update(zip(node.outputs[:n], new.outputs[:n], strict=True))
        sem.replaced.update(zip(node.outputs[n:], new.outputs[n + a : n + a + k], strict=True))
        t_states, t_scans = new.outputs[n : n + a], new.outputs[n + a + k :]
    else:
        records = _record_scan_states(node, body, n, m, k, in_axes)
        set_inputs(g, [*t_s_in, *s_in, *x_in, *t_x_in])
        refs = [*(s_out[j] for j in act_s), *(y[i] for i in act_y)]
        set_outputs(g, bem, [*t_s_out, *t_y], refs, lin)
        attrs = _scan_attrs(
            node,
            g,
            scan_input_directions=[0] * n + in_dirs + pick(in_dirs, act_x),
            scan_input_axes=[0] * n + in_axes + pick(in_axes, act_x),
            scan_output_directions=pick(out_dirs, act_y),
            scan_output_axes=pick(out_axes, act_y),
        )
        inputs = [*t_init, *records, *node.inputs[n:], *t_xs]
        new = emit_node(em, "Scan", inputs, attrs, len(act_s) + len(act_y))
        new.meta[LINEAR_META] = LinearInfo(
            [lin], {"n": n, "m": m, "a": len(act_s), "b": len(act_x), "y": len(act_y)}
        )
        t_states, t_scans = new.outputs[: len(act_s)], new.outputs[len(act_s) :]
    place_tangents(em, node, result, [*act_s, *(n + i for i in act_y)], [*t_states, *t_scans])
    return result


def _record_scan_states(
    node: ir.Node, body: ir.Graph, n: int, m: int, k: int, in_axes: Sequence[int]
) -> list[ir.Value]:
    """Makes the primal Scan also output the state each iteration starts from."""
    out_dirs = _ints(node, "scan_output_directions", k)
    out_axes = _ints(node, "scan_output_axes", k)
    em = Emitter(0)
    recs = [em.op("Identity", [v]) for v in body.inputs[:n]]
    for r, v in zip(recs, body.inputs[:n], strict=True):
        copy_type(r, v)
    body.extend(em.take())
    body.outputs.extend(recs)
    node.attributes["scan_output_directions"] = ir.AttrInt64s(
        "scan_output_directions", [*out_dirs, *([0] * n)]
    )
    node.attributes["scan_output_axes"] = ir.AttrInt64s("scan_output_axes", [*out_axes, *([0] * n)])
    node.resize_outputs(n + k + n)
    steps: ir.SymbolicDim | int | None = None
    first = node.inputs[n] if m else None
    if first is not None and first.shape is not None:
        steps = first.shape.dims[in_axes[0] % first.shape.rank()]
    records = list(node.outputs[n + k :])
    for r, v in zip(records, body.inputs[:n], strict=True):
        r.type = v.type
        if v.shape is not None and steps is not None:
            r.shape = ir.Shape([steps, *v.shape.dims])
    return records


@scan.transpose
def _scan_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> Tangents:
    sem = scoped(em)
    info = linear_info(node)
    n, m, a, b, ny = (info.counts[x] for x in ("n", "m", "a", "b", "y"))
    captured = captured_linear(node, em.linear)
    g = node.attributes["body"].as_graph()
    (lin,) = info.lins
    in_dirs = _ints(node, "scan_input_directions", n + m + b)
    in_axes = _ints(node, "scan_input_axes", n + m + b)
    out_dirs = _ints(node, "scan_output_directions", ny)
    out_axes = _ints(node, "scan_output_axes", ny)
    t_s_in, recs_in = list(g.inputs[:a]), list(g.inputs[a : a + n])
    x_in, t_x_in = list(g.inputs[a + n : a + n + m]), list(g.inputs[a + n + m :])
    t_s_out, t_y = list(g.outputs[:a]), list(g.outputs[a:])
    ct_s = new_inputs(t_s_in)
    acc = new_inputs(captured)
    present = [i for i in range(ny) if cts[a + i] is not None]
    ct_y = new_inputs([t_y[i] for i in present])
    seeds = list(zip(t_s_out, ct_s, strict=True))
    seeds += [(t_y[i], c) for i, c in zip(present, ct_y, strict=True)]
    got = sem.hooks.transpose_body(g, lin, seeds, [*t_s_in, *t_x_in, *captured])
    bem = body_emitter(sem)
    new_s = [
        c if c is not None else bem.zeros_like(primal_in_body(lin, t, g))
        for c, t in zip(got[:a], t_s_in, strict=True)
    ]
    new_x = [
        c if c is not None else bem.zeros_like(primal_in_body(lin, t, g))
        for c, t in zip(got[a : a + b], t_x_in, strict=True)
    ]
    new_acc = [
        bem.op("Add", [s, c]) if c is not None else s
        for s, c in zip(acc, got[a + b :], strict=True)
    ]
    set_inputs(g, [*ct_s, *acc, *recs_in, *x_in, *ct_y])
    set_outputs(g, bem, [*new_s, *new_acc, *new_x], [*ct_s, *acc, *t_x_in])
    node.meta[TAKEN] = True
    init_s = [tangent_or_zero(em, cts[j], node.outputs[j]) for j in range(a)]
    init_acc = [em.zeros_like(c) for c in captured]
    x_dirs, x_axes = in_dirs[n : n + m], in_axes[n : n + m]
    tx_dirs, tx_axes = in_dirs[n + m :], in_axes[n + m :]
    attrs = _scan_attrs(
        node,
        g,
        scan_input_directions=[1] * n + _flip(x_dirs) + _flip([out_dirs[i] for i in present]),
        scan_input_axes=[0] * n + x_axes + [out_axes[i] for i in present],
        scan_output_directions=_flip(tx_dirs),
        scan_output_axes=list(tx_axes),
    )
    inputs = [*init_s, *init_acc, *node.inputs[a : a + n + m], *(cts[a + i] for i in present)]
    new = emit_node(em, "Scan", inputs, attrs, a + len(captured) + b)
    outs = list(new.outputs)
    for o, v in zip(outs, [*node.inputs[:a], *captured, *node.inputs[a + n + m :]], strict=True):
        copy_type(o, v)
    result: list[ir.Value | None] = [*outs[:a], *([None] * (n + m)), *outs[a + len(captured) :]]
    return [*result, *outs[a : a + len(captured)]]


# -------------------------------------------------------------------------------------- vmap
def _axis(axis: int, value: ir.Value, bx: Batcher, extra: int = 0) -> int:
    """A non-negative axis of ``value`` (of rank ``rank(value) + extra``)."""
    return axis if axis >= 0 else axis + bx.rank(value) + extra


@scan.batch
def _scan_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    body = graph_attr(node, "body")
    m = node.attributes.get_int("num_scan_inputs", 0)
    n = len(node.inputs) - m
    k = len(node.outputs) - n
    in_axes = list(node.attributes.get_ints("scan_input_axes", [0] * m))
    out_axes = list(node.attributes.get_ints("scan_output_axes", [0] * k))
    result, flags = state_fixpoint(bx, body, list(batched), [(i, i) for i in range(n)])
    out_flags = result.finish([*flags[:n], *([False] * k)])
    inputs: list[ir.Value | None] = []
    for i in range(n):
        arg, original = args[i], node.inputs[i]
        assert arg is not None and original is not None
        inputs.append(initial_state(bx, arg, batched[i], original, flags[i]))
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
