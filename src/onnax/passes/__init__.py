"""The transform passes: ``onnx_ir.passes.FunctionalPass`` subclasses."""

from onnax.passes.grad import GradPass
from onnax.passes.jvp import JvpPass
from onnax.passes.vjp import VjpPass

__all__ = ["GradPass", "JvpPass", "VjpPass"]
# VmapPass, UnrollPass and the composed passes (derived.py) are exported by the onnax package.
