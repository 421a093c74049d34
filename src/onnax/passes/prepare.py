"""Bringing a user's model into the form every transform starts from.

The source model is cloned node by node (``onnx_ir.Model.clone``), so nothing a transform or shape
inference does to nodes, values or shapes can reach the caller's model. Tensors are not copied:
the clone shares the caller's weight tensors, which no transform ever writes into (derivative
models only add new tensors). That keeps a transform's time and memory independent of the size
of the weights: onnx.checker and onnx.version_converter, which only work on protobuf, see a
*skeleton* of the model in which every large initializer is demoted to a typed graph input.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import onnx
import onnx.shape_inference
import onnx.version_converter
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnx_shape_inference import infer_symbolic_shapes

from onnax.core.opsets import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from onnax.errors import InvalidModelError
from onnax.passes.inline_if import simplify_control_flow
from onnax.passes.scan8 import unbatch_scan8
from onnax.passes.shape_fill import complete_shapes

__all__ = ["MIN_OPSET", "RANK_GUESSED", "infer_shapes", "prepare"]

logger = logging.getLogger(__name__)

_SKELETON_MAX_ELEMENTS = 1024
"""Initializers up to this size stay in the skeleton: shapes, axes, scales and other small
constants that the checker or a version adapter may read. Larger ones are weights."""

UPGRADE_OPSET = 17
"""The opset models older than MIN_OPSET are converted to. Not MIN_OPSET itself: from opset 16 on
the rules can accumulate with ScatterElements/ScatterND ``reduction="add"`` (MaxPool's and
Gather's transposes), which before that need a one-hot the size of input x output and do not fit
in memory on an image model. Converting to MIN_OPSET is the fallback when this fails."""


def infer_shapes(model: ir.Model, *, complete: bool = True) -> None:
    """Runs symbolic shape inference in place (sorting first, as inference walks in list order).

    onnx_shape_inference's answers are completed by :func:`~onnax.passes.shape_fill.complete_shapes`:
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
    """
    model.graph.sort()
    _infer(model)
    if complete:
        complete_shapes(model, _infer, _guessed_ranks)
    guessed = False
    for graph in (model.graph, *model.graph.subgraphs()):
        guessed = _forget_guessed_ranks(graph) or guessed
    model.graph.meta[RANK_GUESSED] = bool(model.graph.meta.get(RANK_GUESSED)) or guessed


RANK_GUESSED = "onnax.rank_guessed"
"""``graph.meta`` key: whether inference has met a guessed rank in this model (sticky). The
values computed from one can be recognised in the model inference saw, not in what the
transforms make of it (vmap batches the Squeeze away), and ``Shape`` of such a value keeps a
guessed length: so a transform's result gets inferred shapes only when this is False."""


def _infer(model: ir.Model) -> None:
    infer_symbolic_shapes(model, warn_on_missing=False)


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
    for node in graph:
        if node.op_type in _RANK_FREE:
            continue
        if _guesses_rank(node) or any(v in guessed for v in _shape_inputs(node) if v is not None):
            guessed.update(node.outputs)
    return guessed


def _forget_guessed_ranks(graph: ir.Graph) -> bool:
    """Clears the shapes resting on a guessed rank; True if there were any."""
    guessed = _guessed_ranks(graph)
    for out in guessed:
        if not out.is_graph_output():
            out.shape = None
    return bool(guessed)


def _has_untyped_io(model: ir.Model) -> bool:
    return any(v.type is None for v in (*model.graph.inputs, *model.graph.outputs))


def _is_weight(value: ir.Value) -> bool:
    tensor = value.const_value
    return tensor is not None and tensor.size > _SKELETON_MAX_ELEMENTS


def _skeleton_proto(model: ir.Model) -> tuple[onnx.ModelProto, list[str]]:
    """The proto of ``model`` with every large initializer demoted to a typed graph input.

    ``model`` is changed only while serialising and restored before returning (it must be the
    transform's own copy all the same). Returns the proto and the demoted names that were
    initializers only (not graph inputs), in the order they were appended to the graph inputs.
    """
    graph = model.graph
    demoted: list[tuple[ir.Value, ir.TensorProtocol, bool]] = []
    for name, value in list(graph.initializers.items()):
        if not _is_weight(value):
            continue
        tensor = value.const_value
        assert tensor is not None
        graph.initializers.pop(name)
        value.const_value = None
        if value.type is None:
            value.type = ir.TensorType(tensor.dtype)
        if value.shape is None:
            value.shape = ir.Shape(tensor.shape.numpy())
        appended = not value.is_graph_input()
        if appended:
            graph.inputs.append(value)
        demoted.append((value, tensor, appended))
    try:
        proto = ir.to_proto(model)
    finally:
        for value, tensor, appended in demoted:
            if appended:
                graph.inputs.remove(value)
            value.const_value = tensor
            graph.register_initializer(value)
    return proto, [str(v.name) for v, _, appended in demoted if appended]


def _restore_weights(source: ir.Model, converted: ir.Model, appended: list[str]) -> None:
    """Turns the demoted inputs of ``converted`` back into initializers sharing the tensors."""
    graph = converted.graph
    inputs = {v.name: v for v in graph.inputs}
    for name, original in source.graph.initializers.items():
        if not _is_weight(original):
            continue
        value = inputs[name]
        if name in appended:
            graph.inputs.remove(value)
        value.const_value = original.const_value
        graph.register_initializer(value)


def _check(proto: onnx.ModelProto, transform: str) -> None:
    """Runs onnx.checker on the model's skeleton."""
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        raise InvalidModelError(
            f"{transform}: the model fails onnx.checker: {str(err).strip().splitlines()[0]} "
            "Fix the model first; onnx.checker.check_model(onnx_ir.to_proto(model)) reproduces it."
        ) from err


def _opset(model: ir.Model, transform: str) -> int:
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if opset is None:
        # A model of other domains only (ai.onnx.ml, say): derivative nodes still need the
        # default domain, at a version every supported runtime has.
        opset = DEFAULT_OPSET
        model.opset_imports[""] = opset
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
    _restore_weights(model, result, appended)
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


def _clone(model: ir.Model) -> ir.Model:
    """A structural copy sharing the weight tensors.

    onnx_ir's cloner cannot copy a subgraph whose output is a value captured from the enclosing
    graph (``then_branch = () => (X) {}``); such models are copied through their serialised form
    instead, which copies the weights too but is exact.
    """
    try:
        return model.clone()
    except RuntimeError:
        return ir.from_proto(ir.to_proto(model))


def prepare(model: ir.Model, transform: str) -> ir.Model:
    """Returns an independent, checked, inlined, sorted and shape-inferred copy of ``model``.

    The copy shares the weight tensors of ``model`` (tensors are never written to).

    Raises:
        InvalidModelError: If the model fails onnx.checker or its opset cannot be served.
    """
    if not isinstance(model, ir.Model):
        raise TypeError(
            f"{transform}: expected an onnx_ir.Model, got {type(model).__name__}. "
            "Load a file with onnx_ir.load(path) or convert a proto with onnx_ir.from_proto(proto)."
        )
    copy = _clone(model)
    if _has_untyped_io(copy):
        infer_shapes(copy)  # the checker wants typed inputs and outputs
    proto, appended = _skeleton_proto(copy)
    _check(proto, transform)
    opset = _opset(copy, transform)
    if opset < MIN_OPSET:
        copy = _upgrade(copy, proto, appended, opset, transform)
    if copy.functions:
        common.InlinePass()(copy)
    simplify_control_flow(copy)
    infer_shapes(copy)
    return copy
