"""Scalar training losses appended to a model, with the numbers of ``torch.nn.functional``.

``add_loss`` leaves the model's inputs and outputs in place and appends one target input (and an
optional per-example weight input) and one rank-0 loss output, computed by plain ONNX operators.
"""

from __future__ import annotations

from typing import Literal

import onnx_ir as ir

from onnax.core.selection import format_shape, is_float
from onnax.errors import SelectionError
from onnax.passes.clone import clone_model
from onnax.training._build import Builder, model_names, opset_of

__all__ = ["LOSSES", "LossKind", "Reduction", "add_loss"]

LossKind = Literal["mse", "l1", "huber", "cross_entropy", "bce_with_logits", "nll"]
Reduction = Literal["mean", "sum"]
LOSSES: tuple[str, ...] = ("mse", "l1", "huber", "cross_entropy", "bce_with_logits", "nll")
_CLASS_LOSSES = ("cross_entropy", "nll")
_HALF = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_INDEX_TYPES = (ir.DataType.INT64, ir.DataType.INT32)


def add_loss(
    model: ir.Model,
    output: str,
    kind: LossKind,
    target: str = "target",
    reduction: Reduction = "mean",
    weight: str | None = None,
    *,
    name: str = "loss",
    probabilities: bool = False,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    delta: float = 1.0,
) -> ir.Model:
    """A copy of ``model`` with a scalar loss of ``output`` against a target input.

    The loss is that of the PyTorch function of the same name with ``reduction`` (``mse_loss``,
    ``l1_loss``, ``huber_loss``, ``cross_entropy``, ``binary_cross_entropy_with_logits``,
    ``nll_loss``). The class axis of ``cross_entropy`` and ``nll`` is axis 1, as in PyTorch.
    FLOAT16/BFLOAT16 outputs are cast to FLOAT first, so the loss of a half model is FLOAT.

    Args:
        model: The model; it is not modified.
        output: The graph output the loss is computed on (logits, predictions, log-probabilities).
        kind: ``"mse"``, ``"l1"``, ``"huber"``, ``"cross_entropy"``, ``"bce_with_logits"`` or
            ``"nll"``.
        target: The name of the target input. A new input is added unless the model already has
            a graph input of that name, which is then used (and its dtype checked). Class-index
            targets are INT64 and shaped like ``output`` without axis 1; the others are float and
            shaped like ``output``.
        reduction: ``"mean"`` or ``"sum"`` over the per-element losses. With class indices,
            ``"mean"`` divides by the number of targets that are not ``ignore_index``.
        weight: None, or the name of a per-example weight input of shape ``[N]`` (the batch
            axis, axis 0): the per-element losses are multiplied by it before the reduction, as
            ``(F.<loss>(..., reduction="none") * w[:, None, ...]).mean()`` would.
        name: The name of the loss output.
        probabilities: For ``cross_entropy``: the target holds class probabilities (float,
            shaped like ``output``) instead of class indices.
        ignore_index: For class indices: targets equal to it contribute nothing.
        label_smoothing: For ``cross_entropy``: PyTorch's ``label_smoothing`` in ``[0, 1]``.
        delta: For ``huber``: the threshold between the quadratic and the linear part.

    Returns:
        A new model with the inputs of ``model`` then the target (then the weight), and the
        outputs of ``model`` then the rank-0 loss.

    Raises:
        SelectionError: An unknown output, a non-float output, an existing target or weight
            input of the wrong dtype, or a name already in use.
        ValueError: An unknown ``kind`` or ``reduction``, or options that do not apply.
        InvalidModelError: The model's opset is below 13.
    """
    _check_options(kind, reduction, probabilities, label_smoothing, delta)
    what = f"add_loss({kind})"
    out = clone_model(model)
    opset_of(out, what)
    graph = out.graph
    by_name = {v.name: v for v in graph.outputs}
    y = by_name.get(output)
    if y is None:
        raise SelectionError(
            f"{what}: no graph output named {output!r}. Graph outputs: {list(by_name)}. "
            "Remedy: pass one of them as `output`."
        )
    if not is_float(y) or y.dtype is None:
        raise SelectionError(
            f"{what}: output {output!r} is {y.dtype.name if y.dtype else y.type}, expected "
            "FLOAT16, BFLOAT16, FLOAT or DOUBLE. Remedy: compute the loss on a floating-point "
            "output (logits, predictions)."
        )
    rank = y.shape.rank() if y.shape is not None else None
    if kind in _CLASS_LOSSES and (rank is None or rank < 2):
        raise SelectionError(
            f"{what}: output {output!r} has shape {format_shape(y.shape)}, expected rank 2 or "
            "more ([N, C, ...], classes on axis 1). Remedy: give the model a batch axis."
        )
    if weight is not None and rank is None:
        raise SelectionError(
            f"{what}: output {output!r} has an unknown rank, so a per-example weight cannot be "
            "broadcast over it. Remedy: run shape inference on the model first."
        )
    taken = model_names(out)
    if name in taken:
        raise SelectionError(
            f"{what}: the name {name!r} for the loss output is already used in the model. "
            "Remedy: pass another `name=`."
        )
    b = Builder(graph, taken)
    dtype = ir.DataType.FLOAT if y.dtype in _HALF else y.dtype
    x = b.op("Cast", y, to=dtype) if y.dtype in _HALF else y
    indices = kind in _CLASS_LOSSES and not probabilities
    t_shape = _target_shape(y.shape, indices)
    t = _input(b, target, ir.DataType.INT64 if indices else dtype, t_shape, what, "target")
    mask = None
    if indices:
        per, mask = _class_index_loss(b, x, t, kind, ignore_index, label_smoothing, dtype, y)
    elif kind == "cross_entropy":
        per = _class_probability_loss(b, x, t, label_smoothing, dtype, y)
    else:
        per = _elementwise_loss(b, x, t, kind, delta, dtype)
    if weight is not None and rank is not None:
        batch = [y.shape[0]] if y.shape is not None else [None]
        w = _input(b, weight, dtype, ir.Shape(batch), what, "weight")
        per_rank = rank - 1 if indices or kind == "cross_entropy" else rank
        if per_rank > 1:
            w = b.op("Unsqueeze", w, b.axes(*range(1, per_rank)))
        per = b.op("Mul", per, w)
    loss = _reduce(b, per, mask, reduction, dtype)
    loss.name = b.fresh(name)
    loss.dtype = dtype
    loss.shape = ir.Shape([])
    graph.outputs.append(loss)
    return out


