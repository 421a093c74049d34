"""GELU spelled with primitives, recognised at its last ``Mul``: one slope instead of a chain.

Exporters write GELU out as elementwise primitives: torch's exact GELU as
``0.5 * (x * (1 + erf(x / sqrt 2)))``, GPT-2's tanh approximation as
``(0.5 * x) * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x ** 3)))``. Linearised node by node,
every one of those nodes gets a tangent and reverse mode transposes each: nine (erf) or thirteen
(tanh) full-size passes over the activation, and the residuals of several intermediates. Read as
one function of ``x``, the tangent is ``slope(x) * t_x``, with the slope built from the values
the forward sweep already holds (the Erf input and ``1 + erf``; the cube term, the Tanh input,
``tanh`` and ``1 + tanh``): six (erf) or seven (tanh) full-size passes, the last the backward
sweep's product, and a scalar product of the cotangent (the ``0.5``), which onnxruntime folds
into the MatMul producing it; and one residual. The per-node tangents of the intermediates are
left to dead-code removal when nothing else reads them (and are used as before when something
does).

The forward chain itself stays as exported, and unfused in the gradient model: onnxruntime
fuses it into one ``Gelu`` (or ``FastGelu``) kernel only when no node outside the chain reads
its intermediates. A slope that reads only ``x`` and recomputes the rest (its own Erf or Tanh)
lets the forward fuse, but measured slower (``tests/benchmarks/bench_gelu.py``; erf at
convnext's size 64 against 56 ms for the GELU part, elementwise only): onnxruntime's ``Gelu``
kernel costs about what ``Div`` and ``Erf`` do, so fusing saves about two passes while the
recomputation adds three, one of them a second Erf.

The slope is the chain rule of the graph as written, with its own constants (the exported
``sqrt 2``, ``0.5``, ``0.044715``): not a different approximation of GELU.

:func:`gelu_tangent` is called by the ``Mul`` jvp rule; it matches only when every
intermediate carries a tangent (no stop_gradient inside) and the constants carry none.

Second order (a Hessian-vector product, forward over reverse; reverse over reverse transposes
the same tangent): the gradient holds the slope as primitives, and :func:`gelu_slope_tangent`,
called by the ``Add`` (erf's ``s + x bell``) and ``Mul`` (tanh's ``(z + 1) s``) jvp rules,
reads it back as one function of ``x`` too: erf's tangent is ``2 bell (1 - u^2) t_x``, four
full-size passes where the node rules spend eleven (with a second ``Exp``); tanh's ten where
they spend eighteen. ViT-S/16's Hessian-vector product at batch 8: the elementwise kernels on
the MLP's activations 244 -> 120 ms, the whole 5.29 -> 5.11 times the primal.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.selection import FLOAT_TYPES
from onnax.core.static import constant_of

__all__ = ["gelu_slope_tangent", "gelu_tangent"]


def _scalar(v: ir.Value | None, x: ir.Value) -> float | None:
    """The value of a one-element constant that broadcasts to ``x``'s shape, else None."""
    if v is None or v.is_graph_input():
        return None
    data = constant_of(v)
    if data is None or data.size != 1 or not np.issubdtype(data.dtype, np.floating):
        return None
    if data.ndim > 0 and (x.shape is None or data.ndim > x.shape.rank()):
        return None
    return float(data.reshape(()))


def _producer(v: ir.Value | None, op_type: str) -> ir.Node | None:
    node = v.producer() if v is not None else None
    if node is None or node.op_type != op_type or node.domain != "" or len(node.inputs) < 1:
        return None
    return node


def _split_const(node: ir.Node, x_like: ir.Value | None = None) -> tuple[ir.Value, float] | None:
    """``(value, c)`` for a binary node of a value and a scalar constant ``c`` (either order)."""
    a, b = node.inputs[0], node.inputs[1] if len(node.inputs) > 1 else None
    if a is None or b is None:
        return None
    for value, const in ((a, b), (b, a)):
        c = _scalar(const, x_like if x_like is not None else value)
        if c is not None and constant_of(value) is None:
            return value, c
    return None


