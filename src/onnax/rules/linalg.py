"""Linear algebra: MatMul, Gemm and Einsum.

All three are bilinear (Gemm: affine in ``C``), so every jvp is a sum of the operator applied with
one operand replaced by its tangent, and every transpose contracts the cotangent with the other
(primal) operands:

* ``MatMul`` follows numpy: 1-D operands get a dimension prepended (left) or appended (right)
  that is removed again, and batch dimensions broadcast. The transposes sum over broadcast batch
  dimensions (``unbroadcast``); the 1-D cases are written without any Transpose at all.
* ``Gemm`` computes ``alpha * A' @ B' + beta * C`` with ``A' = A`` or ``Aᵀ`` (``transA``), and
  likewise ``B'``; the cotangents of ``A`` and ``B`` are Gemms again with the ``trans*`` flags
  rearranged, the one of ``C`` is ``beta * unbroadcast(ct)``.
* ``Einsum``: the cotangent of operand ``k`` is one Einsum of the cotangent with the other
  operands whose output is operand ``k``'s own subscripts. Three things break the naive version
  and are handled here: a label that appears in no other term (the operand was summed over it:
  its cotangent is constant along that axis, which an extra operand of ones shaped like operand
  ``k`` supplies inside the same Einsum), a label repeated within operand ``k`` (the operand's
  diagonal was read: the cotangent is embedded on the diagonal by identity matrices built at run
  time from the operand's shape with ``Range``/``Equal``/``Cast``), and broadcasting, of the
  ellipsis dimensions (as documented) and of size-1 labelled dimensions (as onnxruntime and numpy
  allow): the cotangent is summed back over the broadcast axes.

Batch rules (vmap) need no loop: ``MatMul`` broadcasts batch dimensions already (a batched 1-D
operand is lifted to a stack of 1-row/1-column matrices, and a batched operand with fewer batch
dimensions than the other gets size-1 axes after its batch axis); ``Gemm``, which takes only
matrices, becomes ``MatMul`` with ``Transpose``/``Mul``/``Add``; ``Einsum`` names the batch axis
with a fresh label on the batched operands and in front of the output.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.attrs import float_attr, int_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import batch_rules, jvp_rules, transpose_rules
from onnax.core.shapes import broadcast_to, unbroadcast
from onnax.errors import UnsupportedOperatorError

Tangents = Sequence[ir.Value | None]
Dim = int | ir.SymbolicDim


# ------------------------------------------------------------------------------- helpers
def _dims(node: ir.Node, value: ir.Value, what: str, term: Sequence[str] = ("...",)) -> list[Dim]:
    """The dimensions of ``value``; reverse mode needs at least its rank.

    An Einsum operand's ``term`` without an ellipsis gives the rank when inference has none
    (behind a ``Squeeze`` without axes, say): then every dimension is unknown.
    """
    if value.shape is None and "..." not in term:
        return [ir.SymbolicDim(None) for _ in term]
    if value.shape is None:
        origin = _origin(node)
        raise UnsupportedOperatorError(
            f"{op_label(origin)} ({node_label(origin)}): the rank of its {what} "
            f"{value.name or 'a derivative value'!r} is "
            "unknown after shape inference, and the reverse-mode rule needs it to lay out the "
            "cotangent. Remedy: declare the shapes (symbolic dimensions are fine) of the graph "
            "inputs that feed this node."
        )
    return list(value.shape.dims)


def _shaped(dims: Sequence[Dim]) -> ir.Value:
    """A detached value carrying only a shape.

    It serves as the ``result`` argument of ``unbroadcast``, which reads nothing but its shape
    (emitted values have none until the next shape inference).
    """
    return ir.Value(name=None, shape=ir.Shape(list(dims)))


def _same_dim(a: Dim, b: Dim) -> bool:
    """True when two dimensions are provably equal."""
    if isinstance(a, int) or isinstance(b, int):
        return a == b
    return a.value is not None and a == b


def _unbroadcast_checked(
    em: Emitter, node: ir.Node, index: int, ct: ir.Value, result_dims: Sequence[Dim]
) -> ir.Value:
    """``unbroadcast`` of ``ct`` to input ``index`` of ``node``.

    Raises a user-facing error for the one case ``unbroadcast`` cannot build before opset 13: a
    symbolic operand dimension that may or may not broadcast at run time.
    """
    operand = node.inputs[index]
    assert operand is not None
    target = _dims(node, operand, "input")
    lead = len(result_dims) - len(target)
    if em.opset < 13:
        for dt, dr in zip(target, result_dims[lead:], strict=True):
            if not isinstance(dt, int) and not _same_dim(dt, dr):
                origin = _origin(node)
                raise UnsupportedOperatorError(
                    f"{op_label(origin)} at opset {em.opset} ({node_label(origin)}): the dimension "
                    f"{dt} of {_input_name(node, index)} may broadcast against {dr} at run "
                    "time, and summing the cotangent over it needs ReduceSum with run-time axes "
                    "(opset 13). Remedy: convert the model to opset 13 or newer "
                    "(onnx.version_converter), or give the dimensions the same symbolic name or a "
                    "static size."
                )
    return unbroadcast(em, ct, operand, _shaped(result_dims))


_PRIMAL = "onnax.linalg.primal_node"
"""Node metadata key: the user's node a linear node was emitted for (named in error messages)."""


