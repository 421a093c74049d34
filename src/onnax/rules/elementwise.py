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
from onnax.core.registry import BatchRule, batch_rules, jvp_rules, transpose_rules
from onnax.core.selection import FLOAT_TYPES
from onnax.core.shapes import broadcast_to, same_shape, unbroadcast
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import (
    attributes_of,
    register_broadcasting_batch,
    register_linear_unary,
    register_vectorized_batch,
)

Tangents = Sequence[ir.Value | None]
Args = Sequence[ir.Value | None]
BatchResult = tuple[list[ir.Value | None], list[bool]]


def note_ranks(rule: BatchRule) -> BatchRule:
    """The batch rule, which also records the rank of the node's outputs when inference left it.

    An elementwise result has the largest rank of its operands. Shape inference loses it after a
    reduction over run-time axes (an expanded RMSNormalization computes its axes with Shape,
    Size and Range); the reduction's batch rule writes the rank it knows down, and writing it on
    through elementwise nodes lets the broadcasting batch rules that follow align operands.
    """

    def noted(
        bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
    ) -> tuple[Sequence[ir.Value | None], Sequence[bool]]:
        result = rule(bx, node, args, batched)
        shapes = [v.shape for v in node.inputs if v is not None]
        if shapes and all(shape is not None for shape in shapes):
            rank = max(shape.rank() for shape in shapes if shape is not None)
            for y in node.outputs:
                if y.shape is None:
                    y.shape = ir.Shape([None] * rank)
        return result

    noted.__doc__ = rule.__doc__
    return noted


def _broadcasting_batch(op_type: str, since_versions: Sequence[int]) -> None:
    """Registers the broadcasting batch rule at every ``since_version`` of the operator."""
    for v in since_versions:
        register_broadcasting_batch([op_type], since_version=v)
        rule = batch_rules.lookup("", op_type, v)
        assert rule is not None
        batch_rules.add(op_type, note_ranks(rule), since_version=v)


def _vectorized_batch(op_type: str, since_versions: Sequence[int]) -> None:
    """Registers the vectorized (apply as is) batch rule at every ``since_version``."""
    for v in since_versions:
        register_vectorized_batch([op_type], since_version=v)
        rule = batch_rules.lookup("", op_type, v)
        assert rule is not None
        batch_rules.add(op_type, note_ranks(rule), since_version=v)


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


for _op in ("Add", "Sub"):
    for _v in (7, 13, 14):
        jvp_rules.add(_op, _add_sub_jvp, since_version=_v)
        transpose_rules.add(_op, _add_sub_transpose, since_version=_v)
    _broadcasting_batch(_op, (1, 6, 7, 13, 14))


# ----------------------------------------------------------------------------------- Mul
def _mul_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb) = node.inputs, tangents
    assert a is not None and b is not None
    if a is b and ta is not None:
        # x * x: one term, 2x · t, instead of t·x + x·t.
        return [em.op("Mul", [ta, em.op("Mul", [a, em.scalar(2.0, a)])])]
    terms = []
    if ta is not None:
        terms.append(em.op("Mul", [ta, b]))
    if tb is not None:
        terms.append(em.op("Mul", [a, tb]))
    return [em.add_all(terms)]


def _mul_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
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
_broadcasting_batch("Mul", (1, 6, 7, 13, 14))


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


def _div_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[1]:
        raise AssertionError("Div is linear in its numerator only")
    return [unbroadcast(em, em.op("Div", [ct, b]), a, y), None]


for _v in (7, 13, 14):
    jvp_rules.add("Div", _div_jvp, since_version=_v)
    transpose_rules.add("Div", _div_transpose, since_version=_v)
_broadcasting_batch("Div", (1, 6, 7, 13, 14))