@dataclasses.dataclass(frozen=True)
class _Cdf:
    """``s = 1 + f(u(x))``, f erf or tanh, and what the slope reads."""

    kind: str  # "erf" or "tanh"
    x: ir.Value
    s: ir.Value
    f: ir.Value  # erf(u) or tanh(u)
    u: ir.Value  # the argument of f
    du: float  # erf: du/dx (u = x * du)
    cube: ir.Value | None  # tanh: m = c1 * x**3, as the graph computes it
    c2: float  # tanh: u = c2 * (x + m)
    values: tuple[ir.Value, ...]  # the intermediates, which must all carry tangents


def _one_plus(s: ir.Value) -> ir.Value | None:
    """``f`` when ``s = Add(f, 1)`` (either order)."""
    node = _producer(s, "Add")
    if node is None:
        return None
    split = _split_const(node)
    return split[0] if split is not None and split[1] == 1.0 else None


def _erf_cdf(s: ir.Value, f: ir.Value) -> _Cdf | None:
    erf = _producer(f, "Erf")
    if erf is None or erf.inputs[0] is None:
        return None
    u = erf.inputs[0]
    scale = _producer(u, "Div") or _producer(u, "Mul")
    if scale is None:
        return None
    if scale.op_type == "Div":
        x, c = scale.inputs[0], _scalar(scale.inputs[1], u)
        if x is None or c is None or c == 0.0 or constant_of(x) is not None:
            return None
        du = 1.0 / c
    else:
        split = _split_const(scale)
        if split is None:
            return None
        x, du = split
    return _Cdf("erf", x, s, f, u, du, None, 0.0, (s, f, u))


def _tanh_cdf(s: ir.Value, f: ir.Value) -> _Cdf | None:
    tanh = _producer(f, "Tanh")
    if tanh is None or tanh.inputs[0] is None:
        return None
    u = tanh.inputs[0]
    outer = _producer(u, "Mul")
    split = _split_const(outer) if outer is not None else None
    if split is None:
        return None
    inner, c2 = split
    add = _producer(inner, "Add")
    if add is None or len(add.inputs) != 2:
        return None
    for x, m in (add.inputs, add.inputs[::-1]):
        if x is None or m is None:
            continue
        scaled = _producer(m, "Mul")
        split = _split_const(scaled) if scaled is not None else None
        if split is not None and _is_cube_of(split[0], x):
            return _Cdf("tanh", x, s, f, u, 0.0, m, c2, (s, f, u, inner, m, split[0]))
    return None


def _is_cube_of(p: ir.Value, x: ir.Value) -> bool:
    """Whether ``p`` is ``Pow(x, 3)`` or ``Mul(Mul(x, x), x)`` (either order)."""
    node = p.producer()
    if node is None or node.domain != "":
        return False
    if node.op_type == "Pow":
        return node.inputs[0] is x and _scalar(node.inputs[1], x) == 3.0
    if node.op_type != "Mul":
        return False
    a, b = node.inputs
    for square, other in ((a, b), (b, a)):
        sq = _producer(square, "Mul")
        if other is x and sq is not None and sq.inputs[0] is x and sq.inputs[1] is x:
            return True
    return False


def _cdf_of(s: ir.Value) -> _Cdf | None:
    f = _one_plus(s)
    if f is None:
        return None
    return _erf_cdf(s, f) or _tanh_cdf(s, f)


def _match(node: ir.Node) -> tuple[_Cdf, float, tuple[ir.Value, ...]] | None:
    """``(cdf, k, products)`` when ``node`` computes ``k * x * s``; ``products`` are the inner Muls."""
    split = _split_const(node)
    if split is not None:
        # k * (x * s) or (x * s) * k
        inner, k = split
        xs = _producer(inner, "Mul")
        if xs is None:
            return None
        for x, s in (xs.inputs, xs.inputs[::-1]):
            cdf = _cdf_of(s) if s is not None else None
            if cdf is not None and cdf.x is x:
                return cdf, k, (inner,)
        return None
    a, b = node.inputs
    for h, s in ((a, b), (b, a)):
        cdf = _cdf_of(s) if s is not None else None
        if cdf is None:
            continue
        if h is cdf.x:
            if _scaled_by_consumer(node):
                return None  # the enclosing k * (x * s) matches instead, in one piece
            return cdf, 1.0, ()
        half = _producer(h, "Mul")
        split = _split_const(half) if half is not None else None
        if split is not None and split[0] is cdf.x:
            assert h is not None
            return cdf, split[1], (h,)
    return None


