"""Unique (11; 28 only adds element types).

The values output ``Y`` is a gather of ``X`` at the ``indices`` output (the first occurrence of
each unique value or slice): along ``axis`` when it is given, of the flattened input otherwise.
So its tangent is ``Gather(t, indices, axis)`` (``Gather(Reshape(t, [-1]), indices)`` without an
axis), whose transpose (a scatter-add) serves reverse mode; the integer outputs (``indices``,
``inverse_indices``, ``counts``) carry no derivative. Ties are what Unique is about: the
derivative is that of the gather at the chosen first occurrences, i.e. it holds while the
perturbation keeps equal values equal (the finite-difference derivative in a direction that
splits a tie does not exist).

vmap: the number of unique values depends on the data, so examples would get outputs of
different lengths, which one batched tensor cannot hold; Unique with a batched input is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher, input_name
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError

unique = OpRules("Unique", since=11)


@unique.jvp
def _unique_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    outs: list[ir.Value | None] = [None] * len(node.outputs)
    if t is None:
        return outs
    indices = node.outputs[1] if len(node.outputs) > 1 else None
    if indices is None or not indices.name:
        # Written without its indices output: compute them with a second Unique (primal only).
        attrs = {k: a.value for k, a in node.attributes.items()}
        indices = em.op_multi("Unique", [node.inputs[0]], attrs, num_outputs=2)[1]
    axis = node.attributes.get("axis")
    if axis is None:
        flat = em.op("Reshape", [t, em.ints([-1])])
        outs[0] = em.op("Gather", [flat, indices], {"axis": 0})
    else:
        outs[0] = em.op("Gather", [t, indices], {"axis": axis.as_int()})
    return outs


@unique.batch
def _unique_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    raise UnsupportedOperatorError(
        f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) gets a batched input "
        f"(input 0 {input_name(node, args, 0)!r}): the number of unique values depends on each "
        "example's data, so the examples' outputs could differ in length, which one batched "
        "tensor cannot hold. Remedy: give that input in_axes None (shared), or apply Unique "
        "outside the vmapped model (one example at a time)."
    )
