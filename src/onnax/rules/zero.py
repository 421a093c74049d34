"""Operators with a zero derivative, and OneHot.

Comparisons, logical and bitwise operators, shape queries, index-valued operators (ArgMax, NonZero,
...) and the rounding family (Sign Floor Ceil Round, Hardmax) are piecewise constant: their
tangent is a symbolic zero, whatever the type of their output. Registering them lets a derivative
flow *past* them (``x * Floor(x)``, ``Where(x > 0, x, 0)``) instead of stopping the transform.
A float output of such an operator that is a graph output gets a materialised zero tangent.

OneHot is piecewise constant in its indices and depth but linear in its ``values`` input (the
off/on pair), so it has a real rule here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import jvp_rules
from onnax.rules._patterns import register_zero

Tangents = Sequence[ir.Value | None]

ZERO_SINCE: Mapping[str, int] = {
    # Comparisons and logic: boolean results.
    "Equal": 1,
    "Less": 1,
    "Greater": 1,
    "LessOrEqual": 12,
    "GreaterOrEqual": 12,
    "And": 1,
    "Or": 1,
    "Xor": 1,
    "Not": 1,
    "IsNaN": 9,
    "IsInf": 10,
    # Bitwise: integer-only inputs, so never reached by a derivative; listed for completeness.
    "BitShift": 11,
    "BitwiseAnd": 18,
    "BitwiseOr": 18,
    "BitwiseXor": 18,
    "BitwiseNot": 18,
    # Shape queries and index-valued results.
    "Shape": 1,
    "Size": 1,
    "ArgMax": 1,
    "ArgMin": 1,
    "NonZero": 9,
    "NonMaxSuppression": 10,
    "QuantizeLinear": 10,
    # Float-valued but piecewise constant (zero almost everywhere), or independent of the values.
    "Sign": 9,
    "Floor": 1,
    "Ceil": 1,
    "Round": 11,
    "Hardmax": 1,
    "EyeLike": 9,
}
"""Each operator's earliest ONNX ``since_version``: the zero rule serves every later version."""

for _op, _v in ZERO_SINCE.items():
    register_zero([_op], since_version=_v)


# ---------------------------------------------------------------------------------- OneHot
def _onehot_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # y = off + mask * (on - off) with mask = OneHot(indices, depth, [0, 1]): the same node with
    # unit values (same types, so the runtime kernel the model already uses serves it).
    tv = tangents[2] if len(tangents) > 2 else None
    if tv is None:
        return [None]
    indices, depth, values = node.inputs
    assert indices is not None and depth is not None and values is not None
    if values.dtype is None:
        raise InternalRuleError(f"OneHot: the element type of {values.name!r} is unknown")
    unit = em.const(np.array([0, 1], dtype=values.dtype.numpy()))
    axis = node.attributes.get_int("axis", -1)
    mask = em.op("OneHot", [indices, depth, unit], {"axis": axis})
    # The mask has exactly the output's shape; say so, since inference cannot see a run-time depth
    # and a symbolic one-hot axis would otherwise make the transposes fall back to run-time axes.
    mask.shape = node.outputs[0].shape.copy() if node.outputs[0].shape is not None else None
    off = em.op("Gather", [tv, em.const(np.array(0, dtype=np.int64))], {"axis": 0})
    on = em.op("Gather", [tv, em.const(np.array(1, dtype=np.int64))], {"axis": 0})
    return [em.op("Add", [em.op("Mul", [mask, em.op("Sub", [on, off])]), off])]


for _v in (9, 11):
    jvp_rules.add("OneHot", _onehot_jvp, since_version=_v)