def _tangent_sum(em: Emitter, node: ir.Node, terms: Sequence[ir.Value]) -> ir.Value | None:
    """The sum of the tangent ``terms`` of ``node``'s output, each stamped with its shape.

    Every term has exactly the output's shape, but shape inference may not prove it (broadcasting
    batch dimensions N and M infers a fresh symbol), and an ``Add`` of terms with unrelated
    symbolic shapes could not be transposed without run-time shape witnesses. Inference keeps
    shapes that are already set.
    """
    y = node.outputs[0]
    for t in terms:
        producer = t.producer()
        if producer is None or producer not in em.nodes:
            continue  # not emitted here (a tangent passed through): leave it alone
        producer.meta[_PRIMAL] = node
        if y.shape is not None:
            t.shape = y.shape.copy()
        if y.type is not None:
            t.type = y.type
    return em.add_all(terms)


def _origin(node: ir.Node) -> ir.Node:
    """The user's node behind a linear node (the node itself when it is not linear)."""
    primal = node.meta.get(_PRIMAL)
    return primal if isinstance(primal, ir.Node) else node


def _input_name(node: ir.Node, index: int) -> str:
    """``input <index> '<name>'`` of the user's node behind ``node``."""
    value = _origin(node).inputs[index]
    return f"input {index} {value.name if value is not None else None!r}"


def _swap_last(em: Emitter, x: ir.Value, rank: int) -> ir.Value:
    """Transposes the last two axes of a tensor of rank ``rank``."""
    return em.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


# -------------------------------------------------------------------------------- MatMul
def _matmul_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb) = node.inputs, tangents
    assert a is not None and b is not None
    terms = []
    if ta is not None:
        terms.append(em.op("MatMul", [ta, b]))
    if tb is not None:
        terms.append(em.op("MatMul", [a, tb]))
    return [_tangent_sum(em, node, terms)]


def _matmul_transpose_by_matrix(
    em: Emitter, ct: ir.Value, a: ir.Value, b: ir.Value, linear: Sequence[bool]
) -> list[ir.Value | None]:
    """MatMul's transpose when ``b`` is a matrix and ``a``'s rank is unknown.

    (A Squeeze without axes before it, say.) Neither cotangent needs that rank.

    ``a [..., k] @ b [k, n]`` broadcasts nothing, so ``ct @ bᵀ`` is laid out like ``a`` (a
    vector too), and ``ct_b`` is ``aᵀ @ ct`` with every leading axis of both flattened into the
    rows.
    """
    if linear[0]:
        return [em.op("MatMul", [ct, _swap_last(em, b, 2)]), None]
    static = [d for d in b.shape.dims if isinstance(d, int)] if b.shape is not None else []
    if len(static) == 2:
        rows_a, rows_ct = em.ints([-1, static[0]]), em.ints([-1, static[1]])
    else:
        shape = em.op("Shape", [b])
        minus = em.ints([-1])
        rows_a = em.op("Concat", [minus, em.slice(shape, [0], [1], [0])], {"axis": 0})
        rows_ct = em.op("Concat", [minus, em.slice(shape, [1], [2], [0])], {"axis": 0})
    flat_a = em.op("Reshape", [a, rows_a])
    flat_ct = em.op("Reshape", [ct, rows_ct])
    return [None, em.op("MatMul", [em.transpose(flat_a, [1, 0]), flat_ct])]


