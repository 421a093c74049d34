"""Normalization operators.

Covered: BatchNormalization (inference form) LayerNormalization InstanceNormalization
GroupNormalization RMSNormalization LpNormalization MeanVarianceNormalization LRN.

Several of these have ONNX function bodies; the direct rules here take precedence and give
smaller derivative graphs. Every rule recomputes the statistics it needs from the primal input
with ordinary operators (``ReduceMean``, ``Sub``, ``Mul``, ``Sqrt``, ``Reciprocal``...) and
expresses the tangent with linear operators on tangents only (``Mul`` by primal coefficients,
``Add``, ``Sub``, ``Neg``, ``ReduceMean``/``ReduceSum``, ``Reshape``, ``Unsqueeze``, ``Expand``,
``Cast``, and ``Pad``/``Slice`` for LRN), so reverse mode comes from the existing transposes and
this module needs no transpose rule.

Standardisation. LayerNorm, InstanceNorm and GroupNorm standardise ``x`` over some axes:
``xhat = (x - mean) * inv`` with ``inv = 1 / sqrt(var + eps)`` (``var`` the biased variance,
computed two-pass as ``mean((x - mean)**2)``). Its tangent is

    dxhat = inv * (t - mean(t) - xhat * mean(xhat * t))

(``mean(xhat) = 0`` removes the centring of ``t`` inside the second mean). The affine part
``y = xhat * scale + bias`` adds ``xhat * dscale + dbias``. RMSNormalization is the uncentred
version: ``xhat = x * inv``, ``inv = 1 / sqrt(mean(x**2) + eps)``,
``dxhat = inv * (t - xhat * mean(xhat * t))``.

Per operator:

* **BatchNormalization** (9, 14, 15), inference form: ``y = (x - mean) * a + B`` with
  ``a = scale / sqrt(var + eps)`` per channel (axis 1). The tangent is
  ``t * a + xhat * (dscale - scale * inv**2 / 2 * dvar) + (dB - a * dmean)``, the per-channel
  parts combined in ``[C]`` space before one ``Unsqueeze`` to ``[C, 1, ..., 1]``. Training mode
  (``training_mode=1``, opset 14+) standardises with the batch's statistics over every axis but
  1, like LayerNormalization over those axes, and its running-statistics outputs
  ``input * momentum + current * (1 - momentum)`` get tangents too; under vmap each example
  takes the statistics of its own batch. Before opset 14 training is told by the extra outputs
  (``mean``, ``var``, ``saved_mean``, ``saved_var``): refused with a remedy. From opset 15 the
  scale/bias and mean/var may have other element types than ``X``: they (and their tangents)
  are cast to ``X``'s type (onnxruntime has no such mixed kernel for float/double to test it).
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
* **LRN** (1, 13) is *lowered* for jvp, vjp and grad (:data:`onnax.core.registry.lowerings`,
  applied by the expansion pass): ``y = x * exp(-beta * log(D))``, ``D = bias + alpha / size
  * S``, ``S`` the sum of ``x**2`` over the channel window ``[c - floor((size-1)/2),
  c + ceil((size-1)/2)]``, one ``Pad`` of the channel axis and ``size`` ``Slice``s added up.
  The derivative comes from those primitives' rules, and the derived model computes the primal
  from the same pieces (onnxruntime's LRN kernel is 10x slower than they are). vmap keeps the
  operator (a batch rule).

Batch rules (vmap) keep the batch axis first. Operators that normalise per example along axes
counted from the end or per channel of a leading ``N`` axis are folded or shifted:

* BatchNorm (inference), InstanceNorm, GroupNorm and LRN treat every row of the leading ``N``
  axis alike, so when only ``X`` is batched the batch is folded into it: ``[B, N, C, ...]`` is
  reshaped to ``[B*N, C, ...]``, the operator applied, and the result reshaped back.
* LayerNorm, RMSNorm, LpNorm and MVN normalise along given axes: a non-negative axis is shifted by
  one, a negative one keeps its meaning.
* A batched scale or bias (or BatchNorm mean/var) differs per example: the operator normalises
  with unit scale and zero bias (LayerNorm/RMSNorm take a scalar 1; InstanceNorm/GroupNorm
  vectors of ones and zeros), and the affine part is applied elementwise with the parameters
  broadcast (``[B, C]`` as ``[B, 1, C, 1, ...]``; GroupNorm-18's per-group ones in the grouped
  layout). BatchNorm with batched parameters is written elementwise entirely:
  ``x * a + (B - mean * a)`` with ``a = scale / sqrt(var + eps)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import float_attr, int_attr, ints_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import BatchRule, JvpRule, batch_rules, jvp_rules, lowerings
from onnax.core.shapes import broadcast_to
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

Tangents = Sequence[ir.Value | None]
Args = Sequence[ir.Value | None]
BatchResult = tuple[list[ir.Value | None], list[bool]]

_INT64_MAX = int(np.iinfo(np.int64).max)
_DEFAULT_EPS = 1e-5
_MVN_EPS = 1e-9  # the constant of MeanVarianceNormalization's function body

# The since_versions of each schema (onnx 1.23). Below 11 only the ones serving 11 matter:
# BatchNormalization 14 added training_mode, 15 separate types for scale/bias and mean/var;
# GroupNormalization 21 moved scale/bias from per group to per channel (and added stash_type);
# the other changes added element types only.
_VERSIONS: dict[str, tuple[int, ...]] = {
    "BatchNormalization": (9, 14, 15),
    "LayerNormalization": (17,),
    "InstanceNormalization": (6, 22),
    "GroupNormalization": (18, 21),
    "RMSNormalization": (23,),
    "LpNormalization": (1, 22),
    "MeanVarianceNormalization": (9, 13),
    "LRN": (1, 13),
}


# ------------------------------------------------------------------------------ helpers
def _f32(value: float) -> float:
    """A FLOAT attribute as the runtime sees it (stored as float32)."""
    return float(np.float32(value))


def _eps(node: ir.Node) -> float:
    return _f32(float_attr(node, "epsilon", _DEFAULT_EPS))


def _dtype(value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise InternalRuleError(f"value {value.name!r} has no dtype")
    return value.dtype


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _x(node: ir.Node) -> ir.Value:
    x = node.inputs[0]
    if x is None:
        raise InternalRuleError(f"{op_label(node)}: the data input is missing")
    return x


def _present(value: ir.Value) -> bool:
    """Whether an output is produced (an omitted optional output has an empty name)."""
    return bool(value.name) or bool(value.uses()) or value.is_graph_output()


def _rank(node: ir.Node, value: ir.Value) -> int:
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"the rank of {value.name!r}, input of {op_label(node)} ({node_label(node)}), is "
            "unknown after shape inference, and the derivative of this operator needs it to "
            "place its normalised axes. Remedy: give the model's inputs shapes of known rank "
            "(symbolic dimensions are fine)."
        )
    return value.shape.rank()


def _cast(em: Emitter, value: ir.Value, source: ir.DataType, target: ir.DataType) -> ir.Value:
    """``value`` (of element type ``source``) as ``target``; nothing when they agree."""
    return value if source == target else em.op("Cast", [value], {"to": target})


def _trailing_axes(node: ir.Node, x: ir.Value, axis: int) -> list[int]:
    """The axes ``axis..rank-1``; negative ones when ``axis`` is, which needs no rank."""
    if axis < 0:
        return list(range(axis, 0))
    return list(range(axis, _rank(node, x)))


def _per_channel(em: Emitter, v: ir.Value, rank: int) -> ir.Value:
    """A ``[C]`` vector as ``[C, 1, ..., 1]``, broadcasting along axis 1 of a rank-``rank`` value."""
    return em.unsqueeze(v, list(range(1, rank - 1)))


def _sum_shaped(
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
class _Standardized:
    """``xhat = (x - mean) * inv`` over ``axes`` (kept dimensions), from primal values."""

    axes: list[int]
    mean: ir.Value | None
    inv: ir.Value
    xhat: ir.Value
    var: ir.Value  # mean(d**2) (of x**2 for the RMS form), kept dimensions


def _standardize(
    em: Emitter,
    x: ir.Value,
    axes: list[int],
    eps: float,
    dtype: ir.DataType,
    *,
    center: bool = True,
) -> _Standardized:
    """Recomputes the statistics of ``x`` (element type ``dtype``) with a two-pass variance.

    ``center=False`` is the RMS form (no mean is subtracted).
    """
    mean = em.reduce("ReduceMean", x, axes, keepdims=True) if center else None
    d = em.op("Sub", [x, mean]) if mean is not None else x
    var = em.reduce("ReduceMean", em.op("Mul", [d, d]), axes, keepdims=True)
    inv = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [var, em.scalar(eps, dtype)])])])
    return _Standardized(axes, mean, inv, em.op("Mul", [d, inv]), var)


@dataclasses.dataclass(frozen=True)
class _StandardizedTangent:
    dxhat: ir.Value
    mean_t: ir.Value | None  # mean(t), the tangent of the mean (None for the RMS form)
    mean_xt: ir.Value  # mean(xhat * t)


def _standardized_tangent(em: Emitter, t: ir.Value, s: _Standardized) -> _StandardizedTangent:
    """``inv * (t - mean(t) - xhat * mean(xhat * t))`` (without ``mean(t)`` for RMS)."""
    mean_xt = em.reduce("ReduceMean", em.op("Mul", [t, s.xhat]), s.axes, keepdims=True)
    mean_t = None
    centered = t
    if s.mean is not None:
        mean_t = em.reduce("ReduceMean", t, s.axes, keepdims=True)
        centered = em.op("Sub", [t, mean_t])
    inner = em.op("Sub", [centered, em.op("Mul", [s.xhat, mean_xt])])
    return _StandardizedTangent(em.op("Mul", [inner, s.inv]), mean_t, mean_xt)


def _register(op_type: str, rule: JvpRule) -> None:
    for v in _VERSIONS[op_type]:
        jvp_rules.add(op_type, rule, since_version=v)


def _register_batch(op_type: str, rule: BatchRule) -> None:
    for v in _VERSIONS[op_type]:
        batch_rules.add(op_type, rule, since_version=v)


# ------------------------------------------------------------------------- BatchNormalization
def _refuse_training(node: ir.Node, opset: int, transform: str) -> None:
    """Raises for the training form (``training_mode=1`` or the outputs only training computes).

    jvp (and so vjp and grad) calls it only for the forms it does not differentiate: before
    opset 14, where training is told by the outputs (``mean``, ``var``, ``saved_mean``,
    ``saved_var``), and the extra outputs without ``training_mode=1``.
    """
    training = int_attr(node, "training_mode", 0)
    extra = [o.name or f"#{i + 1}" for i, o in enumerate(node.outputs[1:]) if _present(o)]
    if not training and not extra:
        return
    what = "training_mode=1" if training else f"the training-only outputs {extra}"
    raise UnsupportedOperatorError(
        f"{transform}: {op_label(node)} at opset {opset} ({node_label(node)}) is in training mode "
        f"({what}): it normalises with the mean and variance of the current batch and updates "
        f"running statistics, and {_SUPPORTED_FORMS[transform]}. Remedy: "
        "export the model in inference mode (e.g. model.eval() before torch.onnx.export), or "
        "convert it to opset 14 or newer, where training is the attribute training_mode=1 "
        "(onnx.version_converter.convert_version), or compute the batch statistics with "
        "ReduceMean over axes [0, 2, 3, ...] and normalise with Sub/Div/Sqrt (or "
        "InstanceNormalization/GroupNormalization when per-example statistics are meant)."
    )


_SUPPORTED_FORMS = {
    "jvp": "onnax differentiates the inference form and, from opset 14, training_mode=1",
    "vmap": "onnax batches the inference form and, from opset 14, training_mode=1",
}


def _batch_norm_training_jvp(
    em: Emitter, node: ir.Node, tangents: Tangents
) -> list[ir.Value | None]:
    """Training mode (opset 14+): the statistics are the batch's, over every axis but 1.

    ``y = xhat * scale + B`` with ``xhat`` standardised over ``[0, 2, 3, ...]`` (population
    variance, as the schema and onnxruntime); the running statistics are
    ``input * momentum + current * (1 - momentum)``, whose tangents are
    ``dinput * momentum + dcurrent * (1 - momentum)`` with ``dmean = mean(t)`` and
    ``dvar = 2 * mean(d * t) = 2 * mean(xhat * t) / inv``.
    """
    x, y = _x(node), node.outputs[0]
    dt, rank = _dtype(x), _rank(node, x)
    scale = node.inputs[1]
    assert scale is not None
    cast: list[ir.Value | None] = []
    for t, p in zip(tangents, node.inputs, strict=False):
        cast.append(None if t is None or p is None else _cast(em, t, _dtype(p), dt))
    cast.extend([None] * (5 - len(cast)))
    tx, ts, tb, tm, tv = cast
    outs: list[ir.Value | None] = [None] * len(node.outputs)
    wants_stats = [i < len(node.outputs) and _present(node.outputs[i]) for i in (1, 2)]
    if (
        tx is None
        and ts is None
        and tb is None
        and not ((wants_stats[0] and tm is not None) or (wants_stats[1] and tv is not None))
    ):
        return outs
    axes = [0, *range(2, rank)]
    s = _standardize(em, x, axes, _eps(node), dt)
    st = _standardized_tangent(em, tx, s) if tx is not None else None
    terms: list[ir.Value | None] = []
    if st is not None:
        terms.append(
            em.op("Mul", [st.dxhat, _per_channel(em, _cast(em, scale, _dtype(scale), dt), rank)])
        )
    if ts is not None:
        terms.append(em.op("Mul", [s.xhat, _per_channel(em, ts, rank)]))
    small = _per_channel(em, tb, rank) if tb is not None else None
    if terms or small is not None:
        outs[0] = _sum_shaped(em, terms, small, None, y)
    momentum = _f32(float_attr(node, "momentum", 0.9))
    currents: list[ir.Value | None] = [None, None]
    if st is not None:
        assert st.mean_t is not None
        two_over_inv = em.op("Div", [em.scalar(2.0, dt), s.inv])
        currents = [st.mean_t, em.op("Mul", [st.mean_xt, two_over_inv])]
    for k, (wanted, t_input, current) in enumerate(
        zip(wants_stats, (tm, tv), currents, strict=True)
    ):
        if not wanted or (t_input is None and current is None):
            continue
        parts: list[ir.Value | None] = []
        if t_input is not None:
            parts.append(em.op("Mul", [t_input, em.scalar(momentum, dt)]))
        if current is not None:
            flat = em.op("Reshape", [current, em.ints([-1])])
            parts.append(em.op("Mul", [flat, em.scalar(1.0 - momentum, dt)]))
        total = em.add_all(parts)
        assert total is not None
        stat = node.inputs[3 + k]
        assert stat is not None
        outs[1 + k] = _cast(em, total, dt, _dtype(stat))
    return outs


def _batch_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """See the module doc: ``t * a + xhat * (dscale - scale * inv**2 / 2 * dvar) + (dB - a * dmean)``."""
    if em.opset >= 14 and int_attr(node, "training_mode", 0):
        return _batch_norm_training_jvp(em, node, tangents)
    _refuse_training(node, em.opset, "jvp")
    x, y = _x(node), node.outputs[0]
    dt, rank = _dtype(x), _rank(node, x)
    params: list[ir.Value] = []
    for i in range(1, 5):
        p = node.inputs[i]
        assert p is not None
        params.append(_cast(em, p, _dtype(p), dt))
    scale, _, mean, var = params
    cast: list[ir.Value | None] = []
    for t, p in zip(tangents, node.inputs, strict=False):
        cast.append(None if t is None or p is None else _cast(em, t, _dtype(p), dt))
    tx, ts, tb, tm, tv = cast
    rest: list[ir.Value | None] = [None] * (len(node.outputs) - 1)
    if all(t is None for t in (tx, ts, tb, tm, tv)):
        return [None, *rest]
    inv = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [var, em.scalar(_eps(node), x)])])])
    a = em.op("Mul", [scale, inv])
    full: list[ir.Value | None] = []
    if tx is not None:
        factor = _per_channel(em, a, rank)
        channels = node.inputs[1].shape if node.inputs[1] is not None else None
        if channels is not None and channels.rank() == 1:
            # Declared so that the Conv before can take the factor into its weight in reverse
            # mode (rules/conv.py); emitted values carry no shapes until inference.
            factor.dtype, factor.shape = dt, ir.Shape([channels.dims[0], *[1] * (rank - 2)])
        full.append(em.op("Mul", [tx, factor]))
    # dscale and dvar both multiply xhat: combined per channel first.
    var_term = None
    if tv is not None:
        coef = em.op("Mul", [em.op("Mul", [scale, em.op("Mul", [inv, inv])]), em.scalar(-0.5, x)])
        var_term = em.op("Mul", [tv, coef])
    g = em.add_all([ts, var_term])
    if g is not None:
        xhat = em.op(
            "Mul",
            [
                em.op("Sub", [x, _per_channel(em, mean, rank)]),
                _per_channel(em, inv, rank),
            ],
        )
        full.append(em.op("Mul", [xhat, _per_channel(em, g, rank)]))
    # dB and dmean shift every element of a channel alike: combined per channel as well.
    shift = tb
    if tm is not None:
        moved = em.op("Mul", [tm, a])
        shift = em.op("Neg", [moved]) if tb is None else em.op("Sub", [tb, moved])
    small = _per_channel(em, shift, rank) if shift is not None else None
    return [_sum_shaped(em, full, small, None, y), *rest]


_register("BatchNormalization", _batch_norm_jvp)


# ------------------------------------------------------------------------- LayerNormalization
def _layer_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = _x(node), node.outputs[0]
    scale, bias = node.inputs[1], _input(node, 2)
    assert scale is not None
    tx = tangents[0]
    ts = tangents[1] if len(tangents) > 1 else None
    tb = tangents[2] if len(tangents) > 2 else None
    axes = _trailing_axes(node, x, int_attr(node, "axis", -1))
    s = _standardize(em, x, axes, _eps(node), _dtype(x))
    st = _standardized_tangent(em, tx, s) if tx is not None else None
    terms: list[ir.Value | None] = [
        em.op("Mul", [st.dxhat, scale]) if st is not None else None,
        em.op("Mul", [s.xhat, ts]) if ts is not None else None,
    ]
    outs: list[ir.Value | None] = [_sum_shaped(em, terms, tb, bias, y)]
    if len(node.outputs) > 1:
        mean_out, dmean = node.outputs[1], None
        if st is not None and st.mean_t is not None and _present(mean_out):
            dmean = _cast(em, st.mean_t, _dtype(x), _dtype(mean_out))
        outs.append(dmean)
    if len(node.outputs) > 2:
        inv_out = node.outputs[2]
        dinv = None
        if st is not None and _present(inv_out):
            coef = em.op("Neg", [em.op("Mul", [s.inv, s.inv])])
            dinv = _cast(em, em.op("Mul", [st.mean_xt, coef]), _dtype(x), _dtype(inv_out))
        outs.append(dinv)
    return outs


_register("LayerNormalization", _layer_norm_jvp)


# ------------------------------------------------------------------------- RMSNormalization
def _rms_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = _x(node), node.outputs[0]
    scale = node.inputs[1]
    assert scale is not None
    tx, ts = tangents[0], tangents[1] if len(tangents) > 1 else None
    if tx is None and ts is None:
        return [None]
    axes = _trailing_axes(node, x, int_attr(node, "axis", -1))
    s = _standardize(em, x, axes, _eps(node), _dtype(x), center=False)
    terms: list[ir.Value | None] = []
    if tx is not None:
        terms.append(em.op("Mul", [_standardized_tangent(em, tx, s).dxhat, scale]))
    if ts is not None:
        terms.append(em.op("Mul", [s.xhat, ts]))
    return [_sum_shaped(em, terms, None, None, y)]


_register("RMSNormalization", _rms_norm_jvp)


# -------------------------------------------------------- InstanceNormalization, GroupNormalization
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
        em.op("Mul", [dxhat, _per_channel(em, scale, rank)]) if dxhat is not None else None,
        em.op("Mul", [xhat, _per_channel(em, ts, rank)]) if ts is not None else None,
    ]
    small = _per_channel(em, tb, rank) if tb is not None else None
    return _sum_shaped(em, terms, small, None, out)


def _instance_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = _x(node), node.outputs[0]
    if all(t is None for t in tangents):
        return [None]
    rank = _rank(node, x)
    s = _standardize(em, x, list(range(2, rank)), _eps(node), _dtype(x))
    dxhat = _standardized_tangent(em, tangents[0], s).dxhat if tangents[0] is not None else None
    return [_channel_affine_tangent(em, node, dxhat, s.xhat, tangents, rank, y)]


_register("InstanceNormalization", _instance_norm_jvp)


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
        x, y = _x(node), node.outputs[0]
        if all(t is None for t in tangents):
            return [None]
        rank, groups = _rank(node, x), _num_groups(node)
        grouped = em.ints([0, groups, _group_size(x, groups)])
        s = _standardize(em, em.op("Reshape", [x, grouped]), [2], _eps(node), _dtype(x))
        tx = tangents[0]
        dxhat = None
        if tx is not None:
            dxhat = _standardized_tangent(em, em.op("Reshape", [tx, grouped]), s).dxhat
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


for _v, _per in ((18, False), (21, True)):
    jvp_rules.add("GroupNormalization", _group_norm_jvp(_per), since_version=_v)


# ------------------------------------------------------------------------- LpNormalization
def _lp_order(node: ir.Node, opset: int, transform: str) -> int:
    p = int_attr(node, "p", 2)
    if p not in (1, 2):
        raise UnsupportedOperatorError(
            f"{transform}: {op_label(node)} at opset {opset} ({node_label(node)}) has p={p}; ONNX "
            "defines LpNormalization for p=1 and p=2 only. Remedy: set p to 1 or 2, or write the "
            "normalisation as x / Pow(ReduceSum(Pow(Abs(x), p)), 1/p)."
        )
    return p


def _lp_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """``(t - y * sum(w * t)) / n``; 0 on a zero slice."""
    t = tangents[0]
    p = _lp_order(node, em.opset, "jvp")
    if t is None:
        return [None]
    x, y = _x(node), node.outputs[0]
    axes = [int_attr(node, "axis", -1)]
    norm = em.reduce("ReduceL2" if p == 2 else "ReduceL1", x, axes, keepdims=True)
    weights = y if p == 2 else em.op("Sign", [x])
    is_zero = em.op("Equal", [norm, em.scalar(0.0, x)])
    safe = em.op("Where", [is_zero, em.scalar(1.0, x), norm])
    inv = em.op("Where", [is_zero, em.scalar(0.0, x), em.op("Reciprocal", [safe])])
    projected = em.reduce_sum(em.op("Mul", [t, weights]), axes, keepdims=True)
    return [em.op("Mul", [em.op("Sub", [t, em.op("Mul", [y, projected])]), inv])]


_register("LpNormalization", _lp_norm_jvp)


# ------------------------------------------------------------------ MeanVarianceNormalization
def _mvn_axes(node: ir.Node) -> list[int]:
    axes = ints_attr(node, "axes", [0, 2, 3])
    assert axes is not None
    return axes


def _mvn_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """``(t - mean(t) - y * mean(t * d / s)) / (s + 1e-9)``."""
    t = tangents[0]
    if t is None:
        return [None]
    x, y = _x(node), node.outputs[0]
    axes = _mvn_axes(node)
    d = em.op("Sub", [x, em.reduce("ReduceMean", x, axes, keepdims=True)])
    std = em.op("Sqrt", [em.reduce("ReduceMean", em.op("Mul", [d, d]), axes, keepdims=True)])
    inv = em.op("Reciprocal", [em.op("Add", [std, em.scalar(_f32(_MVN_EPS), x)])])
    # A constant slice has std 0 (a kink of sqrt): d is 0 there too, so dividing by 1 instead
    # gives the unit vector 0 rather than 0/0.
    is_zero = em.op("Equal", [std, em.scalar(0.0, x)])
    unit = em.op("Div", [d, em.op("Where", [is_zero, em.scalar(1.0, x), std])])
    centered = em.op("Sub", [t, em.reduce("ReduceMean", t, axes, keepdims=True)])
    along = em.reduce("ReduceMean", em.op("Mul", [t, unit]), axes, keepdims=True)
    return [em.op("Mul", [em.op("Sub", [centered, em.op("Mul", [y, along])]), inv])]


_register("MeanVarianceNormalization", _mvn_jvp)


# ------------------------------------------------------------------------------------ LRN
def _lrn_size(node: ir.Node) -> int:
    size = node.attributes.get_int("size", None)
    if size is None or size < 1:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}) has size={size}; ONNX requires a positive "
            "size. Remedy: set the size attribute."
        )
    return size


def _window_sum(em: Emitter, z: ir.Value, size: int, rank: int) -> ir.Value:
    """``S[:, c] = sum(z[:, c - floor((size-1)/2) : c + ceil((size-1)/2) + 1])``, zero outside.

    Linear in ``z``: a zero ``Pad`` of the channel axis and ``size`` shifted ``Slice``s of the
    padded value (each ``C`` long: its end counts back from the padded end), added up.
    """
    if size == 1:
        return z
    before, after = (size - 1) // 2, size // 2
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    padded = em.op("Pad", [z, em.ints(pads)])
    pieces = [
        em.slice(padded, [k], [k - (size - 1) if k < size - 1 else _INT64_MAX], [1])
        for k in range(size)
    ]
    total = em.add_all(pieces)
    assert total is not None
    return total


def _lrn_lowering(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    """``y = x * exp(-beta * log(D))``, ``D = bias + alpha / size * W(x * x)``.

    A lowering rather than a jvp rule: differentiated, the primal is computed once from the
    pieces its derivative needs (``D`` and ``D**-beta``), and onnxruntime's LRN kernel, measured
    10x slower than these primitives (and slower than the whole derivative), is not run at
    all. ``exp(-beta * log(D))`` rather than ``Pow``: onnxruntime's Pow with a non-integer
    exponent is a scalar loop, twice as slow.
    """
    x = _x(node)
    size, rank = _lrn_size(node), _rank(node, x)
    alpha = _f32(float_attr(node, "alpha", 1e-4))
    beta = _f32(float_attr(node, "beta", 0.75))
    bias = _f32(float_attr(node, "bias", 1.0))
    square_sum = _window_sum(em, em.op("Mul", [x, x]), size, rank)
    base = em.op(
        "Add", [em.scalar(bias, x), em.op("Mul", [square_sum, em.scalar(alpha / size, x)])]
    )
    scale = em.op("Exp", [em.op("Mul", [em.op("Log", [base]), em.scalar(-beta, x)])])
    return [em.op("Mul", [x, scale])]


for _v in _VERSIONS["LRN"]:
    lowerings.add("LRN", _lrn_lowering, since_version=_v)


# ------------------------------------------------------------------------- batch rules
def _shift_axis(axis: int) -> int:
    """An axis of one example in the batched value: negative axes keep counting from the end."""
    return axis if axis < 0 else axis + 1


def _fold(bx: Batcher, x: ir.Value, original: ir.Value) -> tuple[ir.Value, ir.Value]:
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
        rest = bx.slice(full, [2], [_INT64_MAX], [0])
        fold_shape = bx.op("Concat", [bx.ints([-1]), rest], {"axis": 0})
    if isinstance(dims[0], int) and len(inner) == len(dims) - 1:
        restore = bx.batched_shape(bx.ints([dims[0], *inner]))
    else:
        restore = bx.op("Shape", [x])
    return bx.op("Reshape", [x, fold_shape]), restore


def _folded_batch(bx: Batcher, node: ir.Node, args: Args) -> ir.Value:
    """The operator applied with its data input's batch folded into the leading N axis."""
    x = args[0]
    assert x is not None
    folded, restore = _fold(bx, x, _x(node))
    y = bx.op(node.op_type, [folded, *args[1:]], attributes_of(node))
    return bx.op("Reshape", [y, restore])


