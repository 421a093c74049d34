"""Arithmetic and elementwise math: Add Sub Mul Div Neg Pow Sum Mean Max Min Identity Exp Log
Sqrt Reciprocal Abs, trigonometric and hyperbolic functions, Erf, Cast, CastLike, Where, Clip.

Binary operators broadcast: a tangent is expanded to the result's shape in forward mode, and a
cotangent summed back to the operand's shape (``unbroadcast``) in reverse mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.registry import jvp_rules, transpose_rules
from onnax.core.shapes import broadcast_to, unbroadcast
from onnax.rules._patterns import register_linear_unary

Tangents = Sequence[ir.Value | None]


# ------------------------------------------------------------------------------- Add / Sub
def _add_sub_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert a is not None and b is not None
    if ta is not None and tb is not None:
        return [em.op(node.op_type, [ta, tb])]
    if ta is not None:
        return [broadcast_to(em, ta, a, y)]
    if tb is not None:
        tb = broadcast_to(em, tb, b, y)
        return [tb if node.op_type == "Add" else em.op("Neg", [tb])]
    return [None]


def _add_sub_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    ca = unbroadcast(em, ct, a, y) if linear[0] else None
    cb = None
    if linear[1]:
        cb = unbroadcast(em, ct, b, y)
        if node.op_type == "Sub":
            cb = em.op("Neg", [cb])
    return [ca, cb]


for _op in ("Add", "Sub"):
    for _v in (7, 13, 14):
        jvp_rules.add(_op, _add_sub_jvp, since_version=_v)
        transpose_rules.add(_op, _add_sub_transpose, since_version=_v)


# ----------------------------------------------------------------------------------- Mul
def _mul_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb) = node.inputs, tangents
    assert a is not None and b is not None
    terms = []
    if ta is not None:
        terms.append(em.op("Mul", [ta, b]))
    if tb is not None:
        terms.append(em.op("Mul", [a, tb]))
    return [em.add_all(terms)]


def _mul_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[0] and linear[1]:
        raise AssertionError("Mul of two linear values is not linear")
    if linear[0]:
        return [unbroadcast(em, em.op("Mul", [ct, b]), a, y), None]
    return [None, unbroadcast(em, em.op("Mul", [a, ct]), b, y)]


for _v in (7, 13, 14):
    jvp_rules.add("Mul", _mul_jvp, since_version=_v)
    transpose_rules.add("Mul", _mul_transpose, since_version=_v)


# ----------------------------------------------------------------------------------- Div
def _div_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert a is not None and b is not None
    terms = []
    if ta is not None:
        terms.append(em.op("Div", [ta, b]))
    if tb is not None:
        # d(a/b)/db = -y/b
        coef = em.op("Neg", [em.op("Div", [y, b])])
        terms.append(em.op("Mul", [tb, coef]))
    return [em.add_all(terms)]


def _div_transpose(em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[1]:
        raise AssertionError("Div is linear in its numerator only")
    return [unbroadcast(em, em.op("Div", [ct, b]), a, y), None]


for _v in (7, 13, 14):
    jvp_rules.add("Div", _div_jvp, since_version=_v)
    transpose_rules.add("Div", _div_transpose, since_version=_v)


# ---------------------------------------------------------------------- Neg / Identity
register_linear_unary("Neg", (6, 13))
register_linear_unary("Identity", (1, 13, 14, 16, 19, 21, 25))
