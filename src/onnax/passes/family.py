"""``FamilyPass``: the CasADi family as a step of an ``onnx_ir`` PassManager.

A module of its own: ``onnax.casadi`` builds on ``onnax.api``, which the other pass classes
serve, so keeping this one apart keeps the imports acyclic.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import onnx_ir as ir

from onnax.casadi import Family, family

__all__ = ["FamilyPass"]


class FamilyPass(ir.passes.PassBase):
    """Writes the CasADi family of the model (``onnax.casadi.family``); returns it unchanged.

    A side-effect-only pass in onnx_ir's terms (in place, input unchanged): the files are its
    product, and after a run :attr:`family` describes them.

    Args:
        path: The model file to write (``.../f.onnx``); siblings are written beside it.
        **options: ``inputs``, ``outputs``, ``layout``, ``kinds`` and ``dims`` of ``family``.
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__()
        self.path = path
        self.options: Mapping[str, Any] = options
        self.family: Family | None = None

    @property
    def in_place(self) -> bool:
        """The model passes through as the same object."""
        return True

    @property
    def changes_input(self) -> bool:
        """The model is only read."""
        return False

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Writes the files; the model passes through unmodified."""
        self.family = family(model, self.path, **self.options)
        return ir.passes.PassResult(model, modified=False)
