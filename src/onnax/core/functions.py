"""Function bodies of ONNX operators, instantiated for one node at the model's opset.

Many ONNX operators are defined by a *function body* in their schema (a graph of simpler ONNX
operators), some by a *context-dependent* one built from the node's attributes and input types.
:func:`function_body` returns that body as a small standalone model whose graph inputs are the
node's present inputs and whose outputs are the node's used outputs: attribute references are
resolved (from the node, then the schema's defaults), absent optional inputs are cut, nodes that
feed no wanted output are dropped, and the body is converted to the model's opset when it was
written for another one (a body for opset 18 spells ``ReduceMean``'s axes as an input; at opset 17
they are an attribute).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import onnx
import onnx.defs
import onnx.helper
import onnx.shape_inference
import onnx.version_converter
import onnx_ir as ir

__all__ = ["Body", "BodyConversionError", "function_body", "schema_at", "static_body_operators"]

_ONNX_DOMAINS = ("", "ai.onnx")


class BodyConversionError(Exception):
    """The function body exists but cannot be converted to the model's opset.

    Attributes:
        written_for: The opset the body was written for.
        opset: The model's opset.
        detail: Which body node and operator failed, at which versions, and why.
    """

    def __init__(self, written_for: int, opset: int, detail: str) -> None:
        super().__init__(detail)
        self.written_for = written_for
        self.opset = opset
        self.detail = detail


@dataclasses.dataclass
class Body:
    """A function body instantiated for one node.

    Attributes:
        model: A standalone model at the requested opset computing the node's outputs.
        input_index: For each graph input of ``model``, the index of the node input it stands for.
        output_index: For each graph output of ``model``, the index of the node output it computes.
        written_for: The opset the schema wrote the body for.
        converted: Whether ``onnx.version_converter`` had to convert it.
    """

    model: onnx.ModelProto
    input_index: list[int]
    output_index: list[int]
    written_for: int
    converted: bool


def schema_at(domain: str, op_type: str, opset: int) -> Any:
    """The schema serving ``opset``, or None. Typed Any: onnx's stubs lack the function API."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _pick(versions: Iterable[int], opset: int) -> int | None:
    """The newest body version not newer than ``opset``, else the oldest one."""
    ordered = sorted(versions)
    if not ordered:
        return None
    older = [v for v in ordered if v <= opset]
    return older[-1] if older else ordered[0]


def _graph_ops(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    ops: set[str] = set()
    for n in nodes:
        if n.domain in _ONNX_DOMAINS:
            ops.add(n.op_type)
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                ops |= _graph_ops(g.node)
    return ops


def static_body_operators(op_type: str, opset: int) -> tuple[int, set[str]] | None:
    """The opset a static function body of ``op_type`` at ``opset`` was written for, and its ops.

    Returns:
        None when the schema serving ``opset`` has no (context-independent) function body.
    """
    schema = schema_at("", op_type, opset)
    if schema is None or not schema.has_function:
        return None
    version = _pick(schema.function_opset_versions, opset)
    if version is None:
        return None
    function = onnx.FunctionProto()
    function.ParseFromString(schema.get_function_with_opset_version(version))
    return version, _graph_ops(function.node)


def _input_type(value: ir.Value | None) -> onnx.TypeProto:
    if value is None or value.type is None:
        return onnx.TypeProto()
    return ir.to_proto(value).type


def _raw_body(node: ir.Node, opset: int) -> tuple[onnx.FunctionProto, Any] | None:
    schema = schema_at(node.domain, node.op_type, opset)
    if schema is None:
        return None
    data = b""
    if schema.has_function:
        version = _pick(schema.function_opset_versions, opset)
        if version is not None:
            data = schema.get_function_with_opset_version(version)
    if not data and schema.has_context_dependent_function:
        version = _pick(schema.context_dependent_function_opset_versions, opset)
        if version is not None:
            node_proto = ir.to_proto(node)
            types = [_input_type(v).SerializeToString() for v in node.inputs]
            try:
                data = schema.get_context_dependent_function_with_opset_version(
                    version, node_proto.SerializeToString(), types
                )
            except Exception:  # the builder refuses this node (missing types, bad attributes)
                data = b""
    if not data:
        return None
    function = onnx.FunctionProto()
    function.ParseFromString(data)
    return function, schema


def _resolve_refs(
    nodes: Iterable[onnx.NodeProto], given: Mapping[str, onnx.AttributeProto]
) -> list[onnx.NodeProto]:
    """Copies of ``nodes`` with ``ref_attr_name`` attributes replaced by the given ones."""
    out = []
    for n in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        del copy.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:
                source = given.get(a.ref_attr_name)
                if source is None:
                    continue  # an unset optional attribute: ONNX drops the reference
                resolved = onnx.AttributeProto()
                resolved.CopyFrom(source)
                resolved.name = a.name
                copy.attribute.append(resolved)
                continue
            attr = onnx.AttributeProto()
            attr.CopyFrom(a)
            if attr.type == onnx.AttributeProto.GRAPH:
                _resolve_graph(attr.g, given)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _resolve_graph(g, given)
            copy.attribute.append(attr)
        out.append(copy)
    return out


def _resolve_graph(graph: onnx.GraphProto, given: Mapping[str, onnx.AttributeProto]) -> None:
    nodes = _resolve_refs(graph.node, given)
    del graph.node[:]
    graph.node.extend(nodes)


def _rename_inputs(nodes: Iterable[onnx.NodeProto], renames: Mapping[str, str]) -> None:
    """Renames value references in place, inside subgraphs too (absent inputs become "")."""
    for n in nodes:
        for i, name in enumerate(n.input):
            if name in renames:
                n.input[i] = renames[name]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(a.g.node, renames)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rename_inputs(g.node, renames)


def _reads(node: onnx.NodeProto) -> set[str]:
    """Every value name a node reads, including those its subgraphs read from outside."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            for inner in g.node:
                names |= _reads(inner)
    return names


def _prune(nodes: list[onnx.NodeProto], wanted: Iterable[str]) -> list[onnx.NodeProto]:
    """The nodes some wanted value depends on, in their original order."""
    needed = set(wanted)
    kept: list[onnx.NodeProto] = []
    for n in reversed(nodes):
        if any(o and o in needed for o in n.output):
            kept.append(n)
            needed |= _reads(n)
    return kept[::-1]


def _default_ops(graph: onnx.GraphProto) -> Iterable[tuple[int, onnx.NodeProto]]:
    for k, n in enumerate(graph.node):
        if n.domain in _ONNX_DOMAINS:
            yield k, n


def _changed_ops(graph: onnx.GraphProto, written_for: int, opset: int) -> list[tuple[int, str]]:
    """Body nodes whose operator has another schema version at ``opset`` than at ``written_for``."""
    changed = []
    for k, n in _default_ops(graph):
        a = schema_at("", n.op_type, written_for)
        b = schema_at("", n.op_type, opset)
        if a is None or b is None or a.since_version != b.since_version:
            changed.append((k, n.op_type))
        for attr in n.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            if any(_changed_ops(g, written_for, opset) for g in subs):
                changed.append((k, n.op_type))
    return changed


def _version_label(op_type: str, opset: int) -> str:
    schema = schema_at("", op_type, opset)
    if schema is None:
        return f"does not exist at opset {opset}"
    return f"is {op_type}-{schema.since_version} at opset {opset}"


def _pin_down(model: onnx.ModelProto, written_for: int, opset: int, err: Exception) -> str:
    """Names the first body node that the converter cannot convert on its own."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    infos = {
        vi.name: vi
        for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
    }
    for k, op_type in _changed_ops(model.graph, written_for, opset):
        n = model.graph.node[k]
        inputs = [infos.get(i) or onnx.helper.make_empty_tensor_value_info(i) for i in n.input if i]
        outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in n.output if o]
        single = onnx.helper.make_model(
            onnx.helper.make_graph([n], "one", inputs, outputs),
            opset_imports=list(model.opset_import),
            ir_version=model.ir_version,
        )
        try:
            onnx.version_converter.convert_version(single, opset)
        except Exception as inner:
            reason = str(inner).strip().splitlines()[-1] if str(inner).strip() else repr(inner)
            label = f"body node {k} ({op_type}" + (f" {n.name!r})" if n.name else ")")
            return (
                f"{label}: {op_type} {_version_label(op_type, written_for)} and "
                f"{_version_label(op_type, opset)}; onnx.version_converter: {reason}"
            )
    first = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
    return f"onnx.version_converter: {first}"


