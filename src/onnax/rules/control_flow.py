"""Control flow: If, Loop and Scan in forward and reverse mode.

The rules work on whole subgraphs through the hooks of a
:class:`~onnax.core.subgraphs.ScopedEmitter` (the walks of the passes), in one of two modes:

* **forward** (jvp): the node is replaced by one node of the same operator whose body computes
  primal and tangent values together. Loops and Scans carry the tangents as extra state, scan
  inputs and scan outputs: nothing is stored, and any number of seeds works.
* **linearize** (reverse mode): the primal node stays. A Loop or Scan additionally records the
  state every iteration starts from (as extra scan outputs; the primal Loop is replaced by one
  that also counts its iterations in an extra state, so that vmap can batch the records of
  examples that stop at different iterations); a separate *linear* node reads the
  records, recomputes the body's primal part locally and computes the tangents, so that it is
  linear in the tangents. Its transpose rule builds the backward node: an If on the same
  condition, or a Loop/Scan running the iterations backwards (reading the records from the last
  one), recomputing the primal part and running the transposed body. The cotangent of an outer
  value read by a body (a captured weight) accumulates in the backward node's state, so its cost
  is O(|w|), not O(T·|w|).

A transpose rule returns the cotangents of its explicit inputs followed by those of the captured
linear values (:func:`~onnax.core.subgraphs.captured_linear`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.diagnostics import node_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import jvp_rules, transpose_rules
from onnax.core.selection import is_float
from onnax.core.subgraphs import (
    TAKEN,
    BodyLinearization,
    ScopedEmitter,
    as_output,
    captured_linear,
    discard_graph,
    new_value_like,
    redirect_outputs,
    subgraph_reads,
)
from onnax.errors import UnsupportedOperatorError

__all__ = ["RECORDS", "record_outputs"]

_META = "onnax.control_flow"
"""``node.meta`` key of a linear control-flow node: what its transpose rule needs."""

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


Tangents = Sequence[ir.Value | None]


# ------------------------------------------------------------------------------ helpers
def _scoped(em: Emitter) -> ScopedEmitter:
    if not isinstance(em, ScopedEmitter):
        raise InternalRuleError("control-flow rules need the ScopedEmitter of the passes")
    return em


def _body_emitter(em: ScopedEmitter) -> ScopedEmitter:
    """A fresh emitter for nodes that go into a subgraph (constants are not shared)."""
    return ScopedEmitter(em.opset, em.linear, em.hooks)


def _emit_node(
    em: Emitter,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Mapping[str, object],
    num_outputs: int,
) -> ir.Node:
    node = ir.node(op_type, list(inputs), attributes=dict(attributes), num_outputs=num_outputs)  # type: ignore[arg-type]
    em.nodes.append(node)
    return node


def _place_tangents(
    em: Emitter,
    node: ir.Node,
    result: list[ir.Value | None],
    positions: Sequence[int],
    tangents: Sequence[ir.Value],
) -> None:
    """Records ``tangents`` as the linear tangents of ``node``'s outputs at ``positions``."""
    for k, t in zip(positions, tangents, strict=True):
        _like(t, node.outputs[k])
        em.linear.add(t)
        result[k] = t


def _like(target: ir.Value, source: ir.Value | None) -> None:
    if source is None:
        return
    target.type = source.type
    target.shape = source.shape.copy() if source.shape is not None else None


def _flush(em: Emitter, graph: ir.Graph, *, front: bool = False) -> list[ir.Node]:
    """Moves the nodes emitted through ``em`` into ``graph`` (at the front if asked)."""
    nodes = em.take()
    if not nodes:
        return nodes
    if front and len(graph) > 0:
        graph.insert_before(graph[0], nodes)
    else:
        graph.extend(nodes)
    return nodes


