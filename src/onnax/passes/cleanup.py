"""Tidying a transformed model: dead code, order, names, types and shapes.

:class:`Cleanup` is a sequence of small in-place passes, each a step that can be read, reused
and reordered on its own (onnx_ir's own passes where they do what is needed):

1. :class:`RemoveDeadNodes`, then :class:`~onnax.passes.fast_steps.RemoveUnusedNodes` (onnx_ir's
   ``RemoveUnusedNodesPass`` with its schema lookups cached), in one walk (:class:`PruneNodes`);
2. :class:`EliminateCommonSubexpressions` (``CommonSubexpressionEliminationPass`` that keeps
   the outputs' declared types; it leaves no dead code, as the inputs of a duplicate are
   those of its twin, which stays);
3. :class:`SortGraph`, :class:`FixOutputs`, :class:`FixNames` (``NameFixPass``, then
   :class:`UniqueNamesAcrossScopes`) and :class:`NameMainGraph`;
4. :class:`AnnotateShapes`;
5. :class:`Simplify`, on the annotated types and shapes: a :class:`FixedPoint` of
   :class:`~onnax.passes.simplify.SimplifyLocally` (chain collapsing, Identity removal,
   folding of shape arithmetic) and CSE, then dead code again and names for what it created.
   Its rewrites keep every output value's type and shape true, so the annotation stands.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import onnx_ir as ir
import onnx_ir.passes as passes
import onnx_ir.passes.common as common
from onnx_shape_inference import OpUsageError, ShapeInferenceError

from onnax.core.batching import detach
from onnax.core.fast_ir import detach_inputs, new_shape
from onnax.core.fast_nodes import node_list
from onnax.core.inference import RANK_GUESSED, infer_shapes
from onnax.core.name_fix import fix_names_flat
from onnax.core.subgraphs import graph_attributes
from onnax.core.traverse import flat_block, model_graphs, subgraphs
from onnax.passes.cse import eliminate
from onnax.passes.fast_steps import (
    RemoveUnusedNodes,
    SortGraph,
    remove_unused_initializers,
    trim,
)
from onnax.passes.simplify import SimplifyLocally, remove_unused
from onnax.passes.steps import Steps

__all__ = [
    "AnnotateShapes",
    "Cleanup",
    "EliminateCommonSubexpressions",
    "FixNames",
    "FixOutputs",
    "FixedPoint",
    "NameMainGraph",
    "PruneNodes",
    "RemoveDeadNodes",
    "Simplify",
    "SortGraph",
    "UniqueNamesAcrossScopes",
    "cleanup",
]

logger = logging.getLogger(__name__)


def cleanup(model: ir.Model) -> ir.Model:
    """Removes dead nodes, sorts, makes every name unique and infers types and shapes.

    The primal part of a derivative model is kept whole (its outputs are still outputs); what
    goes is the forward work that no requested derivative needs.

    Args:
        model: The transformed model, changed in place.

    Returns:
        ``model``.
    """
    return Cleanup()(model).model


class Cleanup(Steps):
    """The steps of :func:`cleanup` as one in-place pass.

    None of the steps adds a node holding a body (they remove, reorder, rename, rewrite
    locally and annotate): on a graph without bodies they run in a
    :func:`~onnax.core.traverse.flat_block`, where looking for subgraphs walks nothing.
    """

    def __init__(self) -> None:
        cse, fix_outputs = EliminateCommonSubexpressions(), FixOutputs()
        super().__init__(
            PruneNodes(),
            # No dead code after it: a duplicate's inputs are its twin's, which stays.
            cse,
            SortGraph(),
            fix_outputs,
            FixNames(),
            NameMainGraph(),
            # Sorted by SortGraph: the steps between only append output aliases and rename.
            AnnotateShapes(presorted=True),
            # Sorting, naming and annotating change no CSE key, adding output aliases might.
            Simplify(settled=lambda: cse.settled and not fix_outputs.aliased),
        )

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the steps on ``model``."""
        with flat_block(model.graph):
            return super().call(model)


