"""On-device training as plain ONNX: losses, optimizers and a training step any runtime runs.

Built on :func:`onnax.grad`: :func:`add_loss` appends a scalar loss, :func:`step` makes one
model that computes the loss, the gradients and the optimizer update (``torch.optim``'s rules),
:func:`accumulation` splits that into a micro-batch and an apply model, and the helpers in
:mod:`onnax.training.state` feed and read them.
"""

from onnax.training.losses import LOSSES, add_loss
from onnax.training.optimizers import SGD, Adam, AdamW, Optimizer
from onnax.training.state import carry, initial_state, layout, trained_model
from onnax.training.step import accumulation, step

__all__ = [
    "LOSSES",
    "SGD",
    "Adam",
    "AdamW",
    "Optimizer",
    "accumulation",
    "add_loss",
    "carry",
    "initial_state",
    "layout",
    "step",
    "trained_model",
]
