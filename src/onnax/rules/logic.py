"""Comparisons, logic, bitwise operators and the rounding family: zero derivatives.

Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not IsNaN IsInf BitShift BitwiseAnd
BitwiseOr BitwiseXor BitwiseNot Sign Floor Ceil Round.

Their results are boolean, integer or piecewise constant: the tangent is a symbolic zero,
whatever the type of the output. Registering them lets a derivative flow *past* them
(``x * Floor(x)``, ``Where(x > 0, x, 0)``) instead of stopping the transform. A float output of
such an operator that is a graph output gets a materialised zero tangent. The bitwise operators
take integers only, so no derivative ever reaches them; they are listed for completeness (and
for vmap).

Batch rules (vmap): the binary operators broadcast (batched operands aligned past the batch
axis); the unary ones apply to the batched value as they are.
"""

from __future__ import annotations

from onnax.core.registry import OpRules
from onnax.rules._patterns import broadcasting_batch, vectorized_batch

# --------------------------------------------------------------------- broadcasting operators
# Each block starts at the operators' earliest ONNX since_version; later schema versions keep
# the semantics these rules rely on.
for _binary in (
    OpRules(("Equal", "Less", "Greater", "And", "Or", "Xor"), since=1),
    OpRules(("LessOrEqual", "GreaterOrEqual"), since=12),
    OpRules("BitShift", since=11),
    OpRules(("BitwiseAnd", "BitwiseOr", "BitwiseXor"), since=18),
):
    _binary.zero()
    _binary.batch(broadcasting_batch)


# ------------------------------------------------------------------------ unary operators
# Not, the rounding family (Sign Floor Ceil Round) and the value tests (IsNaN IsInf).
for _unary in (
    OpRules(("Not", "Floor", "Ceil"), since=1),
    OpRules(("Sign", "IsNaN"), since=9),
    OpRules("IsInf", since=10),
    OpRules("Round", since=11),
    OpRules("BitwiseNot", since=18),
):
    _unary.zero()
    _unary.batch(vectorized_batch)