def _set_outputs(
    graph: ir.Graph,
    em: Emitter,
    values: Sequence[ir.Value],
    like: Sequence[ir.Value],
    lin: BodyLinearization | None = None,
) -> None:
    """Replaces the outputs of ``graph`` by ``values`` (wrapped where they cannot be outputs).

    Each output gets the type and shape of the matching value of ``like`` (the checker wants
    typed subgraph outputs, and emitted nodes have none). A wrapper of a tangent is a linear
    node: it joins ``lin`` so that the transposition of the body sees it.
    """
    nodes = _flush(em, graph)
    taken: set[ir.Value] = set()
    outs = [as_output(em, v, graph, taken) for v in values]
    for o, ref in zip(outs, like, strict=True):
        if o.type is None:
            o.type = ref.type
        if o.shape is None and ref.shape is not None:
            o.shape = ref.shape.copy()
    nodes += _flush(em, graph)
    if lin is not None:
        lin.linear_nodes.extend(n for n in nodes if any(o in em.linear for o in n.outputs))
    graph.outputs.clear()
    graph.outputs.extend(outs)


def _set_inputs(graph: ir.Graph, values: Sequence[ir.Value]) -> None:
    graph.inputs.clear()
    graph.inputs.extend(values)


def _active_values(graph: ir.Graph, seeds: Iterable[ir.Value]) -> set[ir.Value]:
    """Float values of ``graph`` that depend on ``seeds`` (an over-approximation of activity)."""
    active = set(seeds)
    for node in graph:
        if any(v is not None and v in active for v in node.inputs) or any(
            v in active for v in subgraph_reads(node)
        ):
            active.update(o for o in node.outputs if is_float(o))
    return active


def _active_states(
    graph: ir.Graph,
    state_in: Sequence[ir.Value],
    state_out: Sequence[ir.Value],
    initially: Iterable[int],
    other_seeds: Iterable[ir.Value],
) -> list[int]:
    """The loop-carried states with a tangent: a fixpoint over the body.

    A state whose initial tangent is zero becomes active after one iteration when the body mixes
    an active value (a scan input, a captured outer value, another active state) into it.
    """
    others = list(other_seeds)
    active = {j for j in initially if is_float(state_in[j])}
    while True:
        reach = _active_values(graph, [*others, *(state_in[j] for j in active)])
        grown = active | {
            j for j, v in enumerate(state_out) if v in reach and is_float(state_in[j])
        }
        if grown == active:
            return sorted(active)
        active = grown


def _outer_seeds(em: ScopedEmitter, node: ir.Node) -> list[ir.Value]:
    return [v for v in subgraph_reads(node) if v in em.tangent]


def _ints(node: ir.Node, name: str, count: int) -> list[int]:
    got = node.attributes.get_ints(name, None)
    return list(got) if got is not None else [0] * count


def _flip(directions: Sequence[int]) -> list[int]:
    return [1 - d for d in directions]


def _new_inputs(values: Sequence[ir.Value]) -> list[ir.Value]:
    return [new_value_like(v) for v in values]


def _tangent_or_zero(em: Emitter, tangent: ir.Value | None, primal: ir.Value | None) -> ir.Value:
    if tangent is not None:
        return tangent
    if primal is None:
        raise InternalRuleError("a zero tangent for an absent value")
    return em.zeros_like(primal)


@dataclasses.dataclass
class _LinearInfo:
    """What the transpose rule of a linear control-flow node needs to know."""

    lins: list[BodyLinearization]
    counts: dict[str, int]


def _info(node: ir.Node) -> _LinearInfo:
    info = node.meta.get(_META)
    if not isinstance(info, _LinearInfo):
        raise InternalRuleError(
            f"{node.op_type} applied to a tangent without the record of its linearization"
        )
    return info


