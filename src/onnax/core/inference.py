"""Shape inference as every transform needs it: symbolic, completed, and free of guesses.

:func:`infer_shapes` runs onnx_shape_inference, completes its answers
(:mod:`onnax.core.shape_fill`) and then takes back what rests on a guess: the ranks of a
``Squeeze`` without axes of run-time dimensions, the symbolic dimensions broadcast against each
other (:mod:`onnax.core.broadcast_dims`), and the numbers inference puts in place of the
dimensions a user declared. Every pass that needs shapes calls it; it lives here, below the
passes, so that none of them has to import another pass for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import onnx_ir as ir
import onnx_shape_inference as osi
from onnx_shape_inference import OpUsageError, ShapeInferenceError, infer_symbolic_shapes

from onnax.core.broadcast_dims import forget_guessed_broadcasts
from onnax.core.fast_nodes import node_list
from onnax.core.inferred import remember, unchanged
from onnax.core.quick_infer import engine_idle, settle
from onnax.core.shape_fill import complete_shapes
from onnax.core.traverse import fixed_nesting, sort, subgraphs

__all__ = ["RANK_GUESSED", "infer_shapes"]


def infer_shapes(
    model: ir.Model,
    *,
    complete: bool = True,
    new_only: bool = False,
    record: bool = False,
    presorted: bool = False,
) -> None:
    """Runs symbolic shape inference in place (sorting first, as inference walks in list order).

    onnx_shape_inference's answers are completed by :func:`~onnax.core.shape_fill.complete_shapes`:
    static shape arithmetic is folded into ``const_value`` annotations and
    ``onnx.shape_inference`` fills what is still unknown, alternating with onnx_shape_inference.

    onnx_shape_inference gives a ``Squeeze`` without axes the input's rank when some of its
    dimensions are symbolic, which is a guess (a dimension that is 1 at run time goes away),
    and rules reading that rank would lay cotangents out wrongly. Such outputs, and every value
    inferred from them, get their shapes cleared (:func:`_forget_guessed_ranks`): the rules
    then use a rank-free form or refuse with a message. Neither completion step reads or fills
    them.

    Args:
        model: The model, changed in place.
        complete: Whether to complete onnx_shape_inference's answers (costs one more round of
            inference where folding learns something).
        new_only: Whether the first round of onnx_shape_inference may pass over the nodes
            whose record from the last recording call still holds
            (:func:`onnax.core.inferred.unchanged`): a transform infers the model it was
            given, then again after adding nodes to it, and most of a round's time went into
            nodes whose outputs it already knew. Later rounds, which follow what completion
            learnt, infer every node.
        record: Whether to record what this call knew, for later ``new_only`` calls
            (:func:`onnax.core.inferred.remember`). A record costs about a tenth of an
            inference, so only prepare's records: reverse mode's second inference (of the
            linearized model) passing over prepare's nodes and not recording, cleanup's passes
            over prepare's nodes again; recording the linearized model cost what it saved.
        presorted: Whether the caller has just sorted the model
            (:func:`onnax.core.traverse.sort`) and since then only renamed values or appended
            nodes reading values placed before them, so that the sort would change nothing
            (its check walks every node: a fiftieth of a jvp where cleanup sorted just before).
    """
    declared = _declared_io_shapes(model)
    if not presorted:
        sort(model.graph)
    # Inference and completion change values, never which nodes hold bodies.
    with fixed_nesting(model.graph):
        _infer_past_guesses(model, unchanged(model) if new_only else ())
        if complete:
            complete_shapes(model, _infer_past_guesses, _guessed_ranks)
        guessed = False
        for graph in (model.graph, *subgraphs(model.graph)):
            guessed = _forget_guessed_ranks(graph) or guessed
        model.graph.meta[RANK_GUESSED] = bool(model.graph.meta.get(RANK_GUESSED)) or guessed
        forget_guessed_broadcasts(model)
        _keep_declared_dims(declared)
        if record:
            remember(model)


RANK_GUESSED = "onnax.rank_guessed"
"""``graph.meta`` key: whether inference has met a guessed rank in this model (sticky). The
values computed from one can be recognised in the model inference saw, not in what the
transforms make of it (vmap batches the Squeeze away), and ``Shape`` of such a value keeps a
guessed length: so a transform's result gets inferred shapes only when this is False."""