def _scaled_by_consumer(node: ir.Node) -> bool:
    y = node.outputs[0]
    if y.is_graph_output() or len(y.uses()) != 1:
        return False
    consumer = next(iter(y.uses())).node
    return (
        consumer.op_type == "Mul" and consumer.domain == "" and _split_const(consumer) is not None
    )


def _slope(em: Emitter, cdf: _Cdf, k: float) -> tuple[ir.Value, float] | None:
    """``(slope, factor)``: the derivative of ``k x s`` is ``factor * slope``."""
    x, s = cdf.x, cdf.s
    if cdf.kind == "erf":
        # d(k x s)/dx = k (s + x erf'(u) du) = k (s + x exp(ln K - u^2)), K = du 2/sqrt(pi).
        # The factor k stays a scalar product of the cotangent, which onnxruntime folds into the
        # MatMul that computes it (MatMulScaleFusion) instead of a full-size k * s.
        big_k = cdf.du * 2.0 / math.sqrt(math.pi)
        if big_k <= 0.0:
            return None
        u2 = em.op("Mul", [cdf.u, cdf.u])
        bell = em.op("Exp", [em.op("Sub", [em.scalar(math.log(big_k), x), u2])])
        return em.op("Add", [s, em.op("Mul", [x, bell])]), k
    # d(k x s)/dx = k s + k x (1 - t^2) c2 (1 + 3 c1 x^2) = k s (1 + (u + 2 c2 m) (1 - t)),
    # with 1 - t^2 = (1 - t) s, c1 x^3 = m and c2 (x + 3 m) = u + 2 c2 m (u = c2 (x + m), the
    # Tanh input): six passes. The factor k is left to the cotangent, like erf's, rather than
    # a seventh pass scaling z (measured: bench_gelu.py).
    assert cdf.cube is not None
    near = em.op("Add", [cdf.u, em.op("Mul", [cdf.cube, em.scalar(2.0 * cdf.c2, x)])])
    z = em.op("Mul", [near, em.op("Sub", [em.scalar(1.0, x), cdf.f])])
    return em.op("Mul", [em.op("Add", [z, em.scalar(1.0, x)]), s]), k


def gelu_tangent(em: Emitter, node: ir.Node) -> ir.Value | None:
    """The tangent of a primitive GELU ending at ``node`` (a ``Mul``) from that of its ``x``.

    None when ``node`` does not end such a chain, or a value inside it has no tangent (a
    stop_gradient) or a constant has one (differentiated w.r.t. the constant), or the element
    type is not a float one: the caller then uses the ``Mul`` rule.
    """
    tangent: dict[ir.Value, ir.Value] | None = getattr(em, "tangent", None)
    y = node.outputs[0]
    if tangent is None or len(node.inputs) != 2 or y.dtype not in FLOAT_TYPES:
        return None
    found = _match(node)
    if found is None:
        return None
    cdf, k, products = found
    t_x = _chain_tangent(tangent, node, cdf.x, (*cdf.values, *products))
    if t_x is None:
        return None
    found_slope = _slope(em, cdf, k)
    if found_slope is None:
        return None
    slope, factor = found_slope
    # The factor outermost: reverse mode applies it first, to the incoming cotangent.
    t_y = em.op("Mul", [t_x, slope])
    return t_y if factor == 1.0 else em.op("Mul", [t_y, em.scalar(factor, cdf.x)])


def _chain_tangent(
    tangent: dict[ir.Value, ir.Value], node: ir.Node, x: ir.Value, values: tuple[ir.Value, ...]
) -> ir.Value | None:
    """The tangent of ``x``, when the chain ending at ``node`` may be read as one function of it.

    That is when every value inside (``values``) carries a tangent and no constant input does;
    else None.
    """
    t_x = tangent.get(x)
    if t_x is None or any(tangent.get(v) is None for v in values):
        return None
    chain = [node, *(p for p in (v.producer() for v in values) if p is not None)]
    if any(
        i is not None and constant_of(i) is not None and tangent.get(i) is not None
        for n in chain
        for i in n.inputs
    ):
        return None
    return t_x