def _matmul_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[0] and linear[1]:
        raise AssertionError("MatMul of two linear values is not linear")
    if a.shape is None and b.shape is not None and b.shape.rank() == 2:
        return _matmul_transpose_by_matrix(em, ct, a, b, linear)
    da, db = _dims(node, a, "input"), _dims(node, b, "input")
    ra, rb = len(da), len(db)
    if linear[0]:
        # ct_a = ct @ bᵀ, laid out like a.
        if ra == 1 and rb == 1:
            return [em.op("Mul", [ct, b]), None]
        if ra == 1 and rb == 2:
            # ct [n] @ bᵀ [n, k]: a vector-matrix product, which stays one matrix product (not
            # a stack of matrix-vector products) when vmap adds a batch axis to ct.
            return [em.op("MatMul", [ct, _swap_last(em, b, 2)]), None]
        if ra == 1:
            # a [k] was lifted to [1, k]: ct [..., n] -> b @ ct[..., n, 1] = [..., k, 1], summed
            # over the batch axes and the appended one.
            r = em.op("MatMul", [b, em.unsqueeze(ct, [rb - 1])])
            return [em.reduce_sum(r, [*range(rb - 2), rb - 1], keepdims=False), None]
        if rb == 1:
            # b [k] was lifted to [k, 1]: ct [..., m] -> ct[..., m, 1] * b = [..., m, k] = a's shape.
            return [em.op("Mul", [em.unsqueeze(ct, [ra - 1]), b]), None]
        r = em.op("MatMul", [ct, _swap_last(em, b, rb)])
        dy = _dims(node, y, "output")
        return [_unbroadcast_checked(em, node, 0, r, [*dy[:-2], *da[-2:]]), None]
    # ct_b = aᵀ @ ct, laid out like b.
    if ra == 1 and rb == 1:
        return [None, em.op("Mul", [a, ct])]
    if ra == 1:
        # a[k, 1] @ ct[..., 1, n] = [..., k, n]: the batch axes are b's own, nothing to sum.
        return [None, em.op("MatMul", [em.unsqueeze(a, [1]), em.unsqueeze(ct, [rb - 2])])]
    if rb == 1 and ra == 2:
        # ct [m] @ a [m, k]: a vector-matrix product, one matrix product under vmap.
        return [None, em.op("MatMul", [ct, a])]
    if rb == 1:
        # ct[..., 1, m] @ a[..., m, k] = [..., 1, k], summed over every axis but the last.
        r = em.op("MatMul", [em.unsqueeze(ct, [ra - 2]), a])
        return [None, em.reduce_sum(r, list(range(ra - 1)), keepdims=False)]
    r = em.op("MatMul", [_swap_last(em, a, ra), ct])
    dy = _dims(node, y, "output")
    return [None, _unbroadcast_checked(em, node, 1, r, [*dy[:-2], *db[-2:]])]


for _v in (1, 9, 13):
    jvp_rules.add("MatMul", _matmul_jvp, since_version=_v)
    transpose_rules.add("MatMul", _matmul_transpose, since_version=_v)


# ---------------------------------------------------------------------------------- Gemm
def _gemm_attrs(node: ir.Node) -> tuple[float, float, int, int]:
    return (
        float_attr(node, "alpha", 1.0),
        float_attr(node, "beta", 1.0),
        int_attr(node, "transA", 0),
        int_attr(node, "transB", 0),
    )


def _gemm(
    em: Emitter, inputs: Sequence[ir.Value], alpha: float, beta: float, trans_a: int, trans_b: int
) -> ir.Value:
    """A Gemm with only the non-default attributes.

    ``C`` may be left out: it is optional from opset 11 on, the oldest opset served.
    """
    attrs = {
        "alpha": alpha if alpha != 1.0 else None,
        "beta": beta if beta != 1.0 and len(inputs) > 2 else None,
        "transA": 1 if trans_a else None,
        "transB": 1 if trans_b else None,
    }
    return em.op("Gemm", list(inputs), attrs)


