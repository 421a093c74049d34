"""The public rule API: rules for operators onnax does not know, such as custom-domain ones.

A model that uses an operator of its own domain (``my.ops::Swish``) can be differentiated and
batched once the operator has rules. :func:`register` takes the rules themselves, in the
signatures of :mod:`onnax.core.registry`; the helpers declare the common kinds in one call:

* :func:`register_zero_derivative`: outputs that are integer, boolean or piecewise constant;
* :func:`register_linear`: linear in the first input (scaling, a fixed layout change), so that
  the operator applied to the tangent is the tangent, and a given operator its transpose;
* :func:`register_elementwise`: one input, elementwise, with ``dy/dx`` given as an expression
  built from the primal values (``lambda em, x, y: ...``).

Registered rules take part in everything: jvp, vjp, grad, vmap and their compositions (the
emitted tangent computation must use operators that have rules, as built-in rules do). A second
registration of the same operator and version raises; see ``docs/writing-rules.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx_ir as ir
import onnx_shape_inference as osi

from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import (
    BatchRule,
    JvpRule,
    LoweringRule,
    OpRules,
    Tangents,
    TransposeRule,
)
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, elementwise_unary, note_ranks, vectorized_batch

__all__ = [
    "Derivative",
    "ShapeRule",
    "like_first_input",
    "register",
    "register_elementwise",
    "register_linear",
    "register_zero_derivative",
    "registered",
]

Derivative = Callable[[Emitter, ir.Value, ir.Value], ir.Value]
"""``(emitter, x, y) -> dy/dx`` of a one-input elementwise operator ``y = f(x)``, built with
``em.op(...)`` from the primal values only (``lambda em, x, y: em.op("Cos", [x])``)."""


ShapeRule = Callable[[osi.ShapeInferenceContext, ir.Node], None]
"""An onnx_shape_inference rule ``(ctx, node) -> None`` that sets the outputs' dtype and shape
(``ctx.set_dtype``, ``ctx.set_shape``). The transforms read the types of every value, so an
operator unknown to inference needs one."""


def like_first_input(ctx: osi.ShapeInferenceContext, node: ir.Node) -> None:
    """Shape rule: every output has the first input's dtype and shape.

    For elementwise operators and layout-preserving linear maps.
    """
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return
    for y in node.outputs:
        if x.dtype is not None:
            ctx.set_dtype(y, x.dtype)
        if x.shape is not None:
            ctx.set_shape(y, x.shape)


def _register_shape(domain: str, op_type: str, since_version: int, shape: ShapeRule | None) -> None:
    """Gives onnx_shape_inference the operator's rule, unless it has one already."""
    if shape is None:
        return
    osi.registry.collect()
    if osi.registry.get(domain, op_type, version=since_version) is None:
        osi.registry.register(domain, op_type, since_version=since_version)(shape)


def registered() -> set[tuple[str, str]]:
    """``(domain, op_type)`` of every operator registered through this API.

    They are the user's, not onnax's own: the coverage table and the dispatch snapshot leave
    them out.
    """
    return {key for key, modules in OpRules.owners().items() if __name__ in modules}


def _check_names(domain: str, op_type: str, since_version: int) -> None:
    if not op_type or not isinstance(op_type, str):
        raise ValueError(f"register: op_type must be a non-empty string, got {op_type!r}")
    if not isinstance(domain, str):
        raise ValueError(
            f"register: domain must be a string ('' for ONNX operators), got {domain!r}"
        )
    if since_version < 1:
        raise ValueError(
            f"register: since_version must be at least 1 (the domain's first opset), "
            f"got {since_version}"
        )


def register(
    domain: str,
    op_type: str,
    *,
    jvp: JvpRule | None = None,
    transpose: TransposeRule | None = None,
    batch: BatchRule | None = None,
    lowering: LoweringRule | None = None,
    shape: ShapeRule | None = None,
    since_version: int = 1,
) -> OpRules:
    """Registers rules for ``domain::op_type`` from ``since_version`` of its domain on.

    Args:
        domain: The operator's domain (``""`` for the ONNX domain).
        op_type: The operator.
        jvp: ``(emitter, node, input tangents) -> output tangents`` (``None`` is a zero tangent),
            linear in the tangents. Enables jvp, and with ``transpose`` rules for the operators it
            emits, vjp and grad.
        transpose: ``(emitter, node, output cotangents, which inputs are linear) -> input
            cotangents``, for an operator that jvp rules apply to tangents (a linear one).
        batch: ``(batcher, node, new inputs, which are batched) -> (new outputs, which are
            batched)``, the batch axis at 0. Enables vmap.
        lowering: ``(emitter, node) -> outputs`` computed by operators that have rules: the
            transforms then expand the node instead of needing the other rules.
        shape: The operator's shape inference (:data:`ShapeRule`, e.g. :func:`like_first_input`),
            registered with onnx_shape_inference unless it has one: the transforms need the
            dtype and shape of every value.
        since_version: The version of ``domain`` (the model's opset import of it) from which
            the rules serve.

    Returns:
        The operator's :class:`~onnax.core.registry.OpRules` block, for registering more rules
        (``ops.batch(rule, since=...)``).

    Raises:
        ValueError: No rule given, or a bad name or version.
        onnax.core.registry.DuplicateRuleError: The operator already has a rule of that kind
            at that version.
    """
    _check_names(domain, op_type, since_version)
    if jvp is None and transpose is None and batch is None and lowering is None:
        raise ValueError(
            f"register: no rule given for {domain or 'ai.onnx'}::{op_type}; pass jvp=, "
            "transpose=, batch= or lowering= (or use register_zero_derivative, register_linear "
            "or register_elementwise)"
        )
    ops = OpRules(op_type, since=since_version, domain=domain)
    _register_shape(domain, op_type, since_version, shape)
    if jvp is not None:
        ops.jvp(jvp)
    if transpose is not None:
        ops.transpose(transpose)
    if batch is not None:
        ops.batch(batch)
    if lowering is not None:
        ops.lowering(lowering)
    return ops


