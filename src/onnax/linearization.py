"""``linearize``: the forward sweep once, then the tangent map as often as needed."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.passes.accumulate import Accumulate
from onnax.passes.split import joint_model, split

__all__ = ["linearize"]


def linearize(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    accumulate: Accumulate = "model",
) -> tuple[ir.Model, ir.Model]:
    """Splits forward mode in two, as ``jax.linearize``: a forward model and a linear model.

    The **forward model** takes the primal inputs and returns the primal outputs (same names,
    same order), then the *residuals* ``res_0``, ``res_1``...: the primal values the tangent
    map reads (``1 - tanh(x)²``, the activations a ``MatMul`` multiplies by, the states a
    ``Scan`` went through). The **linear model** takes those residuals, then one tangent
    ``fwd_<x>`` per selected input, and returns one tangent ``fwd_<y>`` per selected output,
    exactly what ``jvp(model, inputs, outputs)`` returns: ``fwd_y = sum_x dy/dx · fwd_x``.
    Every node of the linear model reads a tangent, so repeated Jacobian-vector products at one
    point (Newton-Krylov, Gauss-Newton, Lanczos) pay the primal computation once::

        fwd, lin = onnax.linearize(model, inputs=["x"], outputs=["y"])
        out = fwd_session.run(None, {"x": x})           # y, res_0, res_1, ...
        feeds = dict(zip(residual_names, out[1:])) | {"fwd_x": v}
        jv = lin_session.run(None, feeds)[0]            # fwd_y = J(x) v

    Constants and the weights the tangent map multiplies by move into the linear model instead
    of becoming residuals. A linear ``Scan`` reads the primal values of each iteration (an LSTM
    cell's gates, say) stacked by a residual Scan of the forward model, and a linear ``If`` reads
    its branch's primal values from a residual If. The body of a linear ``Loop`` (or of a Scan
    that carries a primal state, or of a node nested in a linear body) still recomputes the
    primal values its tangents need from the recorded iteration states, as reverse mode does;
    the primal loop itself runs only in the forward model. The prefixes
    follow the model's names: ``fwd2_`` on a model that already has ``fwd_`` names,
    ``res2_`` on one with ``res_`` names.

    Args:
        model: The model to linearize; it is not modified.
        inputs: Graph input or initializer names to differentiate with respect to, in order.
            Default: every FLOAT/DOUBLE graph input that is not an initializer.
        outputs: Graph output names to differentiate, in order. Default: every FLOAT/DOUBLE
            output, except on a model that holds generated derivative outputs (``grad_<x>``,
            ...): then those only, so ``linearize(grad(m, inputs=["w"]), inputs=["w"])`` gives
            a linear model computing Hessian-vector products ``fwd_grad_w``.
        accumulate: The arithmetic of the derivatives of FLOAT16/BFLOAT16 values: ``"model"``
            (default) or ``"float32"``, as for :func:`onnax.jvp`.

    Returns:
        ``(forward, linear)``, two new ``onnx_ir.Model`` built from ordinary ONNX operators. The
        residual names are the forward model's outputs after the primal ones, and the linear
        model's inputs before the tangents.

    Raises:
        SelectionError: A name is unknown or not floating point.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
        InvalidModelError: The model fails ``onnx.checker`` or its opset is not supported.
    """
    joint, n_in, n_out = joint_model(model, inputs, outputs, accumulate)
    halves = split(joint, n_in, n_out)
    return halves.forward, halves.linear
