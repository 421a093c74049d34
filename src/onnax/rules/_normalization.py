"""Helpers shared by the normalization rule modules; they register no rule.

The modules are :mod:`onnax.rules.norm`, :mod:`onnax.rules.batchnorm` and :mod:`onnax.rules.lrn`.

They recompute statistics from primal values with ordinary operators (the standardisation
``xhat = (x - mean) * inv`` and its tangent, see :mod:`onnax.rules.norm`), place per-channel
``[C]`` vectors along axis 1, and fold a vmap batch into the leading ``N`` axis of operators
that treat every row of ``N`` alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import float_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args
from onnax.core.shapes import broadcast_to
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

__all__ = [
    "DEFAULT_EPS",
    "INT64_MAX",
    "Standardized",
    "StandardizedTangent",
    "along_channels",
    "cast_to",
    "channel_param",
    "data_input",
    "dtype_of",
    "epsilon",
    "f32",
    "fold_leading",
    "folded_batch",
    "is_present",
    "known_rank",
    "standardize",
    "standardize_fused",
    "standardized_tangent",
    "standardized_tangent_of",
    "standardized_tangent_parts",
    "sum_shaped",
]

INT64_MAX = int(np.iinfo(np.int64).max)
DEFAULT_EPS = 1e-5


def f32(value: float) -> float:
    """A FLOAT attribute as the runtime sees it (stored as float32)."""
    return float(np.float32(value))


def epsilon(node: ir.Node) -> float:
    """The node's ``epsilon`` attribute (default 1e-5) as the runtime sees it."""
    return f32(float_attr(node, "epsilon", DEFAULT_EPS))


def dtype_of(value: ir.Value) -> ir.DataType:
    """The element type of ``value``, which inference must have given it."""
    if value.dtype is None:
        raise InternalRuleError(f"value {value.name!r} has no dtype")
    return value.dtype


def data_input(node: ir.Node) -> ir.Value:
    """The node's first input (the data), which is never absent."""
    x = node.inputs[0]
    if x is None:
        raise InternalRuleError(f"{op_label(node)}: the data input is missing")
    return x


def is_present(value: ir.Value) -> bool:
    """Whether an output is produced (an omitted optional output has an empty name)."""
    return bool(value.name) or bool(value.uses()) or value.is_graph_output()


def known_rank(node: ir.Node, value: ir.Value) -> int:
    """The rank of ``value`` (an input of ``node``), refused with a remedy when unknown."""
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"the rank of {value.name!r}, input of {op_label(node)} ({node_label(node)}), is "
            "unknown after shape inference, and the derivative of this operator needs it to "
            "place its normalised axes. Remedy: give the model's inputs shapes of known rank "
            "(symbolic dimensions are fine)."
        )
    return value.shape.rank()


def cast_to(em: Emitter, value: ir.Value, source: ir.DataType, target: ir.DataType) -> ir.Value:
    """``value`` (of element type ``source``) as ``target``; nothing when they agree."""
    return value if source == target else em.op("Cast", [value], {"to": target})


def along_channels(em: Emitter, v: ir.Value, rank: int) -> ir.Value:
    """A ``[C]`` vector as ``[C, 1, ..., 1]``, broadcasting along axis 1 of a rank-``rank`` value."""
    return em.unsqueeze(v, list(range(1, rank - 1)))


def sum_shaped(
    em: Emitter,
    terms: Sequence[ir.Value | None],
    small: ir.Value | None,
    small_operand: ir.Value | None,
    out: ir.Value,
) -> ir.Value | None:
    """The sum of ``terms`` (each shaped like ``out``) and ``small`` (broadcastable to it).

    When ``small`` is the only term it is expanded to the output's shape, which a tangent must
    have; otherwise ``Add`` broadcasts it.
    """
    total = em.add_all(terms)
    if small is None:
        return total
    if total is not None:
        return em.op("Add", [total, small])
    if small_operand is None:
        return em.op("Expand", [small, em.shape(out)])
    return broadcast_to(em, small, small_operand, out)


@dataclasses.dataclass(frozen=True)
class Standardized:
    """``xhat = (x - mean) * inv`` over ``axes`` (kept dimensions), from primal values."""

    axes: list[int]
    mean: ir.Value | None
    inv: ir.Value
    xhat: ir.Value
    var: ir.Value | None  # mean(d**2) (of x**2 for the RMS form), kept dims; None if fused


