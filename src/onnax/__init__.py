"""onnax: JAX-style transformations of ONNX models, emitting ordinary ONNX.

``grad``, ``jvp`` and ``vjp`` differentiate; ``vmap`` batches independent examples; ``jacfwd``,
``jacrev`` and ``hessian`` build full Jacobians and Hessians; compositions such as
``jvp(grad(m))`` (Hessian-vector products) and ``vmap(grad(m))`` (per-example gradients) work
without special cases. Each transform takes an ``onnx_ir.Model`` and returns a new one; each
exists as a pass class too (``JvpPass``, ``HessianPass``...) for an ``onnx_ir`` PassManager.
``linearize`` splits a jvp into a forward model and a linear one (many J·v products for the
price of one primal run); ``check`` verifies a derived model numerically; ``FamilyPass`` writes a CasADi family.
"""

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
from onnax.linearization import linearize
from onnax.passes import GradPass, JvpPass, VjpPass
from onnax.passes.derived import HessianPass, JacfwdPass, JacrevPass
from onnax.passes.family import FamilyPass
from onnax.passes.unroll import UnrollPass
from onnax.passes.vmap import VmapPass

__all__ = [
    "CheckError",
    "CheckResult",
    "FamilyPass",
    "GradPass",
    "HessianPass",
    "InvalidModelError",
    "JacfwdPass",
    "JacrevPass",
    "JvpPass",
    "OnnaxError",
    "SelectionError",
    "UnsupportedOperatorError",
    "UnrollPass",
    "UnsupportedValueError",
    "VjpPass",
    "VmapPass",
    "check",
    "grad",
    "hessian",
    "jacfwd",
    "jacrev",
    "jvp",
    "linearize",
    "unroll",
    "vjp",
    "vmap",
]

__version__ = "0.1.0"