@dataclasses.dataclass(frozen=True)
class _ErfSlope:
    """``slope = s + x * bell``, ``bell = exp(ln K - u2)``, ``u2 = u * u``: :func:`_slope`'s erf form."""

    cdf: _Cdf
    bell: ir.Value
    u2: ir.Value
    values: tuple[ir.Value, ...]  # the slope's intermediates, which must all carry tangents


def _is_log_k(v: ir.Value | None, cdf: _Cdf) -> bool:
    """Whether ``v`` is the constant ``ln(du 2 / sqrt(pi))`` of :func:`_slope`, as rounded there.

    A few units in the last place of slack: the identity the slope's tangent uses holds only
    for this constant, and a graph rounded once more (say to float16 after the transform) still
    matches, with an error of that rounding's order.
    """
    c = _scalar(v, cdf.u)
    data = constant_of(v) if v is not None else None
    big_k = cdf.du * 2.0 / math.sqrt(math.pi)
    if c is None or data is None or big_k <= 0.0:
        return False
    expected = math.log(big_k)
    eps = float(np.finfo(data.dtype).eps) if data.dtype.kind == "f" else 2.0**-7  # bfloat16
    return abs(c - expected) <= 4.0 * eps * max(1.0, abs(expected))


def _erf_slope(node: ir.Node) -> _ErfSlope | None:
    """The erf slope when ``node`` (an ``Add``) is ``s + x * exp(ln K - u * u)``, else None."""
    if len(node.inputs) != 2:
        return None
    for s, xb in (node.inputs, node.inputs[::-1]):
        mul = _producer(xb, "Mul")
        if s is None or xb is None or mul is None or len(mul.inputs) != 2:
            continue
        cdf = _cdf_of(s)
        if cdf is None or cdf.kind != "erf":
            continue
        for x, bell in (mul.inputs, mul.inputs[::-1]):
            exp = _producer(bell, "Exp") if x is cdf.x else None
            sub = _producer(exp.inputs[0], "Sub") if exp is not None else None
            if bell is None or exp is None or sub is None or len(sub.inputs) != 2:
                continue
            u2 = sub.inputs[1]
            square = _producer(u2, "Mul")
            if (
                u2 is None
                or square is None
                or square.inputs[0] is not cdf.u
                or square.inputs[1] is not cdf.u
                or not _is_log_k(sub.inputs[0], cdf)
            ):
                continue
            arg = exp.inputs[0]
            assert arg is not None
            return _ErfSlope(cdf, bell, u2, (*cdf.values, u2, arg, bell, xb))
    return None


@dataclasses.dataclass(frozen=True)
class _TanhSlope:
    """``slope = (z + 1) s``, ``z = near (1 - t)``, ``near = u + 2 c2 m``: :func:`_slope`'s tanh form."""

    cdf: _Cdf
    c1: float  # m = c1 * x**3
    near: ir.Value
    w: ir.Value  # 1 - t
    zp: ir.Value  # z + 1
    values: tuple[ir.Value, ...]


def _tanh_slope(node: ir.Node) -> _TanhSlope | None:
    """The tanh slope when ``node`` (a ``Mul``) is ``(near (1 - t) + 1) s``, else None."""
    if len(node.inputs) != 2:
        return None
    for zp, s in (node.inputs, node.inputs[::-1]):
        z = _one_plus(zp) if zp is not None else None
        product = _producer(z, "Mul")
        cdf = _cdf_of(s) if s is not None and product is not None else None
        if zp is None or z is None or product is None or cdf is None or cdf.kind != "tanh":
            continue
        assert cdf.cube is not None
        scaled = _producer(cdf.cube, "Mul")
        cube = _split_const(scaled) if scaled is not None else None
        for near, w in (product.inputs, product.inputs[::-1]):
            sub = _producer(w, "Sub")
            add = _producer(near, "Add")
            if near is None or w is None or sub is None or add is None or cube is None:
                continue
            if _scalar(sub.inputs[0], cdf.x) != 1.0 or sub.inputs[1] is not cdf.f:
                continue
            if not _is_near(add, cdf):
                continue
            values = (*cdf.values, near, w, z, zp)
            return _TanhSlope(cdf, cube[1], near, w, zp, values)
    return None


