"""Bringing a user's model into the form every transform starts from.

The source model is cloned node by node (:func:`onnax.passes.clone.clone_model`), so nothing a
transform or shape inference does to nodes, values, shapes or tensor names can reach the caller's
model. The tensor *data* is not copied: the copy's tensor objects are views of the caller's, and no
transform ever writes into data (derivative models only add new tensors). That keeps a transform's
time and memory independent of the size of the weights: onnx.checker and onnx.version_converter,
which only work on protobuf, see a *skeleton* of the model in which every large initializer is
demoted to a typed graph input.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import onnx
import onnx.shape_inference
import onnx.version_converter
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnx_shape_inference import OpUsageError, ShapeInferenceError, infer_symbolic_shapes

from onnax.core.opsets import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from onnax.errors import InvalidModelError
from onnax.passes.broadcast_dims import forget_guessed_broadcasts
from onnax.passes.clone import clone_model
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
    declared = _declared_io_shapes(model)
    model.graph.sort()
    _infer_past_guesses(model)
    if complete:
        complete_shapes(model, _infer_past_guesses, _guessed_ranks)
    guessed = False
    for graph in (model.graph, *model.graph.subgraphs()):
        guessed = _forget_guessed_ranks(graph) or guessed
    model.graph.meta[RANK_GUESSED] = bool(model.graph.meta.get(RANK_GUESSED)) or guessed
    forget_guessed_broadcasts(model)
    _keep_declared_dims(declared)


RANK_GUESSED = "onnax.rank_guessed"
"""``graph.meta`` key: whether inference has met a guessed rank in this model (sticky). The
values computed from one can be recognised in the model inference saw, not in what the
transforms make of it (vmap batches the Squeeze away), and ``Shape`` of such a value keeps a
guessed length: so a transform's result gets inferred shapes only when this is False."""


_NOT_INFERRED = "onnax.not_inferred"
"""A domain without inference rules: a node moved there is passed over by inference."""


def _infer_past_guesses(model: ir.Model) -> None:
    """Symbolic shape inference that passes over the nodes whose rule refuses its own guesses.

    The model passed onnx.checker's full check before, so a rule that raises does so on a
    shape inference guessed earlier (a ``Squeeze`` without axes keeps a symbolic dimension,
    then ``Einsum "ij->ji"`` finds rank 3 for its 2 indices). Such a node keeps the outputs it
    has (unknown shapes), as the rules work without, and inference goes on after it.
    """
    passed_over: list[tuple[ir.Node, str]] = []
    try:
        while True:
            try:
                infer_symbolic_shapes(model, warn_on_missing=False)
                return
            except (OpUsageError, ShapeInferenceError) as err:
                node = _refusing_node(model, err)
                if node is None or node.domain == _NOT_INFERRED:
                    raise
                passed_over.append((node, node.domain))
                node.domain = _NOT_INFERRED
    finally:
        for node, domain in passed_over:
            node.domain = domain


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
    inlined: list[tuple[ir.Value, ir.TensorProtocol]] = []
    for name, value in list(graph.initializers.items()):
        if not _is_weight(value):
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor):
                # The checker resolves an external reference against the working directory
                # (a proto has no folder); the skeleton carries the few small ones inline.
                inlined.append((value, tensor))
                value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
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
        for value, tensor in inlined:
            value.const_value = tensor
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
    """Runs onnx.checker on the model's skeleton, with strict shape and type inference.

    The full check catches nodes that are well formed but meaningless (``Transpose`` with
    ``perm=[0, 0]``), which the plain check lets through to an invalid result. Errors that
    onnx raises inside the function body of an operator it expands (MeanVarianceNormalization
    13: ``Constant(value_ints = @axes)`` without the attribute) are onnx's own, not the model's:
    those, and the untyped inputs they leave downstream, do not refuse the model.
    """
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.checker.ValidationError as err:
        raise _invalid(transform, str(err).strip().splitlines()[0]) from err
    except onnx.shape_inference.InferenceError as err:
        genuine = _model_errors(str(err))
        if genuine:
            raise _invalid(transform, genuine[0]) from err
        logger.debug("onnx's full check fails inside function bodies only: %s", err)


def _model_errors(message: str) -> list[str]:
    """The entries of a strict-inference error that are about the model's own nodes."""
    body = message.strip().removeprefix("[ShapeInferenceError] Inference error(s): ")
    entries = [e.strip() for e in re.split(r"\n+(?=\(op_type:)", body) if e.strip()]
    # An entry naming a second operator reports an error inside the first one's function body.
    return [
        e
        for e in entries
        if e.count("(op_type:") == 1 and "expected to have type but instead is null" not in e
    ]


def _invalid(transform: str, reason: str) -> InvalidModelError:
    return InvalidModelError(
        f"{transform}: the model fails onnx.checker: {reason} Fix the model first; "
        "onnx.checker.check_model(onnx_ir.to_proto(model), full_check=True) reproduces it."
    )


def _default_domain_import(model: ir.Model) -> None:
    """Gives the model the default-domain import under its canonical name ``""``.

    Must run before the check: a model of other domains only (ai.onnx.ml, say) gets one, at a
    version every supported runtime has, as the derivative nodes need it. A model importing
    the default domain as ``"ai.onnx"`` gets it renamed, nodes included, as every pass reads
    ``opset_imports[""]`` and emits nodes in the ``""`` domain.
    """
    imports = model.opset_imports
    if "" in imports:
        return
    imports[""] = imports.pop("ai.onnx", DEFAULT_OPSET)
    for node in model.graph.all_nodes():
        if node.domain == "ai.onnx":
            node.domain = ""


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


def prepare(model: ir.Model, transform: str) -> ir.Model:
    """Returns an independent, checked, inlined, sorted and shape-inferred copy of ``model``.

    The copy's tensors are views of the data of ``model``'s (data is never written to).

    Raises:
        InvalidModelError: If the model fails onnx.checker or its opset cannot be served.
    """
    if not isinstance(model, ir.Model):
        raise TypeError(
            f"{transform}: expected an onnx_ir.Model, got {type(model).__name__}. "
            "Load a file with onnx_ir.load(path) or convert a proto with onnx_ir.from_proto(proto)."
        )
    if len(model.graph.outputs) == 0:
        # onnx.checker accepts such a graph, but onnxruntime refuses to load it (and every
        # node of it is dead), so no transform of it could run.
        raise InvalidModelError(
            f"{transform}: the graph {model.graph.name!r} has no outputs, expected at least one: "
            "onnxruntime cannot load such a model and nothing in it can be differentiated or "
            "batched. Add the values you need to model.graph.outputs."
        )
    copy = clone_model(model)
    if _has_untyped_io(copy):
        infer_shapes(copy)  # the checker wants typed inputs and outputs
    _default_domain_import(copy)
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
