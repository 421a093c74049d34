"""The public functions: thin wrappers over the passes."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import RandomnessPolicy
from onnax.passes import GradPass, JvpPass, VjpPass
from onnax.passes.accumulate import Accumulate
from onnax.passes.derived import HessianPass, JacfwdPass, JacrevPass
from onnax.passes.remat import Remat
from onnax.passes.stop_gradient import StopGradient
from onnax.passes.unroll import UnrollPass
from onnax.passes.vmap import AxisSpec, VmapPass

__all__ = ["grad", "hessian", "jacfwd", "jacrev", "jvp", "unroll", "vjp", "vmap"]


def jvp(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    accumulate: Accumulate = "model",
    stop_gradient: StopGradient = None,
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
        outputs: Graph output names to differentiate, in order. Default: every FLOAT/DOUBLE
            output, except on a model that already holds generated derivative outputs
            (``grad_<x>``, ``fwd_<y>``, ``adj_<x>``): then those only, so
            ``jvp(grad(m, inputs=["w"], output="loss"), inputs=["w"])`` returns ``loss``,
            ``grad_w`` and the Hessian-vector product ``fwd_grad_w``, without ``fwd_loss``.
        accumulate: The arithmetic of the derivatives of FLOAT16/BFLOAT16 values: ``"model"``
            (default) computes them in the model's own element types; ``"float32"`` runs the
            sums among them (reductions, MatMul, Gemm, Conv, scatter-adds) in FLOAT and casts
            each result back. FLOAT and DOUBLE models are unaffected.
        stop_gradient: Names of main-graph values (graph inputs, initializers or node outputs)
            whose derivative is treated as zero, like ``jax.lax.stop_gradient`` or
            ``detach()``: the primal value is unchanged, no tangent or cotangent flows through
            it. Values inside subgraphs cannot be named. Stopped inputs leave the default
            ``inputs``; naming a value in both is an error. A transform of the result (``jvp``
            of a ``grad`` model, say) needs the names again: each call stops only its own.

    Returns:
        A new ``onnx_ir.Model`` built from ordinary ONNX operators.

    Raises:
        SelectionError: A name is unknown or not floating point.
            Or a ``stop_gradient`` name is unknown or also a selected input.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return JvpPass(inputs, outputs, accumulate, stop_gradient)(model).model


def vjp(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    accumulate: Accumulate = "model",
    stop_gradient: StopGradient = None,
    remat: Remat = "store",
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
        accumulate: The arithmetic of the derivatives of FLOAT16/BFLOAT16 values: ``"model"``
            (default) computes them in the model's own element types; ``"float32"`` runs the
            sums among them (reductions, MatMul, Gemm, Conv, scatter-adds) in FLOAT and casts
            each result back. FLOAT and DOUBLE models are unaffected.
        stop_gradient: Names of main-graph values (graph inputs, initializers or node outputs)
            whose derivative is treated as zero, like ``jax.lax.stop_gradient`` or
            ``detach()``: the primal value is unchanged, no tangent or cotangent flows through
            it. Values inside subgraphs cannot be named. Stopped inputs leave the default
            ``inputs``; naming a value in both is an error. A transform of the result (``jvp``
            of a ``grad`` model, say) needs the names again: each call stops only its own.
        remat: Rematerialization, like ``jax.checkpoint``: ``"store"`` (default) keeps every
            residual the reverse sweep reads; ``"recompute"`` recomputes each of them from the
            inputs, initializers and constants close to where the reverse sweep reads it;
            a list of op types (``["Conv", "MatMul", "Gemm"]``) stores those operators'
            outputs and recomputes the rest from them; an int is a byte budget for the stored
            values, filled greedily with those most expensive to recompute per byte (MatMul,
            Gemm, Conv outputs first; a value with a dynamic dimension has no static size and
            is recomputed). Less memory for more compute; the results are the same.

    Returns:
        A new ``onnx_ir.Model`` built from ordinary ONNX operators.

    Raises:
        SelectionError: A name is unknown or not floating point.
            Or a ``stop_gradient`` name is unknown or also a selected input.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        RematError: ``remat`` is not a policy (unknown op type, negative budget, wrong type).
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return VjpPass(inputs, outputs, accumulate, stop_gradient, remat)(model).model


def grad(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    output: str | None = None,
    accumulate: Accumulate = "model",
    stop_gradient: StopGradient = None,
    remat: Remat = "store",
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
        accumulate: The arithmetic of the derivatives of FLOAT16/BFLOAT16 values: ``"model"``
            (default) computes them in the model's own element types; ``"float32"`` runs the
            sums among them (reductions, MatMul, Gemm, Conv, scatter-adds) in FLOAT and casts
            each result back. FLOAT and DOUBLE models are unaffected.
        stop_gradient: Names of main-graph values (graph inputs, initializers or node outputs)
            whose derivative is treated as zero, like ``jax.lax.stop_gradient`` or
            ``detach()``: the primal value is unchanged, no tangent or cotangent flows through
            it. Values inside subgraphs cannot be named. Stopped inputs leave the default
            ``inputs``; naming a value in both is an error. A transform of the result (``jvp``
            of a ``grad`` model, say) needs the names again: each call stops only its own.
        remat: Rematerialization, like ``jax.checkpoint``: ``"store"`` (default) keeps every
            residual the reverse sweep reads; ``"recompute"`` recomputes each of them from the
            inputs, initializers and constants close to where the reverse sweep reads it;
            a list of op types (``["Conv", "MatMul", "Gemm"]``) stores those operators'
            outputs and recomputes the rest from them; an int is a byte budget for the stored
            values, filled greedily with those most expensive to recompute per byte (MatMul,
            Gemm, Conv outputs first; a value with a dynamic dimension has no static size and
            is recomputed). Less memory for more compute; the results are the same.

    Returns:
        A new ``onnx_ir.Model`` built from ordinary ONNX operators.

    Raises:
        SelectionError: The output is not a rank-0 float, or there is no unique default.
            Or a ``stop_gradient`` name is unknown or also a selected input.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        RematError: ``remat`` is not a policy (unknown op type, negative budget, wrong type).
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return GradPass(inputs, output, accumulate, stop_gradient, remat)(model).model


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

    vmap does not differentiate, so it has no ``stop_gradient`` option: give it to the
    derivative transform (``vmap(grad(m, stop_gradient=[...]))``).

    Returns:
        A new ``onnx_ir.Model`` with the same input and output names.

    Raises:
        SelectionError: ``in_axes``/``out_axes`` do not match the model, an axis is out of range,
            or static batch sizes disagree.
        UnsupportedOperatorError: An operator on a batched path has no batch rule.
    """
    return VmapPass(in_axes, out_axes, axis_size, randomness)(model).model