class Simplify(Steps):
    """The simplification: the local rewrites and CSE to a fixed point, then what they need.

    Dead code and names for the values it created are tidied only when it changed something.

    Args:
        settled: Tells, when the simplification starts, whether the model is free of common
            subexpressions already (see :class:`FixedPoint`); None: not known to be.
    """

    def __init__(self, settled: Callable[[], bool] | None = None) -> None:
        super().__init__(
            FixedPoint(SimplifyLocally(), EliminateCommonSubexpressions(), settled=settled),
            PruneNodes(),
            FixNames(),
        )

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the simplification on ``model``."""
        first, *rest = self.passes
        result = first(model)
        if not result.modified:
            return result
        for step in rest:
            model = step(result.model).model
        return passes.PassResult(model, modified=True)


class FixedPoint(Steps):
    """Runs its steps again while one of them changes the model (at most ``rounds`` times).

    A rewrite can make two nodes equal for CSE, and CSE can give a rewrite a chain to collapse;
    each round is linear, and a few rounds reach the fixed point on the models seen. The first
    step must reach its own fixed point in one run (the local rewrites do: one topological
    sweep collapses a whole chain), so a round in which only the first step changed anything
    ends the loop without a round that would only confirm it.

    Args:
        steps: The steps of a round.
        rounds: The most rounds run.
        settled: Tells, when the rounds start, whether the model is a fixed point of the steps
            after the first already: then a first round in which the first step changes
            nothing ends there, as the others would change nothing either (the cleanup's CSE
            before the simplification leaves no duplicate on a sorted graph, and a second CSE
            cost a tenth of a jvp to find none).
    """

    def __init__(
        self,
        *steps: passes.PassBase,
        rounds: int = 4,
        settled: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(*steps)
        self.rounds = rounds
        self.settled = settled

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the rounds on ``model``."""
        modified = False
        settled = self.settled is not None and self.settled()
        for _ in range(self.rounds):
            first, *rest = self.passes
            result = first(model)
            model, modified = result.model, modified or result.modified
            if settled and not modified:
                break
            again = False
            for step in rest:
                result = step(model)
                model, again = result.model, again or result.modified
            modified = modified or again
            if not again:
                break
        return passes.PassResult(model, modified)


class RemoveDeadNodes(passes.InPlacePass):
    """Removes the nodes nothing uses, detaching the bodies of removed ones.

    See :func:`_remove_dead_nodes` for why onnx_ir's ``RemoveUnusedNodesPass`` is not enough.
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        before = model.graph.num_nodes()
        _remove_dead_nodes(model.graph)
        return passes.PassResult(model, modified=model.graph.num_nodes() != before)


class PruneNodes(passes.InPlacePass):
    """:class:`RemoveDeadNodes`, then :class:`~onnax.passes.fast_steps.RemoveUnusedNodes`, in one walk.

    After the first, the second removes no node: it trims the nodes that stay (trailing empty
    inputs, optional outputs nothing reads) and drops unused initializers. The first walk
    collects the nodes that stay, and they are trimmed from that list, in the second walk's
    order, once the dead nodes are gone: the same model without the second walk over the
    graph's linked list and its test of every output's uses (a derivative model has tens of
    thousands of nodes, and the cleanup prunes twice).
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        if model.functions:
            # Functions are the second step's alone: run the two as they are.
            dead = RemoveDeadNodes()(model).modified
            return passes.PassResult(model, RemoveUnusedNodes()(model).modified or dead)
        graph = model.graph
        before = graph.num_nodes()
        kept: list[ir.Node] = []
        _remove_dead_nodes(graph, kept)
        _trim(kept, frozenset(graph.outputs), graph.opset_imports.get(""))
        removed = remove_unused_initializers(model)
        return passes.PassResult(model, modified=bool(removed) or graph.num_nodes() != before)


def _trim(kept: list[ir.Node], outputs: frozenset[ir.Value], opset: int | None) -> None:
    """Trims the nodes that stay, in the order ``RemoveUnusedNodesPass`` visits them.

    That is last first, each before its bodies, once no dead node is left (so a graph not yet
    sorted is trimmed as that pass trims it).
    """
    for node in kept:
        trim(node, outputs, opset)
        for body in graph_attributes(node) if node._attributes.data else ():
            _trim(list(reversed(body)), frozenset(body.outputs), opset)


