"""Linear algebra: MatMul and Gemm (Einsum is in :mod:`onnax.rules.einsum`).

Both are bilinear (Gemm: affine in ``C``), so every jvp is a sum of the operator applied with one
operand replaced by its tangent, and every transpose contracts the cotangent with the other
(primal) operand:

* ``MatMul`` follows numpy: 1-D operands get a dimension prepended (left) or appended (right)
  that is removed again, and batch dimensions broadcast. The transposes sum over broadcast batch
  dimensions (``unbroadcast``); the 1-D cases are written without any Transpose at all. The
  gradient of a shared 2-D weight ``b [k, n]`` (a Linear layer over ``[..., m, k]``) flattens
  the batch axes into the rows and is one ``Gemm`` with ``transA``, the sum over the batch part
  of the product; a batched MatMul with a ReduceSum after it measured 0.96-1.9x its time at
  transformer sizes (onnxruntime 1.32, one thread) and 8-16x for a few rows (``tests/benchmarks/bench_conv_grad.py``). The
  products of two matrices use Gemm's ``trans*`` flags instead of a Transpose: onnxruntime
  fuses such a Transpose into the MatMul itself (same speed, measured) but only at its extended
  optimisation level, while Gemm has no Transpose to fuse at any level.
* ``Gemm`` computes ``alpha * A' @ B' + beta * C`` with ``A' = A`` or ``Aᵀ`` (``transA``), and
  likewise ``B'``; the cotangents of ``A`` and ``B`` are Gemms again with the ``trans*`` flags
  rearranged, the one of ``C`` is ``beta * unbroadcast(ct)``.

Batch rules (vmap) need no loop: ``MatMul`` broadcasts batch dimensions already (a batched 1-D
operand is lifted to a stack of 1-row/1-column matrices, and a batched operand with fewer batch
dimensions than the other gets size-1 axes after its batch axis); ``Gemm``, which takes only
matrices, becomes ``MatMul`` with ``Transpose``/``Mul``/``Add``.

The helpers that read operand shapes, stamp tangent terms and name the user's node in errors
(:func:`operand_dims`, :func:`tangent_sum`, :func:`origin_node`, ...) serve Einsum too.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.attrs import float_attr, int_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.core.shapes import broadcast_to, unbroadcast
from onnax.errors import UnsupportedOperatorError

__all__ = ["Dim", "input_name", "operand_dims", "origin_node", "same_dim", "tangent_sum"]

Dim = int | ir.SymbolicDim
"""One dimension of an inferred shape: static, or symbolic (possibly unnamed)."""


# ------------------------------------------------------------------------------- helpers
def operand_dims(
    node: ir.Node, value: ir.Value, what: str, term: Sequence[str] = ("...",)
) -> list[Dim]:
    """The dimensions of ``value``; reverse mode needs at least its rank.

    An Einsum operand's ``term`` without an ellipsis gives the rank when inference has none
    (behind a ``Squeeze`` without axes, say): then every dimension is unknown.
    """
    if value.shape is None and "..." not in term:
        return [ir.SymbolicDim(None) for _ in term]
    if value.shape is None:
        origin = origin_node(node)
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


def same_dim(a: Dim, b: Dim) -> bool:
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
    target = operand_dims(node, operand, "input")
    lead = len(result_dims) - len(target)
    if em.opset < 13:
        for dt, dr in zip(target, result_dims[lead:], strict=True):
            if not isinstance(dt, int) and not same_dim(dt, dr):
                origin = origin_node(node)
                raise UnsupportedOperatorError(
                    f"{op_label(origin)} at opset {em.opset} ({node_label(origin)}): the dimension "
                    f"{dt} of {input_name(node, index)} may broadcast against {dr} at run "
                    "time, and summing the cotangent over it needs ReduceSum with run-time axes "
                    "(opset 13). Remedy: convert the model to opset 13 or newer "
                    "(onnx.version_converter), or give the dimensions the same symbolic name or a "
                    "static size."
                )
    return unbroadcast(em, ct, operand, _shaped(result_dims))


_PRIMAL = "onnax.linalg.primal_node"
"""Node metadata key: the user's node a linear node was emitted for (named in error messages)."""


def tangent_sum(em: Emitter, node: ir.Node, terms: Sequence[ir.Value]) -> ir.Value | None:
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


def origin_node(node: ir.Node) -> ir.Node:
    """The user's node behind a linear node (the node itself when it is not linear)."""
    primal = node.meta.get(_PRIMAL)
    return primal if isinstance(primal, ir.Node) else node


def input_name(node: ir.Node, index: int) -> str:
    """``input <index> '<name>'`` of the user's node behind ``node``."""
    value = origin_node(node).inputs[index]
    return f"input {index} {value.name if value is not None else None!r}"


def _swap_last(em: Emitter, x: ir.Value, rank: int) -> ir.Value:
    """Transposes the last two axes of a tensor of rank ``rank``."""
    return em.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


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


# --------------------------------------------------------------------------------- MatMul
matmul = OpRules("MatMul")


@matmul.jvp
def _matmul_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    (a, b), (ta, tb) = node.inputs, tangents
    assert a is not None and b is not None
    terms = []
    if ta is not None:
        terms.append(em.op("MatMul", [ta, b]))
    if tb is not None:
        terms.append(em.op("MatMul", [a, tb]))
    return [tangent_sum(em, node, terms)]


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
    return [None, _gemm(em, [flat_a, flat_ct], 1.0, 1.0, 1, 0)]


@matmul.transpose
def _matmul_transpose(
    em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
) -> list[ir.Value | None]:
    (ct,), (a, b), y = cts, node.inputs, node.outputs[0]
    assert ct is not None and a is not None and b is not None
    if linear[0] and linear[1]:
        raise AssertionError("MatMul of two linear values is not linear")
    if a.shape is None and b.shape is not None and b.shape.rank() == 2:
        return _matmul_transpose_by_matrix(em, ct, a, b, linear)
    da, db = operand_dims(node, a, "input"), operand_dims(node, b, "input")
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
        if ra == 2 and rb == 2:
            return [_gemm(em, [ct, b], 1.0, 1.0, 0, 1), None]
        r = em.op("MatMul", [ct, _swap_last(em, b, rb)])
        dy = operand_dims(node, y, "output")
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
    if rb == 2:
        # A weight [k, n] shared by every row of a [..., m, k]: the sum over the batch axes is
        # part of one product, aᵀ [k, rows] @ ct [rows, n] (a batched MatMul and a ReduceSum
        # of [..., k, n] measured up to 2-8x slower; bench_conv_grad.py). Flatten keeps the
        # batch axes symbolic; Gemm's transA spares the Transpose at every optimisation level.
        rows_a = a if ra == 2 else em.op("Flatten", [a], {"axis": ra - 1})
        rows_ct = ct if ra == 2 else em.op("Flatten", [ct], {"axis": ra - 1})
        return [None, _gemm(em, [rows_a, rows_ct], 1.0, 1.0, 1, 0)]
    r = em.op("MatMul", [_swap_last(em, a, ra), ct])
    dy = operand_dims(node, y, "output")
    return [None, _unbroadcast_checked(em, node, 1, r, [*dy[:-2], *db[-2:]])]


@matmul.batch
def _matmul_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
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


# ----------------------------------------------------------------------------------- Gemm
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


gemm = OpRules("Gemm", since=7)


@gemm.jvp
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
    return [tangent_sum(em, node, terms)]


@gemm.transpose
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


@gemm.batch
def _gemm_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
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
