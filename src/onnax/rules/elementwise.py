"""Arithmetic and elementwise operators.

Add Sub Mul Div Neg Identity Pow Sum Mean Max Min Clip Where Cast CastLike Mod.

Binary and variadic operators broadcast: a tangent is expanded to the result's shape in forward
mode, and a cotangent summed back to the operand's shape (``unbroadcast``) in reverse mode.
Linear ones (Add Sub Neg Identity Sum Mean Where Cast CastLike, and Mul/Div by a primal) have
transpose rules; the others' tangents are spelled with those. Piecewise operators (Max Min Clip)
route the tangent of the selected operand with ``Where``; at a tie the derivative is one-sided
and deterministic (the first operand equal to the output, zero on a Clip bound).

Under vmap the broadcasting operators align batched operands past the batch axis and the unary
ones apply as they are; Clip rewrites to Max/Min when a (scalar-only) bound is batched, and
CastLike's second input only lends its element type.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.selection import FLOAT_TYPES
from onnax.core.shapes import broadcast_to, expand_input, same_shape, unbroadcast
from onnax.core.static import constant_of
from onnax.errors import UnsupportedOperatorError
from onnax.rules._gelu import gelu_slope_tangent, gelu_tangent
from onnax.rules._patterns import (
    attributes_of,
    broadcasting_batch,
    linear_unary_jvp,
    linear_unary_transpose,
    note_ranks,
    vectorized_batch,
)

# ------------------------------------------------------------------------------- Add / Sub
add_sub = OpRules(("Add", "Sub"), since=7)
add_sub.batch(note_ranks(broadcasting_batch))


@add_sub.jvp
def _add_sub_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert a is not None and b is not None
    if ta is not None and tb is not None:
        slope = gelu_slope_tangent(em, node) if node.op_type == "Add" else None
        if slope is not None:
            return [slope]
        return [em.op(node.op_type, [ta, tb])]
    if ta is not None:
        return [broadcast_to(em, ta, a, y)]
    if tb is not None:
        tb = broadcast_to(em, tb, b, y)
        return [tb if node.op_type == "Add" else em.op("Neg", [tb])]
    return [None]


@add_sub.transpose
def _add_sub_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    ca = unbroadcast(em, ct, a, y) if linear[0] else None
    cb = None
    if linear[1]:
        cb = unbroadcast(em, ct, b, y)
        if node.op_type == "Sub":
            cb = em.op("Neg", [cb])
    return [ca, cb]


# ----------------------------------------------------------------------------------- Mul
def _unexpanded(ct: ir.Value, other: ir.Value, y: ir.Value) -> ir.Value:
    """The cotangent ``ct`` of ``y`` before an ``Expand``, when ``other`` broadcasts it anyway.

    ``other`` has the result's shape, so the product broadcasts the Expand's input to the same
    tensor (:func:`~onnax.core.shapes.expand_input`): ``ct`` has ``y``'s shape (the transpose
    contract), so ``Expand(r) == broadcast(r, shape(other))`` element for element.
    """
    r = expand_input(ct)
    if r is None or not same_shape(other, y):
        return ct
    return r


mul = OpRules("Mul", since=7)
mul.batch(note_ranks(broadcasting_batch))


@mul.jvp
def _mul_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb) = node.inputs, tangents
    assert a is not None and b is not None
    gelu = gelu_tangent(em, node)
    if gelu is None and ta is not None and tb is not None:
        gelu = gelu_slope_tangent(em, node)
    if gelu is not None:
        return [gelu]
    if a is b and ta is not None:
        # x * x: one term, 2x · t, instead of t·x + x·t.
        return [em.op("Mul", [ta, em.op("Mul", [a, em.scalar(2.0, a)])])]
    terms = []
    if ta is not None:
        terms.append(em.op("Mul", [ta, b]))
    if tb is not None:
        terms.append(em.op("Mul", [a, tb]))
    return [em.add_all(terms)]


@mul.transpose
def _mul_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[0] and linear[1]:
        raise AssertionError("Mul of two linear values is not linear")
    if linear[0]:
        return [unbroadcast(em, em.op("Mul", [_unexpanded(ct, b, y), b]), a, y), None]
    return [None, unbroadcast(em, em.op("Mul", [a, _unexpanded(ct, a, y)]), b, y)]


# ----------------------------------------------------------------------------------- Div
div = OpRules("Div", since=7)
div.batch(note_ranks(broadcasting_batch))


@div.jvp
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


@div.transpose
def _div_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[1]:
        raise AssertionError("Div is linear in its numerator only")
    return [unbroadcast(em, em.op("Div", [_unexpanded(ct, b, y), b]), a, y), None]


# ---------------------------------------------------------------------- Neg / Identity
for _linear in (OpRules("Neg", since=6), OpRules("Identity", since=1)):
    _linear.jvp(linear_unary_jvp)
    _linear.transpose(linear_unary_transpose())
    _linear.batch(note_ranks(vectorized_batch))


# ---------------------------------------------------------------------------------- helpers
def _expand_unless(
    em: Emitter, t: ir.Value, operands: Sequence[ir.Value | None], y: ir.Value
) -> ir.Value:
    """Expands ``t`` to the shape of ``y``.

    Nothing is emitted when one of ``operands`` (the values ``t`` was broadcast against) already
    has that shape, since ``t`` then has it too.
    """
    if any(v is not None and same_shape(v, y) for v in operands):
        return t
    return em.op("Expand", [t, em.shape(y)])


def _dtype_of(value: ir.Value) -> ir.DataType:
    if value.dtype is None:
        raise InternalRuleError(f"the element type of {value.name!r} is unknown")
    return value.dtype


def _cast(em: Emitter, value: ir.Value, dtype: ir.DataType) -> ir.Value:
    """``value`` with element type ``dtype`` (no node when it already has it)."""
    if value.dtype == dtype:
        return value
    return em.op("Cast", [value], {"to": int(dtype)})


# ----------------------------------------------------------------------------------- Pow
def _small_integer_exponent(a: ir.Value, b: ir.Value) -> int | None:
    """The exponent when it is a constant 1, 2 or 3 (GELU's ``x ** 3``, squares), else None.

    Only a rank-0 exponent qualifies (or one of a single element whose rank does not exceed the
    base's): the result then has the base's shape, which the Mul forms below keep.
    """
    # A graph input's initializer is only a default: the caller may feed another exponent.
    tensor = None if b.is_graph_input() else constant_of(b)
    if tensor is None or tensor.size != 1:
        return None
    rank_a = a.shape.rank() if a.shape is not None else None
    if tensor.ndim > 0 and (rank_a is None or tensor.ndim > rank_a):
        return None
    value = float(tensor.reshape(()))
    return int(value) if value in (1.0, 2.0, 3.0) else None


def _integer_power_slope(em: Emitter, a: ir.Value, n: int, dtype: ir.DataType) -> ir.Value:
    """``n * a ** (n - 1)`` for ``n`` 2 or 3, spelled with Mul: Pow's kernel is several times slower.

    ``a ** 1`` is ``a`` and ``a ** 2`` is ``a * a`` exactly; the integer factor is exact in
    every float type.
    """
    if n == 2:
        return em.op("Mul", [a, em.scalar(2.0, like=dtype)])
    return em.op("Mul", [em.op("Mul", [a, a]), em.scalar(float(n), like=dtype)])


pow_ = OpRules("Pow", since=7)
pow_.batch(note_ranks(broadcasting_batch))


@pow_.jvp
def _pow_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert a is not None and b is not None
    dtype = _dtype_of(y)
    terms = []
    if ta is not None:
        # d(a^b)/da = b * a^(b-1). Since Pow-12 the exponent may have another (even an integer)
        # type; the coefficient is computed in the base's type.
        n = _small_integer_exponent(a, b) if tb is None else None
        if n == 1:
            terms.append(ta)
        elif n is not None:
            terms.append(em.op("Mul", [ta, _integer_power_slope(em, a, n, dtype)]))
        else:
            exponent = _cast(em, b, dtype)
            power = em.op("Pow", [a, em.op("Sub", [exponent, em.scalar(1.0, like=dtype)])])
            terms.append(em.op("Mul", [ta, em.op("Mul", [exponent, power])]))
    if tb is not None:
        # d(a^b)/db = a^b * log(a). At a == 0 the log is replaced by log(1) = 0 so that the
        # derivative is 0 there (as a^b is flat in b for b > 0) and not 0 * -inf = NaN; keeping
        # the -inf out of the graph also keeps its own derivatives finite. For a negative base
        # (only defined at integer b) this uses log|a|: the real part of the complex derivative.
        is_zero = em.op("Equal", [a, em.scalar(0.0, like=a)])
        safe = em.op("Where", [is_zero, em.scalar(1.0, like=a), em.op("Abs", [a])])
        coef = em.op("Mul", [y, em.op("Log", [safe])])
        terms.append(em.op("Mul", [_cast(em, tb, dtype), coef]))
    return [em.add_all(terms)]


# ---------------------------------------------------------------------------- Sum / Mean
sum_mean = OpRules(("Sum", "Mean"), since=6)
sum_mean.batch(note_ranks(broadcasting_batch))


@sum_mean.jvp
def _sum_mean_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    y = node.outputs[0]
    active = [(x, t) for x, t in zip(node.inputs, tangents, strict=False) if t is not None]
    if not active:
        return [None]
    ts = [t for _, t in active]
    total = ts[0] if len(ts) == 1 else em.op("Sum", ts)
    # The sum of the active tangents has the broadcast shape of the active operands only.
    total = _expand_unless(em, total, [x for x, _ in active], y)
    if node.op_type == "Mean":
        total = em.op("Mul", [total, em.scalar(1.0 / len(node.inputs), like=_dtype_of(y))])
    return [total]


@sum_mean.transpose
def _sum_mean_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), y = cts, node.outputs[0]
    assert ct is not None
    if node.op_type == "Mean":
        ct = em.op("Mul", [ct, em.scalar(1.0 / len(node.inputs), like=_dtype_of(y))])
    return [
        unbroadcast(em, ct, x, y) if is_linear and x is not None else None
        for x, is_linear in zip(node.inputs, linear, strict=False)
    ]


# ----------------------------------------------------------------------------- Max / Min
max_min = OpRules(("Max", "Min"), since=6)
max_min.batch(note_ranks(broadcasting_batch))


@max_min.jvp
def _max_min_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    xs, y = node.inputs, node.outputs[0]
    active = [i for i, t in enumerate(tangents) if t is not None]
    if not active:
        return [None]
    if len(xs) == 1:
        return [tangents[0]]
    # The tangent follows the operand that is selected; on a tie the first operand equal to the
    # output wins (a deterministic one-sided derivative), so exactly one operand is chosen.
    zero = em.scalar(0.0, like=_dtype_of(y))
    terms: list[ir.Value | None] = []
    taken: ir.Value | None = None  # where an earlier operand equals the output
    for i in range(active[-1] + 1):
        x = xs[i]
        assert x is not None
        if i == len(xs) - 1 and taken is not None:
            chosen = em.op("Not", [taken])
        else:
            equal = em.op("Equal", [x, y])
            chosen = equal if taken is None else em.op("And", [equal, em.op("Not", [taken])])
            if i < active[-1]:
                taken = equal if taken is None else em.op("Or", [taken, equal])
        t = tangents[i]
        if t is not None:
            # ``chosen`` has the output's shape, so the Where broadcasts the tangent to it.
            terms.append(em.op("Where", [chosen, t, zero]))
    return [em.add_all(terms)]


# ----------------------------------------------------------------------------------- Clip
clip = OpRules("Clip", since=6)


def _clip_bounds(em: Emitter, node: ir.Node) -> tuple[ir.Value | None, ir.Value | None]:
    """The primal bounds: inputs since Clip-11, attributes (absent: unbounded) in Clip-6."""
    x = node.inputs[0]
    assert x is not None
    if "min" in node.attributes or "max" in node.attributes:
        lo, hi = node.attributes.get("min"), node.attributes.get("max")
        return (
            None if lo is None else em.scalar(lo.as_float(), like=_dtype_of(x)),
            None if hi is None else em.scalar(hi.as_float(), like=_dtype_of(x)),
        )
    padded = [*node.inputs[1:3], None, None]
    return padded[0], padded[1]


@clip.jvp
def _clip_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    x, y = node.inputs[0], node.outputs[0]
    assert x is not None
    tx, tlo, thi = [*tangents, None, None][:3]
    lo, hi = _clip_bounds(em, node)
    zero = em.scalar(0.0, like=_dtype_of(y))
    terms = []
    if tx is not None:
        # Strictly inside the interval; on a bound the derivative is taken as zero.
        inside = []
        if lo is not None:
            inside.append(em.op("Greater", [x, lo]))
        if hi is not None:
            inside.append(em.op("Less", [x, hi]))
        if not inside:
            terms.append(tx)
        else:
            mask = inside[0] if len(inside) == 1 else em.op("And", inside)
            terms.append(em.op("Where", [mask, tx, zero]))
    # A bound's tangent reaches the elements it clips. When min > max, Clip returns max
    # everywhere, so max is active there and min nowhere. Each Where broadcasts the scalar bound
    # tangent to x's shape; its transpose sums the cotangent back to a scalar.
    if tlo is not None and lo is not None:
        below = em.op("Less", [x, lo])
        if hi is not None:
            below = em.op("And", [below, em.op("Less", [lo, hi])])
        terms.append(em.op("Where", [below, tlo, zero]))
    if thi is not None and hi is not None:
        above = em.op("Greater", [x, hi])
        if lo is not None:
            above = em.op("Or", [above, em.op("Greater", [lo, hi])])
        terms.append(em.op("Where", [above, thi, zero]))
    return [em.add_all(terms)]


@clip.batch
def _clip_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Clip as is when only x is batched; Max/Min against the aligned bounds otherwise.

    ONNX requires scalar bounds, so a batched bound (one per example) cannot stay a Clip input.
    ``Min(Max(x, lo), hi)`` is Clip's definition, including ``min > max`` (the result is max).
    """
    if not any(batched[1:]):
        return [bx.op("Clip", list(args), attributes_of(node))], [True]
    x, original = args[0], node.inputs[0]
    assert x is not None and original is not None
    rank = bx.rank(original)
    out = bx.align(x, batched[0], original, rank)
    for i, op_type in ((1, "Max"), (2, "Min")):
        bound = args[i] if i < len(args) else None
        bound_original = node.inputs[i] if i < len(node.inputs) else None
        if bound is None or bound_original is None:
            continue
        out = bx.op(op_type, [out, bx.align(bound, batched[i], bound_original, rank)])
    return [out], [True]


# ---------------------------------------------------------------------------------- Where
where = OpRules("Where", since=9)
# The condition broadcasts like the other operands, so it may be batched too.
where.batch(note_ranks(broadcasting_batch))


@where.jvp
def _where_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (c, a, b), (_, ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert c is not None and a is not None and b is not None
    if ta is None and tb is None:
        return [None]
    zero = em.scalar(0.0, like=_dtype_of(y))
    t = em.op("Where", [c, zero if ta is None else ta, zero if tb is None else tb])
    # Where broadcasts its three inputs; the result has y's shape if an input that is not a
    # zero scalar does.
    return [
        _expand_unless(em, t, [c, a if ta is not None else None, b if tb is not None else None], y)
    ]


@where.transpose
def _where_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (c, a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and c is not None and a is not None and b is not None
    zero = em.scalar(0.0, like=_dtype_of(y))
    ca = unbroadcast(em, em.op("Where", [c, ct, zero]), a, y) if linear[1] else None
    cb = unbroadcast(em, em.op("Where", [c, zero, ct]), b, y) if linear[2] else None
    return [None, ca, cb]


# --------------------------------------------------------------------------- Cast / CastLike
cast = OpRules("Cast", since=6)
cast.batch(note_ranks(vectorized_batch))
cast_like = OpRules("CastLike", since=15)


def _cast_target(node: ir.Node) -> ir.DataType:
    if node.op_type == "Cast":
        return ir.DataType(node.attributes.get_int("to", 0))
    out, target = node.outputs[0].dtype, node.inputs[1]
    assert target is not None
    return out if out is not None else _dtype_of(target)


@cast.jvp
def _cast_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    t = tangents[0]
    if t is None:
        return [None]
    target = _cast_target(node)
    if target in FLOAT_TYPES:
        return [_cast(em, t, target)]
    if target.is_floating_point() or target in (ir.DataType.COMPLEX64, ir.DataType.COMPLEX128):
        attr = "attribute to" if node.op_type == "Cast" else "the type of input 1 'target_type'"
        raise UnsupportedOperatorError(
            f"cannot differentiate {op_label(node)} at opset {em.opset} ({node_label(node)}): it "
            f"casts a value that carries a derivative to {target.name} ({attr} = {target.name}), "
            "but onnax differentiates FLOAT16, BFLOAT16, FLOAT and DOUBLE values only, and "
            "dropping the derivative "
            "would silently give zeros. Remedy: compute this part of the model in FLOAT or DOUBLE "
            "(cast to FLOAT instead), or leave the inputs that reach this node out of `inputs`."
        )
    # Integer, boolean and string results are piecewise constant: zero derivative.
    return [None]


@cast.transpose
def _cast_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    back = _cast(em, ct, _dtype_of(x))
    return [back] if node.op_type == "Cast" else [back, None]


cast_like.jvp(_cast_jvp)
cast_like.transpose(_cast_transpose)


@cast_like.batch
def _castlike_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """The second input only lends its element type: batched or not, it is passed as is.

    The result is batched exactly when the cast value is.
    """
    return [bx.op("CastLike", list(args), attributes_of(node))], [batched[0]]


# ----------------------------------------------------------------------------------- Mod
mod = OpRules("Mod", since=10)
mod.batch(note_ranks(broadcasting_batch))


@mod.jvp
def _mod_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    # Floating-point Mod (fmod=1) is a - b*trunc(a/b); fmod=0 would be a - b*floor(a/b). Both have
    # d/da = 1 and d/db = -q with q = (a - y)/b, an integer; Round removes the division's error.
    (a, b), (ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert a is not None and b is not None
    if tb is None:
        return [None if ta is None else broadcast_to(em, ta, a, y)]
    quotient = em.op("Round", [em.op("Div", [em.op("Sub", [a, y]), b])])
    tb_term = em.op("Mul", [tb, em.op("Neg", [quotient])])
    return [tb_term if ta is None else em.op("Add", [ta, tb_term])]
