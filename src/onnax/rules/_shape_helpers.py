"""Helpers shared by the shape-family rule modules (:mod:`layout`, :mod:`slicing`, :mod:`sources`).

Per-axis integer parameters that are static (Python ints) or known at run time only (1-element
int64 vectors), the axis bookkeeping of the batch rules, and :func:`same_op_jvp`, the jvp rule
of every operator that is linear in its data input and keeps its other inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Tangents
from onnax.errors import UnsupportedOperatorError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "Param",
    "add_param",
    "arange",
    "as_int64",
    "as_vector",
    "dim_of",
    "element",
    "ints_like",
    "node_attrs",
    "norm_axis",
    "rank_of",
    "reshape_like",
    "same_op_jvp",
    "shift_runtime_axes",
    "spread",
    "trim",
    "vector_length",
    "zeros_like",
]

Param = int | ir.Value
"""A per-axis integer: a Python int when static, else a 1-D int64 Value holding one element."""

INT64_MAX = int(np.iinfo(np.int64).max)
INT64_MIN = int(np.iinfo(np.int64).min)


def node_attrs(node: ir.Node) -> dict[str, object]:
    """The node's attributes as Python values, to copy onto a node of the same operator."""
    return {k: a.value for k, a in node.attributes.items()}


def trim(inputs: Sequence[ir.Value | None]) -> list[ir.Value | None]:
    """Drops trailing omitted optional inputs."""
    out = list(inputs)
    while out and out[-1] is None:
        out.pop()
    return out


def rank_of(node: ir.Node, value: ir.Value) -> int:
    """The rank of ``value``, an input of ``node``; refused when shape inference left it unknown.

    Raises:
        UnsupportedOperatorError: The rank is unknown.
    """
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"the rank of {value.name!r}, input of {op_label(node)} ({node_label(node)}), is unknown "
            "after shape inference, and the derivative of this operator needs it. Remedy: give "
            "the model's inputs shapes of known rank (symbolic dimensions are fine)."
        )
    return value.shape.rank()


def norm_axis(axis: int, rank: int) -> int:
    """``axis`` counted from the front (a negative axis counts back from ``rank``)."""
    return axis + rank if axis < 0 else axis


def reshape_like(em: Emitter, ct: ir.Value, like: ir.Value) -> ir.Value:
    """Reshapes ``ct`` to the shape of ``like`` (literal zeros in that shape stay zeros)."""
    attrs = {"allowzero": 1} if em.opset >= 14 else None
    return em.op("Reshape", [ct, em.shape(like)], attrs)


def zeros_like(em: Emitter, value: ir.Value) -> ir.Value:
    """``em.zeros_like`` with the known type and shape recorded on the result.

    Shape inference does not see through ``ConstantOfShape(Shape(x))``; the rules downstream
    (Concat's transpose needs the sizes of its inputs) rely on the recorded shape.
    """
    zeros = em.zeros_like(value)
    if zeros.type is None:
        zeros.type = value.type
        zeros.shape = value.shape.copy() if value.shape is not None else None
    return zeros


def as_int64(em: Emitter, value: ir.Value) -> ir.Value:
    """Slice bounds may be int32; the index arithmetic here is int64."""
    if value.dtype == ir.DataType.INT64:
        return value
    return em.op("Cast", [value], {"to": ir.DataType.INT64})


def as_vector(em: Emitter, p: Param) -> ir.Value:
    """``p`` as a 1-element int64 vector."""
    return em.ints([p]) if isinstance(p, int) else p


def element(em: Emitter, vector: ir.Value, k: int) -> ir.Value:
    """Element ``k`` of a 1-D ``vector``, as a 1-element vector."""
    return em.slice(vector, [k], [k + 1], [0])


def dim_of(em: Emitter, x: ir.Value, shape_x: Callable[[], ir.Value], axis: int) -> Param:
    """Dimension ``axis`` of ``x``: an int when static, else a 1-element vector."""
    d = x.shape.dims[axis] if x.shape is not None else None
    if isinstance(d, int):
        return d
    return element(em, shape_x(), axis)