def _check_options(
    kind: str, reduction: str, probabilities: bool, label_smoothing: float, delta: float
) -> None:
    if kind not in LOSSES:
        raise ValueError(f"add_loss: unknown loss kind {kind!r}, expected one of {list(LOSSES)}.")
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"add_loss({kind}): reduction {reduction!r}, expected 'mean' or 'sum' (the "
            "per-element losses are available before add_loss, in the model's own output)."
        )
    if probabilities and kind != "cross_entropy":
        raise ValueError(
            f"add_loss({kind}): probabilities=True applies to 'cross_entropy' only. Remedy: drop "
            "it, or use kind='cross_entropy' on logits."
        )
    if label_smoothing != 0.0 and kind != "cross_entropy":
        raise ValueError(
            f"add_loss({kind}): label_smoothing={label_smoothing} applies to 'cross_entropy' "
            "only (as in PyTorch). Remedy: drop it, or use kind='cross_entropy' on logits."
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(
            f"add_loss({kind}): label_smoothing={label_smoothing}, expected a value in [0, 1]."
        )
    if kind == "huber" and not delta > 0:
        raise ValueError(f"add_loss(huber): delta={delta}, expected a positive threshold.")


def _target_shape(shape: ir.Shape | None, indices: bool) -> ir.Shape | None:
    if shape is None:
        return None
    dims = list(shape.dims)
    return ir.Shape(dims[:1] + dims[2:] if indices else dims)


def _input(
    b: Builder,
    name: str,
    dtype: ir.DataType,
    shape: ir.Shape | None,
    what: str,
    role: str,
) -> ir.Value:
    """The existing graph input ``name`` (dtype checked, cast if needed), or a new one."""
    existing = {v.name: v for v in b.graph.inputs}.get(name)
    if existing is None:
        if name in b.taken:
            raise SelectionError(
                f"{what}: the {role} name {name!r} is already used by a value of the model that "
                f"is not a graph input. Remedy: pass another `{role}=` name."
            )
        b.taken.add(name)
        value = ir.Value(name=name, type=ir.TensorType(dtype), shape=shape)
        b.graph.inputs.append(value)
        return value
    found = existing.dtype
    if dtype == ir.DataType.INT64:
        ok = found in _INDEX_TYPES
        expected = "INT64 (class indices)"
        remedy = "feed class indices as int64, or pass probabilities=True for soft targets"
    else:
        ok = found is not None and found.is_floating_point()
        expected = f"a floating-point type ({dtype.name})"
        remedy = f"cast the {role} to {dtype.name} in the model, or use a float {role} input"
    if not ok:
        raise SelectionError(
            f"{what}: {role} input {name!r} is {found.name if found else existing.type}, "
            f"expected {expected}. Remedy: {remedy}."
        )
    return b.op("Cast", existing, to=dtype) if found != dtype else existing


def _num_classes(b: Builder, y: ir.Value, dtype: ir.DataType) -> ir.Value:
    """The size of axis 1 as a ``dtype`` scalar: a constant when static."""
    dim = y.shape[1] if y.shape is not None else None
    if isinstance(dim, int):
        return b.const(float(dim), dtype)
    size = b.op("Gather", b.op("Shape", y), b.const(1, ir.DataType.INT64), axis=0)
    return b.op("Cast", size, to=dtype)


def _class_index_loss(
    b: Builder,
    x: ir.Value,
    t: ir.Value,
    kind: str,
    ignore_index: int,
    smoothing: float,
    dtype: ir.DataType,
    y: ir.Value,
) -> tuple[ir.Value, ir.Value]:
    """Per-element loss with class indices, and the float mask of the targets that count."""
    logp = b.op("LogSoftmax", x, axis=1) if kind == "cross_entropy" else x
    keep = b.op("Not", b.op("Equal", t, b.const(ignore_index, ir.DataType.INT64)))
    # An ignored target may be out of range (-100): gather at class 0 instead and mask it out.
    safe = b.op("Where", keep, t, b.const(0, ir.DataType.INT64))
    picked = b.op("GatherElements", logp, b.op("Unsqueeze", safe, b.axes(1)), axis=1)
    per = b.op("Neg", b.op("Squeeze", picked, b.axes(1)))
    if smoothing:
        total = b.op("ReduceSum", logp, b.axes(1), keepdims=0)
        uniform = b.op("Div", b.const(smoothing, dtype), _num_classes(b, y, dtype))
        per = b.op(
            "Sub", b.op("Mul", b.const(1.0 - smoothing, dtype), per), b.op("Mul", uniform, total)
        )
    maskf = b.op("Cast", keep, to=dtype)
    return b.op("Mul", per, maskf), maskf


def _class_probability_loss(
    b: Builder, x: ir.Value, t: ir.Value, smoothing: float, dtype: ir.DataType, y: ir.Value
) -> ir.Value:
    logp = b.op("LogSoftmax", x, axis=1)
    if smoothing:
        uniform = b.op("Div", b.const(smoothing, dtype), _num_classes(b, y, dtype))
        t = b.op("Add", b.op("Mul", t, b.const(1.0 - smoothing, dtype)), uniform)
    return b.op("Neg", b.op("ReduceSum", b.op("Mul", logp, t), b.axes(1), keepdims=0))


def _elementwise_loss(
    b: Builder, x: ir.Value, t: ir.Value, kind: str, delta: float, dtype: ir.DataType
) -> ir.Value:
    if kind == "bce_with_logits":
        # log(1 + exp(x)) - x t, written as relu(x) + log(1 + exp(x - 2 relu(x))) - x t: the
        # exponent is -|x| <= 0, so nothing overflows, and its derivative is sigmoid(x) - t at
        # x = 0 too, whichever one-sided derivative the rules give Relu there.
        r = b.op("Relu", x)
        z = b.op("Sub", x, b.op("Add", r, r))
        softplus = b.op("Add", r, b.op("Log", b.op("Add", b.const(1.0, dtype), b.op("Exp", z))))
        return b.op("Sub", softplus, b.op("Mul", x, t))
    d = b.op("Sub", x, t)
    if kind == "mse":
        return b.op("Mul", d, d)
    a = b.op("Abs", d)
    if kind == "l1":
        return a
    quadratic = b.op("Mul", b.const(0.5, dtype), b.op("Mul", d, d))
    linear = b.op("Mul", b.const(delta, dtype), b.op("Sub", a, b.const(0.5 * delta, dtype)))
    return b.op("Where", b.op("Less", a, b.const(delta, dtype)), quadratic, linear)


def _reduce(
    b: Builder, per: ir.Value, mask: ir.Value | None, reduction: str, dtype: ir.DataType
) -> ir.Value:
    total = b.op("ReduceSum", per, keepdims=0)
    if reduction == "sum":
        return total
    if mask is not None:
        return b.op("Div", total, b.op("ReduceSum", mask, keepdims=0))
    count = b.op("Cast", b.op("Size", per), to=dtype)
    return b.op("Div", total, count)
