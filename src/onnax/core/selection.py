"""Resolving the user's selections of inputs and outputs to graph values."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.errors import SelectionError

__all__ = [
    "FLOAT_TYPES",
    "default_inputs",
    "format_shape",
    "is_float",
    "select_inputs",
    "select_outputs",
]

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def is_float(value: ir.Value) -> bool:
    """True for a FLOAT or DOUBLE tensor value."""
    return isinstance(value.type, ir.TensorType) and value.dtype in FLOAT_TYPES


def _as_list(names: str | Sequence[str] | None, what: str, transform: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        return [names]
    names = list(names)
    for n in names:
        if not isinstance(n, str):
            raise SelectionError(
                f"{transform}: {what} must be graph names (str), got {type(n).__name__} {n!r}; "
                "select by name, not by position"
            )
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise SelectionError(f"{transform}: {what} names {n!r} twice; give each name once")
        seen.add(n)
    return names


def default_inputs(graph: ir.Graph) -> list[ir.Value]:
    """FLOAT and DOUBLE graph inputs that are not initializers (IR < 4 lists weights as inputs)."""
    return [v for v in graph.inputs if is_float(v) and v.name not in graph.initializers]


def format_shape(shape: ir.Shape | None) -> str:
    """``[N, 3]`` for a shape, ``unknown`` when there is none."""
    if shape is None:
        return "unknown"
    return "[" + ", ".join(str(d) for d in shape.dims) + "]"


def _describe(value: ir.Value) -> str:
    dtype = value.dtype.name if value.dtype is not None else str(value.type)
    return f"{value.name!r} ({dtype}, shape {format_shape(value.shape)})"


def select_inputs(
    graph: ir.Graph, names: str | Sequence[str] | None, transform: str
) -> list[ir.Value]:
    """Resolves an input selection: graph inputs or initializers, by name, in the given order.

    Raises:
        SelectionError: For an unknown name (listing what can be selected) or a non-float value.
    """
    wanted = _as_list(names, "inputs", transform)
    if wanted is None:
        return default_inputs(graph)
    available: dict[str, ir.Value] = {v.name: v for v in graph.initializers.values() if v.name}
    available.update({v.name: v for v in graph.inputs if v.name})
    chosen = []
    for name in wanted:
        value = available.get(name)
        if value is None:
            selectable = [n for n, v in available.items() if is_float(v)]
            raise SelectionError(
                f"{transform}: no graph input or initializer named {name!r}. "
                f"Selectable FLOAT/DOUBLE names: {selectable}"
            )
        if not is_float(value):
            raise SelectionError(
                f"{transform}: input {_describe(value)} cannot be differentiated: found "
                f"{value.dtype.name if value.dtype is not None else value.type}, expected FLOAT or "
                "DOUBLE. Leave it out of `inputs`; it is treated as a constant"
            )
        chosen.append(value)
    return chosen


def select_outputs(
    graph: ir.Graph, names: str | Sequence[str] | None, transform: str
) -> list[ir.Value]:
    """Resolves an output selection (default: every FLOAT/DOUBLE graph output).

    Raises:
        SelectionError: For an unknown name (listing the outputs) or a non-float output.
    """
    wanted = _as_list(names, "outputs", transform)
    if wanted is None:
        return [v for v in graph.outputs if is_float(v)]
    by_name = {v.name: v for v in graph.outputs}
    chosen = []
    for name in wanted:
        value = by_name.get(name)
        if value is None:
            raise SelectionError(
                f"{transform}: no graph output named {name!r}. Graph outputs: {list(by_name)}"
            )
        if not is_float(value):
            raise SelectionError(
                f"{transform}: output {_describe(value)} has no derivative: found "
                f"{value.dtype.name if value.dtype is not None else value.type}, expected FLOAT or "
                "DOUBLE. Select a floating-point output"
            )
        chosen.append(value)
    return chosen
