"""Optimizer updates written in plain ONNX, with the update rules of ``torch.optim``.

Each optimizer is a frozen dataclass of hyperparameters; :meth:`update` appends the nodes of one
parameter's update. The per-step scalars (bias corrections, ``lr * weight_decay``) are computed in
DOUBLE from the step count and the learning rate, as PyTorch computes them in Python floats, and
cast to the parameter's type where they meet a tensor, so the trajectories agree to float32
rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from onnax.training._build import Builder

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "StepScalars"]


@dataclass(frozen=True)
class StepScalars:
    """Values shared by every parameter's update in one step.

    Attributes:
        lr: The learning rate, a DOUBLE scalar.
        t: The 1-based number of this update (``step + 1``), a DOUBLE scalar.
        first: True at the first update (``step == 0``), a BOOL scalar.
        shared: Per-step scalars already built, by key, so that the parameters of one step
            share one copy (a bias correction is the same for every parameter of a dtype).
    """

    lr: ir.Value
    t: ir.Value
    first: ir.Value
    shared: dict[tuple[object, ...], ir.Value] = field(default_factory=dict)


def _check_nonnegative(what: str, **values: float) -> None:
    for name, value in values.items():
        if not value >= 0.0:
            raise ValueError(f"{what}: {name}={value}, expected a value >= 0 (as torch.optim).")


@dataclass(frozen=True)
class SGD:
    """``torch.optim.SGD``: momentum, dampening, Nesterov momentum and L2 weight decay.

    The momentum buffer starts as the first gradient (not as zeros), as in PyTorch; the step
    count input tells the graph which update is the first.
    """

    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_nonnegative(
            "SGD", lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay
        )
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError(
                f"SGD: nesterov=True needs momentum > 0 and dampening = 0, got momentum="
                f"{self.momentum}, dampening={self.dampening} (as torch.optim.SGD)."
            )

    @property
    def state_names(self) -> tuple[str, ...]:
        """The per-parameter state tensors, named as in ``optimizer.state[p]``."""
        return ("momentum_buffer",) if self.momentum != 0 else ()

    def update(
        self, b: Builder, p: ir.Value, g: ir.Value, state: dict[str, ir.Value], s: StepScalars
    ) -> tuple[ir.Value, dict[str, ir.Value]]:
        """The new parameter and state of one parameter ``p`` with gradient ``g``."""
        dtype = _dtype(p)
        if self.weight_decay != 0:
            g = b.op("Add", g, b.op("Mul", p, b.const(self.weight_decay, dtype)))
        new_state: dict[str, ir.Value] = {}
        if self.momentum != 0:
            mu = b.const(self.momentum, dtype)
            running = b.op(
                "Add",
                b.op("Mul", state["momentum_buffer"], mu),
                b.op("Mul", g, b.const(1.0 - self.dampening, dtype)),
            )
            buf = b.op("Where", s.first, g, running)
            new_state["momentum_buffer"] = buf
            g = b.op("Add", g, b.op("Mul", buf, mu)) if self.nesterov else buf
        key = ("lr", dtype)
        if key not in s.shared:
            s.shared[key] = b.op("Cast", s.lr, to=dtype)
        return b.op("Sub", p, b.op("Mul", g, s.shared[key])), new_state


@dataclass(frozen=True)
class Adam:
    """``torch.optim.Adam``: bias-corrected moments, L2 weight decay, optional AMSGrad."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    amsgrad: bool = False

    decoupled = False
    """Whether the weight decay shrinks the parameter (AdamW) instead of adding to the gradient."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_nonnegative(name, lr=self.lr, eps=self.eps, weight_decay=self.weight_decay)
        for k, beta in enumerate(self.betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name}: betas[{k}]={beta}, expected a value in [0, 1).")

    @property
    def state_names(self) -> tuple[str, ...]:
        """The per-parameter state tensors, named as in ``optimizer.state[p]``."""
        return ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if self.amsgrad else ())

    def update(
        self, b: Builder, p: ir.Value, g: ir.Value, state: dict[str, ir.Value], s: StepScalars
    ) -> tuple[ir.Value, dict[str, ir.Value]]:
        """The new parameter and state of one parameter ``p`` with gradient ``g``."""
        dtype = _dtype(p)
        beta1, beta2 = self.betas
        if self.weight_decay != 0:
            if self.decoupled:
                key = ("shrink", self.weight_decay, dtype)
                if key not in s.shared:
                    double = ir.DataType.DOUBLE
                    decay = b.op("Mul", s.lr, b.const(self.weight_decay, double))
                    shrink = b.op("Sub", b.const(1.0, double), decay)
                    s.shared[key] = b.op("Cast", shrink, to=dtype)
                p = b.op("Mul", p, s.shared[key])
            else:
                g = b.op("Add", g, b.op("Mul", p, b.const(self.weight_decay, dtype)))
        m, v = state["exp_avg"], state["exp_avg_sq"]
        # exp_avg.lerp_(grad, 1 - beta1): m + w (g - m) for a weight below 1/2.
        m = b.op("Add", m, b.op("Mul", b.op("Sub", g, m), b.const(1.0 - beta1, dtype)))
        v = b.op(
            "Add",
            b.op("Mul", v, b.const(beta2, dtype)),
            b.op("Mul", b.op("Mul", g, g), b.const(1.0 - beta2, dtype)),
        )
        new_state = {"exp_avg": m, "exp_avg_sq": v}
        second = v
        if self.amsgrad:
            second = b.op("Max", state["max_exp_avg_sq"], v)
            new_state["max_exp_avg_sq"] = second
        step_size, root2 = self._corrections(b, s, dtype)
        denom = b.op("Add", b.op("Div", b.op("Sqrt", second), root2), b.const(self.eps, dtype))
        new_p = b.op("Sub", p, b.op("Mul", b.op("Div", m, denom), step_size))
        return new_p, new_state

    def _corrections(
        self, b: Builder, s: StepScalars, dtype: ir.DataType
    ) -> tuple[ir.Value, ir.Value]:
        """``lr / (1 - beta1^t)`` and ``sqrt(1 - beta2^t)`` in ``dtype``, built once per step."""
        key = ("adam", self.betas, dtype)
        if key not in s.shared:
            beta1, beta2 = self.betas
            double = ir.DataType.DOUBLE
            one = b.const(1.0, double)
            correction1 = b.op("Sub", one, b.op("Pow", b.const(beta1, double), s.t))
            correction2 = b.op("Sub", one, b.op("Pow", b.const(beta2, double), s.t))
            s.shared[key] = b.op("Cast", b.op("Div", s.lr, correction1), to=dtype)
            s.shared[(*key, 2)] = b.op("Cast", b.op("Sqrt", correction2), to=dtype)
        return s.shared[key], s.shared[(*key, 2)]


@dataclass(frozen=True)
class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay ``p *= 1 - lr * weight_decay``."""

    weight_decay: float = 1e-2
    decoupled = True


Optimizer = SGD | Adam
"""Any optimizer :func:`onnax.training.step` accepts (AdamW is an Adam)."""


def _dtype(value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise ValueError(f"optimizer: the element type of {value.name!r} is unknown")
    return value.dtype
