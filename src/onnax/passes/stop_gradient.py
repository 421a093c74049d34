"""``stop_gradient`` by name: values whose derivative the transforms treat as zero.

Like ``jax.lax.stop_gradient`` or ``Tensor.detach()``: the primal value is unchanged, its tangent
is a symbolic zero, so nothing that depends on the inputs only through it gets a derivative, and
in reverse mode no cotangent flows back through it. The names are those of the main graph (graph
inputs, initializers, node outputs); a value inside a subgraph cannot be stopped by name, which
keeps the walk of the control-flow bodies free of the option.

A stopped name that is also a selected differentiation input is refused: its derivative would be
zero by definition, which is almost certainly not what the caller meant. The default selection
(every floating-point graph input) leaves stopped inputs out instead, so
``grad(m, stop_gradient=["w_target"])`` differentiates the other inputs.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import onnx_ir as ir

from onnax.errors import SelectionError

STOP_MARK = "onnax.stop_gradient"
"""Node metadata key of the ``Identity`` that holds a stopped value's name (:func:`insert_stops`)."""

__all__ = ["STOP_MARK", "StopGradient", "insert_stops", "resolve_stops", "without_stopped"]

StopGradient = str | Sequence[str] | None
"""The user's ``stop_gradient`` argument: one name, names, or None (nothing stopped)."""

_LISTED = 40
"""How many names an unknown-name refusal lists (models have thousands of values)."""


def _names(stop_gradient: StopGradient, transform: str) -> list[str]:
    if stop_gradient is None:
        return []
    if not isinstance(stop_gradient, (str, Sequence, set, frozenset)):
        raise SelectionError(
            f"{transform}: stop_gradient must be a name or a list of names, got "
            f"{type(stop_gradient).__name__}; pass e.g. stop_gradient=['target_q']"
        )
    if isinstance(stop_gradient, str):
        names = [stop_gradient]
    elif isinstance(stop_gradient, (set, frozenset)):
        # Sorted: a set's order changes between runs, and the output bytes must not.
        names = sorted(stop_gradient, key=str)
    else:
        names = list(stop_gradient)
    for n in names:
        if not isinstance(n, str):
            raise SelectionError(
                f"{transform}: stop_gradient must be value names (str), got "
                f"{type(n).__name__} {n!r}; name the values of the main graph to stop"
            )
    # A repeated name is harmless (stopping twice is stopping once); keep the first.
    return list(dict.fromkeys(names))


def _top_level_values(graph: ir.Graph) -> dict[str, ir.Value]:
    values: dict[str, ir.Value] = {}
    for v in (*graph.inputs, *graph.initializers.values()):
        if v.name:
            values.setdefault(v.name, v)
    for node in graph:
        for v in node.outputs:
            if v.name:
                values.setdefault(v.name, v)
    return values


def _subgraph_names(model: ir.Model) -> set[str]:
    names: set[str] = set()
    for g in model.graphs():
        if g is model.graph:
            continue
        names.update(v.name for v in (*g.inputs, *g.initializers.values()) if v.name)
        names.update(v.name for n in g for v in n.outputs if v.name)
    return names


def _unknown(name: str, available: Sequence[str], in_subgraph: bool, transform: str) -> str:
    if in_subgraph:
        return (
            f"{transform}: stop_gradient names {name!r}, a value inside a subgraph (an If, Loop "
            "or Scan body); expected a value of the main graph. Stop the main-graph value the "
            "body reads or the control-flow node's output that carries it instead."
        )
    close = difflib.get_close_matches(name, available, n=3)
    hint = f" Did you mean {close}?" if close else ""
    listed = list(available[:_LISTED])
    more = f" ... and {len(available) - _LISTED} more" if len(available) > _LISTED else ""
    return (
        f"{transform}: stop_gradient names {name!r}, which is no value of the main graph.{hint} "
        f"Main-graph values (inputs, initializers, node outputs): {listed}{more}. "
        "Pass one of those names."
    )


def resolve_stops(model: ir.Model, stop_gradient: StopGradient, transform: str) -> list[ir.Value]:
    """The main-graph values named by ``stop_gradient``, in the given order.

    Raises:
        SelectionError: A name is not a string, or names no value of the main graph (the message
            lists close matches and the graph's names, or says that the name is a subgraph's).
    """
    names = _names(stop_gradient, transform)
    if not names:
        return []
    values = _top_level_values(model.graph)
    stopped = []
    for name in names:
        value = values.get(name)
        if value is None:
            raise SelectionError(
                _unknown(name, list(values), name in _subgraph_names(model), transform)
            )
        stopped.append(value)
    return stopped


def without_stopped(
    xs: list[ir.Value],
    stopped: Sequence[ir.Value],
    explicit: bool,
    transform: str,
) -> list[ir.Value]:
    """The selected inputs, checked against the stopped values.

    Args:
        xs: The resolved input selection.
        stopped: The resolved stopped values.
        explicit: Whether the caller named the inputs (else ``xs`` is the default selection,
            from which stopped values are dropped).
        transform: The user-facing transform name.

    Raises:
        SelectionError: An explicitly selected input is also stopped.
    """
    stopped_set = set(stopped)
    if not explicit:
        return [x for x in xs if x not in stopped_set]
    for x in xs:
        if x in stopped_set:
            raise SelectionError(
                f"{transform}: {x.name!r} is both a selected input and in stop_gradient: its "
                "derivative would be zero by definition. Remove it from `inputs` (to hold it "
                "constant) or from `stop_gradient` (to differentiate with respect to it)."
            )
    return xs


def insert_stops(graph: ir.Graph, stopped: Sequence[ir.Value]) -> set[ir.Value]:
    """Cuts the derivative path at each stopped value; returns the values to give no tangent.

    The consumers of a stopped node output ``s`` read it through a new ``Identity`` whose output
    the walk leaves without a tangent, for two reasons. Expansion may replace the node producing
    ``s`` (and with it the value) before the walk; ``Identity`` is never expanded. And the
    Identity takes over the name of ``s`` (``s`` gets a fresh one), so the derivative model still
    holds a value of that name read by exactly the consumers of ``s`` (and by the derivative
    nodes that need its primal value): a transform of the result can stop it again, even where
    common-subexpression elimination has merged ``s`` with an equal value that was not stopped.
    A stopped graph output keeps its name and stays in the set, so its own derivative is zero.
    """
    cut: set[ir.Value] = set()
    for s in stopped:
        cut.add(s)
        node = s.producer()
        if node is None or node.graph is not graph or not s.uses():
            continue  # a graph input or initializer: the set alone decides
        uses = list(s.uses())  # before the Identity becomes one
        held = ir.Value(name=None, type=s.type, shape=s.shape.copy() if s.shape else None)
        identity = ir.Node("", "Identity", [s], outputs=[held])
        # The mark keeps simplification from removing the Identity, and the name with it.
        identity.metadata_props[STOP_MARK] = str(s.name)
        for use in uses:
            use.node.replace_input_with(use.idx, held)
        graph.insert_after(node, identity)
        if not s.is_graph_output():
            # A fresh name rather than none: expansion names its replacement after it.
            name = str(s.name)
            s.name = _fresh(graph, f"{name}_unstopped")
            held.name = name
        cut.add(held)
    return cut


def _fresh(graph: ir.Graph, base: str) -> str:
    taken = {
        v.name for g in (graph, *graph.subgraphs()) for v in (*g.inputs, *g.initializers.values())
    }
    taken.update(o.name for n in graph.all_nodes() for o in n.outputs)
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    return name
