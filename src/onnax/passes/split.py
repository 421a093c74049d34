"""Linearization as two models: the forward sweep with its residuals, and the linear map.

:func:`joint_model` builds a jvp model in *linearize* mode (the mode of reverse mode): the primal
nodes stay whole and the tangent nodes sit beside them, reading primal values. A Loop or Scan
keeps its primal node, which then also records the state each iteration starts from, and a
separate linear node reads those records; forward mode would instead fuse primal and tangent
into one node, which could not be split. :mod:`onnax.passes.hoist` then moves the primal work
of linear Scan bodies and If branches into residual nodes of their own, so that the linear model
does not redo it.

:func:`split` then partitions that model. A node is *linear* when it reads, directly or through
the subgraphs it holds, a value computed from a tangent input; every other node belongs to the
forward model. The non-linear values that linear nodes read are the *residuals*: outputs of the
forward model and inputs of the linear one. Constants (initializers that are not graph inputs,
Constant nodes and what is computed from those alone) are not residuals: the linear model gets
its own copy of what it reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx
import onnx_ir as ir

from onnax.core.batching import detach
from onnax.core.emit import Emitter
from onnax.core.gcpause import gc_paused
from onnax.core.naming import NameClaims, derivative_outputs, diff_prefix, io_names
from onnax.core.selection import select_inputs, select_outputs
from onnax.core.subgraphs import graph_attributes, subgraph_reads
from onnax.core.traverse import all_nodes, model_graphs
from onnax.passes.accumulate import Accumulate, accumulate_in_float, check_accumulate
from onnax.passes.cleanup import cleanup
from onnax.passes.hoist import hoist_scan, reads
from onnax.passes.hoist_if import hoist_if
from onnax.passes.linearize import linearize
from onnax.passes.outputs import append_outputs
from onnax.passes.prepare import prepare

__all__ = ["Split", "hoist_residuals", "joint_model", "residual_prefix", "split"]

TRANSFORM = "linearize"


@gc_paused
def joint_model(
    model: ir.Model,
    inputs: str | Sequence[str] | None,
    outputs: str | Sequence[str] | None,
    accumulate: Accumulate = "model",
) -> tuple[ir.Model, int, int]:
    """A jvp model whose linear part can be cut out: ``(x..., fwd_x...) -> (y..., fwd_y...)``.

    Selection, names and defaults are those of ``onnax.jvp``; only the treatment of control flow
    differs (see the module docstring).

    Returns:
        The model (``model`` itself is left untouched), its number of primal inputs and its
        number of primal outputs.
    """
    accumulate = check_accumulate(accumulate, TRANSFORM)
    model = prepare(model, TRANSFORM)
    graph = model.graph
    n_in, n_out = len(graph.inputs), len(graph.outputs)
    primal = set(all_nodes(graph))
    xs = select_inputs(graph, inputs, TRANSFORM)
    ys = select_outputs(graph, outputs, TRANSFORM)
    if outputs is None:
        # The seed contract of jvp: on a grad model, the default is its generated outputs, so
        # linearize(grad(m)) is the Hessian-vector product.
        generated = [y for y in derivative_outputs(graph) if y in ys]
        ys = generated or ys
    prefix = diff_prefix(io_names(graph), "fwd")
    claims = NameClaims(model)
    lin = linearize(model, xs, TRANSFORM, mode="linearize", outputs=ys)
    for x, t in zip(xs, lin.tangent_inputs, strict=True):
        claims.claim(t, prefix + str(x.name))
    em = Emitter(lin.opset, lin.linear)
    # A primal Loop is replaced by one that also counts its iterations (the records' length).
    ys = [lin.replaced.get(y, y) for y in ys]
    pairs = [(y, lin.tangent.get(y)) for y in ys]
    append_outputs(em, graph, claims, prefix, pairs, TRANSFORM)
    accumulate_in_float(model, primal, accumulate)
    model = cleanup(model)
    if hoist_residuals(model, n_in):
        model = cleanup(model)
    return model, n_in, n_out


def hoist_residuals(model: ir.Model, n_in: int) -> bool:
    """Gives every linear top-level Scan and If of a joint model a residual node (in place).

    See :mod:`onnax.passes.hoist` and :mod:`onnax.passes.hoist_if`.

    Args:
        model: A joint model: tangent inputs follow ``n_in`` primal ones.
        n_in: The number of primal graph inputs.

    Returns:
        Whether a node was rewritten.
    """
    graph = model.graph
    linear: set[ir.Value] = set(list(graph.inputs)[n_in:])
    changed = False
    for node in list(graph):
        if not any(v in linear for v in reads(node)):
            continue
        linear.update(node.outputs)
        if node.domain == "" and node.op_type == "Scan":
            changed |= hoist_scan(graph, node, linear)
        elif node.domain == "" and node.op_type == "If":
            changed |= hoist_if(graph, node, linear)
    return changed


@dataclasses.dataclass
class Split:
    """The two halves of a linearized model.

    Attributes:
        forward: ``(x...) -> (y..., res...)``.
        linear: ``(res..., fwd_x...) -> (fwd_y...)``.
        residuals: The residual names, in the order of the forward outputs and linear inputs.
    """

    forward: ir.Model
    linear: ir.Model
    residuals: list[str]


def _all_names(model: ir.Model) -> set[str]:
    names: set[str] = set()
    for g in model_graphs(model):
        names.update(v.name for v in g.inputs if v.name)
        names.update(g.initializers)
        names.update(o.name for n in g for o in n.outputs if o.name)
    return names


def residual_prefix(names: set[str]) -> str:
    """``res_`` unless a name of the model starts with it; then ``res2_``, ``res3_``..."""
    k = 1
    while any(n.startswith(f"res{k if k > 1 else ''}_") for n in names):
        k += 1
    return f"res{k if k > 1 else ''}_"


def _copy(model: ir.Model) -> ir.Model:
    # A serialisation round trip: the halves share nothing with each other or with the joint.
    return ir.from_proto(onnx.load_from_string(ir.to_proto(model).SerializeToString()))


def _reads(node: ir.Node) -> list[ir.Value]:
    return [v for v in (*node.inputs, *subgraph_reads(node)) if v is not None]


def split(joint: ir.Model, n_in: int, n_out: int) -> Split:
    """Cuts ``joint`` (from :func:`joint_model`) into the forward and the linear model.

    Args:
        joint: The model; it is not modified.
        n_in: Its number of primal inputs (the tangent inputs follow).
        n_out: Its number of primal outputs (the tangent outputs follow).
    """
    graph = joint.graph
    tangent_in = list(graph.inputs)[n_in:]
    tangent_out = list(graph.outputs)[n_out:]
    inputs = set(graph.inputs)
    # IR < 4 lists every initializer as a graph input too: there the listing says nothing, and
    # weights are constants like any other (the linear model lists its copies as inputs again).
    overridable = inputs if joint.ir_version >= 4 else set()
    constant: set[ir.Value] = {v for v in graph.initializers.values() if v not in overridable}
    linear: set[ir.Value] = set(tangent_in)
    linear_nodes: list[ir.Node] = []
    for node in graph:
        reads = _reads(node)
        if any(v in linear for v in reads):
            linear_nodes.append(node)
            linear.update(node.outputs)
        elif all(v in constant for v in reads):
            constant.update(node.outputs)
    # What the linear part reads from outside itself, in first-read order (stable names).
    wanted: dict[ir.Value, None] = {}
    for node in linear_nodes:
        for v in _reads(node):
            if v not in linear:
                wanted.setdefault(v, None)
    for t in tangent_out:
        if t not in linear:
            wanted.setdefault(t, None)  # a zero tangent computed from primal shapes
    residuals = [v for v in wanted if v not in constant]
    # The constant nodes the linear model copies: those its constants come from.
    keep = set(linear_nodes)
    stack = [v for v in wanted if v in constant]
    while stack:
        producer = stack.pop().producer()
        if producer is None or producer in keep or producer.graph is not graph:
            continue
        keep.add(producer)
        stack.extend(_reads(producer))
    prefix = residual_prefix(_all_names(joint))
    names = [f"{prefix}{i}" for i in range(len(residuals))]
    index = {v: i for i, v in enumerate(graph)}
    forward = _forward(joint, n_in, n_out, [index[n] for n in linear_nodes], residuals, names)
    # The forward model's inference has seen the residuals as outputs: its shapes are the best.
    like = list(forward.graph.outputs)[n_out:]
    lin = _linear(joint, n_in, n_out, {index[n] for n in keep}, residuals, like)
    return Split(forward, lin, names)


def _forward(
    joint: ir.Model,
    n_in: int,
    n_out: int,
    drop: list[int],
    residuals: list[ir.Value],
    names: list[str],
) -> ir.Model:
    model = _copy(joint)
    graph = model.graph
    nodes = list(graph)
    by_name = _values_by_name(graph)
    res = [by_name[str(v.name)] for v in residuals]
    del graph.outputs[n_out:]
    primal_outputs = set(graph.outputs)
    _remove_nodes(graph, [nodes[i] for i in drop])
    del graph.inputs[n_in:]
    em = Emitter(model.opset_imports[""])
    for v, name in zip(res, names, strict=True):
        if v.is_graph_input() or v.is_initializer() or v in primal_outputs or v.producer() is None:
            # A public name stays; the residual is a copy under its own name.
            v = em.op("Identity", [v])
            graph.extend(em.take())
        v.name = name
        graph.outputs.append(v)
    return cleanup(_drop_unused_initializers(model))


def _linear(
    joint: ir.Model,
    n_in: int,
    n_out: int,
    keep: set[int],
    residuals: list[ir.Value],
    like: list[ir.Value],
) -> ir.Model:
    model = _copy(joint)
    graph = model.graph
    nodes = list(graph)
    by_name = _values_by_name(graph)
    tangent_in = list(graph.inputs)[n_in:]
    tangent_out = list(graph.outputs)[n_out:]
    graph.outputs.clear()  # rebuilt below; outputs do not follow replaced uses
    res_inputs = []
    passed: dict[ir.Value, ir.Value] = {}
    for v, out in zip(residuals, like, strict=True):
        old = by_name[str(v.name)]
        new = ir.Value(
            name=None, type=out.type, shape=out.shape.copy() if out.shape is not None else None
        )
        old.replace_all_uses_with(new)
        new.name = out.name
        res_inputs.append(new)
        passed[old] = new
    em = Emitter(model.opset_imports[""])
    outputs = []
    for t in tangent_out:
        if t in passed:
            # A zero tangent of symbolic shape, made by the forward model from the primal's
            # shape: the one node of the linear model that reads no tangent.
            name, t.name = t.name, None
            t = em.op("Identity", [passed[t]])
            t.name = name
            graph.extend(em.take())
        outputs.append(t)
    graph.outputs.extend(outputs)
    graph.inputs.clear()
    graph.inputs.extend([*res_inputs, *tangent_in])
    _remove_nodes(graph, [n for i, n in enumerate(nodes) if i not in keep])
    _drop_unused_initializers(model)
    if model.ir_version < 4:
        # IR < 4 requires every initializer to be a graph input as well.
        graph.inputs.extend(graph.initializers.values())
    return cleanup(model)


def _remove_nodes(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Removes ``nodes`` with the uses they (and their bodies) register on the values they read.

    Stale uses would keep initializers and dead producers alive in the cleanup that follows.
    """
    for node in reversed(nodes):
        for body in graph_attributes(node):
            detach(body)
        for i, v in enumerate(node.inputs):
            if v is not None:
                node.replace_input_with(i, None)
        graph.remove(node, safe=False)


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {str(v.name): v for v in graph.inputs}
    values.update(graph.initializers)
    values.update((str(o.name), o) for n in graph for o in n.outputs)
    return values


def _drop_unused_initializers(model: ir.Model) -> ir.Model:
    graph = model.graph
    inputs = set(graph.inputs)
    outputs = set(graph.outputs)
    for name, v in list(graph.initializers.items()):
        if v not in inputs and v not in outputs and not v.uses():
            del graph.initializers[name]
    return model
