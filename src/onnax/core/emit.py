"""The node builder every rule writes through.

An :class:`Emitter` collects the nodes a rule creates, knows the opset it builds for, caches
constants, and tracks which values are *linear* (tangents and everything computed from them). The
passes decide where the collected nodes go: a forward-mode pass puts every node into the graph, a
reverse-mode pass keeps the linear nodes apart so that it can transpose them.

Opset-dependent spellings (``ReduceSum`` with an ``axes`` attribute before 13 and an input after,
``Squeeze``/``Unsqueeze`` likewise, the other reductions at 18) live here, so that rules never
branch on the opset for the operators they emit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_ir.convenience import convert_attribute

from onnax.core.fast_ir import new_node
from onnax.core.static import array_tensor

__all__ = ["Emitter", "InternalRuleError"]


class InternalRuleError(RuntimeError):
    """A rule broke an invariant of the emitter: a bug in onnax, not in the user's model."""


_AttrValue = Any

_SCALAR_TYPES: dict[type, ir.AttributeType] = {
    int: ir.AttributeType.INT,
    float: ir.AttributeType.FLOAT,
    str: ir.AttributeType.STRING,
}
_LIST_TYPES: dict[type, ir.AttributeType] = {
    int: ir.AttributeType.INTS,
    float: ir.AttributeType.FLOATS,
    str: ir.AttributeType.STRINGS,
}


def _attr(name: str, value: _AttrValue) -> ir.Attr:
    """``convert_attribute(name, value)``, without its protocol checks on the common types.

    ``ir.node`` infers attribute types with ``isinstance`` checks against runtime protocols,
    which dominated the cost of emitting nodes on big models. The exact types rules pass (int,
    float, str, non-empty lists/tuples of one of them, ``ir.Tensor``, ``ir.Graph``) are
    classified here by ``type(...) is``; anything else (bools, numpy scalars, empty or mixed
    lists, ``ir.Attr``...) goes to ``convert_attribute``, so the result is always the same.
    """
    kind = type(value)
    scalar = _SCALAR_TYPES.get(kind)
    if scalar is not None:
        return ir.Attr(name, scalar, value)
    if (kind is list or kind is tuple) and value:
        first = type(value[0])
        listed = _LIST_TYPES.get(first)
        if listed is not None and all(type(x) is first for x in value):
            return ir.Attr(name, listed, value)
    elif kind is ir.Tensor:
        return ir.Attr(name, ir.AttributeType.TENSOR, value)
    elif kind is ir.Graph:
        return ir.Attr(name, ir.AttributeType.GRAPH, value)
    return convert_attribute(name, value)