def register_zero_derivative(
    domain: str,
    op_type: str,
    *,
    since_version: int = 1,
    elementwise: bool = True,
    shape: ShapeRule | None = like_first_input,
) -> OpRules:
    """Declares that no output of the operator has a derivative.

    For integer, boolean or piecewise constant outputs: a rounding, a comparison, an argmax.

    Args:
        domain: The operator's domain.
        op_type: The operator.
        since_version: The version of ``domain`` from which the declaration holds.
        elementwise: The operator acts on each element alone, so vmap applies it to batched
            inputs as it is (a batch rule is registered); ``False`` registers no batch rule.
        shape: Its shape inference (default: outputs like the first input; pass another
            :data:`ShapeRule` for a comparison's bool output, say).

    Returns:
        The operator's OpRules block.
    """
    _check_names(domain, op_type, since_version)
    ops = OpRules(op_type, since=since_version, domain=domain)
    _register_shape(domain, op_type, since_version, shape)
    ops.zero()
    if elementwise:
        ops.batch(note_ranks(vectorized_batch))
    return ops


def register_linear(
    domain: str,
    op_type: str,
    *,
    transpose_op: str | None = None,
    transpose_domain: str | None = None,
    since_version: int = 1,
    elementwise: bool = False,
    shape: ShapeRule | None = like_first_input,
) -> OpRules:
    """Declares an operator linear in its first input, its other inputs and attributes fixed.

    Its tangent is the operator applied to the tangent; its transpose is ``transpose_op``.

    Args:
        domain: The operator's domain.
        op_type: The operator.
        transpose_op: The operator that applies the transpose (adjoint) with the same further
            inputs and attributes; ``None`` when the operator is its own transpose (a symmetric
            scaling). Needed for vjp and grad.
        transpose_domain: The domain of ``transpose_op`` (default: ``domain``).
        since_version: The version of ``domain`` from which the declaration holds.
        elementwise: The operator acts on each element alone (vmap applies it as it is).
        shape: Its shape inference (default: the output like the first input).

    Returns:
        The operator's OpRules block, for a batch rule of a non-elementwise operator.
    """
    _check_names(domain, op_type, since_version)
    ops = OpRules(op_type, since=since_version, domain=domain)
    _register_shape(domain, op_type, since_version, shape)
    target_op = transpose_op or op_type
    target_domain = domain if transpose_domain is None else transpose_domain

    def apply(em: Emitter, op: str, op_domain: str, node: ir.Node, t: ir.Value) -> ir.Value:
        # the operator's own further inputs and attributes, with the tangent as first input
        return em.op_multi(op, [t, *node.inputs[1:]], attributes_of(node), domain=op_domain)[0]

    @ops.jvp
    def jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
        further = [i for i, t in enumerate(tangents) if i > 0 and t is not None]
        if further:
            # register_linear says nothing of the other inputs: a zero would be a guess
            i = further[0]
            raise UnsupportedOperatorError(
                f"no derivative of {op_label(node)} with respect to input {i} "
                f"({node_label(node)}): it was registered with register_linear, which declares "
                "it linear in its first input only. Remedy: leave that input out of `inputs` "
                "(or stop the derivative before it), or register a full jvp rule with "
                f"onnax.rules.register({node.domain!r}, {node.op_type!r}, jvp=...)"
            )
        t = tangents[0]
        out = None if t is None else apply(em, node.op_type, node.domain, node, t)
        return [out, *([None] * (len(node.outputs) - 1))]

    @ops.transpose
    def transpose(
        em: Emitter, node: ir.Node, cts: Tangents, linear: Sequence[bool]
    ) -> list[ir.Value | None]:
        ct = cts[0]
        out = None if ct is None else apply(em, target_op, target_domain, node, ct)
        return [out, *([None] * (len(node.inputs) - 1))]

    if elementwise:
        ops.batch(note_ranks(vectorized_batch))
    return ops


def register_elementwise(
    domain: str,
    op_type: str,
    derivative: Derivative,
    *,
    since_version: int = 1,
    shape: ShapeRule | None = like_first_input,
) -> OpRules:
    """Declares a one-input elementwise operator ``y = f(x)`` with a given ``dy/dx``.

    ``derivative(em, x, y)`` builds ``dy/dx`` from the primal values.

    The tangent is ``derivative * tangent`` (a Mul, whose transpose gives reverse mode), and vmap
    applies the operator to the batched input as it is. The expression may read ``x`` and ``y``
    and must use operators that have rules (``Mul``, ``Sigmoid``, ``Where``...), so the derivative
    model can be differentiated again.

    Args:
        domain: The operator's domain.
        op_type: The operator.
        derivative: ``(emitter, x, y) -> dy/dx``, elementwise, shaped like ``x``.
        since_version: The version of ``domain`` from which the declaration holds.
        shape: Its shape inference (default: the output like the input).

    Returns:
        The operator's OpRules block.
    """
    _check_names(domain, op_type, since_version)
    if not callable(derivative):
        raise ValueError(
            f"register_elementwise: derivative must be a function (em, x, y) -> dy/dx, "
            f"got {derivative!r}"
        )
    ops = OpRules(op_type, since=since_version, domain=domain)
    _register_shape(domain, op_type, since_version, shape)

    def coefficient(em: Emitter, node: ir.Node, x: ir.Value, y: ir.Value) -> ir.Value:
        return derivative(em, x, y)

    ops.jvp(elementwise_unary(coefficient))
    ops.batch(note_ranks(vectorized_batch))
    return ops
