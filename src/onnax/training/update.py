"""The optimizer part of a training graph: step count, learning rate, state, clipping, update.

Shared by the one-model training step and the apply model of gradient accumulation; it only
needs the parameters (as graph inputs) and their gradients (as values of the same graph).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from onnax.training._build import Builder
from onnax.training.optimizers import Optimizer, StepScalars

__all__ = ["Trainable", "UpdateIO", "append_update", "global_norm_clip"]


@dataclass
class Trainable:
    """One trained parameter inside a training graph.

    Attributes:
        name: The parameter's initializer name in the inference model.
        value: The graph input holding it (the FLOAT master weight for a half parameter).
        grad: Its gradient, in the type of ``value``.
        dtype: The parameter's element type in the inference model.
    """

    name: str
    value: ir.Value
    grad: ir.Value
    dtype: ir.DataType


@dataclass
class UpdateIO:
    """What :func:`append_update` added: outputs in order, and the carried input/output pairs."""

    outputs: list[ir.Value] = field(default_factory=list)
    carry: list[tuple[str, str]] = field(default_factory=list)
    state: dict[str, dict[str, str]] = field(default_factory=dict)
    step: str = ""
    lr: str = ""


def new_input(b: Builder, name: str, dtype: ir.DataType, shape: ir.Shape | None) -> ir.Value:
    """A fresh graph input named ``name`` (or ``name_k`` when it is taken)."""
    value = ir.Value(name=b.fresh(name), type=ir.TensorType(dtype), shape=shape)
    b.graph.inputs.append(value)
    return value


def new_output(b: Builder, value: ir.Value, name: str, like: ir.Value) -> ir.Value:
    """Names ``value`` freshly after ``name`` and types it like ``like``; returns it.

    A value that is already a graph input or output is routed through an Identity, so that each
    graph output has its own name.
    """
    if value.is_graph_input() or value.is_graph_output() or value.producer() is None:
        value = b.op("Identity", value)
    value.name = b.fresh(name)
    value.type = like.type
    value.shape = like.shape
    return value


def global_norm_clip(b: Builder, grads: list[ir.Value], max_norm: float) -> list[ir.Value]:
    """``torch.nn.utils.clip_grad_norm_``: scale by ``min(1, max_norm / (norm + 1e-6))``.

    The norm is taken over all gradients together, in FLOAT for half gradients; like PyTorch the
    factor is applied even when it is 1, so the clipped graph is the same for every step.
    """
    dtype = grads[0].dtype or ir.DataType.FLOAT
    squares = [b.op("ReduceSum", b.op("Mul", g, g), keepdims=0) for g in grads]
    total = squares[0] if len(squares) == 1 else b.op("Sum", *squares)
    norm = b.op("Sqrt", total)
    coef = b.op("Div", b.const(max_norm, dtype), b.op("Add", norm, b.const(1e-6, dtype)))
    coef = b.op("Min", coef, b.const(1.0, dtype))
    return [b.op("Mul", g, coef) for g in grads]


def append_update(
    b: Builder,
    trainables: list[Trainable],
    optimizer: Optimizer,
    max_grad_norm: float | None,
) -> UpdateIO:
    """Appends ``step``, ``lr`` and the state inputs and the whole update to ``b.graph``.

    The ``lr`` input gets a stored default (``optimizer.lr``), so feeding it is optional; the
    ``step`` input is the number of updates already made (0 at the start).

    Returns:
        The new parameter, state and step outputs (in that order) and their carry pairs.
    """
    io = UpdateIO()
    step = new_input(b, "step", ir.DataType.INT64, ir.Shape([]))
    lr = new_input(b, "lr", ir.DataType.FLOAT, ir.Shape([]))
    lr.const_value = ir.tensor(np.array(optimizer.lr, dtype=np.float32), name=lr.name)
    b.graph.register_initializer(lr)
    io.step, io.lr = str(step.name), str(lr.name)
    scalars = StepScalars(
        lr=b.op("Cast", lr, to=ir.DataType.DOUBLE),
        t=b.op("Cast", b.op("Add", step, b.const(1, ir.DataType.INT64)), to=ir.DataType.DOUBLE),
        first=b.op("Equal", step, b.const(0, ir.DataType.INT64)),
    )
    grads = [t.grad for t in trainables]
    if max_grad_norm is not None:
        grads = global_norm_clip(b, grads, max_grad_norm)
    new_params, new_states = [], []
    for t, g in zip(trainables, grads, strict=True):
        state_in = {
            s: new_input(
                b, f"{t.value.name}.{s}", t.value.dtype or ir.DataType.FLOAT, t.value.shape
            )
            for s in optimizer.state_names
        }
        io.state[t.name] = {s: str(v.name) for s, v in state_in.items()}
        new_p, new_state = optimizer.update(b, t.value, g, state_in, scalars)
        out = new_output(b, new_p, f"{t.value.name}.new", t.value)
        new_params.append(out)
        io.carry.append((str(t.value.name), str(out.name)))
        for s, v in new_state.items():
            out_s = new_output(b, v, f"{state_in[s].name}.new", state_in[s])
            new_states.append(out_s)
            io.carry.append((str(state_in[s].name), str(out_s.name)))
    step_out = b.op("Add", step, b.const(1, ir.DataType.INT64))
    step_out = new_output(b, step_out, f"{step.name}.new", step)
    io.carry.append((str(step.name), str(step_out.name)))
    io.outputs = [*new_params, *new_states, step_out]
    return io
