"""Unrolling: ``UnrollPass`` replaces loops of a known trip count by copies of their body.

A ``Scan`` is unrolled when the length of its scan axis is static (known from the shapes before
the model runs); a ``Loop`` when its trip count ``M`` is a constant and nothing can end it
early: its condition input is absent or a constant true, and its body's condition output is
(a chain of ``Identity`` copies of) its condition input or a constant true. Other loops stay as
they are. Bodies are unrolled first, also inside ``If`` branches, so nested loops unroll from the
inside out.

Each iteration is a copy of the body whose inputs are bound to the current state: the state
variables of the previous copy, the iteration's slice of every scan input (``Gather`` at a
constant index, counted from the end for a reverse direction), the iteration number and a true
condition for a ``Loop``. Values the body reads from enclosing graphs are shared by all copies.
Scan outputs are stacked with ``Unsqueeze`` + ``Concat`` along their axis (in reverse order for
a reverse direction); a ``Loop``'s along a new axis 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from onnax.core.attrs import ints_attr
from onnax.core.emit import Emitter
from onnax.passes.prepare import infer_shapes, prepare

__all__ = ["UnrollPass", "unroll_graph"]

_Replacement = tuple[list[ir.Node], list[ir.Value]]


class UnrollPass(ir.passes.FunctionalPass):
    """Replaces every ``Scan`` and ``Loop`` of a known trip count by copies of its body.

    Args:
        max_steps: Loops with more iterations than this stay as they are (None: no limit).
    """

    def __init__(self, max_steps: int | None = None) -> None:
        super().__init__()
        self.max_steps = max_steps

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the unrolled model; the argument is left untouched."""
        model = prepare(model, "unroll")
        opset = model.opset_imports.get("", 11)
        modified = unroll_graph(model.graph, opset, self.max_steps)
        if modified:
            common.RemoveUnusedNodesPass()(model)
            _unique_names(model)
            infer_shapes(model)
        return ir.passes.PassResult(model, modified=modified)


