"""The public functions: thin wrappers over the passes."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.passes import GradPass, JvpPass, VjpPass

__all__ = ["grad", "jvp", "vjp"]


def jvp(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
) -> ir.Model:
    """Forward mode: a model that also computes Jacobian-vector products.

    The result takes the primal inputs, then one tangent ``fwd_<x>`` per selected input (same
    shape and dtype), and returns the primal outputs, then one tangent ``fwd_<y>`` per selected
    output: ``fwd_y = sum_x dy/dx · fwd_x``. On a model that already has ``fwd_`` names the prefix
    is ``fwd2_`` (then ``fwd3_``...), so ``jvp(jvp(m))`` needs no arguments.

    Args:
        model: The model to differentiate; it is not modified.
        inputs: Graph input or initializer names to differentiate with respect to, in order.
            Default: every FLOAT/DOUBLE graph input that is not an initializer.
        outputs: Graph output names to differentiate, in order. Default: every FLOAT/DOUBLE output.

    Returns:
        A new ``onnx_ir.Model`` built from ordinary ONNX operators.

    Raises:
        SelectionError: A name is unknown or not floating point.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return JvpPass(inputs, outputs)(model).model


def vjp(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
) -> ir.Model:
    """Reverse mode: a model that also computes vector-Jacobian products.

    The result takes the primal inputs, then one cotangent ``adj_<y>`` per selected output (same
    shape and dtype), and returns the primal outputs, then one cotangent ``adj_<x>`` per selected
    input: ``adj_x = sum_y (dy/dx)ᵀ · adj_y``. The prefix becomes ``adj2_``... on a model that
    already has ``adj_`` names.

    Args:
        model: The model to differentiate; it is not modified.
        inputs: Graph input or initializer names to differentiate with respect to, in order.
            Default: every FLOAT/DOUBLE graph input that is not an initializer.
        outputs: Graph output names to differentiate, in order. Default: every FLOAT/DOUBLE output.

    Returns:
        A new ``onnx_ir.Model`` built from ordinary ONNX operators.

    Raises:
        SelectionError: A name is unknown or not floating point.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return VjpPass(inputs, outputs)(model).model


def grad(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    output: str | None = None,
) -> ir.Model:
    """The gradient of one rank-0 output, with an implicit unit seed.

    The result takes the primal inputs unchanged and returns the primal outputs, then one gradient
    ``grad_<x>`` per selected input (same shape and dtype). Initializers selected by name keep
    their stored values.

    Args:
        model: The model to differentiate; it is not modified.
        inputs: Graph input or initializer names, in order. Default: every FLOAT/DOUBLE graph
            input that is not an initializer.
        output: The rank-0 FLOAT/DOUBLE output to differentiate. Default: the only one.

    Returns:
        A new ``onnx_ir.Model`` built from ordinary ONNX operators.

    Raises:
        SelectionError: The output is not a rank-0 float, or there is no unique default.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return GradPass(inputs, output)(model).model