def function_body(node: ir.Node, opset_imports: Mapping[str, int]) -> Body | None:
    """The function body of ``node``'s operator, ready to inline at the model's opsets.

    Args:
        node: A node of an ONNX-domain operator; its inputs should carry types (context-dependent
            bodies depend on them).
        opset_imports: The model's opset imports.

    Returns:
        The body, or None when the operator's schema at the model's opset has no function body.

    Raises:
        BodyConversionError: If the body was written for another opset and cannot be converted.
    """
    if node.domain not in _ONNX_DOMAINS:
        return None
    opset = opset_imports.get("", opset_imports.get("ai.onnx"))
    if opset is None:
        return None
    found = _raw_body(node, opset)
    if found is None:
        return None
    function, schema = found
    written_for = next(
        (o.version for o in function.opset_import if o.domain in _ONNX_DOMAINS), opset
    )

    given: dict[str, onnx.AttributeProto] = {
        name: a.default_value
        for name, a in schema.attributes.items()
        if a.default_value.type != onnx.AttributeProto.UNDEFINED
    }
    given.update({name: ir.to_proto(attr) for name, attr in node.attributes.items()})
    nodes = _resolve_refs(function.node, given)

    renames: dict[str, str] = {}
    inputs: list[onnx.ValueInfoProto] = []
    input_index: list[int] = []
    for i, formal in enumerate(function.input):
        value = node.inputs[i] if i < len(node.inputs) else None
        if value is None:
            renames[formal] = ""
            continue
        inputs.append(onnx.helper.make_value_info(formal, _input_type(value)))
        input_index.append(i)
    _rename_inputs(nodes, renames)

    outputs: list[onnx.ValueInfoProto] = []
    output_index: list[int] = []
    for i, formal in enumerate(function.output):
        value = node.outputs[i] if i < len(node.outputs) else None
        if value is None or not value.name or not (value.uses() or value.is_graph_output()):
            continue
        outputs.append(onnx.helper.make_empty_tensor_value_info(formal))
        output_index.append(i)
    nodes = _prune(nodes, [o.name for o in outputs])

    imports = [onnx.helper.make_opsetid("", written_for)]
    imports += [
        onnx.helper.make_opsetid(o.domain, o.version)
        for o in function.opset_import
        if o.domain not in _ONNX_DOMAINS
    ]
    model = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, f"{node.op_type}_body", inputs, outputs),
        opset_imports=imports,
        ir_version=10,
    )
    converted = False
    if written_for != opset:
        if _changed_ops(model.graph, written_for, opset):
            try:
                model = onnx.version_converter.convert_version(model, opset)
            except Exception as err:
                raise BodyConversionError(
                    written_for, opset, _pin_down(model, written_for, opset, err)
                ) from err
            converted = True
        else:
            del model.opset_import[:]
            model.opset_import.extend([onnx.helper.make_opsetid("", opset), *imports[1:]])
    return Body(model, input_index, output_index, written_for, converted)