# ----------------------------------------------------------------------------------- If
def _if_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> Tangents:
    sem = _scoped(em)
    names = ("then_branch", "else_branch")
    n = len(node.outputs)
    if sem.hooks.mode == "forward":
        branches = [node.attributes[k].as_graph() for k in names]
    else:
        branches = [
            node.attributes[k].as_graph().clone(allow_outer_scope_values=True) for k in names
        ]
    lins = [sem.hooks.linearize_body(g, dict(sem.tangent)) for g in branches]
    # Read after linearizing: forward mode may have replaced a nested node producing an output.
    primal_outs = [list(g.outputs) for g in branches]
    maps = [lin.tangent for lin in lins]
    active = [
        k
        for k in range(n)
        if is_float(node.outputs[k])
        and any(outs[k] in m for outs, m in zip(primal_outs, maps, strict=True))
    ]
    if not active:
        if sem.hooks.mode != "forward":
            for g in branches:
                discard_graph(g)
        return [None] * n
    for g, outs, m, lin in zip(branches, primal_outs, maps, lins, strict=True):
        bem = _body_emitter(sem)
        touts = [_tangent_or_zero(bem, m.get(outs[k]), outs[k]) for k in active]
        keep = outs if sem.hooks.mode == "forward" else []
        _set_outputs(g, bem, [*keep, *touts], [*keep, *(outs[k] for k in active)], lin)
    attrs = {"then_branch": branches[0], "else_branch": branches[1]}
    if sem.hooks.mode == "forward":
        new = _emit_node(em, "If", [node.inputs[0]], attrs, n + len(active))
        new.name = node.name  # messages keep naming the user's node
        redirect_outputs(node.outputs, new.outputs[:n])
        sem.replaced.update(zip(node.outputs, new.outputs[:n], strict=True))
        touts = list(new.outputs[n:])
    else:
        new = _emit_node(em, "If", [node.inputs[0]], attrs, len(active))
        new.meta[_META] = _LinearInfo(list(lins), {})
        touts = list(new.outputs)
    result: list[ir.Value | None] = [None] * n
    for k, t in zip(active, touts, strict=True):
        _like(t, node.outputs[k])
        em.linear.add(t)
        result[k] = t
    return result


def _if_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> Tangents:
    sem = _scoped(em)
    info = _info(node)
    captured = captured_linear(node, em.linear)
    zeros = [em.zeros_like(c) for c in captured]
    branches = [node.attributes[k].as_graph() for k in ("then_branch", "else_branch")]
    for g, lin in zip(branches, info.lins, strict=True):
        seeds = [(o, ct) for o, ct in zip(g.outputs, cts, strict=True) if ct is not None]
        got = sem.hooks.transpose_body(g, lin, seeds, captured)
        bem = _body_emitter(sem)
        values = [c if c is not None else z for c, z in zip(got, zeros, strict=True)]
        _set_outputs(g, bem, values, captured)
    node.meta[TAKEN] = True
    if not captured:
        for g in branches:
            discard_graph(g)
        return [None]
    attrs = {"then_branch": branches[0], "else_branch": branches[1]}
    new = _emit_node(em, "If", [node.inputs[0]], attrs, len(captured))
    for out, c in zip(new.outputs, captured, strict=True):
        _like(out, c)
    return [None, *new.outputs]


# --------------------------------------------------------------------------------- Scan
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


