"""Derivative rules, one module per operator family.

Each module registers its jvp and transpose rules (and, later, batch rules) into the registries
of :mod:`onnax.core.registry` when imported. :func:`collect` imports them all once.
"""

from __future__ import annotations

import importlib

from onnax.core.registry import jvp_rules, transpose_rules

__all__ = ["FAMILIES", "collect", "jvp_rules", "transpose_rules"]

FAMILIES = (
    "elementwise",
    "activations",
    "linalg",
    "reduce",
    "layout",
    "slicing",
    "padding",
    "sources",
    "indexing",
    "zero",
    "random",
    "norm",
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
    "control_flow",
    "control_flow_batch",
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