def _channel_param(bx: Batcher, p: ir.Value, batched: bool, rank: int) -> ir.Value:
    """A per-channel parameter broadcasting along axis 1 of a rank-``rank`` example.

    ``[C]`` becomes ``[C, 1, ..., 1]``; a batched ``[B, C]`` becomes ``[B, 1, C, 1, ...]``.
    """
    if batched:
        return bx.unsqueeze(p, [1, *range(3, rank + 1)])
    return bx.unsqueeze(p, list(range(1, rank - 1)))


def _vector(bx: Batcher, value: float, length: ir.Value | int, like: ir.Value) -> ir.Value:
    """A 1-D vector of ``value`` of the given length in the element type of ``like``."""
    if isinstance(length, int):
        return bx.const(np.full((length,), value, dtype=_dtype(like).numpy()))
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
    x, original = args[0], _x(node)
    assert x is not None
    length = groups if groups is not None else _channels(bx, x, batched[0], original)
    ones, zeros = _vector(bx, 1.0, length, original), _vector(bx, 0.0, length, original)
    attrs = attributes_of(node)
    if not batched[0]:
        return bx.op(node.op_type, [x, ones, zeros], attrs)
    folded, restore = _fold(bx, x, original)
    return bx.op("Reshape", [bx.op(node.op_type, [folded, ones, zeros], attrs), restore])