def _is_near(add: ir.Node, cdf: _Cdf) -> bool:
    """Whether ``add`` is ``u + m * 2 c2`` (either order, the scalar either side)."""
    for u, scaled in (add.inputs, add.inputs[::-1]):
        mul = _producer(scaled, "Mul")
        split = _split_const(mul) if mul is not None else None
        if u is cdf.u and split is not None and split[0] is cdf.cube:
            expected = 2.0 * cdf.c2
            return abs(split[1] - expected) <= 1e-6 * max(1.0, abs(expected))
    return False


def _erf_curve(em: Emitter, found: _ErfSlope, t_x: ir.Value) -> ir.Value:
    """``2 bell (1 - u^2) t_x``: see :func:`gelu_slope_tangent`."""
    x = found.cdf.x
    curve = em.op("Mul", [found.bell, em.op("Sub", [em.scalar(1.0, x), found.u2])])
    return em.op("Mul", [em.op("Mul", [t_x, curve]), em.scalar(2.0, x)])


def _tanh_curve(em: Emitter, found: _TanhSlope, t_x: ir.Value) -> ir.Value:
    """``s w (near' + u' (zp - near s)) t_x``: see :func:`gelu_slope_tangent`.

    With ``u' = c2 (1 + 3 c1 x^2)`` and ``near' = c2 (1 + 9 c1 x^2) = 3 u' - 2 c2`` that is
    ``s w (u' (3 + zp - near s) - 2 c2) t_x``.
    """
    cdf = found.cdf
    x, c2 = cdf.x, cdf.c2
    x2 = em.op("Mul", [x, x])
    du = em.op("Add", [em.op("Mul", [x2, em.scalar(3.0 * found.c1 * c2, x)]), em.scalar(c2, x)])
    rest = em.op(
        "Sub", [em.op("Add", [found.zp, em.scalar(3.0, x)]), em.op("Mul", [found.near, cdf.s])]
    )
    inner = em.op("Sub", [em.op("Mul", [du, rest]), em.scalar(2.0 * c2, x)])
    curve = em.op("Mul", [em.op("Mul", [cdf.s, found.w]), inner])
    return em.op("Mul", [curve, t_x])


def gelu_slope_tangent(em: Emitter, node: ir.Node) -> ir.Value | None:
    """The tangent of a GELU's slope (:func:`_slope`) ending at ``node`` (its last node).

    Forward over reverse (a Hessian-vector product) differentiates the slope the gradient
    holds. For erf (an ``Add``), node by node that is eleven full-size passes (the tangents of
    ``u``, ``erf``, ``u * u``, the bell and ``x * bell``, the bell a second ``Exp``); read as
    one function of ``x``, ``d(s + x bell)/dx = bell + bell (1 - 2 x u du) = 2 bell (1 - u^2)``
    (``ds/dx = erf'(u) du = K exp(-u^2) = bell`` and ``x du = u``), four passes from values the
    sweep holds. For tanh (a ``Mul``), with ``w = 1 - t``, ``s' = s w u'`` and ``z' = w (near'
    - near s u')``: ``d((z + 1) s)/dx = s w (near' + u' (z + 1 - near s))``, ten passes where the
    node rules spend eighteen. None when ``node`` is not such a slope, a value inside it has
    no tangent, a constant has one, or the type is not a float one: the caller then uses the
    node rules.
    """
    tangent: dict[ir.Value, ir.Value] | None = getattr(em, "tangent", None)
    y = node.outputs[0]
    if tangent is None or y.dtype not in FLOAT_TYPES:
        return None
    found: _ErfSlope | _TanhSlope | None = (
        _erf_slope(node) if node.op_type == "Add" else _tanh_slope(node)
    )
    if found is None:
        return None
    t_x = _chain_tangent(tangent, node, found.cdf.x, found.values)
    if t_x is None:
        return None
    if isinstance(found, _ErfSlope):
        return _erf_curve(em, found, t_x)
    return _tanh_curve(em, found, t_x)