def _scale(em: Emitter, x: ir.Value, factor: float, like: ir.Value) -> ir.Value:
    return x if factor == 1.0 else em.op("Mul", [x, em.scalar(factor, like)])


def _gemm_c(node: ir.Node) -> ir.Value | None:
    return node.inputs[2] if len(node.inputs) > 2 else None


def _gemm_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    a, b, c, y = node.inputs[0], node.inputs[1], _gemm_c(node), node.outputs[0]
    assert a is not None and b is not None
    ta, tb = tangents[0], tangents[1]
    tc = tangents[2] if len(tangents) > 2 and c is not None else None
    alpha, beta, trans_a, trans_b = _gemm_attrs(node)
    terms: list[ir.Value] = []
    # The tangent of C rides along in the first Gemm term: Gemm(tA, B, tC) is linear in (tA, tC).
    if ta is not None:
        terms.append(
            _gemm(em, [ta, b] + ([tc] if tc is not None else []), alpha, beta, trans_a, trans_b)
        )
        tc = None
    if tb is not None:
        terms.append(
            _gemm(em, [a, tb] + ([tc] if tc is not None else []), alpha, beta, trans_a, trans_b)
        )
        tc = None
    if tc is not None:
        assert c is not None
        terms.append(broadcast_to(em, _scale(em, tc, beta, y), c, y))
    return [_tangent_sum(em, node, terms)]


def _gemm_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), a, b, c, y = cts, node.inputs[0], node.inputs[1], _gemm_c(node), node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[0] and linear[1]:
        raise AssertionError("Gemm of two linear values is not linear")
    alpha, beta, trans_a, trans_b = _gemm_attrs(node)
    out: list[ir.Value | None] = [None] * len(node.inputs)
    if linear[0]:
        # Y = alpha A' B': ct_A' = alpha ct B'ᵀ, and ct_A = ct_A'ᵀ = alpha B' ctᵀ when transA.
        if trans_a:
            out[0] = _gemm(em, [b, ct], alpha, 1.0, trans_b, 1)
        else:
            out[0] = _gemm(em, [ct, b], alpha, 1.0, 0, 1 - trans_b)
    if linear[1]:
        # ct_B' = alpha A'ᵀ ct, and ct_B = alpha ctᵀ A' when transB.
        if trans_b:
            out[1] = _gemm(em, [ct, a], alpha, 1.0, 1, trans_a)
        else:
            out[1] = _gemm(em, [a, ct], alpha, 1.0, 1 - trans_a, 0)
    if len(linear) > 2 and linear[2]:
        assert c is not None
        out[2] = unbroadcast(em, _scale(em, ct, beta, y), c, y)
    return out


for _v in (7, 9, 11, 13):
    jvp_rules.add("Gemm", _gemm_jvp, since_version=_v)
    transpose_rules.add("Gemm", _gemm_transpose, since_version=_v)


# -------------------------------------------------------------------------------- Einsum
_ELLIPSIS = "..."
_LETTERS = string.ascii_lowercase + string.ascii_uppercase
Term = list[str]
"""The subscripts of one operand: letters and at most one ``"..."`` token."""
Label = str | int
"""One axis of a term: its letter, or ``-j`` for the j-th ellipsis dimension from the right (the
ellipsis dimensions of all operands align from the right, as in broadcasting)."""


def _einsum_error(node: ir.Node, what: str, remedy: str) -> UnsupportedOperatorError:
    return UnsupportedOperatorError(
        f"{op_label(node)} ({node_label(node)}): {what}. Remedy: {remedy}."
    )


def _tokenize(node: ir.Node, term: str) -> Term:
    tokens: Term = []
    i = 0
    while i < len(term):
        if term.startswith(_ELLIPSIS, i):
            tokens.append(_ELLIPSIS)
            i += 3
        elif term[i] in _LETTERS:
            tokens.append(term[i])
            i += 1
        else:
            raise _einsum_error(
                node,
                f"the equation term {term!r} contains {term[i]!r}; subscripts are ASCII letters and '...'",
                "fix the equation attribute",
            )
    if tokens.count(_ELLIPSIS) > 1:
        raise _einsum_error(
            node,
            f"the equation term {term!r} has more than one '...'",
            "fix the equation attribute",
        )
    return tokens


