"""The training step: ``grad`` of the loss, then the optimizer update, as one ONNX model.

Three builders share one layout (:mod:`onnax.training.state` reads it back):

* :func:`step`: ``(batch, targets, params, state, step, lr) -> (loss, params', state', step')``;
* :func:`accumulation`: a micro-batch model ``(batch, targets, params, sums) -> (loss, sums')``
  that adds each micro-batch's gradient into FLOAT buffers, and an apply model
  ``(params, sums, micro_batches, state, step, lr) -> (params', state', step')`` that updates
  with their mean.

FLOAT16/BFLOAT16 parameters train as FLOAT master weights: the graph input is the FLOAT master,
cast to the half type where the model reads it; gradients are cast to FLOAT (after an optional
static loss scale is divided out) and the optimizer runs in FLOAT.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from onnax.api import grad
from onnax.core.selection import HALF_TYPES, format_shape, is_float
from onnax.errors import SelectionError
from onnax.training._build import Builder, model_names, opset_of
from onnax.training.optimizers import SGD, Adam, AdamW, Optimizer
from onnax.training.params import lift_params, select_params
from onnax.training.state import METADATA_KEY
from onnax.training.update import Trainable, append_update, new_input, new_output

__all__ = ["accumulation", "step"]


def step(
    model: ir.Model,
    loss: str = "loss",
    params: str | Sequence[str] | None = None,
    frozen: str | Sequence[str] = (),
    optimizer: Optimizer | None = None,
    *,
    max_grad_norm: float | None = None,
    loss_scale: float = 1.0,
) -> ir.Model:
    """One training step as a single plain-ONNX model.

    Inputs, in order: the model's own inputs (batch, targets), every trained parameter (named as
    its initializer, holding the current value, with the initial value stored as its default),
    the optimizer state (``<param>.<state>``, named as ``torch.optim``'s state:
    ``momentum_buffer``, ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``), ``step`` (INT64, the
    number of updates already made) and ``lr`` (FLOAT, default ``optimizer.lr``). Outputs: the
    loss (as computed *before* the update), the new parameters (``<param>.new``), the new state
    (``<state>.new``) and ``step.new``. :func:`onnax.training.carry` lists which output feeds which
    input next time; :func:`onnax.training.initial_state` gives the step-0 values.

    Args:
        model: A model with a rank-0 loss output (see :func:`onnax.training.add_loss`); not
            modified.
        loss: The name of the loss output.
        params: Names or fnmatch patterns of the initializers to train (None: every float
            initializer but BatchNormalization running statistics).
        frozen: Names or fnmatch patterns of initializers to keep constant.
        optimizer: :class:`SGD`, :class:`Adam` or :class:`AdamW` (default ``AdamW()``).
        max_grad_norm: Clip the gradients to this global 2-norm first, as
            ``torch.nn.utils.clip_grad_norm_``.
        loss_scale: Differentiate ``loss * loss_scale`` and divide the gradients by it in FLOAT:
            a static loss scale that keeps small FLOAT16 gradients from flushing to zero.

    Returns:
        The training model.

    Raises:
        SelectionError: Unknown or non-scalar loss, params or frozen entries that match nothing,
            non-float params.
        UnsupportedOperatorError: ``grad`` meets an operator without a rule.
        InvalidModelError: The model's opset is below 13.
    """
    opt = _check_optimizer(optimizer, "step")
    g, trainables, record = _gradient_model(model, loss, params, frozen, loss_scale, "step")
    b = Builder(g.graph, model_names(g))
    io = append_update(b, trainables, opt, _check_clip(max_grad_norm, "step"))
    loss_value = {v.name: v for v in g.graph.outputs}[loss]
    _finish(g, [loss_value, *io.outputs], trainables)
    record.update(
        kind="step",
        carry=io.carry,
        state=io.state,
        step=io.step,
        lr=io.lr,
        optimizer=repr(opt),
    )
    g.metadata_props[METADATA_KEY] = json.dumps(record)
    return g


def accumulation(
    model: ir.Model,
    loss: str = "loss",
    params: str | Sequence[str] | None = None,
    frozen: str | Sequence[str] = (),
    optimizer: Optimizer | None = None,
    *,
    max_grad_norm: float | None = None,
    loss_scale: float = 1.0,
) -> tuple[ir.Model, ir.Model]:
    """Gradient accumulation: a micro-batch model and an apply model.

    The micro-batch model takes the model's inputs, the parameters and one FLOAT gradient sum per
    parameter (``<param>.grad_sum``) and returns the loss and the sums plus this micro-batch's
    gradient (``<param>.grad_sum.new``). The apply model takes the parameters, the sums, the
    number of micro-batches they hold (``micro_batches``, INT64), the optimizer state, ``step``
    and ``lr``, and updates with the mean gradient, exactly as :func:`step` would with that
    gradient: with a ``mean`` loss over equal micro-batches, k micro-batches and one apply are
    one :func:`step` on the whole batch. Clipping applies to the mean gradient.

    Args:
        model: As for :func:`step`.
        loss: As for :func:`step`.
        params: As for :func:`step`.
        frozen: As for :func:`step`.
        optimizer: As for :func:`step`.
        max_grad_norm: As for :func:`step`.
        loss_scale: As for :func:`step`.

    Returns:
        ``(micro_batch_model, apply_model)``; both carry records, so
        :func:`onnax.training.initial_state` works on each (zero sums for the micro-batch model).

    Raises:
        As :func:`step`.
    """
    opt = _check_optimizer(optimizer, "accumulation")
    clip = _check_clip(max_grad_norm, "accumulation")
    what = "accumulation"
    g, trainables, record = _gradient_model(model, loss, params, frozen, loss_scale, what)
    b = Builder(g.graph, model_names(g))
    sums_out, micro_carry, sum_names = [], [], {}
    for t in trainables:
        total = new_input(
            b, f"{t.value.name}.grad_sum", t.grad.dtype or ir.DataType.FLOAT, t.value.shape
        )
        out = new_output(b, b.op("Add", total, t.grad), f"{total.name}.new", total)
        sums_out.append(out)
        micro_carry.append((str(total.name), str(out.name)))
        sum_names[t.name] = str(total.name)
    loss_value = {v.name: v for v in g.graph.outputs}[loss]
    _finish(g, [loss_value, *sums_out], trainables)
    micro_record = dict(record, kind="micro_batch", carry=micro_carry, grad_sums=sum_names)
    g.metadata_props[METADATA_KEY] = json.dumps(micro_record)
    apply = _apply_model(g, trainables, sum_names, opt, clip, record)
    return g, apply


def _apply_model(
    micro: ir.Model,
    trainables: list[Trainable],
    sum_names: dict[str, str],
    opt: Optimizer,
    clip: float | None,
    record: dict[str, Any],
) -> ir.Model:
    """The update half of accumulation, a graph of its own over the same names."""
    graph = ir.Graph([], [], nodes=[], opset_imports=dict(micro.opset_imports), name="apply")
    b = Builder(graph, set())
    count = new_input(b, "micro_batches", ir.DataType.INT64, ir.Shape([]))
    count.const_value = ir.tensor(np.array(1, dtype=np.int64), name=count.name)
    graph.register_initializer(count)
    inner: list[Trainable] = []
    for t in trainables:
        p = ir.Value(name=b.fresh(str(t.value.name)), type=t.value.type, shape=t.value.shape)
        graph.inputs.append(p)
        init = micro.graph.initializers.get(str(t.value.name))
        if init is not None and init.const_value is not None:
            # A tensor of its own: the two models must not share objects a pass may rename.
            p.const_value = ir.tensor(init.const_value.numpy(), name=str(p.name))
            graph.register_initializer(p)
        total = ir.Value(name=b.fresh(sum_names[t.name]), type=t.grad.type, shape=t.value.shape)
        graph.inputs.append(total)
        dtype = t.grad.dtype or ir.DataType.FLOAT
        mean = b.op("Div", total, b.op("Cast", count, to=dtype))
        inner.append(Trainable(t.name, p, mean, t.dtype))
    io = append_update(b, inner, opt, clip)
    graph.outputs.extend(io.outputs)
    apply = ir.Model(graph, ir_version=micro.ir_version)
    apply.metadata_props[METADATA_KEY] = json.dumps(
        dict(
            record,
            kind="apply",
            carry=io.carry,
            state=io.state,
            step=io.step,
            lr=io.lr,
            grad_sums=sum_names,
            micro_batches=str(count.name),
            optimizer=repr(opt),
        )
    )
    return apply


def _check_optimizer(optimizer: Optimizer | None, what: str) -> Optimizer:
    if optimizer is None:
        return AdamW()
    if not isinstance(optimizer, (SGD, Adam)):
        raise TypeError(
            f"{what}: optimizer is {type(optimizer).__name__}, expected onnax.training.SGD, "
            "Adam or AdamW (e.g. optimizer=AdamW(lr=1e-3))."
        )
    return optimizer


def _check_clip(max_grad_norm: float | None, what: str) -> float | None:
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(
            f"{what}: max_grad_norm={max_grad_norm}, expected a positive norm or None (no "
            "clipping)."
        )
    return max_grad_norm


def _check_loss(model: ir.Model, loss: str, what: str) -> None:
    by_name = {v.name: v for v in model.graph.outputs}
    value = by_name.get(loss)
    if value is None:
        raise SelectionError(
            f"{what}: no graph output named {loss!r} to use as the loss. Graph outputs: "
            f"{list(by_name)}. Remedy: pass loss=<one of them>, or append one with "
            "onnax.training.add_loss(model, <output>, <kind>)."
        )
    if not is_float(value) or value.shape is None or value.shape.rank() != 0:
        dtype = value.dtype.name if value.dtype else str(value.type)
        raise SelectionError(
            f"{what}: loss output {loss!r} is {dtype} of shape {format_shape(value.shape)}, "
            "expected a rank-0 floating-point scalar. Remedy: reduce it to a scalar, e.g. with "
            "onnax.training.add_loss(model, <output>, <kind>)."
        )


def _gradient_model(
    model: ir.Model,
    loss: str,
    params: str | Sequence[str] | None,
    frozen: str | Sequence[str],
    loss_scale: float,
    what: str,
) -> tuple[ir.Model, list[Trainable], dict[str, Any]]:
    """``grad`` of the loss with respect to the lifted parameters, with master weights."""
    opset_of(model, what)
    _check_loss(model, loss, what)
    if not loss_scale > 0:
        raise ValueError(f"{what}: loss_scale={loss_scale}, expected a positive factor.")
    names = select_params(model.graph, params, frozen, what)
    lifted, initial = lift_params(model, names)
    target = loss
    if loss_scale != 1.0:
        b0 = Builder(lifted.graph, model_names(lifted))
        value = {v.name: v for v in lifted.graph.outputs}[loss]
        scaled = b0.op("Mul", value, b0.const(loss_scale, value.dtype or ir.DataType.FLOAT))
        scaled.name = target = b0.fresh(f"{loss}.scaled")
        scaled.type, scaled.shape = value.type, ir.Shape([])
        lifted.graph.outputs.append(scaled)
    half = any(initial[n].dtype in HALF_TYPES for n in names)
    g = grad(lifted, inputs=names, output=target, accumulate="float32" if half else "model")
    graph = g.graph
    b = Builder(graph, model_names(g))
    inputs = {v.name: v for v in graph.inputs}
    grads = list(graph.outputs)[-len(names) :]
    trainables = []
    for name, gv in zip(names, grads, strict=True):
        p = inputs[name]
        dtype = p.dtype or ir.DataType.FLOAT
        if dtype in HALF_TYPES:
            p = _master_weight(b, p)
            gv = b.op("Cast", gv, to=ir.DataType.FLOAT)
        if loss_scale != 1.0:
            gv = b.op("Div", gv, b.const(loss_scale, p.dtype or ir.DataType.FLOAT))
        init = initial[name]
        start = init.numpy().astype(p.dtype.numpy() if p.dtype else np.float32)
        p.const_value = ir.tensor(start, name=name)
        trainables.append(Trainable(name, p, gv, dtype))
    record: dict[str, Any] = {
        "loss": loss,
        "params": {str(t.value.name): {"param": t.name, "dtype": t.dtype.name} for t in trainables},
    }
    return g, trainables, record


def _master_weight(b: Builder, half: ir.Value) -> ir.Value:
    """Replaces the half graph input by a FLOAT one of the same name, cast where it is read."""
    graph = b.graph
    name = str(half.name)
    position = list(graph.inputs).index(half)
    half.name = b.fresh(f"{name}.half")
    master = ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=half.shape)
    graph.inputs[position] = master
    cast = ir.node("Cast", [master], {"to": half.dtype})
    if len(graph):
        graph.insert_before(graph[0], cast)
    else:
        graph.append(cast)
    half.replace_all_uses_with(cast.outputs[0])
    cast.outputs[0].name = half.name
    cast.outputs[0].type, cast.outputs[0].shape = half.type, half.shape
    return master


def _finish(g: ir.Model, outputs: list[ir.Value], trainables: list[Trainable]) -> None:
    """Sets the outputs, drops what they do not need and stores the parameters' start values."""
    graph = g.graph
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    common.RemoveUnusedNodesPass()(g)
    for t in trainables:
        graph.register_initializer(t.value)
