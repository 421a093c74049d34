"""Expansion of operators without a rule into the primitives they are defined by.

Before a transform walks the graph, every *active* node (one an input of the transform reaches:
a value carrying a tangent for jvp/vjp/grad, a batched value for vmap) whose operator has no rule
for that transform is replaced by

1. its registered lowering (:data:`onnax.core.registry.lowerings`), or else
2. its ONNX function body (or context-dependent one) at the model's opset, converted to that
   opset when the schema wrote it for another (:mod:`onnax.core.functions`).

The replacement is expanded again where it contains such operators, until only operators with
rules (or without any expansion) remain. Each expansion is built in a small standalone model with
the node's input types and shapes, where shape inference and constant folding turn its shape
arithmetic into constants; only then is it inlined. A rule written for an operator always wins
over its expansion, and inactive nodes are left alone (the primal keeps its fused kernels).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from onnax.core.diagnostics import RANDOM_OPS, node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.functions import BodyConversionError, function_body
from onnax.core.inference import infer_shapes
from onnax.core.registry import Registry, batch_rules, lowerings
from onnax.core.selection import is_float
from onnax.core.static import constant_of
from onnax.core.subgraphs import graph_attributes, subgraph_reads
from onnax.core.traverse import model_graphs
from onnax.errors import UnsupportedOperatorError
from onnax.passes.fold import MAX_FOLDED_ELEMENTS, fold_constants
from onnax.rules import collect

__all__ = ["MAX_DEPTH", "expand"]

MAX_DEPTH = 16
"""Nesting limit of expansions within expansions (a guard against a lowering emitting itself)."""


@dataclasses.dataclass
class _Replacement:
    model: ir.Model
    input_index: list[int]
    output_index: list[int]


def _symbols(values: list[ir.Value]) -> set[str]:
    return {
        str(d)
        for v in values
        if v.shape is not None
        for d in v.shape.dims
        if not isinstance(d, int)
    }


def _expandable(node: ir.Node) -> bool:
    """Random, sequence, optional and control-flow nodes keep their own (clearer) errors."""
    if node.domain in ("", "ai.onnx") and node.op_type in RANDOM_OPS:
        return False
    if graph_attributes(node):
        return False
    return not any(
        v is not None and isinstance(v.type, (ir.SequenceType, ir.OptionalType))
        for v in (*node.inputs, *node.outputs)
    )


class _Expander:
    def __init__(self, model: ir.Model, rules: Registry, transform: str) -> None:
        self.model = model
        self.opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        self.rules = rules
        self.transform = transform
        # vmap batches every value an input reaches; derivatives only flow through floats.
        self.floats_only = rules is not batch_rules
        self._used_names: set[str] | None = None  # collected at the first expansion
        self.count = 0
        self.active: set[ir.Value] = set()

    def carries(self, value: ir.Value) -> bool:
        return not self.floats_only or value.type is None or is_float(value)

    def graph(self, graph: ir.Graph, active: set[ir.Value]) -> None:
        for node in list(graph):
            self.node(graph, node, active, 0)

    def node(self, graph: ir.Graph, node: ir.Node, active: set[ir.Value], depth: int) -> None:
        # Every node of the model is asked: a loop over the inputs, and the bodies looked
        # for only on a node with attributes (none without holds one).
        for v in node.inputs:
            if v is not None and v in active:
                break
        else:
            held = node.attributes.data and subgraph_reads(node)
            if not held or not any(v in active for v in held):
                return
        if (
            depth < MAX_DEPTH
            and self.rules.lookup(node.domain, node.op_type, self.opset) is None
            and _expandable(node)
        ):
            self.active = active
            replacement = self.replacement(node)
            if replacement is not None:
                for new in self.inline(graph, node, replacement):
                    self.node(graph, new, active, depth + 1)
                return
        for sub in graph_attributes(node) if node.attributes.data else ():
            # Over-approximated: every body input may carry the derivative or batch dimension.
            active.update(v for v in sub.inputs if self.carries(v))
            self.graph(sub, active)
        active.update(o for o in node.outputs if self.carries(o))

    # ------------------------------------------------------------- building expansions
    def replacement(self, node: ir.Node) -> _Replacement | None:
        lowering = lowerings.lookup(node.domain, node.op_type, self.opset)
        if lowering is not None:
            return self.lowered(node, lowering)
        try:
            body = function_body(node, self.model.opset_imports)
        except BodyConversionError as err:
            what = "batch" if self.rules is batch_rules else "derivative"
            registry = "batch_rules" if self.rules is batch_rules else "jvp_rules"
            raise UnsupportedOperatorError(
                f"{self.transform}: no {what} rule for {op_label(node)} at opset {self.opset} "
                f"({node_label(node)}), and its ONNX function body (written for opset "
                f"{err.written_for}) could not be converted to opset {err.opset}: {err.detail}. "
                f"Remedy: convert the model to opset {err.written_for} or newer "
                "(onnx.version_converter.convert_version), leave the inputs that reach this node "
                "out of the transform, or register a rule with "
                f"onnax.rules.{registry}.register({node.op_type!r}, domain={node.domain!r})."
            ) from err
        if body is None:
            return None
        model = ir.from_proto(body.model)
        for w, i in zip(model.graph.inputs, body.input_index, strict=True):
            self._describe(w, node.inputs[i])
        return _Replacement(model, body.input_index, body.output_index)

    def lowered(self, node: ir.Node, lowering: object) -> _Replacement:
        inputs: list[ir.Value] = []
        input_index: list[int] = []
        args: list[ir.Value | None] = []
        for i, v in enumerate(node.inputs):
            if v is None:
                args.append(None)
                continue
            w = ir.Value(name=f"in{i}")
            self._describe(w, v)
            inputs.append(w)
            input_index.append(i)
            args.append(w)
        clone = ir.Node(
            node.domain,
            node.op_type,
            args,
            list(node.attributes.values()),
            num_outputs=len(node.outputs),
        )
        for mine, theirs in zip(clone.outputs, node.outputs, strict=True):
            mine.type = theirs.type
            mine.shape = theirs.shape.copy() if theirs.shape is not None else None
            mine.name = theirs.name
        em = Emitter(self.opset)
        results = lowering(em, clone)  # type: ignore[operator]
        for i in range(len(clone.inputs)):
            clone.replace_input_with(i, None)
        outputs: list[ir.Value] = []
        output_index: list[int] = []
        for i, (old, new) in enumerate(zip(node.outputs, results, strict=False)):
            if new is None or not (old.uses() or old.is_graph_output()):
                continue
            outputs.append(new)
            output_index.append(i)
        graph = ir.Graph(
            inputs, outputs, nodes=em.take(), opset_imports=dict(self.model.opset_imports)
        )
        return _Replacement(
            ir.Model(graph, ir_version=self.model.ir_version), input_index, output_index
        )

    def _describe(self, w: ir.Value, v: ir.Value | None) -> None:
        """Gives a stand-in input the type, shape and (small) content of the value it stands for."""
        if v is None:
            return
        w.type = v.type
        w.shape = v.shape.copy() if v.shape is not None else None
        # A differentiated (or batched) initializer is not a constant: folding it would drop it.
        array = None if v in self.active else constant_of(v)
        if array is not None and array.size <= MAX_FOLDED_ELEMENTS:
            w.const_value = ir.tensor(np.asarray(array))

    # ------------------------------------------------------------------------ inlining
    def inline(self, graph: ir.Graph, node: ir.Node, rep: _Replacement) -> list[ir.Node]:
        model = rep.model
        sub = model.graph
        try:
            infer_shapes(model)
            fold_constants(model)
        except Exception:  # shapes are an optimisation; the body stays valid without them
            pass
        # Every replacing output must come out of a node of its own: a pass-through input or
        # an output listed twice would otherwise swap names with the user's values.
        seen: set[ir.Value] = set()
        for k, out in enumerate(list(sub.outputs)):
            if out.producer() is None or out in seen:
                copy = ir.node("Identity", [out])
                copy.outputs[0].type = out.type
                copy.outputs[0].shape = out.shape.copy() if out.shape is not None else None
                sub.append(copy)
                sub.outputs[k] = copy.outputs[0]
            seen.add(sub.outputs[k])
        nodes = list(sub)
        known = _symbols([v for v in node.inputs if v is not None])
        prefix = node.name or (node.outputs[0].name if node.outputs else None) or node.op_type
        for n in nodes:
            for inner in (n, *(m for g in graph_attributes(n) for m in g.all_nodes())):
                inner.name = self._fresh(f"{prefix}/{inner.op_type}")
                for o in inner.outputs:
                    o.name = self._fresh(f"{prefix}/{o.name or 'v'}")
            for o in n.outputs:
                if o.shape is not None and not _symbols([o]) <= known:
                    # Symbols invented by the standalone inference mean nothing in the graph.
                    o.shape = None
        new_outputs = list(sub.outputs)
        sub.outputs.clear()
        sub.remove(nodes)
        for w, i in zip(list(sub.inputs), rep.input_index, strict=True):
            target = node.inputs[i]
            for use in list(w.uses()):
                use.node.replace_input_with(use.idx, target)
        sub.inputs.clear()
        graph.insert_before(node, nodes)
        kept: list[tuple[ir.Value, ir.Value]] = []
        for i, new in zip(rep.output_index, new_outputs, strict=True):
            old = node.outputs[i]
            if new.type is None:
                new.type = old.type
            if new.shape is None and old.shape is not None:
                new.shape = old.shape.copy()
            for use in list(old.uses()):
                use.node.replace_input_with(use.idx, new)
            if old.is_graph_output():
                kept.append((old, new))
        for out in node.outputs:
            for use in list(out.uses()):  # an output the body does not compute, yet named
                use.node.replace_input_with(use.idx, None)
        node.resize_outputs(0)
        graph.remove(node, safe=True)
        # The passes hold on to the graph outputs they selected, so an output value survives,
        # re-produced by an Identity of the expansion rather than replaced.
        for old, new in kept:
            graph.insert_after(nodes[-1], ir.Node("", "Identity", [new], outputs=[old]))
        self.count += 1
        return nodes

    def _fresh(self, base: str) -> str:
        if self._used_names is None:
            self._used_names = {
                v.name
                for g in model_graphs(self.model)
                for v in (*g.inputs, *(o for n in g for o in n.outputs))
                if v.name
            }
            self._used_names.update(self.model.graph.initializers)
        name, k = base, 1
        while name in self._used_names:
            k += 1
            name = f"{base}_{k}"
        self._used_names.add(name)
        return name


def expand(model: ir.Model, inputs: list[ir.Value], rules: Registry, transform: str) -> int:
    """Expands, in place, the active nodes of ``model`` that have no rule in ``rules``.

    Args:
        model: A prepared model (sorted, shapes inferred); changed in place.
        inputs: The values the transform starts from (selected or batched inputs).
        rules: The registry deciding which operators need no expansion (``jvp_rules`` for
            jvp/vjp/grad, ``batch_rules`` for vmap).
        transform: The transform's name, for messages.

    Returns:
        The number of nodes expanded; when positive, shapes have been re-inferred.

    Raises:
        UnsupportedOperatorError: If an operator's function body cannot be converted to the
            model's opset.
    """
    collect()  # rules decide what needs no expansion
    expander = _Expander(model, rules, transform)
    expander.graph(model.graph, set(inputs))
    if expander.count:
        infer_shapes(model)
    return expander.count