def _parse_equation(node: ir.Node) -> tuple[list[Term], Term]:
    """The operand terms and the explicit output term of an Einsum node.

    An implicit output (no ``->``) is, per the ONNX specification, the ellipsis (if any operand
    has one) followed by the labels that appear exactly once, sorted by ASCII value.
    """
    equation = node.attributes.get_string("equation", None)
    if equation is None:
        raise _einsum_error(
            node, "the 'equation' attribute is missing", "set the equation attribute"
        )
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = [_tokenize(node, t) for t in lhs.split(",")]
    if len(terms) != len(node.inputs):
        raise _einsum_error(
            node,
            f"the equation {equation!r} has {len(terms)} operand terms but the node has {len(node.inputs)} inputs",
            "make the number of comma-separated terms equal to the number of inputs",
        )
    if arrow:
        output = _tokenize(node, rhs)
    else:
        counts: dict[str, int] = {}
        for t in terms:
            for s in t:
                if s != _ELLIPSIS:
                    counts[s] = counts.get(s, 0) + 1
        ellipsis = [_ELLIPSIS] if any(_ELLIPSIS in t for t in terms) else []
        output = ellipsis + sorted(s for s, n in counts.items() if n == 1)
    letters = [s for s in output if s != _ELLIPSIS]
    if len(set(letters)) != len(letters):
        raise _einsum_error(
            node,
            f"the output term {''.join(output)!r} repeats a label",
            "name every output axis once",
        )
    return terms, output


def _layout(term: Term, rank: int) -> list[Label]:
    """The label of each axis of an operand of rank ``rank`` with subscripts ``term``."""
    n_ellipsis = rank - (len(term) - (1 if _ELLIPSIS in term else 0))
    labels: list[Label] = []
    for s in term:
        if s == _ELLIPSIS:
            labels.extend(range(-n_ellipsis, 0))
        else:
            labels.append(s)
    return labels


def _einsum_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    equation = node.attributes.get_string("equation", "")
    terms = []
    for k, t in enumerate(tangents):
        if t is not None:
            operands = list(node.inputs)
            operands[k] = t
            terms.append(em.op("Einsum", operands, {"equation": equation}))
    return [_tangent_sum(em, node, terms)]


def _stamp(value: ir.Value, dims: Sequence[Dim], dtype: ir.DataType) -> None:
    """Sets the shape of a helper computed from a run-time shape.

    Shape inference may not know it, and a later transform (a second derivative) reads its rank.
    """
    value.shape = ir.Shape(list(dims))
    value.dtype = dtype


def _eye(em: Emitter, n: ir.Value, dtype: ir.DataType) -> ir.Value:
    """An n x n identity built at run time from ``n`` (a 1-element int64 tensor)."""
    count = em.squeeze(n, [0])
    r = em.op("Range", [em.const(np.array(0, np.int64)), count, em.const(np.array(1, np.int64))])
    same = em.op("Equal", [em.unsqueeze(r, [1]), r])
    return em.op("Cast", [same], {"to": int(dtype)})


