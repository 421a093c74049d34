"""Which initializers are trained, and lifting them to graph inputs."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

import onnx_ir as ir

from onnax.core.selection import is_float
from onnax.errors import SelectionError
from onnax.passes.clone import clone_model

__all__ = ["lift_params", "running_statistics", "select_params"]


def _as_names(value: str | Sequence[str] | None, what: str, arg: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise SelectionError(
                f"{what}: `{arg}` holds {type(name).__name__} {name!r}, expected names or fnmatch "
                "patterns (str)."
            )
    return names


def _matches(pattern: str, names: Sequence[str]) -> list[str]:
    return [n for n in names if n == pattern or fnmatchcase(n, pattern)]


def running_statistics(graph: ir.Graph) -> set[str]:
    """Initializers that inference BatchNormalizations read as running mean and variance.

    PyTorch keeps these as buffers, not parameters: an optimizer never updates them.
    """
    stats: set[str] = set()
    for node in graph.all_nodes():
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        mode = node.attributes.get("training_mode")
        if mode is not None and mode.as_int():
            continue
        stats.update(v.name for v in node.inputs[3:5] if v is not None and v.name)
    return stats


def select_params(
    graph: ir.Graph,
    params: str | Sequence[str] | None,
    frozen: str | Sequence[str],
    what: str,
) -> list[str]:
    """The names of the trained initializers, in initializer order.

    Args:
        graph: The main graph.
        params: Names or fnmatch patterns of initializers to train; None: every float one
            except BatchNormalization running statistics (:func:`running_statistics`).
        frozen: Names or fnmatch patterns of initializers to keep constant.
        what: The caller, for messages.

    Raises:
        SelectionError: A name or pattern that matches nothing (listing the float initializers),
            or a selected initializer that is not floating point.
    """
    inits = [name for name in graph.initializers if name]
    floats = [name for name in inits if is_float(graph.initializers[name])]
    wanted = _as_names(params, what, "params")
    if wanted is None:
        stats = running_statistics(graph)
        chosen = [name for name in floats if name not in stats]
    else:
        picked: set[str] = set()
        for pattern in wanted:
            hits = _matches(pattern, inits)
            if not hits:
                raise SelectionError(
                    f"{what}: params entry {pattern!r} matches no initializer. Float "
                    f"initializers: {floats}. Remedy: pass one of these names or a pattern "
                    "that matches some (fnmatch syntax: 'fc.*')."
                )
            for name in hits:
                value = graph.initializers[name]
                if not is_float(value):
                    dtype = value.dtype.name if value.dtype else str(value.type)
                    raise SelectionError(
                        f"{what}: parameter {name!r} is {dtype}, expected FLOAT16, BFLOAT16, "
                        "FLOAT or DOUBLE: only floating-point tensors have gradients. Remedy: "
                        f"leave {name!r} out of `params` (it stays a constant)."
                    )
            picked.update(hits)
        chosen = [name for name in inits if name in picked]
    for pattern in _as_names(frozen, what, "frozen") or []:
        if not _matches(pattern, floats):
            raise SelectionError(
                f"{what}: frozen entry {pattern!r} matches no float initializer, so it freezes "
                f"nothing. Float initializers: {floats}. Remedy: correct the name or pattern "
                "(fnmatch syntax: 'encoder.*'), or drop it."
            )
        chosen = [name for name in chosen if name not in _matches(pattern, chosen)]
    if not chosen:
        raise SelectionError(
            f"{what}: no parameter left to train (float initializers: {floats}). Remedy: "
            "select some with `params=` or freeze fewer with `frozen=`."
        )
    return chosen


def lift_params(
    model: ir.Model, names: Sequence[str]
) -> tuple[ir.Model, dict[str, ir.TensorProtocol]]:
    """A copy of ``model`` whose initializers ``names`` are graph inputs without a value.

    Returns:
        The copy (the lifted inputs follow the original inputs, in ``names`` order) and the
        initial value of each lifted parameter.
    """
    lifted = clone_model(model)
    graph = lifted.graph
    initial: dict[str, ir.TensorProtocol] = {}
    for name in names:
        value = graph.initializers.pop(name)
        if value.const_value is None:
            raise SelectionError(f"parameter {name!r} has no stored value to start from.")
        initial[name] = value.const_value
        value.const_value = None
        if value not in graph.inputs:
            graph.inputs.append(value)
    return lifted, initial
