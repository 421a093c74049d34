"""Pass classes for the composed transforms: full Jacobians and Hessians.

Like :class:`~onnax.passes.JvpPass`, each is an ``onnx_ir.passes.FunctionalPass``, so it runs in
an ``onnx_ir.passes.PassManager`` or ``Sequential`` with other passes::

    manager = ir.passes.PassManager([UnrollPass(), HessianPass(["w"], "loss")])
    hess = manager(model).model
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import onnx_ir as ir

from onnax.errors import OnnaxError
from onnax.passes.stop_gradient import StopGradient

__all__ = ["HessianPass", "JacfwdPass", "JacrevPass"]

_INNER = re.compile(r"^(grad|jvp|vjp|vmap|jacfwd|jacrev): ")


class JacfwdPass(ir.passes.FunctionalPass):
    """Appends full Jacobians ``jac_<y>_<x>`` (shape ``Y + X``), computed by forward mode.

    Args:
        inputs: Input or initializer names (default: FLOAT/DOUBLE graph inputs).
        outputs: Output names (default: FLOAT/DOUBLE outputs).
        stop_gradient: Main-graph values whose derivative is treated as zero.
    """

    mode = "fwd"

    def __init__(
        self,
        inputs: str | Sequence[str] | None = None,
        outputs: str | Sequence[str] | None = None,
        stop_gradient: StopGradient = None,
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs
        self.stop_gradient = stop_gradient

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the Jacobian model; the argument is left untouched."""
        from onnax.passes.jacobian import jacobian_model

        return ir.passes.PassResult(
            jacobian_model(model, self.inputs, self.outputs, self.mode, self.stop_gradient),
            modified=True,
        )


class JacrevPass(JacfwdPass):
    """Appends full Jacobians ``jac_<y>_<x>`` (shape ``Y + X``), computed by reverse mode.

    Args:
        inputs: Input or initializer names (default: FLOAT/DOUBLE graph inputs).
        outputs: Output names (default: FLOAT/DOUBLE outputs).
        stop_gradient: Main-graph values whose derivative is treated as zero.
    """

    mode = "rev"


class HessianPass(ir.passes.FunctionalPass):
    """Appends ``hess_<y>_<x1>_<x2>`` of one rank-0 output, as ``jacfwd(jacrev(model))``.

    Errors say ``hessian:``, whichever inner step raised them (and name that step).

    Args:
        inputs: Input or initializer names (default: FLOAT/DOUBLE graph inputs).
        output: The rank-0 output (default: the only rank-0 FLOAT/DOUBLE output).
        stop_gradient: Main-graph values whose derivative is treated as zero (in both steps).
    """

    def __init__(
        self,
        inputs: str | Sequence[str] | None = None,
        output: str | None = None,
        stop_gradient: StopGradient = None,
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.output = output
        self.stop_gradient = stop_gradient

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the Hessian model; the argument is left untouched."""
        try:
            return ir.passes.PassResult(self._hessian(model), modified=True)
        except OnnaxError as err:
            text = str(err)
            inner = _INNER.match(text)
            if inner is None:
                raise
            step = inner.group(1)
            raise type(err)(
                f"hessian: {text[inner.end() :]} (in the {step} step of jacfwd(jacrev(model)))"
            ) from err

    def _hessian(self, model: ir.Model) -> ir.Model:
        from onnax.passes.grad import scalar_output
        from onnax.passes.jacobian import jacobian_model
        from onnax.passes.prepare import prepare

        prepared = prepare(model, "hessian")
        y = scalar_output(prepared.graph, self.output, "hessian")
        first = jacobian_model(prepared, self.inputs, [str(y.name)], "rev", self.stop_gradient)
        n_primal = len(prepared.graph.outputs)
        grads = [str(v.name) for v in list(first.graph.outputs)[n_primal:]]
        x_names = [g[len(f"jac_{y.name}_") :] for g in grads]
        second = jacobian_model(first, x_names, grads, "fwd", self.stop_gradient)
        graph = second.graph
        primal = list(graph.outputs)[:n_primal]
        blocks = list(graph.outputs)[n_primal + len(grads) :]
        graph.outputs.clear()
        graph.outputs.extend(primal)
        for k, block in enumerate(blocks):
            x1, x2 = x_names[k // len(x_names)], x_names[k % len(x_names)]
            block.name = f"hess_{y.name}_{x1}_{x2}"
            graph.outputs.append(block)
        return second