# ---------------------------------------------------------------------- Neg / Identity
register_linear_unary("Neg", (6, 13))
register_linear_unary("Identity", (1, 13, 14, 16, 19, 21, 25))
_vectorized_batch("Neg", (1, 6, 13))
_vectorized_batch("Identity", (1, 13, 14, 16, 19, 21, 23, 24, 25))


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
def _pow_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb), y = node.inputs, tangents, node.outputs[0]
    assert a is not None and b is not None
    dtype = _dtype_of(y)
    terms = []
    if ta is not None:
        # d(a^b)/da = b * a^(b-1). Since Pow-12 the exponent may have another (even an integer)
        # type; the coefficient is computed in the base's type.
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


for _v in (7, 12, 13, 15):
    jvp_rules.add("Pow", _pow_jvp, since_version=_v)
_broadcasting_batch("Pow", (1, 7, 12, 13, 15))


# ---------------------------------------------------------------------------- Sum / Mean
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


for _op in ("Sum", "Mean"):
    for _v in (6, 8, 13):
        jvp_rules.add(_op, _sum_mean_jvp, since_version=_v)
        transpose_rules.add(_op, _sum_mean_transpose, since_version=_v)
    _broadcasting_batch(_op, (1, 6, 8, 13))


# ----------------------------------------------------------------------------- Max / Min
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


for _op in ("Max", "Min"):
    for _v in (6, 8, 12, 13):
        jvp_rules.add(_op, _max_min_jvp, since_version=_v)
    _broadcasting_batch(_op, (1, 6, 8, 12, 13))


# ----------------------------------------------------------------------------------- Clip
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


for _v in (6, 11, 12, 13):
    jvp_rules.add("Clip", _clip_jvp, since_version=_v)


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


for _v in (1, 6, 11, 12, 13):
    batch_rules.add("Clip", _clip_batch, since_version=_v)


# ---------------------------------------------------------------------------------- Where
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


def _where_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (c, a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and c is not None and a is not None and b is not None
    zero = em.scalar(0.0, like=_dtype_of(y))
    ca = unbroadcast(em, em.op("Where", [c, ct, zero]), a, y) if linear[1] else None
    cb = unbroadcast(em, em.op("Where", [c, zero, ct]), b, y) if linear[2] else None
    return [None, ca, cb]


for _v in (9, 16):
    jvp_rules.add("Where", _where_jvp, since_version=_v)
    transpose_rules.add("Where", _where_transpose, since_version=_v)
# The condition broadcasts like the other operands, so it may be batched too.
_broadcasting_batch("Where", (9, 16))


# --------------------------------------------------------------------------- Cast / CastLike
def _cast_target(node: ir.Node) -> ir.DataType:
    if node.op_type == "Cast":
        return ir.DataType(node.attributes.get_int("to", 0))
    out, target = node.outputs[0].dtype, node.inputs[1]
    assert target is not None
    return out if out is not None else _dtype_of(target)


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


def _cast_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    ct, x = cts[0], node.inputs[0]
    assert ct is not None and x is not None
    back = _cast(em, ct, _dtype_of(x))
    return [back] if node.op_type == "Cast" else [back, None]


jvp_rules.add("Cast", _cast_jvp, since_version=6)
transpose_rules.add("Cast", _cast_transpose, since_version=6)
jvp_rules.add("CastLike", _cast_jvp, since_version=15)
transpose_rules.add("CastLike", _cast_transpose, since_version=15)
_vectorized_batch("Cast", (1, 6, 9, 13, 19, 21, 23, 24, 25, 28))


def _castlike_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """The second input only lends its element type: batched or not, it is passed as is.

    The result is batched exactly when the cast value is.
    """
    return [bx.op("CastLike", list(args), attributes_of(node))], [batched[0]]


for _v in (15, 19, 21, 23, 24, 25):
    batch_rules.add("CastLike", _castlike_batch, since_version=_v)


# ----------------------------------------------------------------------------------- Mod
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


jvp_rules.add("Mod", _mod_jvp, since_version=10)
_broadcasting_batch("Mod", (10, 13, 28))