class EliminateCommonSubexpressions(passes.InPlacePass):
    """onnx_ir's ``CommonSubexpressionEliminationPass``, keeping the outputs' declared types.

    It runs as :func:`~onnax.passes.cse.eliminate_common_subexpressions` (the same rewrite,
    linear in the graph's size).

    When a rule emits a copy of a primal output (Sin's tangent computes ``Cos(x)``, a graph
    output of its own), CSE may keep the emitted, untyped copy in the output's place: the
    output would then serialise without a type, which ``onnx.checker`` rejects.
    """

    def __init__(self) -> None:
        super().__init__()
        self.settled = False
        """Whether the last run left the graph free of duplicates (:func:`~onnax.passes.cse.eliminate`)."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        declared = [(v.type, v.shape) for v in model.graph.outputs]
        modified, self.settled = eliminate(model.graph)
        _keep_output_types(model.graph, declared)
        return passes.PassResult(model, modified=modified)


class FixOutputs(passes.InPlacePass):
    """``OutputFixPass``, keeping a main-graph input passed through as an output.

    See :func:`_fix_outputs`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.aliased = False
        """Whether the last run had outputs to separate (it may have added nodes)."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        self.aliased = _fix_outputs(model)
        return passes.PassResult(model, modified=True)


class FixNames(passes.InPlacePass):
    """``NameFixPass``, then :class:`UniqueNamesAcrossScopes`.

    A model without subgraphs or functions, as most derivative models are, is named in one
    loop (:func:`onnax.core.name_fix.fix_names_flat`, the very names the pass gives), and
    its single graph then has unique names across scopes already.
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        modified = fix_names_flat(model)
        if modified is not None:
            return passes.PassResult(model, modified=modified)
        common.NameFixPass()(model)
        _unique_across_scopes(model)
        return passes.PassResult(model, modified=True)


class UniqueNamesAcrossScopes(passes.InPlacePass):
    """Gives every value a name no other graph of the model holds.

    See :func:`_unique_across_scopes`.
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        _unique_across_scopes(model)
        return passes.PassResult(model, modified=True)


class NameMainGraph(passes.InPlacePass):
    """Names an unnamed main graph ``main`` (onnx.checker wants a name)."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        if model.graph.name:
            return passes.PassResult(model, modified=False)
        model.graph.name = "main"
        return passes.PassResult(model, modified=True)


class AnnotateShapes(passes.InPlacePass):
    """Gives every value its type and the shape that inference knows for sure.

    See :func:`_annotate`.

    Args:
        presorted: Whether the model comes sorted and named, as :class:`SortGraph` leaves it
            (``infer_shapes(presorted=True)``).
    """

    def __init__(self, *, presorted: bool = False) -> None:
        super().__init__()
        self.presorted = presorted

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        _annotate(model, presorted=self.presorted)
        return passes.PassResult(model, modified=True)


def _remove_dead_nodes(graph: ir.Graph, kept: list[ir.Node] | None = None) -> None:
    """Removes the nodes nothing uses, last first, detaching the bodies of removed ones.

    ``RemoveUnusedNodesPass`` leaves the body of a removed If, Loop or Scan reading the values
    it captures from the enclosing graph: those keep a use, so their producers stay, reading
    values that are gone (vmap of an unused Loop that captures a batched value left the
    unbatched producer behind, and the model failed onnx.checker's order check).

    The nodes of ``graph`` that stay are appended to ``kept``, if given, last first.
    """
    outputs = frozenset(graph.outputs)
    dead = []
    for node in reversed(node_list(graph)):
        # graph_attributes only for a node with attributes: a truth test for most nodes.
        held = graph_attributes(node) if node._attributes.data else ()
        if _used(node, outputs):
            if kept is not None:
                kept.append(node)
            for body in held:
                _remove_dead_nodes(body)
            continue
        for body in held:
            detach(body)
        # Its producers must see it gone at once (they come next); removal waits, as one
        # call per node would cost the graph's outputs each time.
        detach_inputs(node)
        dead.append(node)
    remove_unused(graph, dead)


def _used(node: ir.Node, outputs: frozenset[ir.Value]) -> bool:
    """Whether an output of ``node`` is a graph output or has a use (a loop: no generator)."""
    for out in node.outputs:  # noqa: SIM110
        if out in outputs or out.uses():
            return True
    return False


def _fix_outputs(model: ir.Model) -> bool:
    """``OutputFixPass``, except that a main-graph input passed through as an output stays so.

    The pass separates such an output from the input with an Identity and renames the input
    ``<name>_orig``: a public input name would change (``(x) => (x)`` would take ``x_orig``).
    The main graph's inputs and outputs keep their names, so the pass-through is restored
    (onnx.checker and onnxruntime accept it: the source model had it).

    Returns:
        Whether the pass ran (there were outputs to separate): only then are nodes added.
    """
    graph = model.graph
    if not model.functions and not any(_aliased_outputs(g) for g in (graph, *subgraphs(graph))):
        return False  # the pass would add nothing: its two walks of every graph cost more
    passthrough = {v: v.name for v in graph.outputs if v.is_graph_input()}
    common.OutputFixPass()(model)
    for i, out in enumerate(list(graph.outputs)):
        node = out.producer()
        if node is None or node.op_type != "Identity" or node.graph is not graph:
            continue
        x = node.inputs[0]
        if x is None or x not in passthrough or out.name != passthrough[x]:
            continue
        graph.outputs[i] = x
        graph.remove(node, safe=True)
        x.name = passthrough[x]
    return True