def standardize(
    em: Emitter,
    x: ir.Value,
    axes: list[int],
    eps: float,
    dtype: ir.DataType,
    *,
    center: bool = True,
) -> Standardized:
    """Recomputes the statistics of ``x`` (element type ``dtype``) with a two-pass variance.

    ``center=False`` is the RMS form (no mean is subtracted).
    """
    mean = em.reduce("ReduceMean", x, axes, keepdims=True) if center else None
    d = em.op("Sub", [x, mean]) if mean is not None else x
    var = em.reduce("ReduceMean", em.op("Mul", [d, d]), axes, keepdims=True)
    inv = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [var, em.scalar(eps, dtype)])])])
    return Standardized(axes, mean, inv, em.op("Mul", [d, inv]), var)


# The element types whose LayerNormalization stashes at float32 (stash_type=1) without losing
# precision: for a double X onnxruntime has no kernel with a double InvStdDev (stash_type=11).
_FUSED_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def standardize_fused(
    em: Emitter, x: ir.Value, axis: int, axes: list[int], eps: float, normalized: ir.Value
) -> Standardized | None:
    """``xhat`` and ``inv`` over ``axis..`` from one unit-scale LayerNormalization, or None.

    One fused kernel replaces the seven nodes :func:`standardize` emits (two means, the
    difference, the variance's square, Add, Sqrt, Reciprocal) and reads ``x`` once; its
    InvStdDev output is the inverse standard deviation the derivative needs. None for the element
    types where that output would lose precision (double: it is float32); the caller then
    recomputes the statistics with :func:`standardize`.

    Args:
        em: The emitter.
        x: The data.
        axis: The first normalised axis (LayerNormalization's ``axis``).
        axes: The normalised axes, for the tangent's means.
        eps: The epsilon as the runtime sees it.
        normalized: A value shaped like the normalised dimensions (the primal's Scale), whose
            shape the unit scale takes.
    """
    dt = dtype_of(x)
    if dt not in _FUSED_TYPES:
        return None
    shape = normalized.shape
    dims = [d for d in shape.dims if isinstance(d, int)] if shape is not None else []
    if shape is not None and len(dims) == shape.rank():
        ones = em.const(np.full(tuple(dims), 1.0, dtype=dt.numpy()))
    else:
        ones = em.op("Expand", [em.scalar(1.0, dt), em.op("Shape", [normalized])])
    xhat, mean, inv = em.op_multi(
        "LayerNormalization",
        [x, ones],
        {"axis": axis, "epsilon": eps, "stash_type": 1},
        num_outputs=3,
    )
    # The statistics are float32 (the stash type); mean only marks the centred form here.
    mean.dtype = inv.dtype = ir.DataType.FLOAT
    xhat.dtype = dt
    return Standardized(axes, mean, cast_to(em, inv, ir.DataType.FLOAT, dt), xhat, None)


@dataclasses.dataclass(frozen=True)
class StandardizedTangent:
    """The tangent of a :class:`Standardized` value and the means it is built from."""

    dxhat: ir.Value
    mean_t: ir.Value | None  # mean(t), the tangent of the mean (None for the RMS form)
    mean_xt: ir.Value  # mean(xhat * t)


def standardized_tangent(em: Emitter, t: ir.Value, s: Standardized) -> StandardizedTangent:
    """``inv * (t - mean(t) - xhat * mean(xhat * t))`` (without ``mean(t)`` for RMS)."""
    mean_xt = em.reduce("ReduceMean", em.op("Mul", [t, s.xhat]), s.axes, keepdims=True)
    mean_t = None
    centered = t
    if s.mean is not None:
        mean_t = em.reduce("ReduceMean", t, s.axes, keepdims=True)
        centered = em.op("Sub", [t, mean_t])
    inner = em.op("Sub", [centered, em.op("Mul", [s.xhat, mean_xt])])
    return StandardizedTangent(em.op("Mul", [inner, s.inv]), mean_t, mean_xt)