def _einsum_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), y = cts, node.outputs[0]
    assert ct is not None
    linear_at = [i for i, is_lin in enumerate(linear) if is_lin]
    if len(linear_at) != 1:
        raise AssertionError("Einsum is linear in exactly one operand")
    k = linear_at[0]
    x = node.inputs[k]
    assert x is not None and y.dtype is not None
    terms, output = _parse_equation(node)
    term_k = terms[k]
    dims_k = _dims(node, x, "input", term_k)
    labels_k = _layout(term_k, len(dims_k))

    # The operands of the cotangent Einsum, besides operand k's helpers: ct and the others.
    operands: list[ir.Value] = [ct]
    op_terms: list[Term] = [output]
    seen: dict[Label, list[Dim]] = {}

    def note(term: Term, value: ir.Value, what: str) -> None:
        dims = _dims(node, value, what, term)
        for label, d in zip(_layout(term, len(dims)), dims, strict=True):
            seen.setdefault(label, []).append(d)

    note(output, y, "output")
    for j, (term, value) in enumerate(zip(terms, node.inputs, strict=True)):
        if j != k:
            assert value is not None
            operands.append(value)
            op_terms.append(term)
            note(term, value, "input")

    # Operand k's first dimension for each label.
    dim_of: dict[Label, Dim] = {}
    axis_of: dict[Label, int] = {}
    for axis, (label, d) in enumerate(zip(labels_k, dims_k, strict=True)):
        dim_of.setdefault(label, d)
        axis_of.setdefault(label, axis)

    # A label of operand k that the others do not supply at full size (appearing in no other
    # term, or only with size 1, or the ellipsis absent elsewhere) comes from a tensor of ones
    # shaped like operand k: the cotangent is constant along such an axis.
    needs_ones = _ELLIPSIS in term_k and not any(_ELLIPSIS in t for t in op_terms)
    for label, d in dim_of.items():
        others = seen.get(label, [])
        if not others or (d != 1 and all(o == 1 for o in others)):
            needs_ones = True
    if needs_ones:
        one = ir.tensor(np.ones((1,), dtype=y.dtype.numpy()))
        ones = em.op("ConstantOfShape", [em.shape(x)], {"value": one})
        _stamp(ones, dims_k, y.dtype)
        operands.append(ones)
        op_terms.append(term_k)

    # A label repeated in operand k: its later occurrences get fresh letters tied to the first
    # by an identity matrix, which embeds the cotangent on the diagonal.
    used = {s for t in (*terms, output) for s in t}
    fresh = (s for s in _LETTERS if s not in used)
    out_term: Term = []
    eyes: dict[str, ir.Value] = {}
    for s in term_k:
        if s == _ELLIPSIS or s not in out_term:
            out_term.append(s)
            continue
        letter = next(fresh, None)
        if letter is None:
            raise _einsum_error(
                node,
                "the equation uses so many labels that no letter is left to transpose a repeated label",
                "split the Einsum into several",
            )
        if s not in eyes:
            axis = axis_of[s]
            eyes[s] = _eye(em, em.slice(em.shape(x), [axis], [axis + 1], [0]), y.dtype)
            _stamp(eyes[s], [dims_k[axis]] * 2, y.dtype)
        operands.append(eyes[s])
        op_terms.append([s, letter])
        out_term.append(letter)

    if needs_ones:
        for label, d in zip(labels_k, dims_k, strict=True):
            seen.setdefault(label, []).append(d)
    # The ellipsis axes of the result: those of every input, aligned from the right. When operand
    # k has fewer (or none), the extra leading ones are summed away after the Einsum.
    n_ellipsis = max([-label for label in seen if isinstance(label, int)], default=0)
    if _ELLIPSIS in term_k:
        start = term_k.index(_ELLIPSIS)
        extra = n_ellipsis - sum(1 for label in labels_k if isinstance(label, int))
    elif any(_ELLIPSIS in t for t in op_terms):
        # onnxruntime refuses an output without '...' when the inputs have ellipsis axes.
        out_term.insert(0, _ELLIPSIS)
        start, extra = 0, n_ellipsis
    else:
        start, extra = 0, 0
    equation = ",".join("".join(t) for t in op_terms) + "->" + "".join(out_term)
    r = em.op("Einsum", operands, {"equation": equation})
    out: list[ir.Value | None] = [None] * len(node.inputs)
    out[k] = _sum_broadcast_axes(em, node, k, r, labels_k, dims_k, seen, start, extra)
    return out