_NOT_INFERRED = "onnax.not_inferred"
"""The domain a node is moved to while inference passes over it: its rules do nothing
(:func:`_pass_over`), so a passed-over node costs a dictionary look-up, not the search for a
function body that a domain without rules costs the engine."""


def _pass_over(ctx: object, node: ir.Node) -> None:
    """The inference rule of every operator in the private domain: leaves the outputs as they are."""


_PASSED_OVER: set[str] = set()
"""The operators that :func:`_pass_over` is registered for in the private domain."""


def _register_pass_over(op_types: Iterable[str]) -> None:
    new = set(op_types) - _PASSED_OVER
    for op_type in sorted(new):
        osi.registry.register(_NOT_INFERRED, op_type, since_version=1)(_pass_over)
    _PASSED_OVER.update(new)


def _infer_past_guesses(model: ir.Model, skipped: Sequence[ir.Node] = ()) -> None:
    """Symbolic shape inference that passes over the nodes whose rule refuses its own guesses.

    The model passed onnx.checker's full check before, so a rule that raises does so on a
    shape inference guessed earlier (a ``Squeeze`` without axes keeps a symbolic dimension,
    then ``Einsum "ij->ji"`` finds rank 3 for its 2 indices). Such a node keeps the outputs it
    has (unknown shapes), as the rules work without, and inference goes on after it.

    The ``skipped`` nodes are passed over the same way from the start: they keep the outputs
    they have. So are the settled constants (:func:`_settled_constants`), and the nodes that
    :func:`onnax.core.quick_infer.settle` infers first, just as the engine would, at a small
    part of its cost (most of a derivative model: elementwise arithmetic, ``MatMul``,
    ``Reshape``...). When that leaves the engine nothing to do, it does not run: its walks
    over the whole model (naming dimensions, collecting symbols, relating ``Reshape``
    element counts) took over a quarter of its time on the benchmark's vjp.
    """
    skipped = list(dict.fromkeys([*skipped, *_settled_constants(model)]))  # each once
    passing = set(skipped)
    settled = settle(model, passing)
    skipped.extend(settled)
    passing.update(settled)
    if engine_idle(model, passing):
        return
    passed_over: list[tuple[ir.Node, str]] = []
    _register_pass_over(node.op_type for node in skipped)
    for known in skipped:
        passed_over.append((known, known.domain))
        known.domain = _NOT_INFERRED
    try:
        while True:
            try:
                infer_symbolic_shapes(model, warn_on_missing=False)
                return
            except (OpUsageError, ShapeInferenceError) as err:
                node = _refusing_node(model, err)
                if node is None or node.domain == _NOT_INFERRED:
                    raise
                _register_pass_over([node.op_type])
                passed_over.append((node, node.domain))
                node.domain = _NOT_INFERRED
    finally:
        for node, domain in reversed(passed_over):
            node.domain = domain


def _settled_constants(model: ir.Model) -> list[ir.Node]:
    """The ``Constant`` nodes whose output holds its tensor, with the tensor's type and shape.

    Inference would find just that type and shape (and a reader takes the tensor from
    ``const_value`` before looking at the producer), but reading the attribute checks it
    against ``TensorProtocol``, a runtime protocol check that made the thousands of constants
    a derivative model holds a fifth of its inference.
    """
    settled = []
    for graph in (model.graph, *subgraphs(model.graph)):
        for node in node_list(graph):
            # The slots, as Node.op_type and .domain return them: every node is asked.
            if node._op_type != "Constant" or node._domain != "":
                continue
            out = node.outputs[0]
            attr = node.attributes.get("value")
            tensor = out.const_value
            if (
                tensor is None
                or attr is None
                or attr.is_ref()
                or attr.value is not tensor
                or out.dtype != tensor.dtype
                or out.shape is None
                or out.shape.dims != tensor.shape.dims
                or out.is_graph_output()
            ):
                continue
            settled.append(node)
    return settled


