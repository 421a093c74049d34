"""Running small passes one after another, as :class:`onnx_ir.passes.Sequential` does.

``Sequential`` wraps whatever a step raises in a ``PassError`` naming the steps before it. The
steps of ``prepare`` and ``cleanup`` raise the errors a user reads (``InvalidModelError`` with
its remedy, ``TypeError`` for a wrong argument): those must reach the caller as they are, so a
transform's errors keep their type and message whichever steps run before.
"""

from __future__ import annotations

import logging

import onnx_ir as ir
import onnx_ir.passes as passes

__all__ = ["Steps"]

logger = logging.getLogger(__name__)


class Steps(passes.Sequential):
    """A :class:`~onnx_ir.passes.Sequential` whose steps' errors propagate unwrapped."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the steps in order on ``model``, each on the result of the one before."""
        modified = False
        for step in self.passes:
            logger.debug("running %s", type(step).__name__)
            result = step(model)
            model = result.model
            modified = modified or result.modified
        return passes.PassResult(model, modified)