def _sum_broadcast_axes(
    em: Emitter,
    node: ir.Node,
    k: int,
    r: ir.Value,
    labels_k: list[Label],
    dims_k: list[Dim],
    seen: dict[Label, list[Dim]],
    start: int,
    extra: int,
) -> ir.Value:
    """Sums ``r`` back to the shape of operand ``k``, ``x``.

    ``r`` is laid out like ``x`` (labels ``labels_k``, sizes ``dims_k``) except that its sizes are
    the broadcast sizes of the Einsum inputs (``seen``: label -> their sizes) and that it has
    ``extra`` more ellipsis axes, starting at axis ``start``.
    """
    x = node.inputs[k]
    assert x is not None
    static_axes: list[int] = []
    dynamic_axes: dict[int, int] = {}  # axis of r -> axis of x
    first_axis: set[Label] = set()
    for axis_x, (label, d) in enumerate(zip(labels_k, dims_k, strict=True)):
        if label in first_axis:
            continue  # a repeated label: its later axes come from an identity, never broadcast
        first_axis.add(label)
        axis_r = axis_x + extra if axis_x >= start else axis_x
        sizes = seen.get(label, [])
        if isinstance(d, int):
            if d == 1 and any(s != 1 for s in sizes):
                static_axes.append(axis_r)
        elif isinstance(label, int) and not all(s == 1 or _same_dim(s, d) for s in sizes):
            # An ellipsis dimension that may be 1 at run time while another operand's is not.
            dynamic_axes[axis_r] = axis_x
    if static_axes:
        r = em.reduce_sum(r, static_axes, keepdims=True)
    if dynamic_axes:
        if em.opset < 13:
            origin = _origin(node)
            raise UnsupportedOperatorError(
                f"{op_label(origin)} at opset {em.opset} ({node_label(origin)}): an ellipsis "
                f"dimension of {_input_name(node, k)} may broadcast at run time, and summing the "
                "cotangent over it needs ReduceSum with run-time axes (opset 13). Remedy: convert "
                "the model to opset 13 or newer (onnx.version_converter), or give the ellipsis "
                "dimensions of all operands the same symbolic names or static sizes."
            )
        # Sum over the candidate axes whose size in x is 1 at run time; summing an axis whose
        # size is already 1 changes nothing, so the other axes are marked with a 2.
        shape_x = em.shape(x)
        rank_r = len(dims_k) + extra
        pieces = [
            em.slice(shape_x, [dynamic_axes[a]], [dynamic_axes[a] + 1], [0])
            if a in dynamic_axes
            else em.ints([2])
            for a in range(rank_r)
        ]
        is_one = em.op("Equal", [em.op("Concat", pieces, {"axis": 0}), em.ints([1])])
        axes = em.op("Reshape", [em.op("NonZero", [is_one]), em.ints([-1])])
        r = em.op("ReduceSum", [r, axes], {"keepdims": 1, "noop_with_empty_axes": 1})
    if extra > 0:
        r = em.reduce_sum(r, list(range(start, start + extra)), keepdims=False)
    return r


for _v in (12, 28):
    jvp_rules.add("Einsum", _einsum_jvp, since_version=_v)
    transpose_rules.add("Einsum", _einsum_transpose, since_version=_v)


# ------------------------------------------------------------------------- batch rules
Args = Sequence[ir.Value | None]


def _batch_rank(node: ir.Node, index: int) -> int:
    """The unbatched rank of input ``index``; a user-reachable error when it is unknown."""
    value = node.inputs[index]
    assert value is not None
    if value.shape is None:
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} ({node_label(node)}): batching it needs the rank of its "
            f"input {index} {value.name!r}, which shape inference could not determine. Remedy: "
            "declare the shapes (symbolic dimensions are fine) of the graph inputs that feed "
            "this node, or make the shapes it is reshaped to static in length."
        )
    return value.shape.rank()


