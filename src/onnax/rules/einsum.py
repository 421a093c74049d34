"""Einsum.

Einsum is multilinear, so its jvp is a sum of Einsums with one operand replaced by its tangent,
and the cotangent of operand ``k`` is one Einsum of the cotangent with the other operands whose
output is operand ``k``'s own subscripts. Three things break the naive version and are handled
here: a label that appears in no other term (the operand was summed over it: its cotangent is
constant along that axis, which an extra operand of ones shaped like operand ``k`` supplies
inside the same Einsum), a label repeated within operand ``k`` (the operand's diagonal was read:
the cotangent is embedded on the diagonal by identity matrices built at run time from the
operand's shape with ``Range``/``Equal``/``Cast``), and broadcasting, of the ellipsis dimensions
(as documented) and of size-1 labelled dimensions (as onnxruntime and numpy allow): the
cotangent is summed back over the broadcast axes.

The batch rule (vmap) names the batch axis with a fresh label on the batched operands and in
front of the output.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules.linalg import Dim, input_name, operand_dims, origin_node, same_dim, tangent_sum

__all__: list[str] = []

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


einsum = OpRules("Einsum", since=12)


@einsum.jvp
def _einsum_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    equation = node.attributes.get_string("equation", "")
    terms = []
    for k, t in enumerate(tangents):
        if t is not None:
            operands = list(node.inputs)
            operands[k] = t
            terms.append(em.op("Einsum", operands, {"equation": equation}))
    return [tangent_sum(em, node, terms)]


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


@einsum.transpose
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
    dims_k = operand_dims(node, x, "input", term_k)
    labels_k = _layout(term_k, len(dims_k))

    # The operands of the cotangent Einsum, besides operand k's helpers: ct and the others.
    operands: list[ir.Value] = [ct]
    op_terms: list[Term] = [output]
    seen: dict[Label, list[Dim]] = {}

    def note(term: Term, value: ir.Value, what: str) -> None:
        dims = operand_dims(node, value, what, term)
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
        elif isinstance(label, int) and not all(s == 1 or same_dim(s, d) for s in sizes):
            # An ellipsis dimension that may be 1 at run time while another operand's is not.
            dynamic_axes[axis_r] = axis_x
    if static_axes:
        r = em.reduce_sum(r, static_axes, keepdims=True)
    if dynamic_axes:
        if em.opset < 13:
            origin = origin_node(node)
            raise UnsupportedOperatorError(
                f"{op_label(origin)} at opset {em.opset} ({node_label(origin)}): an ellipsis "
                f"dimension of {input_name(node, k)} may broadcast at run time, and summing the "
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


@einsum.batch
def _einsum_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
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
