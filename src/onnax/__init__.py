"""onnax: JAX-style transformations (grad, jvp, vjp) of ONNX models, emitting ordinary ONNX."""

from onnax.api import grad, hessian, jacfwd, jacrev, jvp, unroll, vjp, vmap
from onnax.checking import CheckResult, check
from onnax.errors import (
    CheckError,
    InvalidModelError,
    OnnaxError,
    SelectionError,
    UnsupportedOperatorError,
    UnsupportedValueError,
)
from onnax.passes import GradPass, JvpPass, VjpPass
from onnax.passes.vmap import VmapPass

__all__ = [
    "CheckError",
    "CheckResult",
    "GradPass",
    "InvalidModelError",
    "JvpPass",
    "OnnaxError",
    "SelectionError",
    "UnsupportedOperatorError",
    "UnsupportedValueError",
    "VjpPass",
    "VmapPass",
    "check",
    "grad",
    "hessian",
    "jacfwd",
    "jacrev",
    "jvp",
    "unroll",
    "vjp",
    "vmap",
]

__version__ = "0.1.0"
