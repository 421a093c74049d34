"""Forward mode: ``JvpPass``."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.gcpause import gc_paused
from onnax.core.naming import NameClaims, derivative_outputs, diff_prefix, io_names
from onnax.core.produced import remember
from onnax.core.selection import select_inputs, select_outputs
from onnax.core.traverse import all_nodes
from onnax.passes.accumulate import Accumulate, accumulate_in_float, check_accumulate
from onnax.passes.cleanup import cleanup
from onnax.passes.linearize import linearize
from onnax.passes.outputs import append_outputs
from onnax.passes.prepare import prepare
from onnax.passes.stop_gradient import StopGradient, resolve_stops, without_stopped

__all__ = ["JvpPass"]


class JvpPass(ir.passes.FunctionalPass):
    """Appends Jacobian-vector products: ``(x..., fwd_x...) -> (y..., fwd_y...)``.

    One tangent input per selected input (same dtype and shape, named ``fwd_<x>``) and one
    tangent output per selected output (``fwd_<y>`` = J·tangents) follow the primal inputs and
    outputs. The prefix becomes ``fwd2_``, ``fwd3_``... when the model already uses ``fwd_``.

    Args:
        inputs: Names of the graph inputs or initializers to differentiate with respect to
            (default: every FLOAT/DOUBLE graph input that is not an initializer).
        outputs: Names of the graph outputs to differentiate (default: every FLOAT/DOUBLE
            output; on a model that holds generated derivative outputs, ``grad_<x>``,
            ``fwd_<y>``, ``adj_<x>``, those only).
        accumulate: ``"model"`` computes the derivatives in the model's element types;
            ``"float32"`` runs the sums among them (reductions, MatMul, Gemm, Conv, scatter-adds)
            in FLOAT where they combine FLOAT16/BFLOAT16 values.
        stop_gradient: Names of main-graph values (inputs, initializers or node outputs)
            whose derivative is treated as zero, like ``jax.lax.stop_gradient``: the primal is
            unchanged, no tangent or cotangent flows through them. Stopped inputs leave the
            default ``inputs``; naming one in ``inputs`` as well is an error.
    """

    def __init__(
        self,
        inputs: str | Sequence[str] | None = None,
        outputs: str | Sequence[str] | None = None,
        accumulate: Accumulate = "model",
        stop_gradient: StopGradient = None,
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs
        self.accumulate = check_accumulate(accumulate, "jvp")
        self.stop_gradient = stop_gradient

    @gc_paused
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the forward-mode model; the argument is left untouched."""
        model = prepare(model, "jvp")
        graph = model.graph
        primal = set(all_nodes(graph))
        stopped = resolve_stops(model, self.stop_gradient, "jvp")
        xs = select_inputs(graph, self.inputs, "jvp")
        xs = without_stopped(xs, stopped, self.inputs is not None, "jvp")
        ys = select_outputs(graph, self.outputs, "jvp")
        if self.outputs is None:
            # The seed contract of higher derivatives: on a model that holds generated
            # derivatives (a grad model, say) the default differentiates those only, so
            # jvp(grad(m)) is the HVP without the tangent of the loss, which costs a sweep.
            generated = [y for y in derivative_outputs(graph) if y in ys]
            ys = generated or ys
        prefix = diff_prefix(io_names(graph), "fwd")
        claims = NameClaims(model)
        lin = linearize(model, xs, "jvp", outputs=ys, stop_gradient=stopped)
        for x, t in zip(xs, lin.tangent_inputs, strict=True):
            claims.claim(t, prefix + x.name)  # type: ignore[operator]
        em = Emitter(lin.opset, lin.linear)
        ys = [lin.replaced.get(y, y) for y in ys]  # forward mode replaces control-flow nodes
        append_outputs(em, graph, claims, prefix, [(y, lin.tangent.get(y)) for y in ys], "jvp")
        accumulate_in_float(model, primal, self.accumulate)
        return ir.passes.PassResult(remember(cleanup(model)), modified=True)