def arange(em: Emitter, n: Param) -> ir.Value:
    """``[0, 1, ..., n-1]`` as int64."""
    if isinstance(n, int):
        return em.const(np.arange(n, dtype=np.int64))
    zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
    return em.op("Range", [zero, em.squeeze(n, [0]), one])


def add_param(em: Emitter, a: Param, b: Param) -> Param:
    """``a + b``, computed here when both are static, else emitted."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, int) and a == 0:
        return b
    return em.op("Add", [as_vector(em, a), as_vector(em, b)])


def spread(
    em: Emitter,
    values: list[int] | ir.Value,
    axes: list[int] | ir.Value | None,
    rank: int,
    default: int,
) -> list[Param]:
    """Per-axis parameters from ``values`` given for ``axes`` (None: the leading axes).

    Axes that ``axes`` does not list get ``default``. Run-time axes are normalized and scattered
    into a full-rank vector at run time.
    """
    if axes is None:
        if isinstance(values, ir.Value):
            n = (
                values.shape.dims[0]
                if values.shape is not None and values.shape.rank() == 1
                else None
            )
            if not isinstance(n, int):
                # The length is only known at run time: the axes are Range(len(values)).
                length = em.op("Shape", [values])
                axes = arange(em, length)
            else:
                axes = list(range(n))
        else:
            axes = list(range(len(values)))
    if not isinstance(axes, ir.Value):
        out: list[Param] = [default] * rank
        for k, a in enumerate(axes):
            out[norm_axis(a, rank)] = (
                values[k] if isinstance(values, list) else element(em, values, k)
            )
        return out
    axes = as_int64(em, axes)
    rank_c = em.ints([rank])
    normalized = em.op(
        "Where", [em.op("Less", [axes, em.ints([0])]), em.op("Add", [axes, rank_c]), axes]
    )
    vector = values if isinstance(values, ir.Value) else em.ints(values)
    full = em.op("ScatterElements", [em.ints([default] * rank), normalized, vector], {"axis": 0})
    return [element(em, full, j) for j in range(rank)]


# ------------------------------------------------------------------------ batch helpers
def ints_like(bx: Batcher, values: Sequence[int], like: ir.Value | None) -> ir.Value:
    """A 1-D integer constant in the element type of ``like`` (int32 or int64 indices)."""
    dtype = like.dtype if like is not None and like.dtype is not None else ir.DataType.INT64
    return bx.const(np.array(list(values), dtype=dtype.numpy()))


def shift_runtime_axes(bx: Batcher, axes: ir.Value, rank: int | ir.Value) -> ir.Value:
    """Run-time axes normalised and shifted past the batch axis, in their own integer type.

    ``rank`` (an int, or a 1-element int64 vector) is what negative axes count back from.
    """
    dtype = axes.dtype if axes.dtype is not None else ir.DataType.INT64
    np_dtype = dtype.numpy()
    if isinstance(rank, int):
        rank_v = bx.const(np.array(rank, dtype=np_dtype))
    else:
        rank_v = rank if dtype == ir.DataType.INT64 else bx.op("Cast", [rank], {"to": dtype})
    zero, one = bx.const(np.array(0, np_dtype)), bx.const(np.array(1, np_dtype))
    negative = bx.op("Less", [axes, zero])
    normalized = bx.op("Where", [negative, bx.op("Add", [axes, rank_v]), axes])
    return bx.op("Add", [normalized, one])


def vector_length(value: ir.Value | None) -> int | None:
    """The static length of a 1-D value, or None."""
    if value is None or value.shape is None or value.shape.rank() != 1:
        return None
    n = value.shape.dims[0]
    return n if isinstance(n, int) else None


# ----------------------------------------------------------- same operator on the tangent
def same_op_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """The operator applied to the tangent of its data input, other inputs and attributes kept."""
    t = tangents[0]
    if t is None:
        return [None] * len(node.outputs)
    outs = em.op_multi(
        node.op_type, [t, *node.inputs[1:]], node_attrs(node), num_outputs=len(node.outputs)
    )
    return list(outs)
