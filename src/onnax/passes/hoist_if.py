"""Moves the primal work of a linear If's branches into an If of its own, for ``linearize``.

In linearize mode the branches of a linear If recompute the primal values their tangents need
from the values they capture (``tanh(x * w)`` for the tangent of ``tanh``). Here a *residual If*
on the same condition computes them once, in the forward model: its then-branch returns the
then-residuals followed by empty tensors standing in for the else-residuals (same element type
and rank, so the branches agree on their output types), the else-branch the other way round.
The linear If's branches read those outputs as captured values and keep only their tangent nodes
(and the constants those read).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnax.passes.hoist import as_outputs, drop_node, reads, remove_dead

__all__ = ["hoist_if"]


def _split_branch(branch: ir.Graph, linear: set[ir.Value]) -> tuple[set[ir.Node], list[ir.Value]]:
    """The branch's tangent nodes, and its residuals.

    The residuals are the primal values that tangent nodes read and that the branch computes
    from captured values, in branch order; none when a branch output is such a value.
    """
    tangent = set(linear)
    local: set[ir.Value] = set()  # computed from the branch's own constants alone
    moved: set[ir.Node] = set()
    tangent_nodes: set[ir.Node] = set()
    for node in branch:
        node_reads = reads(node)
        if any(v in tangent for v in node_reads):
            tangent.update(node.outputs)
            tangent_nodes.add(node)
        elif all(v in local for v in node_reads):
            local.update(node.outputs)
        else:
            moved.add(node)
    if any(v.producer() in moved for v in branch.outputs):
        return tangent_nodes, []
    residuals: dict[ir.Value, None] = {}
    for node in branch:
        if node in tangent_nodes:
            for v in reads(node):
                if v.producer() in moved:
                    residuals.setdefault(v, None)
    return tangent_nodes, list(residuals)


def _empty_like(value: ir.Value) -> ir.Node:
    """A Constant empty tensor of ``value``'s element type and rank (both must be known)."""
    assert value.dtype is not None and value.shape is not None
    dims = [0] * value.shape.rank()
    array = np.zeros(dims, dtype=value.dtype.numpy())
    return ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.tensor(array))], num_outputs=1)


def hoist_if(graph: ir.Graph, node: ir.Node, linear: set[ir.Value]) -> bool:
    """Rewrites the linear If ``node`` of ``graph`` (in place) as the module docstring says.

    Returns:
        Whether it was rewritten (not when no branch has residuals, a residual's type or rank
        is unknown, or a branch output is primal).
    """
    names = ("then_branch", "else_branch")
    branches = [node.attributes[k].as_graph() for k in names]
    parts = [_split_branch(b, linear) for b in branches]
    residuals = [r for _, r in parts]
    if not any(residuals):
        return False
    every = [v for rs in residuals for v in rs]
    if any(v.dtype is None or v.shape is None for v in every):
        return False
    new_branches = []
    for k, (branch, (tangent_nodes, _)) in enumerate(zip(branches, parts, strict=True)):
        # A copy of the branch without its tangent nodes, returning its residuals, and empty
        # tensors in the places of the other branch's.
        copy = branch.clone(allow_outer_scope_values=True)
        originals, copies = list(branch), list(copy)
        position = {n: i for i, n in enumerate(originals)}
        outputs: list[ir.Value] = []
        for j, rs in enumerate(residuals):
            for v in rs:
                if j == k:
                    outputs.append(copies[position[v.producer()]].outputs[v.index()])  # type: ignore[index]
                    continue
                empty = _empty_like(v)
                copy.append(empty)
                outputs.append(empty.outputs[0])
        for original, c in reversed(list(zip(originals, copies, strict=True))):
            if original in tangent_nodes:
                drop_node(copy, c)
        copy.outputs.clear()
        copy.outputs.extend(as_outputs(copy, outputs))
        remove_dead(copy)
        new_branches.append(copy)
    stacked = [ir.Value(name=None, type=v.type) for v in every]
    residual_if = ir.Node(
        "",
        "If",
        [node.inputs[0]],
        [ir.AttrGraph(k, g) for k, g in zip(names, new_branches, strict=True)],
        outputs=stacked,
        name=f"{node.name}_residuals" if node.name else None,
    )
    graph.insert_before(node, residual_if)
    for v, outer in zip(every, stacked, strict=True):
        v.replace_all_uses_with(outer)
    for branch in branches:
        remove_dead(branch)
    return True