class Emitter:
    """Builds nodes for one graph at one opset.

    Args:
        opset: The default-domain opset the emitted nodes must be valid for.
        linear: The set of linear values, shared with the pass; outputs of a node with a linear
            input are added to it.
        shape_witness: Given a linear value, emits (through this emitter) and returns its run-time
            shape computed from non-linear values, or returns None when it cannot.
    """

    def __init__(
        self,
        opset: int,
        linear: set[ir.Value] | None = None,
        shape_witness: Callable[[ir.Value], ir.Value | None] | None = None,
    ) -> None:
        self.opset = opset
        self.linear: set[ir.Value] = linear if linear is not None else set()
        self.shape_witness = shape_witness
        self.nodes: list[ir.Node] = []
        self._constants: dict[tuple[object, ...], ir.Value] = {}

    # ----------------------------------------------------------------- node creation
    def take(self) -> list[ir.Node]:
        """Returns the nodes emitted since the last call and forgets them."""
        nodes, self.nodes = self.nodes, []
        return nodes

    def op_multi(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, _AttrValue] | None = None,
        *,
        num_outputs: int = 1,
        domain: str = "",
    ) -> tuple[ir.Value, ...]:
        """Emits one node and returns all of its outputs."""
        attrs = [_attr(k, v) for k, v in (attributes or {}).items() if v is not None]
        # The constructor's node, built without its checks (the arguments are made here).
        node = new_node(domain, op_type, inputs, attrs, num_outputs)
        linear = self.linear
        for v in inputs:  # a loop: no generator per emitted node
            if v is not None and v in linear:
                linear.update(node.outputs)
                break
        self.nodes.append(node)
        return tuple(node.outputs)

    def op(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Mapping[str, _AttrValue] | None = None,
        *,
        domain: str = "",
    ) -> ir.Value:
        """Emits one single-output node and returns its output."""
        return self.op_multi(op_type, inputs, attributes, domain=domain)[0]

    # ------------------------------------------------------------------- constants
    def const(self, array: np.ndarray | ir.TensorProtocol) -> ir.Value:
        """A Constant holding ``array`` (cached: equal constants are emitted once)."""
        # The key comes from numpy: building an ir.Tensor first is slow and almost always a
        # cache hit (scalars like 0 and 1 are asked for thousands of times in a big graph).
        data = array if isinstance(array, np.ndarray) else array.numpy()
        key = (str(data.dtype), data.shape, data.tobytes())
        cached = self._constants.get(key)
        if cached is not None:
            return cached
        tensor = array_tensor(data)
        value = self.op("Constant", [], {"value": tensor})
        # With const_value set, readers (shape inference, get_const_tensor) take the tensor
        # directly instead of checking the attribute against TensorProtocol, a slow runtime
        # protocol check, for each of the thousands of Unsqueeze/Reshape/Slice constants.
        value.const_value = tensor
        value.dtype = ir.DataType.from_numpy(data.dtype)
        value.shape = ir.Shape(list(data.shape))
        self._constants[key] = value
        return value

    def scalar(self, number: float, like: ir.Value | ir.DataType) -> ir.Value:
        """A rank-0 constant with the element type of ``like`` (a value or a data type)."""
        dtype = like if isinstance(like, ir.DataType) else like.dtype
        if dtype is None:
            raise InternalRuleError(f"scalar(): value {like!r} has no dtype")
        return self.const(np.array(number, dtype=dtype.numpy()))

    def ints(self, values: Sequence[int]) -> ir.Value:
        """A 1-D int64 constant."""
        return self.const(np.array(list(values), dtype=np.int64))

    # ----------------------------------------------------------------------- shapes
    def shape(self, value: ir.Value) -> ir.Value:
        """The run-time shape of ``value`` (a static constant when the shape is known).

        A linear value is never read directly: the reverse sweep does not compute it. Its shape
        comes from a non-linear value of the same shape (the shape witness).
        """
        shape = value.shape
        if shape is not None and shape.is_static():
            return self.ints(list(shape.numpy()))
        if value in self.linear:
            shape_tensor = self.shape_witness(value) if self.shape_witness else None
            if shape_tensor is None:
                raise InternalRuleError(f"no shape witness for linear value {value.name!r}")
            return shape_tensor
        return self.op("Shape", [value])

    def zeros_like(self, value: ir.Value) -> ir.Value:
        """A tensor of zeros with the shape and element type of ``value``.

        Spelled ``Expand(0, shape)`` rather than ``ConstantOfShape``: symbolic shape inference
        gives the former a shape even when a dimension is symbolic, and later rules need it.
        """
        if value.dtype is None:
            raise InternalRuleError(f"zeros_like(): value {value.name!r} has no dtype")
        zero = self.scalar(0.0, value)
        if value.shape is not None and value.shape.rank() == 0:
            return zero
        return self.op("Expand", [zero, self.shape(value)])

    # ------------------------------------------------------ opset-aware spellings
    def reduce(
        self,
        op_type: str,
        x: ir.Value,
        axes: Sequence[int] | ir.Value | None,
        *,
        keepdims: bool,
    ) -> ir.Value:
        """A reduction over ``axes`` (None: all axes), spelled for this opset."""
        moved_at = 13 if op_type == "ReduceSum" else 18
        attrs: dict[str, _AttrValue] = {"keepdims": int(keepdims)}
        if axes is not None and not isinstance(axes, ir.Value) and len(axes) == 0:
            return x
        if self.opset >= moved_at:
            axes_input = (
                None if axes is None else (axes if isinstance(axes, ir.Value) else self.ints(axes))
            )
            return self.op(op_type, [x] if axes_input is None else [x, axes_input], attrs)
        if isinstance(axes, ir.Value):
            raise InternalRuleError(f"{op_type} with run-time axes needs opset >= {moved_at}")
        if axes is not None:
            attrs["axes"] = list(axes)
        return self.op(op_type, [x], attrs)

    def reduce_sum(
        self, x: ir.Value, axes: Sequence[int] | ir.Value | None, *, keepdims: bool
    ) -> ir.Value:
        """``ReduceSum`` over ``axes`` (None: all axes)."""
        return self.reduce("ReduceSum", x, axes, keepdims=keepdims)

    def unsqueeze(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        """``Unsqueeze`` with ``axes``, spelled for this opset."""
        if not axes:
            return x
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)])
        return self.op("Unsqueeze", [x], {"axes": list(axes)})

    def squeeze(self, x: ir.Value, axes: Sequence[int]) -> ir.Value:
        """``Squeeze`` with ``axes``, spelled for this opset."""
        if not axes:
            return x
        if self.opset >= 13:
            return self.op("Squeeze", [x, self.ints(axes)])
        return self.op("Squeeze", [x], {"axes": list(axes)})

    def slice(
        self,
        x: ir.Value,
        starts: Sequence[int] | ir.Value,
        ends: Sequence[int] | ir.Value,
        axes: Sequence[int] | ir.Value,
        steps: Sequence[int] | ir.Value | None = None,
    ) -> ir.Value:
        """``Slice`` with inputs (opset >= 10)."""

        def as_value(v: Sequence[int] | ir.Value) -> ir.Value:
            return v if isinstance(v, ir.Value) else self.ints(v)

        inputs = [x, as_value(starts), as_value(ends), as_value(axes)]
        if steps is not None:
            inputs.append(as_value(steps))
        return self.op("Slice", inputs)

    def transpose(self, x: ir.Value, perm: Sequence[int]) -> ir.Value:
        """``Transpose`` by ``perm``; the identity permutation emits nothing."""
        if list(perm) == list(range(len(perm))):
            return x
        return self.op("Transpose", [x], {"perm": list(perm)})

    def add_all(self, terms: Sequence[ir.Value | None]) -> ir.Value | None:
        """The sum of the non-None ``terms``; None when all are None (a symbolic zero)."""
        present = [t for t in terms if t is not None]
        if not present:
            return None
        total = present[0]
        for t in present[1:]:
            total = self.op("Add", [total, t])
        return total