def _matmul_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> tuple[list[ir.Value | None], list[bool]]:
    """MatMul under vmap: numpy broadcasting of the batch dimensions does the work.

    The batch axis (axis 0) of a batched operand must land in the broadcast batch dimensions,
    never in the matrix dimensions: a batched 1-D operand is lifted to a stack of matrices
    (``[B, 1, k]`` on the left, ``[B, k, 1]`` on the right) whose size-1 axis is squeezed from the
    result, and a batched operand with fewer batch dimensions than the other gets size-1 axes
    after its batch axis so that right alignment pairs it with the other's batch dimensions.
    """
    a, b = args
    assert a is not None and b is not None
    fa, fb = batched[0], batched[1]
    other = node.inputs[1]
    unknown = node.inputs[0] is not None and node.inputs[0].shape is None
    small = other is not None and other.shape is not None and other.shape.rank() <= 2
    if fa and not fb and unknown and small:
        # A batched operand of unknown rank against a shared vector or matrix: the batch axis
        # can only land among its own leading dimensions, whatever its rank (a 1-D example
        # becomes a row of the stack, and the result drops that axis alike).
        return [bx.op("MatMul", [a, b])], [True]
    ra, rb = _batch_rank(node, 0), _batch_rank(node, 1)
    # A stack of vectors against one shared matrix is one matrix product with the batch as its
    # rows: no lifting, so onnxruntime can still fuse a following Add/activation into a Gemm.
    if fa and not fb and ra == 1 and rb == 2:
        return [bx.op("MatMul", [a, b])], [True]
    if fb and not fa and rb == 1 and ra == 2:
        return [bx.op("MatMul", [b, _swap_last(bx, a, 2)])], [True]
    lift_a, lift_b = fa and ra == 1, fb and rb == 1
    if lift_a:
        a, ra = bx.unsqueeze(a, [1]), 2
    if lift_b:
        b, rb = bx.unsqueeze(b, [2]), 2
    rank = max(ra, rb)  # per-example ranks, after lifting
    if fa:
        a = bx.unsqueeze(a, list(range(1, 1 + rank - ra)))
    if fb:
        b = bx.unsqueeze(b, list(range(1, 1 + rank - rb)))
    # The ranks of the tensors actually multiplied, and of their product.
    na, nb = (1 + rank) if fa else ra, (1 + rank) if fb else rb
    nr = max(na, nb) if na >= 2 and nb >= 2 else (nb - 1 if na == 1 else na - 1)
    out = bx.op("MatMul", [a, b])
    squeeze = []
    if lift_a:
        squeeze.append(nr - 2 if nb >= 2 else nr - 1)
    if lift_b:
        squeeze.append(nr - 1)
    return [bx.squeeze(out, squeeze)], [True]


def _gemm_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> tuple[list[ir.Value | None], list[bool]]:
    """Gemm under vmap: Gemm takes only matrices, so it becomes ``alpha * A' @ B' + beta * C``.

    ``A'``/``B'`` transpose the last two axes when ``transA``/``transB`` is set (of the stack of
    matrices for a batched operand), ``MatMul`` broadcasts a shared operand against a batched one,
    and a batched ``C`` gets size-1 axes after its batch axis to broadcast against ``[M, N]``.
    """
    a, b = args[0], args[1]
    assert a is not None and b is not None
    alpha, beta, trans_a, trans_b = _gemm_attrs(node)
    y = node.outputs[0]
    if trans_a:
        a = _swap_last(bx, a, 3 if batched[0] else 2)
    if trans_b:
        b = _swap_last(bx, b, 3 if batched[1] else 2)
    out = _scale(bx, bx.op("MatMul", [a, b]), alpha, y)
    c = args[2] if len(args) > 2 else None
    if c is not None:
        if batched[2]:
            # C broadcasts unidirectionally to [M, N]: size-1 axes after the batch axis.
            c = bx.unsqueeze(c, list(range(1, 3 - _batch_rank(node, 2))))
        out = bx.op("Add", [out, _scale(bx, c, beta, y)])
    return [out], [True]


def _einsum_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> tuple[list[ir.Value | None], list[bool]]:
    """Einsum under vmap: a fresh label names the batch axis.

    Batched operands get the label first (their batch axis is axis 0, in front of any ellipsis),
    and so does the output, which keeps it from being summed; shared operands keep their terms.
    An implicit output is made explicit first (the fresh label would otherwise join it sorted).
    """
    terms, output = _parse_equation(node)
    used = {s for t in (*terms, output) for s in t}
    letter = next((s for s in _LETTERS if s not in used), None)
    if letter is None:
        raise _einsum_error(
            node,
            "vmap needs a fresh subscript for the batch axis, but the equation uses all 52 letters",
            "split the Einsum into several, or give its batched inputs in_axes None",
        )
    new_terms = [[letter, *t] if f else t for t, f in zip(terms, batched, strict=True)]
    equation = ",".join("".join(t) for t in new_terms) + "->" + letter + "".join(output)
    return [bx.op("Einsum", list(args), {"equation": equation})], [True]


for _v in (1, 9, 13):
    batch_rules.add("MatMul", _matmul_batch, since_version=_v)
for _v in (7, 9, 11, 13):
    batch_rules.add("Gemm", _gemm_batch, since_version=_v)
for _v in (12, 28):
    batch_rules.add("Einsum", _einsum_batch, since_version=_v)
