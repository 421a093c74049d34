"""Pattern helpers shared by the rule modules (the counterparts of JAX's ``defjvp`` family)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import op_label
from onnax.core.emit import Emitter, InternalRuleError
from onnax.core.registry import (
    Args,
    BatchResult,
    BatchRule,
    JvpRule,
    Tangents,
    TransposeRule,
)

__all__ = [
    "Coefficient",
    "TypedOps",
    "batch_data",
    "original_input",
    "attributes_of",
    "broadcasting_batch",
    "elementwise_unary",
    "linear_unary_jvp",
    "linear_unary_transpose",
    "note_ranks",
    "vectorized_batch",
]

Coefficient = Callable[[Emitter, ir.Node, ir.Value, ir.Value], ir.Value]
"""``(emitter, node, x, y) -> dy/dx``, built from primal values only."""


def elementwise_unary(coefficient: Coefficient) -> JvpRule:
    """The jvp rule ``fwd_y = coefficient(x, y) * fwd_x`` of a one-input elementwise operator.

    Its reverse mode comes from the transpose of ``Mul``; no transpose rule is needed.
    """

    def rule(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
        t = tangents[0]
        if t is None:
            return [None]
        coef = coefficient(em, node, node.inputs[0], node.outputs[0])  # type: ignore[arg-type]
        return [em.op("Mul", [t, coef])]

    return rule


def linear_unary_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """The jvp rule of an operator linear in its first input (``Neg``, ``Identity``).

    The operator is applied to the tangent, its attributes and further inputs carried over.
    """
    t = tangents[0]
    if t is None:
        return [None]
    return [em.op(node.op_type, [t, *node.inputs[1:]], attributes_of(node))]


def linear_unary_transpose(transpose_op: str | None = None) -> TransposeRule:
    """The transpose rule of an operator linear in its first input.

    It applies ``transpose_op`` (default: the operator itself) to the cotangent.
    """

    def rule(
        em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
    ) -> list[ir.Value | None]:
        ct = cts[0]
        if ct is None:
            return [None]
        return [em.op(transpose_op or node.op_type, [ct, *node.inputs[1:]], attributes_of(node))]

    return rule


def vectorized_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Batch rule of operators that act on each element independently: apply them as they are.

    Only the first input may be batched; further inputs (if any) must be shared, which the rule
    checks by materializing them otherwise.
    """
    outs = bx.op_multi(
        node.op_type,
        list(args),
        attributes_of(node),
        num_outputs=len(node.outputs),
        domain=node.domain,
    )
    return list(outs), [True] * len(outs)


def broadcasting_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
) -> BatchResult:
    """Batch rule of multidirectionally broadcasting elementwise operators (Add, Where, ...).

    Batched operands get size-1 axes after the batch axis so that numpy-style right alignment
    still lines up their own dimensions; shared operands broadcast as they are.
    """
    rank = max(bx.rank(v) for v in node.inputs if v is not None)
    aligned = [
        None if a is None or v is None else bx.align(a, b, v, rank)
        for a, b, v in zip(args, batched, node.inputs, strict=True)
    ]
    outs = bx.op_multi(
        node.op_type,
        aligned,
        attributes_of(node),
        num_outputs=len(node.outputs),
        domain=node.domain,
    )
    return list(outs), [True] * len(outs)


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


def attributes_of(node: ir.Node, **overrides: object) -> dict[str, object]:
    """The node's attributes as Python values, with some replaced (None drops one)."""
    attrs: dict[str, object] = {k: a.value for k, a in node.attributes.items()}
    attrs.update(overrides)
    return {k: v for k, v in attrs.items() if v is not None}


class TypedOps:
    """Arithmetic in the element type ``dtype`` on emitted values (weights, masks)."""

    def __init__(self, em: Emitter, dtype: ir.DataType) -> None:
        self.em = em
        self.dtype = dtype

    def c(self, number: float) -> ir.Value:
        return self.em.const(np.array(number, self.dtype.numpy()))

    def __call__(self, op: str, *args: ir.Value) -> ir.Value:
        return self.em.op(op, list(args))

    def mask(self, condition: ir.Value) -> ir.Value:
        return self.em.op("Cast", [condition], {"to": self.dtype})


def batch_data(args: Sequence[ir.Value | None]) -> ir.Value:
    """The data input (first argument) of a batch rule, which is always present."""
    x = args[0]
    if x is None:
        raise InternalRuleError("batch rule: the data input is missing")
    return x


def original_input(node: ir.Node, index: int = 0) -> ir.Value:
    """An original (unbatched) input: read its rank and static dims only, never its value."""
    value = node.inputs[index] if index < len(node.inputs) else None
    if value is None:
        raise InternalRuleError(f"{op_label(node)}: input {index} is missing")
    return value