def unroll_graph(graph: ir.Graph, opset: int, max_steps: int | None = None) -> bool:
    """Unrolls the loops of ``graph`` and of its subgraphs in place; True if any was unrolled."""
    modified = False
    for node in list(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                modified |= unroll_graph(attr.as_graph(), opset, max_steps)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    modified |= unroll_graph(sub, opset, max_steps)
        if node.domain != "":
            continue
        if node.op_type == "Scan":
            replacement = _unroll_scan(node, opset, max_steps)
        elif node.op_type == "Loop":
            replacement = _unroll_loop(node, opset, max_steps)
        else:
            continue
        if replacement is None:
            continue
        nodes, outputs = replacement
        _splice(graph, node, nodes, outputs)
        modified = True
    return modified


# --------------------------------------------------------------------------------- Scan
def _static_length(values: Sequence[ir.Value | None], axes: Sequence[int]) -> int | None:
    for value, axis in zip(values, axes, strict=True):
        if value is None or value.shape is None:
            continue
        rank = value.shape.rank()
        dim = value.shape[axis % rank] if -rank <= axis < rank else None
        if isinstance(dim, int):
            return dim
    return None


def _unroll_scan(node: ir.Node, opset: int, max_steps: int | None) -> _Replacement | None:
    body = node.attributes["body"].as_graph()
    n_scan = node.attributes.get_int("num_scan_inputs", 0)
    n_state = len(node.inputs) - n_scan
    n_out = len(body.outputs) - n_state
    xs = list(node.inputs[n_state:])
    in_axes = ints_attr(node, "scan_input_axes", [0] * n_scan) or []
    in_rev = ints_attr(node, "scan_input_directions", [0] * n_scan) or []
    out_axes = ints_attr(node, "scan_output_axes", [0] * n_out) or []
    out_rev = ints_attr(node, "scan_output_directions", [0] * n_out) or []
    steps = _static_length(xs, in_axes)
    if steps is None or steps == 0 or (max_steps is not None and steps > max_steps):
        return None

    em = Emitter(opset)
    nodes: list[ir.Node] = []
    states: list[ir.Value] = [v for v in node.inputs[:n_state] if v is not None]
    collected: list[list[ir.Value]] = [[] for _ in range(n_out)]
    for t in range(steps):
        bound: dict[ir.Value, ir.Value | None] = dict(
            zip(body.inputs[:n_state], states, strict=True)
        )
        for k, (inner, x) in enumerate(zip(body.inputs[n_state:], xs, strict=True)):
            assert x is not None
            index = em.const(np.array(steps - 1 - t if in_rev[k] else t, np.int64))
            bound[inner] = em.op("Gather", [x, index], {"axis": in_axes[k]})
        nodes.extend(em.take())
        outs = _copy_body(body, bound, em, nodes)
        states = outs[:n_state]
        for k in range(n_out):
            collected[k].append(outs[n_state + k])
    stacked = [
        _stack(em, list(reversed(elems)) if out_rev[k] else elems, out_axes[k])
        for k, elems in enumerate(collected)
    ]
    nodes.extend(em.take())
    return nodes, [*states, *stacked]


# --------------------------------------------------------------------------------- Loop
def _const_scalar(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return None
    array = tensor.numpy()
    return array.reshape(()) if array.size == 1 else None


def _always_true(value: ir.Value, cond_in: ir.Value) -> bool:
    """Whether a Loop body's condition output is a copy of its input or a constant true."""
    while value is not cond_in:
        producer = value.producer()
        if producer is not None and producer.op_type == "Identity" and producer.domain == "":
            value = producer.inputs[0]  # type: ignore[assignment]
            continue
        constant = _const_scalar(value)
        return constant is not None and bool(constant)
    return True


def _unroll_loop(node: ir.Node, opset: int, max_steps: int | None) -> _Replacement | None:
    body = node.attributes["body"].as_graph()
    trip, cond = (node.inputs[i] if i < len(node.inputs) else None for i in (0, 1))
    count = _const_scalar(trip)
    if count is None:
        return None
    if cond is not None:
        initial = _const_scalar(cond)
        if initial is None or not bool(initial):
            return None
    if not _always_true(body.outputs[0], body.inputs[1]):
        return None
    steps = max(int(count), 0)
    n_carried = len(node.inputs) - 2
    n_out = len(body.outputs) - 1 - n_carried
    if (steps == 0 and n_out > 0) or (max_steps is not None and steps > max_steps):
        return None  # an empty scan output has a shape no copy of the body gives

    em = Emitter(opset)
    nodes: list[ir.Node] = []
    carried: list[ir.Value] = [v for v in node.inputs[2:] if v is not None]
    collected: list[list[ir.Value]] = [[] for _ in range(n_out)]
    true = em.const(np.array(True))
    for t in range(steps):
        bound: dict[ir.Value, ir.Value | None] = {
            body.inputs[0]: em.const(np.array(t, np.int64)),
            body.inputs[1]: true,
            **dict(zip(body.inputs[2:], carried, strict=True)),
        }
        nodes.extend(em.take())
        outs = _copy_body(body, bound, em, nodes)
        carried = outs[1 : 1 + n_carried]
        for k in range(n_out):
            collected[k].append(outs[1 + n_carried + k])
    stacked = [_stack(em, elems, 0) for elems in collected]
    nodes.extend(em.take())
    return nodes, [*carried, *stacked]


# ------------------------------------------------------------------------------ helpers
def _copy_body(
    body: ir.Graph, bound: dict[ir.Value, ir.Value | None], em: Emitter, nodes: list[ir.Node]
) -> list[ir.Value]:
    """Appends a copy of ``body``'s nodes with its inputs ``bound``; returns its outputs.

    The copy comes from the public ``Graph.clone`` (not onnx_ir's private cloner, whose
    interface may change in any release); its inputs and initializers are then rewired to the
    bound values, in nested subgraphs too, since a value's uses span every scope.
    """
    copy = body.clone(allow_outer_scope_values=True)
    mapping: dict[ir.Value, ir.Value | None] = {}
    for original, cloned in zip(body.inputs, copy.inputs, strict=True):
        if original in bound:
            mapping[cloned] = bound[original]
    for init in copy.initializers.values():
        if init.const_value is None:
            raise ValueError(f"unroll: the body initializer {init.name!r} holds no tensor")
        mapping[init] = em.const(init.const_value)
    nodes.extend(em.take())
    outputs = list(copy.outputs)
    inner = list(copy)
    copy.outputs.clear()
    copy.remove(inner, safe=False)
    for cloned, target in mapping.items():
        for use in list(cloned.uses()):
            use.node.replace_input_with(use.idx, target)
    for node in inner:
        node.name = None
        for out in node.outputs:
            out.name = None  # named by the graph it joins, then made unique by _unique_names
        nodes.append(node)
    outs = []
    for v in outputs:
        got = mapping.get(v, v)
        if got is None:
            raise ValueError(f"unroll: the body output {v.name!r} is an omitted input")
        outs.append(got)
    return outs


def _stack(em: Emitter, elements: list[ir.Value], axis: int) -> ir.Value:
    """The elements stacked along a new ``axis`` (negative: counted in the stacked rank)."""
    parts = [em.unsqueeze(e, [axis]) for e in elements]
    return parts[0] if len(parts) == 1 else em.op("Concat", parts, {"axis": axis})


def _splice(graph: ir.Graph, node: ir.Node, nodes: list[ir.Node], outputs: list[ir.Value]) -> None:
    """Puts ``nodes`` in place of ``node``, whose outputs become ``outputs``."""
    graph.insert_before(node, nodes)
    for old, new in zip(node.outputs, outputs, strict=True):
        if old.is_graph_output():
            # A fresh copy: the replacement may be a graph input or already another output.
            copy = ir.node("Identity", [new])
            graph.insert_before(node, copy)
            name = old.name
            old.name = None
            old.replace_all_uses_with(copy.outputs[0], replace_graph_outputs=True)
            copy.outputs[0].name = name
            copy.outputs[0].type = old.type
            copy.outputs[0].shape = old.shape
        else:
            old.replace_all_uses_with(new)
    graph.remove(node, safe=True)
    # The body was only a template: its nodes must no longer count as uses of outer values.
    for attr in node.attributes.values():
        subs = [attr.as_graph()] if attr.type == ir.AttributeType.GRAPH else []
        for sub in subs:
            for inner in sub.all_nodes():
                for i in range(len(inner.inputs)):
                    inner.replace_input_with(i, None)


def _unique_names(model: ir.Model) -> None:
    """Makes every value and node name unique across the model's graphs (main graph I/O kept).

    Copies of a body keep the names of the nested subgraphs they contain, and every graph names
    its new values from a counter of its own; onnxruntime needs one assignment per name over the
    whole model.
    """
    main = model.graph
    used: set[str] = set()
    seen: set[ir.Value] = set()
    fixed = [*main.inputs, *main.initializers.values(), *main.outputs]
    for v in fixed:
        if v.name:
            used.add(v.name)
        seen.add(v)
    counter = itertools.count()
    for g in model.graphs():
        values = [*g.inputs, *g.initializers.values(), *(o for n in g for o in n.outputs)]
        for v in values:
            if v in seen:
                continue
            seen.add(v)
            if v.name and v.name not in used:
                used.add(v.name)
                continue
            base = v.name or "unrolled"
            name = f"{base}_{next(counter)}"
            while name in used:
                name = f"{base}_{next(counter)}"
            v.name = name
            used.add(name)
    # Node names too: copies of nested bodies repeat them.
    node_names: set[str] = set()
    for g in model.graphs():
        for n in g:
            if n.name and n.name not in node_names:
                node_names.add(n.name)
                continue
            base = n.name or n.op_type
            name = f"{base}_{next(counter)}"
            while name in node_names:
                name = f"{base}_{next(counter)}"
            n.name = name
            node_names.add(name)
