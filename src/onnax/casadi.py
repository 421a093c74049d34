"""Derivative families for CasADi's ONNX backend: the public face of :mod:`onnax.export.casadi`.

The code lives in :mod:`onnax.export` (:mod:`~onnax.export.casadi` builds and writes a family,
:mod:`~onnax.export.layout` holds the seed layout, :mod:`~onnax.export.contract` checks CasADi's
sibling contract); ``onnax.casadi`` stays the documented import path.
"""

from __future__ import annotations

from onnax.export.casadi import (
    DEFAULT_KINDS,
    CasadiContractError,
    Dim,
    Family,
    Layout,
    SeedLayoutPass,
    build_family,
    casadi_diff_mask,
    casadi_matrix,
    check_family,
    family,
    onnxruntime_library,
    seeded_shape,
    use_onnxruntime,
)

__all__ = [
    "DEFAULT_KINDS",
    "CasadiContractError",
    "Dim",
    "Family",
    "Layout",
    "SeedLayoutPass",
    "build_family",
    "casadi_diff_mask",
    "casadi_matrix",
    "check_family",
    "family",
    "onnxruntime_library",
    "seeded_shape",
    "use_onnxruntime",
]
