"""Normalization operators over axes of each example.

Covered: LayerNormalization InstanceNormalization GroupNormalization RMSNormalization
LpNormalization MeanVarianceNormalization. BatchNormalization is in :mod:`onnax.rules.batchnorm`
and LRN in :mod:`onnax.rules.lrn`; the helpers the three share are in
:mod:`onnax.rules._normalization`.

Several of these have ONNX function bodies; the direct rules here take precedence and give
smaller derivative graphs. Every rule recomputes the statistics it needs from the primal input
with ordinary operators (``ReduceMean``, ``Sub``, ``Mul``, ``Sqrt``, ``Reciprocal``...) and
expresses the tangent with linear operators on tangents only (``Mul`` by primal coefficients,
``Add``, ``Sub``, ``Neg``, ``ReduceMean``/``ReduceSum``, ``Reshape``, ``Unsqueeze``, ``Expand``,
``Cast``), so reverse mode comes from the existing transposes and this module needs no
transpose rule.

Standardisation. LayerNorm, InstanceNorm and GroupNorm (and BatchNorm's training mode)
standardise ``x`` over some axes: ``xhat = (x - mean) * inv`` with ``inv = 1 / sqrt(var + eps)``
(``var`` the biased variance, computed two-pass as ``mean((x - mean)**2)``). Its tangent is

    dxhat = inv * (t - mean(t) - xhat * mean(xhat * t))

(``mean(xhat) = 0`` removes the centring of ``t`` inside the second mean). The affine part
``y = xhat * scale + bias`` adds ``xhat * dscale + dbias``. RMSNormalization is the uncentred
version: ``xhat = x * inv``, ``inv = 1 / sqrt(mean(x**2) + eps)``,
``dxhat = inv * (t - xhat * mean(xhat * t))``.

Per operator:

* **LayerNormalization** (17): standardised over ``axis..rank-1`` (a negative axis needs no
  rank). The optional ``Mean`` and ``InvStdDev`` outputs get tangents ``mean(t)`` and
  ``-inv**2 * mean(xhat * t)``, cast to their element type (the stash type: float32 even for a
  double ``X``). ``Scale`` and ``B`` may broadcast; reverse mode sums them back (``Mul``/``Add``
  transposes). ``stash_type`` only sets the precision of the primal; the derivative is computed in
  ``X``'s type.
* **InstanceNormalization** (6, 22): standardised over the spatial axes ``2..rank-1`` per
  example and channel; scale and bias per channel.
* **GroupNormalization** (18, 21): ``x`` is reshaped to ``[N, G, K]`` (``K`` static when the
  dimensions after N are, so reverse mode's mean counts are constants) and standardised over the
  last axis. At 18 scale and bias have ``G`` elements and apply per group (in the grouped
  layout); at 21 they have ``C`` and apply per channel (after reshaping back). onnx 1.23 marks
  GroupNormalization-18 deprecated and its checker rejects it, so onnax refuses such models
  before any rule runs; the rule is kept (and tested with that check relaxed) for when they get
  through.
* **RMSNormalization** (23): over ``axis..rank-1``. The schema gives the scale a type of its
  own, but the function body multiplies it with the normalised ``X`` and onnx's type inference
  gives ``Y`` the type of ``X``: in a valid model they agree, so no cast is needed.
* **LpNormalization** (1, 22): ``y = x / n`` with ``n`` the L1 (``p=1``) or L2 (``p=2``) norm
  along ``axis``; ``dy = (t - y * sum(w * t)) / n`` with ``w = y`` for ``p=2`` and ``sign(x)``
  for ``p=1``. A zero slice (where onnxruntime outputs 0) gets tangent 0, through a
  ``Where``-guarded ``1/n`` (both branches finite, so reverse mode gives no NaN either).
* **MeanVarianceNormalization** (9, 13): ``y = d / (s + 1e-9)``, ``d = x - mean``,
  ``s = sqrt(mean(d**2))`` over ``axes`` (the function body's ``E[x**2] - E[x]**2`` is the same
  variance); ``dy = (t - mean(t) - y * mean(t * d / s)) / (s + 1e-9)``, with ``d / s`` taken as
  0 on a constant slice (``s = 0``, where ``sqrt`` has a kink).

Batch rules (vmap) keep the batch axis first. Operators that normalise per example along axes
counted from the end or per channel of a leading ``N`` axis are folded or shifted:

* InstanceNorm and GroupNorm treat every row of the leading ``N`` axis alike, so when only ``X``
  is batched the batch is folded into it: ``[B, N, C, ...]`` is reshaped to ``[B*N, C, ...]``,
  the operator applied, and the result reshaped back.
* LayerNorm, RMSNorm, LpNorm and MVN normalise along given axes: a non-negative axis is shifted by
  one, a negative one keeps its meaning.
* A batched scale or bias differs per example: the operator normalises with unit scale and zero
  bias (LayerNorm/RMSNorm take a scalar 1; InstanceNorm/GroupNorm vectors of ones and zeros), and
  the affine part is applied elementwise with the parameters broadcast (``[B, C]`` as
  ``[B, 1, C, 1, ...]``; GroupNorm-18's per-group ones in the grouped layout).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import int_attr, ints_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, BatchRule, JvpRule, OpRules, Tangents
from onnax.core.static import constant_of
from onnax.errors import UnsupportedOperatorError
from onnax.rules._normalization import (
    along_channels,
    cast_to,
    channel_param,
    data_input,
    dtype_of,
    epsilon,
    f32,
    fold_leading,
    folded_batch,
    is_present,
    known_rank,
    standardize,
    standardize_fused,
    standardized_tangent,
    standardized_tangent_of,
    standardized_tangent_parts,
    sum_shaped,
)
from onnax.rules._patterns import attributes_of

__all__: list[str] = []

_MVN_EPS = 1e-9  # the constant of MeanVarianceNormalization's function body


# ------------------------------------------------------------------------------ helpers
def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _trailing_axes(node: ir.Node, x: ir.Value, axis: int) -> list[int]:
    """The axes ``axis..rank-1``; negative ones when ``axis`` is, which needs no rank."""
    if axis < 0:
        return list(range(axis, 0))
    return list(range(axis, known_rank(node, x)))


def _shift_axis(axis: int) -> int:
    """An axis of one example in the batched value: negative axes keep counting from the end."""
    return axis if axis < 0 else axis + 1


def _trailing_norm_batch(has_stats: bool) -> BatchRule:
    """LayerNorm (``has_stats``: Mean and InvStdDev outputs) and RMSNorm."""

    def rule(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
        axis = int_attr(node, "axis", -1)
        n_out = len(node.outputs)
        x = args[0]
        assert x is not None
        if not any(batched[1:]):
            outs = bx.op_multi(
                node.op_type,
                list(args),
                attributes_of(node, axis=_shift_axis(axis)),
                num_outputs=n_out,
            )
            return list(outs), [True] * n_out
        # A batched Scale/B: normalise with a unit scale, then the affine part elementwise.
        scale, original, scale_0 = args[1], data_input(node), node.inputs[1]
        assert scale is not None and scale_0 is not None
        one = bx.scalar(1.0, dtype_of(scale_0))
        outs = bx.op_multi(
            node.op_type,
            [x, one],
            attributes_of(node, axis=_shift_axis(axis) if batched[0] else axis),
            num_outputs=n_out,
        )
        rank = known_rank(node, original)
        y = bx.op("Mul", [outs[0], bx.align(scale, batched[1], scale_0, rank)])
        bias, bias_0 = (args[2], node.inputs[2]) if len(args) > 2 else (None, None)
        if bias is not None and bias_0 is not None:
            y = bx.op("Add", [y, bx.align(bias, batched[2], bias_0, rank)])
        if not has_stats:
            return [y], [True]
        return [y, *outs[1:]], [True] + [batched[0]] * (n_out - 1)

    return rule


# ------------------------------------------------------------------------- LayerNormalization
layer_norm = OpRules("LayerNormalization", since=17)
layer_norm.batch(_trailing_norm_batch(True))


@layer_norm.jvp
def _layer_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = data_input(node), node.outputs[0]
    scale, bias = node.inputs[1], _input(node, 2)
    assert scale is not None
    tx = tangents[0]
    ts = tangents[1] if len(tangents) > 1 else None
    tb = tangents[2] if len(tangents) > 2 else None
    axis = int_attr(node, "axis", -1)
    axes = _trailing_axes(node, x, axis)
    s = standardize_fused(em, x, axis, axes, epsilon(node), scale) or standardize(
        em, x, axes, epsilon(node), dtype_of(x)
    )
    # The tangent of xhat is spelled alike with or without statistics outputs: the unit-scale
    # LayerNormalization a gradient computes xhat with and the model's own one on the same x
    # then share it after CSE (forward over reverse differentiates both).
    # (A dynamic n takes the ReduceMean form, which also gives the statistics' tangents.)
    parts = standardized_tangent_parts(em, tx, s, x) if tx is not None else None
    st = standardized_tangent(em, tx, s) if tx is not None and parts is None else None
    dxhat = parts[0] if parts is not None else (st.dxhat if st is not None else None)
    terms: list[ir.Value | None] = [
        _scaled(em, dxhat, scale, x) if dxhat is not None else None,
        em.op("Mul", [s.xhat, ts]) if ts is not None else None,
    ]
    outs: list[ir.Value | None] = [sum_shaped(em, terms, tb, bias, y)]
    if len(node.outputs) > 1:
        mean_out, dmean = node.outputs[1], None
        if tx is not None and is_present(mean_out):
            mean_t = (
                st.mean_t if st is not None else em.reduce("ReduceMean", tx, axes, keepdims=True)
            )
            assert mean_t is not None
            dmean = cast_to(em, mean_t, dtype_of(x), dtype_of(mean_out))
        outs.append(dmean)
    if len(node.outputs) > 2:
        inv_out = node.outputs[2]
        dinv = None
        if parts is not None and is_present(inv_out):
            dinv = cast_to(em, em.op("Mul", [s.inv, parts[1]]), dtype_of(x), dtype_of(inv_out))
        elif st is not None and is_present(inv_out):
            coef = em.op("Neg", [em.op("Mul", [s.inv, s.inv])])
            dinv = cast_to(em, em.op("Mul", [st.mean_xt, coef]), dtype_of(x), dtype_of(inv_out))
        outs.append(dinv)
    return outs


def _scaled(em: Emitter, dxhat: ir.Value, scale: ir.Value, x: ir.Value) -> ir.Value:
    """``dxhat * scale``, or ``dxhat`` for a ``Constant`` scale of ones.

    A gradient's unit-scale LayerNormalization has one. The scale broadcasts to the normalised
    dimensions of ``dxhat``'s own shape, so the product would only copy it. Only a ``Constant``
    node's: an initializer is a parameter (a model's LayerNorm weights start as ones), whose
    value a derivative model must keep reading.
    """
    producer = scale.producer()
    # The product's type is X's (dxhat's, not yet inferred here).
    if producer is None or producer.op_type != "Constant" or scale.dtype != x.dtype:
        return em.op("Mul", [dxhat, scale])
    ones = constant_of(scale)
    if ones is not None and ones.size > 0 and bool(np.all(ones == 1)):
        return dxhat
    return em.op("Mul", [dxhat, scale])


# ------------------------------------------------------------------------- RMSNormalization
rms_norm = OpRules("RMSNormalization", since=23)
rms_norm.batch(_trailing_norm_batch(False))


@rms_norm.jvp
def _rms_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = data_input(node), node.outputs[0]
    scale = node.inputs[1]
    assert scale is not None
    tx, ts = tangents[0], tangents[1] if len(tangents) > 1 else None
    if tx is None and ts is None:
        return [None]
    axes = _trailing_axes(node, x, int_attr(node, "axis", -1))
    s = standardize(em, x, axes, epsilon(node), dtype_of(x), center=False)
    terms: list[ir.Value | None] = []
    if tx is not None:
        terms.append(em.op("Mul", [standardized_tangent_of(em, tx, s, x), scale]))
    if ts is not None:
        terms.append(em.op("Mul", [s.xhat, ts]))
    return [sum_shaped(em, terms, None, None, y)]


# -------------------------------------------------------------------- InstanceNormalization
def _channel_affine_tangent(
    em: Emitter,
    node: ir.Node,
    dxhat: ir.Value | None,
    xhat: ir.Value,
    tangents: Tangents,
    rank: int,
    out: ir.Value,
) -> ir.Value | None:
    """``dxhat * scale + xhat * dscale + dbias`` with per-channel scale/bias (axis 1)."""
    scale = node.inputs[1]
    assert scale is not None
    ts, tb = tangents[1], tangents[2]
    terms: list[ir.Value | None] = [
        em.op("Mul", [dxhat, along_channels(em, scale, rank)]) if dxhat is not None else None,
        em.op("Mul", [xhat, along_channels(em, ts, rank)]) if ts is not None else None,
    ]
    small = along_channels(em, tb, rank) if tb is not None else None
    return sum_shaped(em, terms, small, None, out)


def _vector(bx: Batcher, value: float, length: ir.Value | int, like: ir.Value) -> ir.Value:
    """A 1-D vector of ``value`` of the given length in the element type of ``like``."""
    if isinstance(length, int):
        return bx.const(np.full((length,), value, dtype=dtype_of(like).numpy()))
    return bx.op("Expand", [bx.scalar(value, like), length])


def _channels(bx: Batcher, x: ir.Value, batched: bool, original: ir.Value) -> ir.Value | int:
    """The number of channels (axis 1 of one example): an int when static."""
    if original.shape is not None and isinstance(original.shape.dims[1], int):
        return original.shape.dims[1]
    return bx.slice(bx.unbatched_shape(x, batched, original), [1], [2], [0])


def _normalized(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool], groups: int | None
) -> ir.Value:
    """Instance/GroupNorm of the data with unit scale and zero bias, batched like the data.

    ``groups`` is the length of GroupNorm-18's parameters; None for one per channel.
    """
    x, original = args[0], data_input(node)
    assert x is not None
    length = groups if groups is not None else _channels(bx, x, batched[0], original)
    ones, zeros = _vector(bx, 1.0, length, original), _vector(bx, 0.0, length, original)
    attrs = attributes_of(node)
    if not batched[0]:
        return bx.op(node.op_type, [x, ones, zeros], attrs)
    folded, restore = fold_leading(bx, x, original)
    return bx.op("Reshape", [bx.op(node.op_type, [folded, ones, zeros], attrs), restore])


# 22 added element types only: one rule serves every version.
instance_norm = OpRules("InstanceNormalization", since=6)


@instance_norm.jvp
def _instance_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = data_input(node), node.outputs[0]
    if all(t is None for t in tangents):
        return [None]
    rank = known_rank(node, x)
    s = standardize(em, x, list(range(2, rank)), epsilon(node), dtype_of(x))
    dxhat = standardized_tangent_of(em, tangents[0], s, x) if tangents[0] is not None else None
    return [_channel_affine_tangent(em, node, dxhat, s.xhat, tangents, rank, y)]


def _instance_norm_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    if not any(batched[1:]):
        return [folded_batch(bx, node, args)], [True]
    rank = known_rank(node, data_input(node))
    xhat = _normalized(bx, node, args, batched, None)
    scale, bias = args[1], args[2]
    assert scale is not None and bias is not None
    y = bx.op("Mul", [xhat, channel_param(bx, scale, batched[1], rank)])
    return [bx.op("Add", [y, channel_param(bx, bias, batched[2], rank)])], [True]


# Registered by a call rather than a decorator: GroupNormalization-21's rule calls it too, and
# keeps its precise return type.
instance_norm.batch(_instance_norm_batch)


# ------------------------------------------------------------------------- GroupNormalization
# 21 moved scale and bias from per group to per channel (and added stash_type).
group_norm = OpRules("GroupNormalization", since=(18, 21))


def _num_groups(node: ir.Node) -> int:
    groups = node.attributes.get_int("num_groups", None)
    if groups is None:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}) has no num_groups attribute, which ONNX "
            "requires. Remedy: set num_groups on the node."
        )
    return groups


def _group_size(x: ir.Value, groups: int) -> int:
    """The length of each group in the ``[N, G, K]`` layout; -1 (inferred) unless static.

    A static ``K`` keeps the reductions' element counts static in reverse mode.
    """
    if x.shape is None:
        return -1
    dims = list(x.shape.dims[1:])
    sizes = [d for d in dims if isinstance(d, int)]
    return math.prod(sizes) // groups if len(sizes) == len(dims) else -1


def _group_norm_jvp(per_channel: bool) -> JvpRule:
    def rule(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
        """Standardised in the ``[N, G, -1]`` layout; affine per group (18) or channel (21)."""
        x, y = data_input(node), node.outputs[0]
        if all(t is None for t in tangents):
            return [None]
        rank, groups = known_rank(node, x), _num_groups(node)
        grouped = em.ints([0, groups, _group_size(x, groups)])
        s = standardize(em, em.op("Reshape", [x, grouped]), [2], epsilon(node), dtype_of(x))
        tx = tangents[0]
        dxhat = None
        if tx is not None:
            dxhat = standardized_tangent(em, em.op("Reshape", [tx, grouped]), s).dxhat
        x_shape = em.shape(x)
        if per_channel:
            xhat = em.op("Reshape", [s.xhat, x_shape])
            if dxhat is not None:
                dxhat = em.op("Reshape", [dxhat, x_shape])
            return [_channel_affine_tangent(em, node, dxhat, xhat, tangents, rank, y)]
        # Per group: [G] parameters broadcast as [G, 1] against the [N, G, K] layout.
        tangent = _channel_affine_tangent(em, node, dxhat, s.xhat, tangents, 3, s.xhat)
        assert tangent is not None
        return [em.op("Reshape", [tangent, x_shape])]

    return rule


group_norm.jvp(_group_norm_jvp(False), since=18)
group_norm.jvp(_group_norm_jvp(True), since=21)


def _group_norm_batch(per_channel: bool) -> BatchRule:
    def rule(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
        if not any(batched[1:]):
            return [folded_batch(bx, node, args)], [True]
        if per_channel:
            return _instance_norm_batch(bx, node, args, batched)
        # GroupNorm-18: per-group [G] / [B, G] parameters in the [(B,) N, G, K] layout.
        groups = _num_groups(node)
        original = data_input(node)
        xhat = _normalized(bx, node, args, batched, groups)
        lead = [0, 0] if batched[0] else [0]
        grouped = bx.op("Reshape", [xhat, bx.ints([*lead, groups, -1])])
        scale, bias = args[1], args[2]
        assert scale is not None and bias is not None

        def param(p: ir.Value, b: bool) -> ir.Value:
            return bx.unsqueeze(p, [1, 3]) if b else bx.unsqueeze(p, [1])

        y = bx.op("Mul", [grouped, param(scale, batched[1])])
        y = bx.op("Add", [y, param(bias, batched[2])])
        x = args[0]
        assert x is not None
        shape = bx.batched_shape(bx.unbatched_shape(x, batched[0], original))
        return [bx.op("Reshape", [y, shape])], [True]

    return rule


group_norm.batch(_group_norm_batch(False), since=18)
group_norm.batch(_group_norm_batch(True), since=21)


# ------------------------------------------------------------------------- LpNormalization
lp_norm = OpRules("LpNormalization")


def _lp_order(node: ir.Node, opset: int, transform: str) -> int:
    p = int_attr(node, "p", 2)
    if p not in (1, 2):
        raise UnsupportedOperatorError(
            f"{transform}: {op_label(node)} at opset {opset} ({node_label(node)}) has p={p}; ONNX "
            "defines LpNormalization for p=1 and p=2 only. Remedy: set p to 1 or 2, or write the "
            "normalisation as x / Pow(ReduceSum(Pow(Abs(x), p)), 1/p)."
        )
    return p


@lp_norm.jvp
def _lp_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """``(t - y * sum(w * t)) / n``; 0 on a zero slice."""
    t = tangents[0]
    p = _lp_order(node, em.opset, "jvp")
    if t is None:
        return [None]
    x, y = data_input(node), node.outputs[0]
    axes = [int_attr(node, "axis", -1)]
    norm = em.reduce("ReduceL2" if p == 2 else "ReduceL1", x, axes, keepdims=True)
    weights = y if p == 2 else em.op("Sign", [x])
    is_zero = em.op("Equal", [norm, em.scalar(0.0, x)])
    safe = em.op("Where", [is_zero, em.scalar(1.0, x), norm])
    inv = em.op("Where", [is_zero, em.scalar(0.0, x), em.op("Reciprocal", [safe])])
    projected = em.reduce_sum(em.op("Mul", [t, weights]), axes, keepdims=True)
    return [em.op("Mul", [em.op("Sub", [t, em.op("Mul", [y, projected])]), inv])]


@lp_norm.batch
def _lp_norm_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    _lp_order(node, bx.opset, "vmap")
    axis = _shift_axis(int_attr(node, "axis", -1))
    return [bx.op(node.op_type, list(args), attributes_of(node, axis=axis))], [True]


# ------------------------------------------------------------------ MeanVarianceNormalization
mvn = OpRules("MeanVarianceNormalization", since=9)


def _mvn_axes(node: ir.Node) -> list[int]:
    axes = ints_attr(node, "axes", [0, 2, 3])
    assert axes is not None
    return axes


@mvn.jvp
def _mvn_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """``(t - mean(t) - y * mean(t * d / s)) / (s + 1e-9)``."""
    t = tangents[0]
    if t is None:
        return [None]
    x, y = data_input(node), node.outputs[0]
    axes = _mvn_axes(node)
    d = em.op("Sub", [x, em.reduce("ReduceMean", x, axes, keepdims=True)])
    std = em.op("Sqrt", [em.reduce("ReduceMean", em.op("Mul", [d, d]), axes, keepdims=True)])
    inv = em.op("Reciprocal", [em.op("Add", [std, em.scalar(f32(_MVN_EPS), x)])])
    # A constant slice has std 0 (a kink of sqrt): d is 0 there too, so dividing by 1 instead
    # gives the unit vector 0 rather than 0/0.
    is_zero = em.op("Equal", [std, em.scalar(0.0, x)])
    unit = em.op("Div", [d, em.op("Where", [is_zero, em.scalar(1.0, x), std])])
    centered = em.op("Sub", [t, em.reduce("ReduceMean", t, axes, keepdims=True)])
    along = em.reduce("ReduceMean", em.op("Mul", [t, unit]), axes, keepdims=True)
    return [em.op("Mul", [em.op("Sub", [centered, em.op("Mul", [y, along])]), inv])]


@mvn.batch
def _mvn_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    axes = [_shift_axis(a) for a in _mvn_axes(node)]
    return [bx.op(node.op_type, list(args), attributes_of(node, axes=axes))], [True]