def _refusing_node(model: ir.Model, err: Exception) -> ir.Node | None:
    if isinstance(err, OpUsageError):
        return err.node
    assert isinstance(err, ShapeInferenceError)
    named = [n for n in model.graph.all_nodes() if err.node_name and n.name == err.node_name]
    return named[0] if len(named) == 1 else None


def _declared_io_shapes(model: ir.Model) -> list[tuple[ir.Value, ir.Shape]]:
    graph = model.graph
    return [(v, v.shape.copy()) for v in (*graph.inputs, *graph.outputs) if v.shape is not None]


def _keep_declared_dims(declared: list[tuple[ir.Value, ir.Shape]]) -> None:
    """Puts back the dimensions the user declared on graph inputs and outputs.

    Inference "refines" a declared symbolic dimension with a number when it finds one, and
    that number can be a guess (``Slice(x[n], 2, 6)`` gets 4, right only when ``n >= 6``):
    the derivative model would then declare ``y`` and its seed as ``[4]`` and onnxruntime
    would refuse the inputs that the source accepts. Only unknown dimensions (``?``) and
    missing shapes take inferred values.
    """
    for value, shape in declared:
        inferred = value.shape
        if inferred is None or inferred.rank() != shape.rank():
            value.shape = shape
            continue
        dims = [
            new if isinstance(old, ir.SymbolicDim) and old.value is None else old
            for old, new in zip(shape.dims, inferred.dims, strict=True)
        ]
        if dims != list(inferred.dims):
            value.shape = ir.Shape(dims)


_RANK_FREE = frozenset({"Shape", "Size"})
"""Operators whose output rank does not depend on the input's."""


def _guesses_rank(node: ir.Node) -> bool:
    """A Squeeze without axes of a value with dimensions unknown before run time."""
    if node.op_type != "Squeeze" or node.domain not in ("", "ai.onnx"):
        return False
    if (len(node.inputs) > 1 and node.inputs[1] is not None) or "axes" in node.attributes:
        return False
    x = node.inputs[0]
    return x is not None and (x.shape is None or not all(isinstance(d, int) for d in x.shape.dims))


def _shape_inputs(node: ir.Node) -> Sequence[ir.Value | None]:
    """The inputs whose shapes decide the shape of the node's outputs.

    ``CastLike`` takes only the element type of its second input. ``Reshape`` to a constant
    shape without 0 (which would copy an input dimension) fixes the rank, and its ``-1`` is
    the element count over the rest, which a guessed shape does not change (it only keeps
    dimensions of size 1 that the run drops).
    """
    if node.domain not in ("", "ai.onnx"):
        return node.inputs
    if node.op_type == "CastLike":
        return node.inputs[:1]
    if node.op_type == "Reshape" and len(node.inputs) > 1 and node.inputs[1] is not None:
        target = node.inputs[1].const_value
        if target is not None and 0 not in target.numpy().reshape(-1).tolist():
            return []
    return node.inputs


def _guessed_ranks(graph: ir.Graph) -> set[ir.Value]:
    """The values of ``graph`` whose shapes rest on a guessed rank (see :func:`infer_shapes`)."""
    guessed: set[ir.Value] = set()
    for node in node_list(graph):
        op_type = node._op_type  # the slot, as Node.op_type returns it: every node is asked
        if op_type in _RANK_FREE:
            continue
        # Every inference walks every graph here: until the first guess (in most models,
        # ever) only a Squeeze can start one, and no node needs its inputs looked at.
        starts = op_type == "Squeeze" and _guesses_rank(node)
        if starts or (guessed and any(v in guessed for v in _shape_inputs(node) if v is not None)):
            guessed.update(node.outputs)
    return guessed


def _forget_guessed_ranks(graph: ir.Graph) -> bool:
    """Clears the shapes resting on a guessed rank; True if there were any."""
    guessed = _guessed_ranks(graph)
    for out in guessed:
        if not out.is_graph_output():
            out.shape = None
    return bool(guessed)
