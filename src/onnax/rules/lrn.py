"""LRN (local response normalization): a lowering for differentiation, a batch rule for vmap.

LRN (1, 13) is *lowered* for jvp, vjp and grad (:data:`onnax.core.registry.lowerings`, applied
by the expansion pass): ``y = x * exp(-beta * log(D))``, ``D = bias + alpha / size * S``, ``S``
the sum of ``x**2`` over the channel window ``[c - floor((size-1)/2), c + ceil((size-1)/2)]``,
one ``Pad`` of the channel axis and ``size`` ``Slice``s added up. The derivative comes from
those primitives' rules, and the derived model computes the primal from the same pieces
(onnxruntime's LRN kernel is 10x slower than they are).

vmap keeps the operator (a batch rule): LRN treats every row of the leading ``N`` axis alike, so
the batch is folded into it (``[B, N, C, ...]`` reshaped to ``[B*N, C, ...]``, the operator
applied, and the result reshaped back).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.attrs import float_attr
from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules
from onnax.errors import UnsupportedOperatorError
from onnax.rules._normalization import INT64_MAX, data_input, f32, folded_batch, known_rank

__all__: list[str] = []

lrn = OpRules("LRN")


def _lrn_size(node: ir.Node) -> int:
    size = node.attributes.get_int("size", None)
    if size is None or size < 1:
        raise UnsupportedOperatorError(
            f"{op_label(node)} ({node_label(node)}) has size={size}; ONNX requires a positive "
            "size. Remedy: set the size attribute."
        )
    return size


def _window_sum(em: Emitter, z: ir.Value, size: int, rank: int) -> ir.Value:
    """``S[:, c] = sum(z[:, c - floor((size-1)/2) : c + ceil((size-1)/2) + 1])``, zero outside.

    Linear in ``z``: a zero ``Pad`` of the channel axis and ``size`` shifted ``Slice``s of the
    padded value (each ``C`` long: its end counts back from the padded end), added up.
    """
    if size == 1:
        return z
    before, after = (size - 1) // 2, size // 2
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    padded = em.op("Pad", [z, em.ints(pads)])
    pieces = [
        em.slice(padded, [k], [k - (size - 1) if k < size - 1 else INT64_MAX], [1])
        for k in range(size)
    ]
    total = em.add_all(pieces)
    assert total is not None
    return total


@lrn.lowering
def _lrn_lowering(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    """``y = x * exp(-beta * log(D))``, ``D = bias + alpha / size * W(x * x)``.

    A lowering rather than a jvp rule: differentiated, the primal is computed once from the
    pieces its derivative needs (``D`` and ``D**-beta``), and onnxruntime's LRN kernel, measured
    10x slower than these primitives (and slower than the whole derivative), is not run at
    all. ``exp(-beta * log(D))`` rather than ``Pow``: onnxruntime's Pow with a non-integer
    exponent is a scalar loop, twice as slow.
    """
    x = data_input(node)
    size, rank = _lrn_size(node), known_rank(node, x)
    alpha = f32(float_attr(node, "alpha", 1e-4))
    beta = f32(float_attr(node, "beta", 0.75))
    bias = f32(float_attr(node, "bias", 1.0))
    square_sum = _window_sum(em, em.op("Mul", [x, x]), size, rank)
    base = em.op(
        "Add", [em.scalar(bias, x), em.op("Mul", [square_sum, em.scalar(alpha / size, x)])]
    )
    scale = em.op("Exp", [em.op("Mul", [em.op("Log", [base]), em.scalar(-beta, x)])])
    return [em.op("Mul", [x, scale])]


@lrn.batch
def _lrn_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    return [folded_batch(bx, node, args)], [True]