def _instance_norm_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    if not any(batched[1:]):
        return [_folded_batch(bx, node, args)], [True]
    rank = _rank(node, _x(node))
    xhat = _normalized(bx, node, args, batched, None)
    scale, bias = args[1], args[2]
    assert scale is not None and bias is not None
    y = bx.op("Mul", [xhat, _channel_param(bx, scale, batched[1], rank)])
    return [bx.op("Add", [y, _channel_param(bx, bias, batched[2], rank)])], [True]


_register_batch("InstanceNormalization", _instance_norm_batch)


def _group_norm_batch(per_channel: bool) -> BatchRule:
    def rule(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
        if not any(batched[1:]):
            return [_folded_batch(bx, node, args)], [True]
        if per_channel:
            return _instance_norm_batch(bx, node, args, batched)
        # GroupNorm-18: per-group [G] / [B, G] parameters in the [(B,) N, G, K] layout.
        groups = _num_groups(node)
        original = _x(node)
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


for _v, _per in ((18, False), (21, True)):
    batch_rules.add("GroupNormalization", _group_norm_batch(_per), since_version=_v)


def _batch_norm_training_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Training mode per example: each example's statistics over its own axes ``0, 2, ...``.

    With the vmap axis at 0 those are axes ``1, 3, ...`` of the batched data; the running
    statistics come out ``[B, C]``.
    """
    original = _x(node)
    dt, rank = _dtype(original), _rank(node, original)
    x = args[0]
    assert x is not None
    x = bx.materialize(x, batched[0], original)
    params: list[ir.Value] = []
    for i in range(1, 5):
        p, o = args[i], node.inputs[i]
        assert p is not None and o is not None
        params.append(_cast(bx, p, _dtype(o), dt))
    scale, bias, input_mean, input_var = params
    s = _standardize(bx, x, [1, *range(3, rank + 1)], _eps(node), dt)
    y = bx.op("Mul", [s.xhat, _channel_param(bx, scale, batched[1], rank)])
    y = bx.op("Add", [y, _channel_param(bx, bias, batched[2], rank)])
    outs: list[ir.Value | None] = [y, None, None]
    wanted = [i < len(node.outputs) and _present(node.outputs[i]) for i in (1, 2)]
    if any(wanted):
        momentum = _f32(float_attr(node, "momentum", 0.9))
        assert s.mean is not None
        for k, (current, before) in enumerate(((s.mean, input_mean), (s.var, input_var))):
            if not wanted[k]:
                continue
            flat = bx.op("Reshape", [current, bx.ints([0, -1])])
            kept = bx.op("Mul", [before, bx.scalar(momentum, dt)])
            new = bx.op("Add", [kept, bx.op("Mul", [flat, bx.scalar(1.0 - momentum, dt)])])
            stat = node.inputs[3 + k]
            assert stat is not None
            outs[1 + k] = _cast(bx, new, dt, _dtype(stat))
    n = len(node.outputs)
    return outs[:n], [o is not None for o in outs[:n]]


def _batch_norm_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    if bx.opset >= 14 and int_attr(node, "training_mode", 0):
        return _batch_norm_training_batch(bx, node, args, batched)
    _refuse_training(node, bx.opset, "vmap")
    rest: list[ir.Value | None] = [None] * (len(node.outputs) - 1)
    if not any(batched[1:]):
        return [_folded_batch(bx, node, args), *rest], [True] * len(node.outputs)
    # Parameters that differ per example: elementwise, x * a + (B - mean * a).
    original = _x(node)
    dt, rank = _dtype(original), _rank(node, original)
    params = []
    for i in range(1, 5):
        p, o = args[i], node.inputs[i]
        assert p is not None and o is not None
        params.append(_cast(bx, p, _dtype(o), dt))
    scale, bias, mean, var = params
    bs, bb, bm, bv = batched[1:5]
    inv = bx.op("Reciprocal", [bx.op("Sqrt", [bx.op("Add", [var, bx.scalar(_eps(node), dt)])])])
    a = bx.op("Mul", [scale, inv])
    shift = bx.op("Sub", [bias, bx.op("Mul", [mean, a])])
    x = args[0]
    assert x is not None
    y = bx.op("Mul", [x, _channel_param(bx, a, bs or bv, rank)])
    y = bx.op("Add", [y, _channel_param(bx, shift, bb or bm or bs or bv, rank)])
    return [y, *rest], [True] * len(node.outputs)


_register_batch("BatchNormalization", _batch_norm_batch)


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
        scale, original, scale_0 = args[1], _x(node), node.inputs[1]
        assert scale is not None and scale_0 is not None
        one = bx.scalar(1.0, _dtype(scale_0))
        outs = bx.op_multi(
            node.op_type,
            [x, one],
            attributes_of(node, axis=_shift_axis(axis) if batched[0] else axis),
            num_outputs=n_out,
        )
        rank = _rank(node, original)
        y = bx.op("Mul", [outs[0], bx.align(scale, batched[1], scale_0, rank)])
        bias, bias_0 = (args[2], node.inputs[2]) if len(args) > 2 else (None, None)
        if bias is not None and bias_0 is not None:
            y = bx.op("Add", [y, bx.align(bias, batched[2], bias_0, rank)])
        if not has_stats:
            return [y], [True]
        return [y, *outs[1:]], [True] + [batched[0]] * (n_out - 1)

    return rule


_register_batch("LayerNormalization", _trailing_norm_batch(True))
_register_batch("RMSNormalization", _trailing_norm_batch(False))


def _lp_norm_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    _lp_order(node, bx.opset, "vmap")
    axis = _shift_axis(int_attr(node, "axis", -1))
    return [bx.op(node.op_type, list(args), attributes_of(node, axis=axis))], [True]


_register_batch("LpNormalization", _lp_norm_batch)


def _mvn_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    axes = [_shift_axis(a) for a in _mvn_axes(node)]
    return [bx.op(node.op_type, list(args), attributes_of(node, axes=axes))], [True]


_register_batch("MeanVarianceNormalization", _mvn_batch)


def _lrn_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    return [_folded_batch(bx, node, args)], [True]


_register_batch("LRN", _lrn_batch)
