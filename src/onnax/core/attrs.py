"""Reading operator parameters that moved from attributes to inputs between opsets."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

__all__ = ["const_ints", "float_attr", "int_attr", "ints_attr", "ints_param"]


def const_ints(value: ir.Value | None) -> list[int] | None:
    """The integer contents of a constant value (initializer or Constant node), or None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    return [int(v) for v in tensor.numpy().reshape(-1)]


def int_attr(node: ir.Node, name: str, default: int) -> int:
    """An INT attribute or its default."""
    return node.attributes.get_int(name, default)


def float_attr(node: ir.Node, name: str, default: float) -> float:
    """A FLOAT attribute or its default."""
    return node.attributes.get_float(name, default)


def ints_attr(node: ir.Node, name: str, default: Sequence[int] | None = None) -> list[int] | None:
    """An INTS attribute or its default."""
    got = node.attributes.get_ints(name, None)
    if got is None:
        return None if default is None else list(default)
    return list(got)


def ints_param(node: ir.Node, name: str, input_index: int) -> list[int] | ir.Value | None:
    """A list-of-ints parameter given either as attribute ``name`` or as input ``input_index``.

    Returns the list when it is static, the input Value when it is only known at run time, and
    None when the parameter is absent.
    """
    from_attr = ints_attr(node, name)
    if from_attr is not None:
        return from_attr
    if input_index < len(node.inputs):
        value = node.inputs[input_index]
        if value is None:
            return None
        static = const_ints(value)
        return static if static is not None else value
    return None
