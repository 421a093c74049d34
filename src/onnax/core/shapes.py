"""Broadcasting helpers and the shape oracle of the reverse sweep.

``unbroadcast`` sums a cotangent shaped like a broadcast result back to an operand's shape. It
decides statically where the shapes allow it and falls back to axes computed at run time only
for the dimensions that are symbolic, so a dynamic batch dimension survives into the derivative
model.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter, InternalRuleError

__all__ = ["ShapeOracle", "broadcast_to", "dims_key", "expand_input", "same_shape", "unbroadcast"]


def dims_key(shape: ir.Shape | None) -> tuple[object, ...] | None:
    """A hashable key of a shape whose dimensions are all known (ints or named symbols)."""
    if shape is None:
        return None
    key: list[object] = []
    for d in shape.dims:
        if isinstance(d, int):
            key.append(d)
        elif d.value is None:
            return None
        else:
            key.append(str(d.value))
    return tuple(key)


def same_shape(a: ir.Value, b: ir.Value) -> bool:
    """True when both shapes are known and provably equal."""
    ka, kb = dims_key(a.shape), dims_key(b.shape)
    return ka is not None and ka == kb


def expand_input(ct: ir.Value) -> ir.Value | None:
    """The input ``r`` of a cotangent computed as ``Expand(r, shape)``, else None.

    A reduction's transpose (the row sums of LayerNorm, Softmax and ReduceMean backward) hands
    back ``Expand(r, shape)``, a full-size pass over memory. Where the cotangent meets a
    full-size operand that broadcasts ``r`` anyway (a product, or the sum with another
    cotangent), ``r`` can take its place and the Expand is left for dead-code removal.
    """
    producer = ct.producer()
    if producer is None or producer.op_type != "Expand" or producer.domain != "":
        return None
    return producer.inputs[0]


def _require_shape(value: ir.Value, what: str) -> ir.Shape:
    if value.shape is None:
        raise InternalRuleError(f"{what}: the shape of {value.name!r} is unknown")
    return value.shape


def broadcast_to(em: Emitter, t: ir.Value, operand: ir.Value, result: ir.Value) -> ir.Value:
    """Expands tangent ``t`` of ``operand`` to the shape of the broadcast ``result``."""
    if same_shape(operand, result):
        return t
    return em.op("Expand", [t, em.shape(result)])


def unbroadcast(em: Emitter, ct: ir.Value, operand: ir.Value, result: ir.Value) -> ir.Value:
    """Sums cotangent ``ct`` (shaped like ``result``) back to the shape of ``operand``."""
    if same_shape(operand, result):
        return ct
    if operand.shape is None or result.shape is None:
        return _unbroadcast_at_run_time(em, ct, operand)
    target = operand.shape
    full = result.shape
    lead = full.rank() - target.rank()
    if lead < 0:
        raise InternalRuleError(f"unbroadcast: {operand.name!r} has a higher rank than the result")
    static_axes: list[int] = []
    dynamic_axes: list[int] = []
    for i, dt in enumerate(target.dims):
        dr = full.dims[lead + i]
        if isinstance(dt, int):
            if dt == 1 and dr != 1:
                static_axes.append(lead + i)
        elif not (isinstance(dr, ir.SymbolicDim) and dr.value is not None and dr == dt):
            dynamic_axes.append(i)
    out = ct
    if static_axes:
        out = em.reduce_sum(out, static_axes, keepdims=True)
    if dynamic_axes and em.opset < 13:
        out = _unbroadcast_axes_one_by_one(em, out, operand, lead, dynamic_axes)
    elif dynamic_axes:
        # A symbolic operand dimension may be 1 at run time; summing over every axis where the
        # operand is 1 is exact, because summing an axis that is already 1 changes nothing.
        operand_shape = em.shape(operand)
        if lead:
            operand_shape = em.op("Concat", [em.ints([1] * lead), operand_shape], {"axis": 0})
        is_one = em.op("Equal", [operand_shape, em.ints([1])])
        axes = em.op("Reshape", [em.op("NonZero", [is_one]), em.ints([-1])])
        out = em.op("ReduceSum", [out, axes], {"keepdims": 1, "noop_with_empty_axes": 1})
    if lead:
        out = em.reduce_sum(out, list(range(lead)), keepdims=False)
    return out


def _unbroadcast_at_run_time(em: Emitter, ct: ir.Value, operand: ir.Value) -> ir.Value:
    """Unbroadcasts when inference lost a shape: every axis is decided in the graph.

    The operand's shape is padded with leading 1s to the cotangent's rank; the leading axes and
    the axes where the padded shape is 1 are summed, and the result is reshaped to the operand.
    """
    if em.opset < 13:
        raise InternalRuleError("unbroadcast of values of unknown shape needs opset 13")
    int64 = ir.DataType.INT64
    ct_shape = em.op("Shape", [ct])
    operand_shape = em.shape(operand)
    rank = em.op("Shape", [ct_shape])
    lead = em.op("Sub", [rank, em.op("Shape", [operand_shape])])
    ones = em.op("ConstantOfShape", [lead], {"value": ir.tensor(np.ones(1, dtype=np.int64))})
    padded = em.op("Concat", [ones, operand_shape], {"axis": 0})
    index = em.op("Range", [em.scalar(0, int64), em.squeeze(rank, [0]), em.scalar(1, int64)])
    summed = em.op("Or", [em.op("Less", [index, lead]), em.op("Equal", [padded, em.ints([1])])])
    axes = em.op("Reshape", [em.op("NonZero", [summed]), em.ints([-1])])
    out = em.op("ReduceSum", [ct, axes], {"keepdims": 1, "noop_with_empty_axes": 1})
    return em.op("Reshape", [out, operand_shape])


def _unbroadcast_axes_one_by_one(
    em: Emitter, ct: ir.Value, operand: ir.Value, lead: int, axes: list[int]
) -> ir.Value:
    """Unbroadcasts run-time axes one at a time (opsets before 13 lack run-time ReduceSum axes).

    For each axis whose size is only known at run time, sum it (static axis, keepdims), choose the sum where the operand's size is
    1, and cut the axis to the operand's size: one element of the broadcast sum, or all of ``ct``.
    """
    operand_shape = em.shape(operand)
    out = ct
    for i in axes:
        size = em.slice(operand_shape, [i], [i + 1], [0])
        summed = em.reduce_sum(out, [lead + i], keepdims=True)
        chosen = em.op("Where", [em.op("Equal", [size, em.ints([1])]), summed, out])
        out = em.slice(chosen, em.ints([0]), size, [lead + i])
    return out


class ShapeOracle:
    """Finds run-time shapes of linear values from the non-linear values of a graph.

    The reverse sweep never computes the linear (tangent) values, so their shapes must be read off
    non-linear values: first the primal a tangent belongs to, then any value with the same
    symbolic shape, and finally one dimension at a time.

    Args:
        values: Non-linear values with inferred shapes, in graph order.
        tangent_of: Maps a tangent to the primal value it is the tangent of.
    """

    def __init__(self, values: Iterable[ir.Value], tangent_of: dict[ir.Value, ir.Value]) -> None:
        self.tangent_of = tangent_of
        self._by_shape: dict[tuple[object, ...], ir.Value] = {}
        self._by_dim: dict[str, tuple[ir.Value, int]] = {}
        for v in values:
            key = dims_key(v.shape)
            if v.shape is None:
                continue
            if key is not None:
                self._by_shape.setdefault(key, v)
            for axis, d in enumerate(v.shape.dims):
                # A dimension is an int or a SymbolicDim: the int test is a C check, the
                # SymbolicDim one a runtime protocol check (this runs per value per sweep).
                if not isinstance(d, int) and d.value is not None:
                    self._by_dim.setdefault(str(d.value), (v, axis))

    def __call__(self, em: Emitter, value: ir.Value) -> ir.Value | None:
        """Emits the run-time shape of linear ``value`` through ``em``; None if unknown."""
        primal = self.tangent_of.get(value)
        if primal is not None:
            return em.shape(primal)
        key = dims_key(value.shape)
        if key is None or value.shape is None:
            return self._shadow(em, value)
        witness = self._by_shape.get(key)
        if witness is not None:
            return em.op("Shape", [witness])
        pieces: list[ir.Value] = []
        for d in value.shape.dims:
            if isinstance(d, int):
                pieces.append(em.ints([d]))
                continue
            found = self._by_dim.get(str(d.value))
            if found is None:
                return self._shadow(em, value)
            source, axis = found
            pieces.append(em.slice(em.op("Shape", [source]), [axis], [axis + 1], [0]))
        return em.op("Concat", pieces, {"axis": 0})

    def _shadow(self, em: Emitter, value: ir.Value) -> ir.Value | None:
        """The run-time shape of a linear value that inference could not describe.

        Found by running its producer on zeros shaped like its linear inputs: a last resort,
        used only where no non-linear value of the same shape exists.
        """
        producer, index = value.producer(), value.index()
        if producer is None or index is None:
            return None
        inputs: list[ir.Value | None] = []
        for v in producer.inputs:
            if v is None or v not in em.linear:
                inputs.append(v)
                continue
            shape = self(em, v)
            if shape is None or v.dtype is None:
                return None
            inputs.append(em.op("Expand", [em.scalar(0.0, v.dtype), shape]))
        attrs = {k: a.value for k, a in producer.attributes.items()}
        outs = em.op_multi(
            producer.op_type,
            inputs,
            attrs,
            num_outputs=len(producer.outputs),
            domain=producer.domain,
        )
        return em.op("Shape", [outs[index]])