def _aliased_outputs(graph: ir.Graph) -> bool:
    """Whether ``OutputFixPass`` aliases an output of ``graph``: a repeated one or an input."""
    outputs = graph.outputs
    return len(set(outputs)) != len(outputs) or any(v.is_graph_input() for v in outputs)


def _keep_output_types(
    graph: ir.Graph, declared: list[tuple[ir.TypeProtocol | None, ir.Shape | None]]
) -> None:
    """Gives back the declared type and shape to graph outputs that CSE replaced.

    When a rule emits a copy of a primal output (Sin's tangent computes ``Cos(x)``, a graph
    output of its own), CSE may keep the emitted, untyped copy in the output's place: the
    output would then serialise without a type, which ``onnx.checker`` rejects.
    """
    for value, (type_, shape) in zip(graph.outputs, declared, strict=True):
        if value.type is None and type_ is not None:
            value.type = type_
        if value.shape is None and shape is not None:
            value.shape = ir.Shape(shape)


def _annotate(model: ir.Model, *, presorted: bool = False) -> None:
    """Gives every value its type and, where inference knows it for sure, its shape.

    The rules build nodes without them; users read them, and onnxruntime trusts them. So no
    shape resting on a guess is written down: in a model where inference met a guessed rank
    (a ``Squeeze`` without axes of run-time dimensions, see :data:`RANK_GUESSED`), the values
    the rules left without a shape get only their types, elsewhere their ranks and static
    dimensions (named ones are left unknown). Inference only adds to a model that
    is complete and valid already: should a rule of onnx_shape_inference refuse a node, the
    values after it keep what they have.
    """
    trusted = model.graph.meta.get(RANK_GUESSED) is False
    unshaped = [
        out
        for graph in model_graphs(model)
        for node in graph
        for out in node.outputs
        if out.shape is None and not out.is_graph_output()
    ]
    try:
        # Without the completion rounds: the next transform completes the shapes it needs,
        # and a second round of inference on a derivative model costs a fifth of a transform.
        infer_shapes(model, complete=False, new_only=True, presorted=presorted)
    except (OpUsageError, ShapeInferenceError):
        logger.debug("shape inference stopped on the transformed model", exc_info=True)
    for value in unshaped:
        if not trusted or value.shape is None:
            value.shape = None
            continue
        # Named dimensions on emitted values would be promises to onnxruntime, which plans
        # buffers from equal names: inference broadcasting ``n`` against ``m`` picks one of
        # them (``forget_guessed_broadcasts`` repairs only the broadcasts themselves, not what
        # follows from them), and a jvp through two Loops then reused an [n] buffer for n + 1
        # values. The rank and the static sizes are kept; the next transform infers the rest.
        value.shape = new_shape(
            [d if isinstance(d, int) else ir.SymbolicDim(None) for d in value.shape.dims]
        )


def _unique_across_scopes(model: ir.Model) -> None:
    """Renames values whose name a value of another graph (a subgraph, an outer graph) holds.

    onnxruntime wants one name per value in the whole model, subgraphs included, and
    ``NameFixPass`` only avoids the names of enclosing graphs seen *before* a subgraph: a name it
    gives inside a body can collide with an outer value placed after the node. The main graph's
    inputs, outputs and initializers keep their names; later holders of a name are renamed.
    """
    graph = model.graph
    public = [*graph.inputs, *graph.outputs, *graph.initializers.values()]
    values = [
        v
        for g in model_graphs(model)
        for v in (*g.inputs, *g.initializers.values(), *(o for n in g for o in n.outputs))
    ]
    used = {v.name for v in values if v.name}
    taken: set[str] = set()
    seen: set[ir.Value] = set()
    for value in (*public, *values):
        if value in seen:
            continue
        seen.add(value)
        if value.name and value.name not in taken:
            taken.add(value.name)
            continue
        base, k = value.name or "v", 1
        while f"{base}_{k}" in used:
            k += 1
        value.name = f"{base}_{k}"
        used.add(value.name)
        taken.add(value.name)