def jacfwd(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    stop_gradient: StopGradient = None,
) -> ir.Model:
    """Full Jacobians by forward mode: ``vmap(jvp(model))`` over an identity basis.

    The result takes the primal inputs only and returns the primal outputs, then one output
    ``jac_<y>_<x>`` per selected output ``y`` and input ``x`` (outputs-major order), of shape
    ``shape(y) + shape(x)``: ``jac[i..., j...] = d y[i...] / d x[j...]``. The basis is generated
    inside the graph from the run-time sizes, never stored. Cheaper than :func:`jacrev` when the
    inputs are smaller than the outputs.

    Args:
        model: The model; it is not modified.
        inputs: Input or initializer names (default: FLOAT/DOUBLE graph inputs).
        outputs: Output names (default: FLOAT/DOUBLE outputs).
        stop_gradient: Main-graph values whose derivative is treated as zero, as in
            :func:`jvp`.

    Returns:
        A new ``onnx_ir.Model``.

    Raises:
        SelectionError: Unknown or non-float names, or inputs and outputs of mixed element types.
            Or a ``stop_gradient`` name is unknown or also a selected input.
    """
    return JacfwdPass(inputs, outputs, stop_gradient)(model).model


def jacrev(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    stop_gradient: StopGradient = None,
) -> ir.Model:
    """Full Jacobians by reverse mode: ``vmap(vjp(model))`` over an identity basis.

    Same outputs and layout as :func:`jacfwd` (``jac_<y>_<x>`` of shape ``shape(y) + shape(x)``,
    outputs-major order); cheaper when the outputs are smaller than the inputs.

    Args:
        model: The model; it is not modified.
        inputs: Input or initializer names (default: FLOAT/DOUBLE graph inputs).
        outputs: Output names (default: FLOAT/DOUBLE outputs).
        stop_gradient: Main-graph values whose derivative is treated as zero, as in
            :func:`vjp`.

    Returns:
        A new ``onnx_ir.Model``.

    Raises:
        SelectionError: Unknown or non-float names, or inputs and outputs of mixed element types.
            Or a ``stop_gradient`` name is unknown or also a selected input.
    """
    return JacrevPass(inputs, outputs, stop_gradient)(model).model


def hessian(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    output: str | None = None,
    stop_gradient: StopGradient = None,
) -> ir.Model:
    """The Hessian of one rank-0 output, as ``jacfwd(jacrev(model))``.

    The result takes the primal inputs and returns the primal outputs, then one output
    ``hess_<y>_<x1>_<x2>`` per ordered pair of selected inputs, of shape
    ``shape(x1) + shape(x2)``: ``hess[i..., j...] = d² y / d x1[i...] d x2[j...]``.

    Args:
        model: The model; it is not modified.
        inputs: Input or initializer names (default: FLOAT/DOUBLE graph inputs).
        output: The rank-0 output (default: the only rank-0 FLOAT/DOUBLE output).
        stop_gradient: Main-graph values whose derivative is treated as zero, as in
            :func:`grad` (both differentiations hold them constant).

    Returns:
        A new ``onnx_ir.Model``.

    Raises:
        SelectionError: The output is not a rank-0 float, or there is no unique default.
            Or a ``stop_gradient`` name is unknown or also a selected input.
    """
    return HessianPass(inputs, output, stop_gradient)(model).model


def unroll(model: ir.Model, max_steps: int | None = None) -> ir.Model:
    """Replaces every ``Scan`` and ``Loop`` whose trip count is known by copies of its body.

    A ``Scan`` unrolls when the length of its scan axis is static; a ``Loop`` when its trip count
    is a constant and its condition cannot end it early (condition input absent or constant true,
    body condition output a copy of its input or a constant true). Loops inside bodies and ``If``
    branches are unrolled too; the others are left in place. The result computes the same outputs
    with no loop that could be unrolled, which suits runtimes and tools without control flow.

    Args:
        model: The model; it is not modified.
        max_steps: Loops with more iterations than this stay as they are (None: no limit).

    Returns:
        A new ``onnx_ir.Model`` with the same inputs and outputs.

    Raises:
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    return UnrollPass(max_steps)(model).model
