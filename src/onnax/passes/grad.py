"""Gradients of a scalar: ``GradPass``."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.gcpause import gc_paused
from onnax.core.naming import NameClaims, diff_prefix, io_names
from onnax.core.produced import remember
from onnax.core.selection import format_shape, is_float, select_inputs, select_outputs
from onnax.core.traverse import all_nodes
from onnax.errors import SelectionError
from onnax.passes.accumulate import Accumulate, accumulate_in_float, check_accumulate
from onnax.passes.cleanup import cleanup
from onnax.passes.linearize import linearize
from onnax.passes.outputs import append_outputs
from onnax.passes.prepare import prepare
from onnax.passes.remat import Remat, RematStats, check_remat, rematerialize
from onnax.passes.stop_gradient import StopGradient, resolve_stops, without_stopped
from onnax.passes.transpose import transpose_linear

__all__ = ["GradPass", "scalar_output"]


def scalar_output(graph: ir.Graph, output: str | None, transform: str = "grad") -> ir.Value:
    """The rank-0 float output named ``output``, or the only one when ``output`` is None.

    ``transform`` names the caller in messages (``hessian`` selects its output here too).

    Raises:
        SelectionError: With the shapes found and how to get a scalar.
    """
    if output is not None and not isinstance(output, str):
        raise SelectionError(
            f"{transform}: `output` must be one graph output name (str), got {type(output).__name__}; "
            "for several outputs use vjp(model, outputs=[...])"
        )
    if output is None:
        scalars = [
            v for v in graph.outputs if is_float(v) and v.shape is not None and v.shape.rank() == 0
        ]
        if len(scalars) != 1:
            described = [
                f"{v.name} ({v.dtype.name if v.dtype else v.type}, shape {format_shape(v.shape)})"
                for v in graph.outputs
            ]
            found = "no" if not scalars else f"{len(scalars)}"
            # With no rank-0 output, naming one cannot help: the remedy is a scalar loss.
            remedy = (
                "Pass output=<name> (--output on the command line) to choose the loss among "
                f"{[str(v.name) for v in scalars]}."
                if scalars
                else "Reduce an output to a scalar loss in the model (ReduceSum or ReduceMean "
                "with keepdims=0), or use vjp(model, outputs=[...]) (onnax vjp --outputs) and "
                "feed an explicit cotangent."
            )
            raise SelectionError(
                f"{transform}: the model has {found} rank-0 FLOAT/DOUBLE outputs, expected "
                f"exactly one. Outputs: {described}. {remedy}"
            )
        return scalars[0]
    (y,) = select_outputs(graph, [output], transform)
    if y.shape is None or y.shape.rank() != 0:
        raise SelectionError(
            f"{transform}: output {y.name!r} has shape {format_shape(y.shape)}, expected rank 0 (a scalar loss). "
            "Reduce it to a scalar in the model (e.g. ReduceSum or ReduceMean with keepdims=0) "
            f"or use vjp(model, outputs=[{y.name!r}]) and feed an explicit cotangent."
        )
    return y


class GradPass(ir.passes.FunctionalPass):
    """Appends the gradient of one rank-0 output: ``(x...) -> (y..., grad_x...)``.

    The seed is an implicit 1, so no input is added. One output per selected input follows the
    primal outputs, named ``grad_<x>`` (``grad2_`` when the model already uses ``grad_``).

    Args:
        inputs: Names of the graph inputs or initializers to differentiate with respect to
            (default: every FLOAT/DOUBLE graph input that is not an initializer).
        output: The rank-0 FLOAT/DOUBLE output (default: the only one there is).
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
        output: str | None = None,
        accumulate: Accumulate = "model",
        stop_gradient: StopGradient = None,
        remat: Remat = "store",
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.output = output
        self.accumulate = check_accumulate(accumulate, "grad")
        self.stop_gradient = stop_gradient
        self.remat = check_remat(remat, "grad")
        self.remat_stats = RematStats()

    @gc_paused
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the gradient model; the argument is left untouched."""
        model = prepare(model, "grad")
        graph = model.graph
        primal = set(all_nodes(graph))
        y = scalar_output(graph, self.output)
        stopped = resolve_stops(model, self.stop_gradient, "grad")
        xs = select_inputs(graph, self.inputs, "grad")
        xs = without_stopped(xs, stopped, self.inputs is not None, "grad")
        prefix = diff_prefix(io_names(graph), "grad")
        claims = NameClaims(model)
        lin = linearize(model, xs, "grad", outputs=[y], stop_gradient=stopped)
        em = Emitter(lin.opset)
        seed = em.scalar(1.0, y)
        graph.extend(em.take())
        cts = transpose_linear(model, lin, [(y, seed)], xs)
        append_outputs(em, graph, claims, prefix, list(zip(xs, cts, strict=True)), "grad")
        accumulate_in_float(model, primal, self.accumulate)
        # A control-flow rule may have replaced the node producing the loss (see transpose).
        loss = lin.replaced.get(y, y)
        self.remat_stats = rematerialize(model, [seed], self.remat, loss)
        return ir.passes.PassResult(remember(cleanup(model)), modified=True)
