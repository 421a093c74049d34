"""If: jvp, transpose and batch rules.

Forward mode replaces the If by one whose branches also compute the tangents; reverse mode adds
a linear If on the same condition whose transpose is a third If running the transposed branches.

Under vmap, an If with a shared condition becomes an If whose branches are batched (an output
batched in one branch is materialised in the other). With a batched condition both branches run
for every example, inlined into the enclosing graph, and ``Where`` picks per example.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import RANDOM_OPS, node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.selection import is_float
from onnax.core.subgraphs import TAKEN, captured_linear, discard_graph, redirect_outputs
from onnax.errors import UnsupportedOperatorError
from onnax.rules.control_flow._batching import (
    along,
    copy_graph,
    graph_attr,
    is_tensor,
    per_example,
    select,
    vmap_label,
)
from onnax.rules.control_flow._common import (
    LINEAR_META,
    LinearInfo,
    body_emitter,
    copy_type,
    emit_node,
    linear_info,
    scoped,
    set_outputs,
    tangent_or_zero,
)

__all__: list[str] = []

# Every schema version: the changes (optional and sequence outputs, new element types) do not
# touch how tensors flow through the branches.
if_ops = OpRules("If", since=1)


# ------------------------------------------------------------------------- jvp and transpose
@if_ops.jvp
def _if_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> Tangents:
    sem = scoped(em)
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
        bem = body_emitter(sem)
        touts = [tangent_or_zero(bem, m.get(outs[k]), outs[k]) for k in active]
        keep = outs if sem.hooks.mode == "forward" else []
        set_outputs(g, bem, [*keep, *touts], [*keep, *(outs[k] for k in active)], lin)
    attrs = {"then_branch": branches[0], "else_branch": branches[1]}
    if sem.hooks.mode == "forward":
        new = emit_node(em, "If", [node.inputs[0]], attrs, n + len(active))
        new.name = node.name  # messages keep naming the user's node
        redirect_outputs(node.outputs, new.outputs[:n])
        sem.replaced.update(zip(node.outputs, new.outputs[:n], strict=True))
        touts = list(new.outputs[n:])
    else:
        new = emit_node(em, "If", [node.inputs[0]], attrs, len(active))
        new.meta[LINEAR_META] = LinearInfo(list(lins), {})
        touts = list(new.outputs)
    result: list[ir.Value | None] = [None] * n
    for k, t in zip(active, touts, strict=True):
        copy_type(t, node.outputs[k])
        em.linear.add(t)
        result[k] = t
    return result


@if_ops.transpose
def _if_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> Tangents:
    sem = scoped(em)
    info = linear_info(node)
    captured = captured_linear(node, em.linear)
    zeros = [em.zeros_like(c) for c in captured]
    branches = [node.attributes[k].as_graph() for k in ("then_branch", "else_branch")]
    for g, lin in zip(branches, info.lins, strict=True):
        seeds = [(o, ct) for o, ct in zip(g.outputs, cts, strict=True) if ct is not None]
        got = sem.hooks.transpose_body(g, lin, seeds, captured)
        bem = body_emitter(sem)
        values = [c if c is not None else z for c, z in zip(got, zeros, strict=True)]
        set_outputs(g, bem, values, captured)
    node.meta[TAKEN] = True
    if not captured:
        for g in branches:
            discard_graph(g)
        return [None]
    attrs = {"then_branch": branches[0], "else_branch": branches[1]}
    new = emit_node(em, "If", [node.inputs[0]], attrs, len(captured))
    for out, c in zip(new.outputs, captured, strict=True):
        copy_type(out, c)
    return [None, *new.outputs]


# -------------------------------------------------------------------------------------- vmap
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


def _differ_statically(a: ir.Shape, b: ir.Shape) -> bool:
    """Whether two shapes differ in rank or in a static dimension."""
    if a.rank() != b.rank():
        return True
    pairs = zip(a.dims, b.dims, strict=True)
    return any(isinstance(x, int) and isinstance(y, int) and x != y for x, y in pairs)


def _check_selectable(bx: Batcher, node: ir.Node, then_g: ir.Graph, else_g: ir.Graph) -> None:
    """Refuses what a per-example ``Where`` between both branches cannot express."""
    where = vmap_label(bx, node)
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
        if not (is_tensor(t) and is_tensor(e)):
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


@if_ops.batch
def _if_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    then_g, else_g = graph_attr(node, "then_branch"), graph_attr(node, "else_branch")
    cond = args[0]
    assert cond is not None
    if not batched[0]:
        bodies = [bx.batch_body(copy_graph(g), []) for g in (then_g, else_g)]
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
    flat = per_example(bx, cond, True)
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
        mask = along(bx, flat, bx.rank(then_y))
        picked.append(select(bx, mask, t, e, then_y.dtype))
    return picked, [True] * len(picked)
