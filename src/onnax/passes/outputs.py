"""The public inputs and outputs a derivative pass appends."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.naming import NameClaims

__all__ = ["append_outputs", "input_like", "materialize"]


def materialize(em: Emitter, graph: ir.Graph, t: ir.Value | None, primal: ir.Value) -> ir.Value:
    """A value that can become a new graph output.

    Zeros stand in for a symbolic zero; an Identity separates a tangent that is already an input
    or output of the graph.
    """
    if t is None:
        # The emitter may hand out the same zeros for two outputs of one type and shape, and
        # one value cannot be two outputs under two names: the Identity below separates them.
        t = em.zeros_like(primal)
    if t.is_graph_input() or t.is_graph_output() or t.is_initializer() or t.producer() is None:
        t = em.op("Identity", [t])
    graph.extend(em.take())
    return t


def input_like(primal: ir.Value) -> ir.Value:
    """A new, unnamed value with the type and shape of ``primal`` (a seed or tangent input)."""
    shape = primal.shape.copy() if primal.shape is not None else None
    return ir.Value(name=None, type=primal.type, shape=shape)


def append_outputs(
    em: Emitter,
    graph: ir.Graph,
    claims: NameClaims,
    prefix: str,
    pairs: Sequence[tuple[ir.Value, ir.Value | None]],
) -> None:
    """Appends one output ``<prefix><primal name>`` per ``(primal, derivative)`` pair.

    The output has the primal's type and shape; a missing derivative (a symbolic zero) becomes
    zeros.
    """
    for primal, derivative in pairs:
        out = materialize(em, graph, derivative, primal)
        claims.claim(out, f"{prefix}{primal.name}")
        out.type = primal.type
        out.shape = primal.shape.copy() if primal.shape is not None else None
        graph.outputs.append(out)
