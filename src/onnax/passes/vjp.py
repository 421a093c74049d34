"""Reverse mode: ``VjpPass``."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.gcpause import gc_paused
from onnax.core.naming import NameClaims, diff_prefix, io_names
from onnax.core.produced import remember
from onnax.core.selection import select_inputs, select_outputs
from onnax.passes.accumulate import Accumulate, accumulate_in_float, check_accumulate
from onnax.passes.cleanup import cleanup
from onnax.passes.linearize import linearize
from onnax.passes.outputs import append_outputs, input_like
from onnax.passes.prepare import prepare
from onnax.passes.remat import Remat, RematStats, check_remat, rematerialize
from onnax.passes.stop_gradient import StopGradient, resolve_stops, without_stopped
from onnax.passes.transpose import transpose_linear

__all__ = ["VjpPass"]


class VjpPass(ir.passes.FunctionalPass):
    """Appends vector-Jacobian products: ``(x..., adj_y...) -> (y..., adj_x...)``.

    One cotangent input per selected output (same dtype and shape, named ``adj_<y>``) and one
    cotangent output per selected input (``adj_<x>`` = Jᵀ·cotangents) follow the primal inputs
    and outputs. The prefix becomes ``adj2_``... when the model already uses ``adj_``.

    Args:
        inputs: Names of the graph inputs or initializers to differentiate with respect to
            (default: every FLOAT/DOUBLE graph input that is not an initializer).
        outputs: Names of the graph outputs to differentiate (default: every FLOAT/DOUBLE output).
        accumulate: ``"model"`` computes the derivatives in the model's element types;
            ``"float32"`` runs the sums among them (reductions, MatMul, Gemm, Conv, scatter-adds)
            in FLOAT where they combine FLOAT16/BFLOAT16 values.
        stop_gradient: Names of main-graph values (inputs, initializers or node outputs)
            whose derivative is treated as zero, like ``jax.lax.stop_gradient``: the primal is
            unchanged, no tangent or cotangent flows through them. Stopped inputs leave the
            default ``inputs``; naming one in ``inputs`` as well is an error.
        remat: Which residuals the reverse sweep reads stored and which it recomputes, like
            ``jax.checkpoint``: ``"store"`` (default) keeps every one; ``"recompute"`` keeps
            none but the inputs, initializers, constants, shape arithmetic and the outputs of
            If/Loop/Scan and random nodes; a list of op types (``["Conv", "MatMul", "Gemm"]``)
            also keeps those operators' outputs; an int is a budget in bytes for the stored
            residuals, filled greedily by recompute cost per byte (see
            :mod:`onnax.passes.remat`).
    """

    def __init__(
        self,
        inputs: str | Sequence[str] | None = None,
        outputs: str | Sequence[str] | None = None,
        accumulate: Accumulate = "model",
        stop_gradient: StopGradient = None,
        remat: Remat = "store",
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.outputs = outputs
        self.accumulate = check_accumulate(accumulate, "vjp")
        self.stop_gradient = stop_gradient
        self.remat = check_remat(remat, "vjp")
        self.remat_stats = RematStats()

    @gc_paused
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the reverse-mode model; the argument is left untouched."""
        model = prepare(model, "vjp")
        graph = model.graph
        primal = set(graph.all_nodes())
        stopped = resolve_stops(model, self.stop_gradient, "vjp")
        xs = select_inputs(graph, self.inputs, "vjp")
        xs = without_stopped(xs, stopped, self.inputs is not None, "vjp")
        ys = select_outputs(graph, self.outputs, "vjp")
        prefix = diff_prefix(io_names(graph), "adj")
        claims = NameClaims(model)
        seeds = []
        for y in ys:
            seed = input_like(y)
            claims.claim(seed, f"{prefix}{y.name}")
            seeds.append((y, seed))
        lin = linearize(model, xs, "vjp", outputs=ys, stop_gradient=stopped)
        cts = transpose_linear(model, lin, seeds, xs)
        for _, seed in seeds:
            graph.inputs.append(seed)
        append_outputs(
            Emitter(lin.opset), graph, claims, prefix, list(zip(xs, cts, strict=True)), "vjp"
        )
        accumulate_in_float(model, primal, self.accumulate)
        # No floating-point output: no seed, no reverse sweep, nothing to rematerialize.
        self.remat_stats = (
            rematerialize(model, [s for _, s in seeds], self.remat, seeds[0][1])
            if seeds
            else RematStats()
        )
        return ir.passes.PassResult(remember(cleanup(model)), modified=True)