def _scan_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> Tangents:
    sem = _scoped(em)
    n, m, k = _scan_layout(node)
    body = node.attributes["body"].as_graph()
    in_dirs, in_axes = _ints(node, "scan_input_directions", m), _ints(node, "scan_input_axes", m)
    out_dirs = _ints(node, "scan_output_directions", k)
    out_axes = _ints(node, "scan_output_axes", k)
    act_x = [i for i in range(m) if tangents[n + i] is not None]
    outer = _outer_seeds(sem, node)
    act_s = _active_states(
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
    t_s_in = _new_inputs([s_in[j] for j in act_s])
    t_x_in = _new_inputs([x_in[i] for i in act_x])
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
    bem = _body_emitter(sem)
    t_s_out = [_tangent_or_zero(bem, tmap.get(s_out[j]), s_out[j]) for j in act_s]
    t_y = [tmap[y[i]] for i in act_y]
    t_init = [_tangent_or_zero(em, tangents[j], node.inputs[j]) for j in act_s]
    t_xs = [tangents[n + i] for i in act_x]
    pick = lambda values, idx: [values[i] for i in idx]  # noqa: E731
    result: list[ir.Value | None] = [None] * (n + k)
    if forward:
        _set_inputs(g, [*s_in, *t_s_in, *x_in, *t_x_in])
        refs = [*s_out, *(s_out[j] for j in act_s), *y, *(y[i] for i in act_y)]
        _set_outputs(g, bem, [*s_out, *t_s_out, *y, *t_y], refs)
        attrs = _scan_attrs(
            node,
            g,
            scan_input_directions=in_dirs + pick(in_dirs, act_x),
            scan_input_axes=in_axes + pick(in_axes, act_x),
            scan_output_directions=out_dirs + pick(out_dirs, act_y),
            scan_output_axes=out_axes + pick(out_axes, act_y),
        )
        inputs = [*node.inputs[:n], *t_init, *node.inputs[n:], *t_xs]
        new = _emit_node(em, "Scan", inputs, attrs, n + len(act_s) + k + len(act_y))
        new.name = node.name  # messages keep naming the user's node
        a = len(act_s)
        redirect_outputs(node.outputs, [*new.outputs[:n], *new.outputs[n + a : n + a + k]])
        sem.replaced.update(zip(node.outputs[:n], new.outputs[:n], strict=True))
        sem.replaced.update(zip(node.outputs[n:], new.outputs[n + a : n + a + k], strict=True))
        t_states, t_scans = new.outputs[n : n + a], new.outputs[n + a + k :]
    else:
        records = _record_scan_states(node, body, n, m, k, in_axes)
        _set_inputs(g, [*t_s_in, *s_in, *x_in, *t_x_in])
        refs = [*(s_out[j] for j in act_s), *(y[i] for i in act_y)]
        _set_outputs(g, bem, [*t_s_out, *t_y], refs, lin)
        attrs = _scan_attrs(
            node,
            g,
            scan_input_directions=[0] * n + in_dirs + pick(in_dirs, act_x),
            scan_input_axes=[0] * n + in_axes + pick(in_axes, act_x),
            scan_output_directions=pick(out_dirs, act_y),
            scan_output_axes=pick(out_axes, act_y),
        )
        inputs = [*t_init, *records, *node.inputs[n:], *t_xs]
        new = _emit_node(em, "Scan", inputs, attrs, len(act_s) + len(act_y))
        new.meta[_META] = _LinearInfo(
            [lin], {"n": n, "m": m, "a": len(act_s), "b": len(act_x), "y": len(act_y)}
        )
        t_states, t_scans = new.outputs[: len(act_s)], new.outputs[len(act_s) :]
    _place_tangents(em, node, result, [*act_s, *(n + i for i in act_y)], [*t_states, *t_scans])
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
        _like(r, v)
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


def _scan_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> Tangents:
    sem = _scoped(em)
    info = _info(node)
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
    ct_s = _new_inputs(t_s_in)
    acc = _new_inputs(captured)
    present = [i for i in range(ny) if cts[a + i] is not None]
    ct_y = _new_inputs([t_y[i] for i in present])
    seeds = list(zip(t_s_out, ct_s, strict=True))
    seeds += [(t_y[i], c) for i, c in zip(present, ct_y, strict=True)]
    got = sem.hooks.transpose_body(g, lin, seeds, [*t_s_in, *t_x_in, *captured])
    bem = _body_emitter(sem)
    new_s = [
        c if c is not None else bem.zeros_like(_primal_in_body(lin, t, g))
        for c, t in zip(got[:a], t_s_in, strict=True)
    ]
    new_x = [
        c if c is not None else bem.zeros_like(_primal_in_body(lin, t, g))
        for c, t in zip(got[a : a + b], t_x_in, strict=True)
    ]
    new_acc = [
        bem.op("Add", [s, c]) if c is not None else s
        for s, c in zip(acc, got[a + b :], strict=True)
    ]
    _set_inputs(g, [*ct_s, *acc, *recs_in, *x_in, *ct_y])
    _set_outputs(g, bem, [*new_s, *new_acc, *new_x], [*ct_s, *acc, *t_x_in])
    node.meta[TAKEN] = True
    init_s = [_tangent_or_zero(em, cts[j], node.outputs[j]) for j in range(a)]
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
    new = _emit_node(em, "Scan", inputs, attrs, a + len(captured) + b)
    outs = list(new.outputs)
    for o, v in zip(outs, [*node.inputs[:a], *captured, *node.inputs[a + n + m :]], strict=True):
        _like(o, v)
    result: list[ir.Value | None] = [*outs[:a], *([None] * (n + m)), *outs[a + len(captured) :]]
    return [*result, *outs[a : a + len(captured)]]


def _primal_in_body(lin: BodyLinearization, t: ir.Value, graph: ir.Graph) -> ir.Value:
    """The primal value a body tangent input belongs to (its shape witness)."""
    primal = lin.tangent_of.get(t)
    if primal is None:
        raise InternalRuleError(f"no primal for tangent input {t.name!r} of {graph.name!r}")
    return primal


# --------------------------------------------------------------------------------- Loop
def _loop_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> Tangents:
    sem = _scoped(em)
    body = node.attributes["body"].as_graph()
    n = len(node.inputs) - 2
    k = len(node.outputs) - n
    outer = _outer_seeds(sem, node)
    act_s = _active_states(
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
    bem = _body_emitter(sem)
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
            _like(got, v)
            v.replace_all_uses_with(got, replace_graph_outputs=True)
            state_values.append(got)
        # Every recorded iteration ran, so the condition it started from was true.
        cond_in.replace_all_uses_with(bem.const(np.array(True)), replace_graph_outputs=True)
        _flush(bem, g, front=True)
    t_v_in = _new_inputs([v_in[j] for j in act_s])
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
    t_v_out = [_tangent_or_zero(bem, tmap.get(v_out[j]), v_out[j]) for j in act_s]
    t_y = [tmap[scans[i]] for i in act_y]
    t_init = [_tangent_or_zero(em, tangents[2 + j], node.inputs[2 + j]) for j in act_s]
    a = len(act_s)
    result: list[ir.Value | None] = [None] * (n + k)
    attrs: dict[str, object] = {"body": g}
    if forward:
        _set_inputs(g, [it, cond_in, *v_in, *t_v_in])
        refs = [cond_out, *v_out, *(v_out[j] for j in act_s), *scans, *(scans[i] for i in act_y)]
        _set_outputs(g, bem, [cond_out, *v_out, *t_v_out, *scans, *t_y], refs)
        inputs = [*node.inputs[:2], *node.inputs[2:], *t_init]
        new = _emit_node(em, "Loop", inputs, attrs, n + a + k + len(act_y))
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
        _set_inputs(g, [it, cond_in, *t_v_in])
        true = bem.const(np.array(True))
        refs = [true, *(v_out[j] for j in act_s), *(scans[i] for i in act_y)]
        _set_outputs(g, bem, [true, *t_v_out, *t_y], refs, lin)
        # An explicit true condition: the loop runs exactly as often as the primal one did.
        true = em.const(np.array(True))
        new = _emit_node(em, "Loop", [count, true, *t_init], attrs, a + len(act_y))
        new.meta[_META] = _LinearInfo([lin], {"n": n, "a": a, "y": len(act_y)})
        t_states, t_scans = new.outputs[:a], new.outputs[a:]
    _place_tangents(em, node, result, [*act_s, *(n + i for i in act_y)], [*t_states, *t_scans])
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
    _like(count_out, count_in)
    states_in = list(body.inputs[2:])
    recs = [bem.op("Identity", [v]) for v in states_in]
    for r, v in zip(recs, states_in, strict=True):
        _like(r, v)
    body.extend(bem.take())
    outs = list(body.outputs)
    body.inputs.append(count_in)
    body.outputs.clear()
    body.outputs.extend([*outs[: 1 + n], count_out, *outs[1 + n :], *recs])
    zero = em.const(np.array(0, dtype=np.int64))
    new = _emit_node(em, "Loop", [*node.inputs, zero], {"body": body}, n + 1 + k + n)
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


def _loop_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> Tangents:
    sem = _scoped(em)
    info = _info(node)
    a, ny = info.counts["a"], info.counts["y"]
    (lin,) = info.lins
    captured = captured_linear(node, em.linear)
    g = node.attributes["body"].as_graph()
    trips = node.inputs[0]
    assert trips is not None
    it, cond_in, t_v_in = g.inputs[0], g.inputs[1], list(g.inputs[2:])
    t_v_out, t_y = list(g.outputs[1 : 1 + a]), list(g.outputs[1 + a :])
    bem = _body_emitter(sem)
    # Backward iteration j replays forward iteration trips-1-j.
    step = new_value_like(it)
    last = bem.op("Sub", [trips, bem.const(np.array(1, dtype=np.int64))])
    index = bem.op("Sub", [last, step])
    _like(index, it)
    it.replace_all_uses_with(index)
    seeds: list[tuple[ir.Value, ir.Value]] = []
    ct_v = _new_inputs(t_v_in)
    seeds += list(zip(t_v_out, ct_v, strict=True))
    for i in range(ny):
        ct = cts[a + i]
        if ct is not None:
            seeds.append((t_y[i], bem.op("Gather", [ct, index], {"axis": 0})))
    acc = _new_inputs(captured)
    _flush(bem, g, front=True)
    got = sem.hooks.transpose_body(g, lin, seeds, [*t_v_in, *captured])
    new_v = [
        c if c is not None else bem.zeros_like(_primal_in_body(lin, t, g))
        for c, t in zip(got[:a], t_v_in, strict=True)
    ]
    new_acc = [
        bem.op("Add", [s, c]) if c is not None else s for s, c in zip(acc, got[a:], strict=True)
    ]
    _set_inputs(g, [step, cond_in, *ct_v, *acc])
    true = bem.const(np.array(True))
    _set_outputs(g, bem, [true, *new_v, *new_acc], [true, *ct_v, *acc])
    node.meta[TAKEN] = True
    init_v = [_tangent_or_zero(em, cts[j], node.outputs[j]) for j in range(a)]
    init_acc = [em.zeros_like(c) for c in captured]
    true = em.const(np.array(True))
    new = _emit_node(em, "Loop", [trips, true, *init_v, *init_acc], {"body": g}, a + len(captured))
    outs = list(new.outputs)
    for o, v in zip(outs, [*node.inputs[2:], *captured], strict=True):
        _like(o, v)
    return [None, None, *outs[:a], *outs[a:]]


# ------------------------------------------------------------------------- registration
# Every schema version: the changes (sequence/optional states, new element types) do not touch
# how tensors flow through the bodies.
for _version in (1, 11, 13, 16, 19, 21, 23, 24, 25):
    jvp_rules.add("If", _if_jvp, since_version=_version)
    transpose_rules.add("If", _if_transpose, since_version=_version)
    jvp_rules.add("Loop", _loop_jvp, since_version=_version)
    transpose_rules.add("Loop", _loop_transpose, since_version=_version)
for _version in (9, 11, 16, 19, 21, 23, 24, 25):
    jvp_rules.add("Scan", _scan_jvp, since_version=_version)
    transpose_rules.add("Scan", _scan_transpose, since_version=_version)
