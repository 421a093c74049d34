"""Loss operators.

Covered: NegativeLogLikelihoodLoss (12, 13, 22) and SoftmaxCrossEntropyLoss (12, 13).

Semantics (onnx's reference implementation and onnxruntime): with ``x`` of shape
``[N, C, d...]``, targets ``t`` of shape ``[N, d...]``, optional class weights ``w`` ``[C]`` and
``keep = (t != ignore_index)`` (all ones without ``ignore_index``), the unreduced loss is
``l = -x[n, t, d] * w[t] * keep``; ``sum`` adds it up, ``mean`` divides that sum by
``sum(w[t] * keep)`` (by ``sum(keep)`` without weights). SoftmaxCrossEntropyLoss is the same with
``x = log_softmax(scores, axis=1)``, its optional second output.

jvp rules. The loss is linear in ``x`` and, for ``none``/``sum``, in ``w``; ``mean`` is the ratio
``S / W`` whose tangent is ``sum(dx_sel * c_x + dw_sel * keep * (-x_sel - L)) / W``. The selected
tangents are ``GatherElements`` of the input tangent with the (ignore-safe) targets along axis 1
and ``Gather`` of the weight tangent with them, so the linear part uses only ``GatherElements``,
``Gather``, ``Squeeze``/``Unsqueeze``, ``Mul``, ``Div``, ``Sub``, ``Add`` and ``ReduceSum``, all
transposable elsewhere in onnax. For SoftmaxCrossEntropyLoss the tangent of ``log_prob`` is
``ts - sum(p * ts, axis 1)`` with ``p = exp(log_prob)``; ``log_prob`` is recomputed as
``scores - ReduceLogSumExp(scores, axis 1)`` (LogSoftmax before opset 13 would flatten the trailing
axes).

Batch rules (vmap). The batch is folded into ``N`` (``[B, N, ...] -> [B*N, ...]``; a shared input
or target is materialized first) and the operator applied with reduction ``none``; the result is
reshaped to ``[B, N, d...]`` and, for ``sum``/``mean``, reduced per example (``mean`` divides by
the per-example sum of the selected weights, ``Gather`` of the weights with the ignore-safe
targets, masked with ``keep``). Batched weights (one weight vector per example) are applied after
the folded unweighted operator, selected with ``GatherElements`` per example.

Targets equal to ``ignore_index`` are replaced by 0 before any gather (``ignore_index`` may be out
of range); their contributions are masked out. A ``mean`` over targets that are all ignored divides
by zero, in the primal as in the derivative.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.rules._patterns import attributes_of

__all__: list[str] = []


def _dtype(value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise InternalRuleError(f"value {value.name!r} has no dtype")
    return value.dtype


def _reduction(node: ir.Node) -> str:
    return node.attributes.get_string("reduction", "mean")


def _ignore_index(node: ir.Node) -> int | None:
    attr = node.attributes.get("ignore_index")
    return None if attr is None else attr.as_int()


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


def _safe_targets(
    em: Emitter,
    target: ir.Value,
    ignore: int | None,
    like: ir.Value,
    target_like: ir.Value | None = None,
) -> tuple[ir.Value, ir.Value | None]:
    """Targets with ``ignore_index`` replaced by 0, and ``keep`` (1/0 in ``like``'s type).

    ``keep`` is None when there is no ``ignore_index`` (nothing is masked). ``like`` and
    ``target_like`` (default ``target``) are original values giving the element types (batched
    values may not carry them).
    """
    if ignore is None:
        return target, None
    int_type = _dtype(target_like or target).numpy()
    ignored = em.op("Equal", [target, em.const(np.array(ignore, int_type))])
    safe = em.op("Where", [ignored, em.const(np.array(0, int_type)), target])
    keep = em.op("Cast", [em.op("Not", [ignored])], {"to": int(_dtype(like))})
    return safe, keep


def _times(em: Emitter, a: ir.Value, b: ir.Value | None) -> ir.Value:
    return a if b is None else em.op("Mul", [a, b])


def _select(em: Emitter, v: ir.Value, safe: ir.Value) -> ir.Value:
    """``v[n, safe[n, d], d]``: the entries of the targeted classes, shaped like the targets."""
    index = em.unsqueeze(safe, [1])
    return em.squeeze(em.op("GatherElements", [v, index], {"axis": 1}), [1])


def _nll_tangent(
    em: Emitter,
    node: ir.Node,
    x: ir.Value,
    tx: ir.Value | None,
    tw: ir.Value | None,
) -> ir.Value | None:
    """Tangent of the NLL loss of log-probabilities ``x`` (tangent ``tx``).

    The targets, weights (tangent ``tw``), reduction and ignore_index are ``node``'s.
    """
    if tx is None and tw is None:
        return None
    target, weight = node.inputs[1], _input(node, 2)
    assert target is not None
    reduction = _reduction(node)
    x_in = node.inputs[0]
    assert x_in is not None
    safe, keep = _safe_targets(em, target, _ignore_index(node), x_in)
    # Per-element weight of the unreduced loss: w[t] * keep (None: all ones).
    selected_w = None if weight is None else em.op("Gather", [weight, safe])
    factor = keep if selected_w is None else _times(em, selected_w, keep)
    terms: list[ir.Value | None] = []
    if tx is not None:
        dx_sel = _select(em, tx, safe)
        coef = em.op("Neg", [factor]) if factor is not None else None
        terms.append(em.op("Neg", [dx_sel]) if coef is None else em.op("Mul", [dx_sel, coef]))
    if tw is not None:
        assert weight is not None
        neg_x = em.op("Neg", [_select(em, x, safe)])
        if reduction == "mean":
            neg_x = em.op("Sub", [neg_x, node.outputs[0]])
        coef_w = _times(em, neg_x, keep)
        terms.append(em.op("Mul", [em.op("Gather", [tw, safe]), coef_w]))
    d_none = em.add_all(terms)
    assert d_none is not None
    if reduction == "none":
        return d_none
    if reduction == "sum":
        return em.reduce_sum(d_none, None, keepdims=False)
    if factor is None:
        return em.reduce("ReduceMean", d_none, None, keepdims=False)
    total = em.reduce_sum(factor, None, keepdims=False)
    return em.op("Div", [em.reduce_sum(d_none, None, keepdims=False), total])


# ------------------------------------------------------------------------- batching a loss
def _fold(bx: Batcher, v: ir.Value) -> ir.Value:
    """``[B, N, rest...] -> [B*N, rest...]``."""
    rest = bx.slice(bx.op("Shape", [v]), [2], [2**62], [0])
    return bx.op("Reshape", [v, bx.op("Concat", [bx.ints([-1]), rest], {"axis": 0})])


def _loss_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    x_orig, t_orig = node.inputs[0], node.inputs[1]
    x_arg, t_arg = args[0], args[1]
    assert x_orig is not None and t_orig is not None and x_arg is not None and t_arg is not None
    x = bx.materialize(x_arg, batched[0], x_orig)
    target = bx.materialize(t_arg, batched[1], t_orig)
    weight = args[2] if len(args) > 2 else None
    weight_batched = weight is not None and batched[2]
    reduction, ignore = _reduction(node), _ignore_index(node)
    n_out = len(node.outputs)

    inputs: list[ir.Value | None] = [_fold(bx, x), _fold(bx, target)]
    if weight is not None and not weight_batched:
        inputs.append(weight)
    outs = bx.op_multi(
        node.op_type,
        inputs,
        attributes_of(node, reduction="none"),
        num_outputs=n_out,
    )
    loss = bx.op("Reshape", [outs[0], bx.op("Shape", [target])])
    results: list[ir.Value | None] = []

    safe, keep = _safe_targets(bx, target, ignore, x_orig, t_orig)
    factor = keep
    if weight is not None:
        if weight_batched:
            # One weight vector per example: select with the flattened targets of each example.
            flat = bx.op("Reshape", [safe, bx.ints([0, -1])])
            picked = bx.op("GatherElements", [weight, flat], {"axis": 1})
            selected = bx.op("Reshape", [picked, bx.op("Shape", [target])])
            loss = bx.op("Mul", [loss, selected])
        else:
            selected = bx.op("Gather", [weight, safe])
        factor = _times(bx, selected, keep)

    axes = list(range(1, bx.rank(t_orig) + 1))
    if reduction == "none":
        results.append(loss)
    elif reduction == "sum":
        results.append(bx.reduce_sum(loss, axes, keepdims=False))
    elif factor is None:
        results.append(bx.reduce("ReduceMean", loss, axes, keepdims=False))
    else:
        total = bx.reduce_sum(factor, axes, keepdims=False)
        results.append(bx.op("Div", [bx.reduce_sum(loss, axes, keepdims=False), total]))
    if n_out > 1:
        results.append(bx.op("Reshape", [outs[1], bx.op("Shape", [x])]))
    return results, [True] * n_out


# ------------------------------------------------------------------------- the operators
# Each is registered once, from its first version: the later ones (13, and 22 for
# NegativeLogLikelihoodLoss) changed nothing the rules depend on.
nll_loss = OpRules("NegativeLogLikelihoodLoss", since=12)
nll_loss.batch(_loss_batch)


@nll_loss.jvp
def _nll_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x = node.inputs[0]
    assert x is not None
    tw = tangents[2] if len(tangents) > 2 else None
    return [_nll_tangent(em, node, x, tangents[0], tw)]


sce_loss = OpRules("SoftmaxCrossEntropyLoss", since=12)
sce_loss.batch(_loss_batch)


@sce_loss.jvp
def _sce_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    scores = node.inputs[0]
    assert scores is not None
    ts = tangents[0]
    tw = tangents[2] if len(tangents) > 2 else None
    if ts is None and tw is None:
        return [None] * len(node.outputs)
    lse = em.reduce("ReduceLogSumExp", scores, [1], keepdims=True)
    log_prob = em.op("Sub", [scores, lse])
    d_log_prob = None
    if ts is not None:
        p = em.op("Exp", [log_prob])
        expected = em.reduce_sum(em.op("Mul", [ts, p]), [1], keepdims=True)
        d_log_prob = em.op("Sub", [ts, expected])
    outs = [_nll_tangent(em, node, log_prob, d_log_prob, tw)]
    if len(node.outputs) > 1:
        outs.append(d_log_prob)
    return outs
