"""The public functions: thin wrappers over the passes."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import RandomnessPolicy
from onnax.passes import GradPass, JvpPass, VjpPass
from onnax.passes.vmap import AxisSpec, VmapPass

__all__ = ["grad", "jvp", "vjp", "vmap"]


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


def vmap(
    model: ir.Model,
    in_axes: AxisSpec = 0,
    out_axes: AxisSpec = 0,
    axis_size: int | None = None,
    randomness: RandomnessPolicy = "error",
) -> ir.Model:
    """Vectorizing map: a model that runs ``model`` on a batch of independent examples.

    Each batched input gains a batch dimension at its ``in_axes`` entry; shared inputs (None) and
    initializers are used as they are by every example. Each output gains the batch dimension at
    its ``out_axes`` entry. The result contains no loop: every operator is rewritten to work on
    the whole batch (``Reshape`` and other shape-consuming operators put the batch dimension back,
    reductions and axis-carrying operators shift their axes).

    Args:
        model: The model to batch; it is not modified.
        in_axes: One int for every input, a sequence in graph-input order, or a dict from input
            name to axis. Entries are ints (negative counts from the end of the batched input) or
            None (shared).
        out_axes: The same, per graph output.
        axis_size: The batch size; None keeps it a symbolic dimension.
        randomness: Random operators: "error" (default), "different" or "same".

    Returns:
        A new ``onnx_ir.Model`` with the same input and output names.

    Raises:
        SelectionError: ``in_axes``/``out_axes`` do not match the model, an axis is out of range,
            or static batch sizes disagree.
        UnsupportedOperatorError: An operator on a batched path has no batch rule.
    """
    return VmapPass(in_axes, out_axes, axis_size, randomness)(model).model
