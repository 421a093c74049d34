"""Derivative rules, modules by operator, and the public API for registering more.

Each module declares an :class:`~onnax.core.registry.OpRules` block per operator and registers
its jvp, transpose and batch rules (or lowering) when imported; :func:`collect` imports them all
once. Rules for operators onnax does not know (custom domains) are registered with
:func:`register` and its helpers :func:`register_zero_derivative`, :func:`register_linear` and
:func:`register_elementwise` (see :mod:`onnax.rules.custom`).
"""

from __future__ import annotations

import importlib

from onnax.core.registry import jvp_rules, transpose_rules
from onnax.rules.custom import (
    register,
    register_elementwise,
    register_linear,
    register_zero_derivative,
)

__all__ = [
    "FAMILIES",
    "collect",
    "jvp_rules",
    "register",
    "register_elementwise",
    "register_linear",
    "register_zero_derivative",
    "transpose_rules",
]

FAMILIES = (
    "elementwise",
    "activations",
    "linalg",
    "einsum",
    "reduce",
    "softmax",
    "layout",
    "slicing",
    "padding",
    "sources",
    "gather",
    "scatter",
    "logic",
    "zero",
    "random",
    "norm",
    "batchnorm",
    "lrn",
    "conv",
    "pool",
    "scans",
    "losses",
    "resample",
    "resize",
    "gridsample",
    "roi",
    "spectral",
    "im2col",
    "quant",
    "unique",
    "recurrent",
    "control_flow.if_",
    "control_flow.scan",
    "control_flow.loop",
    "sequence",
    "microsoft",
    "nchwc",
    "ms_attention",
)

_collected = False


def collect() -> None:
    """Imports every rule module so that its rules are registered."""
    global _collected
    if _collected:
        return
    for family in FAMILIES:
        importlib.import_module(f"onnax.rules.{family}")
    _collected = True
