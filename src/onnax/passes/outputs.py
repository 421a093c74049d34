"""The public inputs and outputs a derivative pass appends."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.naming import NameClaims
from onnax.errors import SelectionError

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
    transform: str,
) -> None:
    """Appends one output ``<prefix><primal name>`` per ``(primal, derivative)`` pair.

    The output has the primal's type and shape; a missing derivative (a symbolic zero) becomes
    zeros.

    Raises:
        SelectionError: The output's name is already a generated input's (a graph output that
            is a graph input, ``x``, has its seed ``adj_x`` named like the cotangent of input
            ``x``) and the two values differ.
    """
    for primal, derivative in pairs:
        name = f"{prefix}{primal.name}"
        if derivative is not None and derivative.name == name and derivative.is_graph_input():
            # A graph output that is its input (``(x) => (x)``) has as derivative the generated
            # input of the same name: the derivative model passes it through, as the primal does.
            graph.outputs.append(derivative)
            continue
        if claims.is_public(name):
            raise SelectionError(
                f"{transform}: the derivative of {primal.name!r} would be named {name!r}, which is "
                f"already a generated input: {primal.name!r} is both a graph input and a graph "
                "output, and the seed of that output is not the derivative of that input "
                f"(the input has other consumers). Give the output its own name "
                f"({primal.name}_out = Identity({primal.name})) or leave it out of the selection."
            )
        out = materialize(em, graph, derivative, primal)
        claims.claim(out, name)
        out.type = primal.type
        out.shape = primal.shape.copy() if primal.shape is not None else None
        graph.outputs.append(out)
