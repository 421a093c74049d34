"""Resolving the user's selections of inputs and outputs to graph values."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.errors import SelectionError

__all__ = [
    "FLOAT_NAMES",
    "FLOAT_TYPES",
    "HALF_TYPES",
    "default_inputs",
    "format_shape",
    "is_float",
    "select_inputs",
    "select_outputs",
]

# The element types onnax differentiates and batches. The half types compute their derivatives
# in their own precision unless a transform is asked to accumulate in FLOAT (passes/accumulate.py).
HALF_TYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE}) | HALF_TYPES
FLOAT_NAMES = "FLOAT16, BFLOAT16, FLOAT or DOUBLE"


def is_float(value: ir.Value) -> bool:
    """True for a FLOAT16, BFLOAT16, FLOAT or DOUBLE tensor value."""
    return isinstance(value.type, ir.TensorType) and value.dtype in FLOAT_TYPES


def _kind(value: ir.Value) -> str:
    """What the value holds, as the refusal messages state it."""
    vtype = value.type
    if isinstance(vtype, ir.SequenceType):
        return f"a sequence ({vtype})"
    if isinstance(vtype, ir.OptionalType):
        return f"an optional ({vtype})"
    if isinstance(vtype, ir.SparseTensorType):
        return f"a sparse tensor ({vtype})"
    return value.dtype.name if value.dtype is not None else str(vtype)


def _refusal(value: ir.Value, what: str, transform: str) -> str:
    """Why ``value`` cannot be selected, and what to do instead."""
    vtype = value.type
    if isinstance(vtype, (ir.SequenceType, ir.OptionalType)):
        kind = "sequence" if isinstance(vtype, ir.SequenceType) else "optional"
        holder = "inside a sequence" if kind == "sequence" else "inside an optional"
        remedy = (
            "Leave it out of `inputs`; it is treated as a constant. To differentiate the tensors "
            f"{holder}, pass them as tensor inputs and build the {kind} in the model"
            if what == "input"
            else f"Select a tensor output; to differentiate the tensors {holder}, output them as "
            "tensors as well"
        )
        return (
            f"{transform}: {what} {value.name!r} is {_kind(value)}, expected a tensor of "
            f"{FLOAT_NAMES}: onnax differentiates tensors only. {remedy}"
        )
    remedy = (
        "Leave it out of `inputs`; it is treated as a constant"
        if what == "input"
        else "Select a floating-point output"
    )
    found = "has no derivative" if what == "output" else "cannot be differentiated"
    return (
        f"{transform}: {what} {_describe(value)} {found}: found {_kind(value)}, expected "
        f"{FLOAT_NAMES}. {remedy}"
    )


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
    """Floating-point graph inputs that are not initializers (IR < 4 lists weights as inputs)."""
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
                f"Selectable floating-point names: {selectable}"
            )
        if not is_float(value):
            raise SelectionError(_refusal(value, "input", transform))
        chosen.append(value)
    return chosen


def select_outputs(
    graph: ir.Graph, names: str | Sequence[str] | None, transform: str
) -> list[ir.Value]:
    """Resolves an output selection (default: every floating-point graph output).

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
            raise SelectionError(_refusal(value, "output", transform))
        chosen.append(value)
    return chosen
