"""BatchNormalization: its jvp rules (inference and training form) and batch rules.

**Inference form** (opset 9 on): ``y = (x - mean) * a + B`` with ``a = scale / sqrt(var + eps)``
per channel (axis 1). The tangent is
``t * a + xhat * (dscale - scale * inv**2 / 2 * dvar) + (dB - a * dmean)``, the per-channel
parts combined in ``[C]`` space before one ``Unsqueeze`` to ``[C, 1, ..., 1]``. It is expressed
with linear operators on tangents only (``Mul`` by primal coefficients, ``Add``, ``Sub``,
``Neg``, ``Unsqueeze``, ``Expand``, ``Cast``), so reverse mode comes from the existing
transposes and the operator needs no transpose rule.

**Training mode** (``training_mode=1``, opset 14+) standardises with the batch's statistics over
every axis but 1, like LayerNormalization over those axes (see :mod:`onnax.rules.norm` for the
standardisation's tangent), and its running-statistics outputs
``input * momentum + current * (1 - momentum)`` get tangents too; under vmap each example takes
the statistics of its own batch. Before opset 14 training is told by the extra outputs
(``mean``, ``var``, ``saved_mean``, ``saved_var``): refused with a remedy.

**Element types.** From opset 15 the scale/bias and mean/var may have other element types than
``X``: they (and their tangents) are cast to ``X``'s type (onnxruntime has no such mixed kernel
for float/double to test it). Opsets 14 and 15 are told apart inside the rules, so one
registration at 9 serves them all.

**Batch rule** (vmap, batch axis first). The inference form treats every row of the leading
``N`` axis alike, so when only ``X`` is batched the batch is folded into it: ``[B, N, C, ...]``
is reshaped to ``[B*N, C, ...]``, the operator applied, and the result reshaped back. With
batched parameters (scale, bias, mean or var differ per example) it is written elementwise:
``x * a + (B - mean * a)`` with ``a = scale / sqrt(var + eps)``, the ``[B, C]`` parameters
broadcast as ``[B, 1, C, 1, ...]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import float_attr, int_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._normalization import (
    along_channels,
    cast_to,
    channel_param,
    data_input,
    dtype_of,
    epsilon,
    f32,
    folded_batch,
    is_present,
    known_rank,
    standardize,
    standardized_tangent,
    sum_shaped,
)

__all__: list[str] = []

batch_norm = OpRules("BatchNormalization", since=9)


def _refuse_training(node: ir.Node, opset: int, transform: str) -> None:
    """Raises for the training form (``training_mode=1`` or the outputs only training computes).

    jvp (and so vjp and grad) calls it only for the forms it does not differentiate: before
    opset 14, where training is told by the outputs (``mean``, ``var``, ``saved_mean``,
    ``saved_var``), and the extra outputs without ``training_mode=1``.
    """
    training = int_attr(node, "training_mode", 0)
    extra = [o.name or f"#{i + 1}" for i, o in enumerate(node.outputs[1:]) if is_present(o)]
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
    x, y = data_input(node), node.outputs[0]
    dt, rank = dtype_of(x), known_rank(node, x)
    scale = node.inputs[1]
    assert scale is not None
    cast: list[ir.Value | None] = []
    for t, p in zip(tangents, node.inputs, strict=False):
        cast.append(None if t is None or p is None else cast_to(em, t, dtype_of(p), dt))
    cast.extend([None] * (5 - len(cast)))
    tx, ts, tb, tm, tv = cast
    outs: list[ir.Value | None] = [None] * len(node.outputs)
    wants_stats = [i < len(node.outputs) and is_present(node.outputs[i]) for i in (1, 2)]
    if (
        tx is None
        and ts is None
        and tb is None
        and not ((wants_stats[0] and tm is not None) or (wants_stats[1] and tv is not None))
    ):
        return outs
    axes = [0, *range(2, rank)]
    s = standardize(em, x, axes, epsilon(node), dt)
    st = standardized_tangent(em, tx, s) if tx is not None else None
    terms: list[ir.Value | None] = []
    if st is not None:
        terms.append(
            em.op(
                "Mul", [st.dxhat, along_channels(em, cast_to(em, scale, dtype_of(scale), dt), rank)]
            )
        )
    if ts is not None:
        terms.append(em.op("Mul", [s.xhat, along_channels(em, ts, rank)]))
    small = along_channels(em, tb, rank) if tb is not None else None
    if terms or small is not None:
        outs[0] = sum_shaped(em, terms, small, None, y)
    momentum = f32(float_attr(node, "momentum", 0.9))
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
        outs[1 + k] = cast_to(em, total, dt, dtype_of(stat))
    return outs


def _unit_batch_norm(em: Emitter, node: ir.Node) -> ir.Value:
    """``xhat = (x - mean) / sqrt(var + eps)``: the node's own operator with unit scale, zero bias.

    One fused kernel reading ``x`` once, instead of Sub and Mul over the data (and the Unsqueezes
    of mean and inv) in the forward sweep.
    """
    scale = node.inputs[1]
    assert scale is not None
    dims = scale.shape.dims if scale.shape is not None else ()
    if len(dims) == 1 and isinstance(dims[0], int):
        ones = em.const(np.ones((dims[0],), dtype=dtype_of(scale).numpy()))
        zeros = em.const(np.zeros((dims[0],), dtype=dtype_of(scale).numpy()))
    else:
        length = em.op("Shape", [scale])
        ones = em.op("Expand", [em.scalar(1.0, scale), length])
        zeros = em.op("Expand", [em.scalar(0.0, scale), length])
    xhat = em.op(
        "BatchNormalization",
        [data_input(node), ones, zeros, node.inputs[3], node.inputs[4]],
        {"epsilon": epsilon(node)},
    )
    xhat.dtype = dtype_of(data_input(node))
    return xhat


def _channel_factor(em: Emitter, node: ir.Node) -> ir.Value | None:
    """``scale / sqrt(var + eps)`` as ``[C, 1, ...]`` (``[1, C]`` for rank 2), or None.

    The node's own operator on a ``[1, C]`` of ones with zero bias and mean computes it in one
    kernel, where Add, Sqrt, Reciprocal, Mul and an Unsqueeze would take five nodes. None when
    the number of channels or the rank is not static.
    """
    x, scale, var = data_input(node), node.inputs[1], node.inputs[4]
    assert scale is not None and var is not None
    dims = scale.shape.dims if scale.shape is not None else ()
    if len(dims) != 1 or not isinstance(dims[0], int) or x.shape is None:
        return None
    channels, rank = dims[0], x.shape.rank()
    ones = em.const(np.ones((1, channels), dtype=dtype_of(x).numpy()))
    bias = em.const(np.zeros((channels,), dtype=dtype_of(scale).numpy()))
    mean = em.const(np.zeros((channels,), dtype=dtype_of(var).numpy()))
    row = em.op("BatchNormalization", [ones, scale, bias, mean, var], {"epsilon": epsilon(node)})
    row.dtype, row.shape = dtype_of(x), ir.Shape([1, channels])
    if rank == 2:
        return row
    factor = em.op("Reshape", [row, em.ints([channels, *[1] * (rank - 2)])])
    # Declared so that the Conv before can take the factor into its weight in reverse mode
    # (rules/conv.py); emitted values carry no shapes until inference.
    factor.dtype, factor.shape = dtype_of(x), ir.Shape([channels, *[1] * (rank - 2)])
    return factor


def _channel_tangent(em: Emitter, t: ir.Value, rank: int) -> ir.Value:
    """A ``[C]`` tangent as ``[1, C, 1, ...]``, of the data's rank.

    Of full rank, its cotangent is one ReduceSum over the broadcast axes (no leading axes to
    sum apart), which the Unsqueeze's transpose then folds into a ReduceSum without kept
    dimensions.
    """
    return em.unsqueeze(t, [0, *range(2, rank)])


@batch_norm.jvp
def _batch_norm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """See the module doc: ``t * a + xhat * (dscale - scale * inv**2 / 2 * dvar) + (dB - a * dmean)``."""
    if em.opset >= 14 and int_attr(node, "training_mode", 0):
        return _batch_norm_training_jvp(em, node, tangents)
    _refuse_training(node, em.opset, "jvp")
    x, y = data_input(node), node.outputs[0]
    dt, rank = dtype_of(x), known_rank(node, x)
    params: list[ir.Value] = []
    for i in range(1, 5):
        p = node.inputs[i]
        assert p is not None
        params.append(cast_to(em, p, dtype_of(p), dt))
    scale, _, _, var = params
    cast: list[ir.Value | None] = []
    for t, p in zip(tangents, node.inputs, strict=False):
        cast.append(None if t is None or p is None else cast_to(em, t, dtype_of(p), dt))
    tx, ts, tb, tm, tv = cast
    rest: list[ir.Value | None] = [None] * (len(node.outputs) - 1)
    if all(t is None for t in (tx, ts, tb, tm, tv)):
        return [None, *rest]
    full: list[ir.Value | None] = []
    # The usual case, running statistics not differentiated, needs the factor alone.
    factor_row = _channel_factor(em, node) if tx is not None and tm is None and tv is None else None
    if factor_row is not None:
        assert tx is not None
        full.append(em.op("Mul", [tx, factor_row]))
    inv = em.op("Reciprocal", [em.op("Sqrt", [em.op("Add", [var, em.scalar(epsilon(node), x)])])])
    a = em.op("Mul", [scale, inv])  # left for dead-code elimination when factor_row serves
    if tx is not None and factor_row is None:
        factor = along_channels(em, a, rank)
        channels = node.inputs[1].shape if node.inputs[1] is not None else None
        if channels is not None and channels.rank() == 1:
            # Declared so that the Conv before can take the factor into its weight in reverse
            # mode (rules/conv.py); emitted values carry no shapes until inference.
            factor.dtype, factor.shape = dt, ir.Shape([channels.dims[0], *[1] * (rank - 2)])
        full.append(em.op("Mul", [tx, factor]))
    # dscale and dvar both multiply xhat: combined per channel first. The coefficient of dvar,
    # -scale * inv**2 / 2, is a * inv * -1/2.
    var_term = None
    if tv is not None:
        coef = em.op("Mul", [a, em.op("Mul", [inv, em.scalar(-0.5, x)])])
        var_term = em.op("Mul", [tv, coef])
    g = em.add_all([ts, var_term])
    if g is not None:
        full.append(em.op("Mul", [_unit_batch_norm(em, node), _channel_tangent(em, g, rank)]))
    # dB and dmean shift every element of a channel alike: combined per channel as well.
    shift = tb
    if tm is not None:
        moved = em.op("Mul", [tm, a])
        shift = em.op("Neg", [moved]) if tb is None else em.op("Sub", [tb, moved])
    small = _channel_tangent(em, shift, rank) if shift is not None else None
    return [sum_shaped(em, full, small, None, y), *rest]


def _batch_norm_training_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Training mode per example: each example's statistics over its own axes ``0, 2, ...``.

    With the vmap axis at 0 those are axes ``1, 3, ...`` of the batched data; the running
    statistics come out ``[B, C]``.
    """
    original = data_input(node)
    dt, rank = dtype_of(original), known_rank(node, original)
    x = args[0]
    assert x is not None
    x = bx.materialize(x, batched[0], original)
    params: list[ir.Value] = []
    for i in range(1, 5):
        p, o = args[i], node.inputs[i]
        assert p is not None and o is not None
        params.append(cast_to(bx, p, dtype_of(o), dt))
    scale, bias, input_mean, input_var = params
    s = standardize(bx, x, [1, *range(3, rank + 1)], epsilon(node), dt)
    y = bx.op("Mul", [s.xhat, channel_param(bx, scale, batched[1], rank)])
    y = bx.op("Add", [y, channel_param(bx, bias, batched[2], rank)])
    outs: list[ir.Value | None] = [y, None, None]
    wanted = [i < len(node.outputs) and is_present(node.outputs[i]) for i in (1, 2)]
    if any(wanted):
        momentum = f32(float_attr(node, "momentum", 0.9))
        assert s.mean is not None and s.var is not None
        for k, (current, before) in enumerate(((s.mean, input_mean), (s.var, input_var))):
            if not wanted[k]:
                continue
            flat = bx.op("Reshape", [current, bx.ints([0, -1])])
            kept = bx.op("Mul", [before, bx.scalar(momentum, dt)])
            new = bx.op("Add", [kept, bx.op("Mul", [flat, bx.scalar(1.0 - momentum, dt)])])
            stat = node.inputs[3 + k]
            assert stat is not None
            outs[1 + k] = cast_to(bx, new, dt, dtype_of(stat))
    n = len(node.outputs)
    return outs[:n], [o is not None for o in outs[:n]]


