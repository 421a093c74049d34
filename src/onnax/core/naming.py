"""Public names of generated inputs and outputs.

Generated graph inputs and outputs are named ``<prefix>_<name>`` after the primal value they
belong to: ``fwd_x`` is the tangent of ``x``, ``adj_y`` the cotangent of ``y``, ``grad_w`` the
gradient with respect to ``w``. When a model already carries names with that prefix, the next
index is used (``fwd2_``, ``fwd3_``, ...), following CasADi's ``diff_prefix`` rule, so that
repeated transforms (``jvp(jvp(m))``) get distinct names without any arguments and stay
compatible with CasADi's ONNX backend. An internal value that happens to hold a generated name is
renamed; public names always win.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx_ir as ir

from onnax.core.traverse import model_graphs

__all__ = ["DERIVATIVE_PREFIXES", "NameClaims", "derivative_outputs", "diff_prefix"]


def diff_prefix(names: Iterable[str], prefix: str) -> str:
    """The prefix for a new derivative level, as CasADi's ``FunctionInternal::diff_prefix``.

    Args:
        names: The input and output names of the model.
        prefix: The kind of derivative: ``"fwd"``, ``"adj"`` or ``"grad"``.

    Returns:
        ``prefix + "_"`` when no name uses the prefix yet, otherwise ``prefix + str(k + 1) + "_"``
        where ``k`` is the highest level present (a bare ``prefix_`` counts as level 1).
    """
    highest = 0
    for name in names:
        end = name.find("_")
        if end < len(prefix) or not name.startswith(prefix):
            continue
        digits = name[len(prefix) : end]
        if digits == "":
            level = 1
        elif digits.isdigit():
            level = int(digits)
        else:
            continue
        highest = max(highest, level)
    return f"{prefix}_" if highest == 0 else f"{prefix}{highest + 1}_"


DERIVATIVE_PREFIXES = ("fwd", "adj", "grad")
"""The kinds of generated outputs a later transform can tell from the primal ones."""


def derivative_outputs(graph: ir.Graph) -> list[ir.Value]:
    """The graph outputs that an earlier transform generated, in graph order.

    An output is generated when its name is ``<kind><level>_<name>`` (``grad_w``, ``fwd_y``,
    ``adj2_x``) for a kind of :data:`DERIVATIVE_PREFIXES` and the name of a graph input,
    initializer or other output: a user's output named ``grad_norm`` with nothing called
    ``norm`` is primal.
    """
    names = {v.name for v in (*graph.inputs, *graph.outputs) if v.name}
    names.update(graph.initializers)
    found = []
    for v in graph.outputs:
        head, sep, rest = (v.name or "").partition("_")
        if not sep or rest not in names or rest == v.name:
            continue
        kind = head.rstrip("0123456789")
        level = head[len(kind) :]
        if kind in DERIVATIVE_PREFIXES and level != "1" and not level.startswith("0"):
            found.append(v)
    return found


def io_names(graph: ir.Graph) -> list[str]:
    """Names of the graph's inputs and outputs."""
    return [v.name for v in (*graph.inputs, *graph.outputs) if v.name]


class NameClaims:
    """Gives generated inputs and outputs their public names, renaming internal values in the way.

    Args:
        model: The model whose names must stay unique (subgraphs included).
    """

    def __init__(self, model: ir.Model) -> None:
        self._owner: dict[str, ir.Value] = {}
        for graph in model_graphs(model):
            for v in (*graph.inputs, *graph.initializers.values()):
                if v.name:
                    self._owner.setdefault(v.name, v)
            for node in graph:
                for v in node.outputs:
                    if v.name:
                        self._owner.setdefault(v.name, v)
        self._public: set[str] = {
            v.name for v in (*model.graph.inputs, *model.graph.outputs) if v.name
        }

    def _fresh(self, base: str) -> str:
        k = 1
        while f"{base}_{k}" in self._owner:
            k += 1
        return f"{base}_{k}"

    def is_public(self, name: str) -> bool:
        """Whether ``name`` is a graph input or output name, generated ones included."""
        return name in self._public

    def claim(self, value: ir.Value, name: str) -> None:
        """Names ``value`` ``name``, moving an internal value that holds it out of the way.

        Raises:
            ValueError: If ``name`` is already a public input or output name; the prefix rule
                makes that impossible, so it indicates a bug.
        """
        holder = self._owner.get(name)
        if holder is not None and holder is not value:
            if name in self._public:
                raise ValueError(f"generated name {name!r} collides with a graph input or output")
            new = self._fresh(name)
            holder.name = new
            self._owner[new] = holder
        value.name = name
        self._owner[name] = value
        self._public.add(name)
