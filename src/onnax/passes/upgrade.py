"""Bringing a model of an old opset up to one the rules serve (a step of :mod:`prepare`).

``onnx.version_converter`` works on protobuf, so it converts the model's skeleton
(:mod:`onnax.core.skeleton`) and the weights are put back afterwards: the conversion costs what
the graph costs, not what its data does. When it fails, the step from one opset to the next
that fails and the first node that fails it on its own are named in the error.
"""

from __future__ import annotations

import onnx
import onnx.helper
import onnx.shape_inference
import onnx.version_converter
import onnx_ir as ir
import onnx_ir.passes as passes

from onnax.core.opsets import MAX_OPSET, MIN_OPSET
from onnax.core.skeleton import restore_weights, skeleton_proto
from onnax.errors import InvalidModelError
from onnax.passes.scan8 import unbatch_scan8

__all__ = ["UPGRADE_OPSET", "UpgradeOpset"]


class UpgradeOpset(passes.InPlacePass):
    """Serves the model's default-domain opset, converting an old one.

    An opset newer than the installed onnx knows is refused; one older than
    :data:`~onnax.core.opsets.MIN_OPSET` is converted (to :data:`UPGRADE_OPSET` if it can).
    In place: a converted model's content replaces the model's own (the converter returns a
    new proto), so the pass fits in a sequence of in-place steps whether it converts or not.

    Args:
        transform: The name of the transform, for error messages.
    """

    def __init__(self, transform: str) -> None:
        self.transform = transform

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        opset = _opset(model, self.transform)
        if opset >= MIN_OPSET:
            return passes.PassResult(model, modified=False)
        proto, appended = skeleton_proto(model)
        _adopt(model, _upgrade(model, proto, appended, opset, self.transform))
        return passes.PassResult(model, modified=True)


def _adopt(model: ir.Model, converted: ir.Model) -> None:
    """Makes ``model`` hold the graph, functions and metadata of ``converted``."""
    model.graph = converted.graph
    model.ir_version = converted.ir_version
    model.producer_name = converted.producer_name
    model.producer_version = converted.producer_version
    model.domain = converted.domain
    model.model_version = converted.model_version
    model.doc_string = converted.doc_string
    model.device_configurations = converted.device_configurations
    model.functions.clear()
    model.functions.update(converted.functions)
    model.metadata_props.clear()
    model.metadata_props.update(converted.metadata_props)


UPGRADE_OPSET = 17
"""The opset models older than MIN_OPSET are converted to. Not MIN_OPSET itself: from opset 16 on
the rules can accumulate with ScatterElements/ScatterND ``reduction="add"`` (MaxPool's and
Gather's transposes), which before that need a one-hot the size of input x output and do not fit
in memory on an image model. Converting to MIN_OPSET is the fallback when this fails."""


def _opset(model: ir.Model, transform: str) -> int:
    opset = model.opset_imports[""]
    if opset > MAX_OPSET:
        raise InvalidModelError(
            f"{transform}: the model uses default-domain opset {opset}, newer than the supported "
            f"interval [{MIN_OPSET}, {MAX_OPSET}] of the installed onnx. Upgrade the onnx package."
        )
    return opset


def _convert(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    return onnx.version_converter.convert_version(proto, target)


def _failing_step(proto: onnx.ModelProto, opset: int) -> tuple[int, onnx.ModelProto]:
    """The first opset step ``k -> k + 1`` that fails, and the model converted up to ``k``."""
    current = proto
    for target in range(opset + 1, MIN_OPSET + 1):
        try:
            current = _convert(current, target)
        except Exception:
            return target, current
    return MIN_OPSET, current


def _failing_node(proto: onnx.ModelProto, target: int) -> onnx.NodeProto | None:
    """The first node that fails to convert to ``target`` on its own (typed from inference)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:
        inferred = proto
    graph = inferred.graph
    types = {v.name: v for v in (*graph.input, *graph.value_info, *graph.output)}
    small = {t.name: t for t in graph.initializer}
    for node in graph.node:
        inputs = [types[n] for n in node.input if n and n in types and n not in small]
        untyped = [
            onnx.helper.make_empty_tensor_value_info(n)
            for n in node.input
            if n and n not in types and n not in small
        ]
        outputs = [types.get(n) or onnx.helper.make_empty_tensor_value_info(n) for n in node.output]
        single = onnx.helper.make_model(
            onnx.helper.make_graph(
                [node],
                "single",
                inputs + untyped,
                outputs,
                [small[n] for n in node.input if n in small],
            ),
            opset_imports=list(inferred.opset_import),
            ir_version=inferred.ir_version,
        )
        try:
            _convert(single, target)
        except Exception:
            return node
    return None


def _upgrade(
    model: ir.Model, proto: onnx.ModelProto, appended: list[str], opset: int, transform: str
) -> ir.Model:
    try:
        try:
            converted = _convert(proto, UPGRADE_OPSET)
        except Exception:
            converted = _convert(proto, MIN_OPSET)
    except Exception as err:
        target, before = _failing_step(proto, opset)
        node = _failing_node(before, target)
        where = (
            f"node {node.name or '<unnamed>'!r} ({node.domain or 'ai.onnx'}::{node.op_type}, "
            f"outputs {list(node.output)}) cannot be converted"
            if node is not None
            else "the conversion fails"
        )
        raise InvalidModelError(
            f"{transform}: the model uses opset {opset}, older than the oldest supported "
            f"{MIN_OPSET}; onnx.version_converter stops at the step from opset {target - 1} to "
            f"{target}: {where}: {str(err).strip().splitlines()[0] if str(err) else type(err).__name__}. "
            f"Replace that operator or convert the model to opset {MIN_OPSET} or newer before "
            "transforming it."
        ) from err
    try:
        unbatch_scan8(proto, converted)
    except ValueError as err:
        raise InvalidModelError(f"{transform}: {err}") from err
    result = ir.from_proto(converted)
    restore_weights(model, result, appended)
    _keep_resize_semantics(result)
    return result


def _keep_resize_semantics(model: ir.Model) -> None:
    """Restores the sampling of Upsample and Resize-10 after conversion.

    onnx.version_converter turns them into Resize-11+ without setting
    ``coordinate_transformation_mode``, whose default there is ``half_pixel``: the converted
    model samples at other points (linear upsampling by 2 of [0, 1, 2] gives 0, 0.25, 0.75...
    instead of 0, 0.5, 1...). Before opset 11 the coordinates were ``asymmetric`` and nearest
    neighbours ``floor``; every Resize of a converted model comes from there.
    """
    for node in model.graph.all_nodes():
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx"):
            continue
        if "coordinate_transformation_mode" not in node.attributes:
            node.attributes["coordinate_transformation_mode"] = ir.AttrString(
                "coordinate_transformation_mode", "asymmetric"
            )
        mode = node.attributes.get_string("mode", "nearest")
        if mode == "nearest" and "nearest_mode" not in node.attributes:
            node.attributes["nearest_mode"] = ir.AttrString("nearest_mode", "floor")