@batch_norm.batch
def _batch_norm_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    if bx.opset >= 14 and int_attr(node, "training_mode", 0):
        return _batch_norm_training_batch(bx, node, args, batched)
    _refuse_training(node, bx.opset, "vmap")
    rest: list[ir.Value | None] = [None] * (len(node.outputs) - 1)
    if not any(batched[1:]):
        return [folded_batch(bx, node, args), *rest], [True] * len(node.outputs)
    # Parameters that differ per example: elementwise, x * a + (B - mean * a).
    original = data_input(node)
    dt, rank = dtype_of(original), known_rank(node, original)
    params = []
    for i in range(1, 5):
        p, o = args[i], node.inputs[i]
        assert p is not None and o is not None
        params.append(cast_to(bx, p, dtype_of(o), dt))
    scale, bias, mean, var = params
    bs, bb, bm, bv = batched[1:5]
    inv = bx.op("Reciprocal", [bx.op("Sqrt", [bx.op("Add", [var, bx.scalar(epsilon(node), dt)])])])
    a = bx.op("Mul", [scale, inv])
    shift = bx.op("Sub", [bias, bx.op("Mul", [mean, a])])
    x = args[0]
    assert x is not None
    y = bx.op("Mul", [x, channel_param(bx, a, bs or bv, rank)])
    y = bx.op("Add", [y, channel_param(bx, shift, bb or bm or bs or bv, rank)])
    return [y, *rest], [True] * len(node.outputs)