def standardized_tangent_of(em: Emitter, t: ir.Value, s: Standardized, x: ir.Value) -> ir.Value:
    """``inv * (t - mean(t) - xhat * mean(xhat * t))``, the tangent of ``xhat`` alone.

    Where the count ``n`` of normalised elements is static, it is spelled so that its transpose
    (reverse mode) is short: ``k = t * inv``, then ``k - (sum(k) + xhat * sum(xhat * k)) / n``
    with ReduceSum (whose transpose is one Expand, where ReduceMean's is a Div and an Expand)
    and ``-1/n`` multiplying the per-row sums, so no Neg or Sub falls on the full-size cotangent.
    Otherwise (a dynamic ``n``), :func:`standardized_tangent`.

    Args:
        em: The emitter.
        t: The tangent of the data.
        s: The standardisation of ``x``.
        x: The data, whose static shape gives ``n``.
    """
    parts = standardized_tangent_parts(em, t, s, x)
    return parts[0] if parts is not None else standardized_tangent(em, t, s).dxhat


def standardized_tangent_parts(
    em: Emitter, t: ir.Value, s: Standardized, x: ir.Value
) -> tuple[ir.Value, ir.Value] | None:
    """:func:`standardized_tangent_of`'s static form, with ``-inv * mean(xhat * t)``.

    ``(dxhat, m)``, where ``m`` is the per-row factor the form computes anyway: the tangent of
    ``inv`` is ``inv * m`` (``-inv**2 * mean(xhat * t)``). None for a dynamic ``n``.
    """
    dims = x.shape.dims if x.shape is not None else None
    sizes = [d for d in (dims[a] for a in s.axes) if isinstance(d, int)] if dims else []
    if dims is None or len(sizes) != len(s.axes):
        return None
    n = math.prod(sizes)
    minus_1_over_n = em.scalar(-1.0 / n, dtype_of(x))
    k = em.op("Mul", [t, s.inv])
    along_xhat = em.reduce_sum(em.op("Mul", [k, s.xhat]), s.axes, keepdims=True)
    m = em.op("Mul", [along_xhat, minus_1_over_n])
    total = em.op("Add", [k, em.op("Mul", [s.xhat, m])])
    if s.mean is None:
        return total, m
    row = em.op("Mul", [em.reduce_sum(k, s.axes, keepdims=True), minus_1_over_n])
    return em.op("Add", [total, row]), m


def fold_leading(bx: Batcher, x: ir.Value, original: ir.Value) -> tuple[ir.Value, ir.Value]:
    """``[B, N, ...]`` reshaped to ``[B*N, ...]``, and the batched shape to restore.

    Constants where the example's dimensions after N are static (the usual case: only N is
    symbolic); read from the batched value at run time otherwise.
    """
    dims = list(original.shape.dims) if original.shape is not None else None
    if dims is None:
        raise InternalRuleError(f"vmap: the rank of {original.name!r} is unknown")
    inner = [d for d in dims[1:] if isinstance(d, int)]
    if len(inner) == len(dims) - 1:
        fold_shape = bx.ints([-1, *inner])
    else:
        full = bx.op("Shape", [x])
        rest = bx.slice(full, [2], [INT64_MAX], [0])
        fold_shape = bx.op("Concat", [bx.ints([-1]), rest], {"axis": 0})
    if isinstance(dims[0], int) and len(inner) == len(dims) - 1:
        restore = bx.batched_shape(bx.ints([dims[0], *inner]))
    else:
        restore = bx.op("Shape", [x])
    return bx.op("Reshape", [x, fold_shape]), restore


def folded_batch(bx: Batcher, node: ir.Node, args: Args) -> ir.Value:
    """The operator applied with its data input's batch folded into the leading N axis."""
    x = args[0]
    assert x is not None
    folded, restore = fold_leading(bx, x, data_input(node))
    y = bx.op(node.op_type, [folded, *args[1:]], attributes_of(node))
    return bx.op("Reshape", [y, restore])


def channel_param(bx: Batcher, p: ir.Value, batched: bool, rank: int) -> ir.Value:
    """A per-channel parameter broadcasting along axis 1 of a rank-``rank`` example.

    ``[C]`` becomes ``[C, 1, ..., 1]``; a batched ``[B, C]`` becomes ``[B, 1, C, 1, ...]``.
    """
    if batched:
        return bx.unsqueeze(p, [1, *range(3, rank + 1)])
    return bx.unsqueeze(p, list(range(1, rank - 1)))
