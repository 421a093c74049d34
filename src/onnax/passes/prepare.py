"""Bringing a user's model into the form every transform starts from.

:class:`Prepare` is a sequence of small passes, each a step that can be read, reused and
reordered on its own:

1. :class:`CloneSource` refuses what is not a model or has no outputs, and clones the rest node
   by node (:func:`onnax.passes.clone.clone_model`), so nothing a transform or shape inference
   does to nodes, values, shapes or tensor names can reach the caller's model. The tensor
   *data* is not copied: the copy's tensor objects are views of the caller's, and no transform
   ever writes into data (derivative models only add new tensors).
2. :class:`TypeInterface` infers the types of untyped graph inputs and outputs (the checker
   wants them).
3. :class:`DefaultDomainImport` names the default domain ``""``.
4. :class:`CheckModel` runs onnx.checker's full check.
5. :class:`~onnax.passes.upgrade.UpgradeOpset` converts an old opset to a supported one.
6. :class:`InlineFunctions` inlines model-local functions.
7. :class:`~onnax.passes.inline_if.SimplifyControlFlow` inlines Ifs on constant conditions.
8. :class:`InferShapes` runs shape inference (:func:`onnax.core.inference.infer_shapes`).

Steps 2 to 8 work in place on the copy. onnx.checker and onnx.version_converter, which only work
on protobuf, see a *skeleton* of the model (:mod:`onnax.core.skeleton`) in which every large
initializer is demoted to a typed graph input: a transform's time and memory stay independent
of the size of the weights.
"""

from __future__ import annotations

import logging
import re

import onnx
import onnx.shape_inference
import onnx_ir as ir
import onnx_ir.passes as passes
import onnx_ir.passes.common as common

from onnax.core.functions import schema_at
from onnax.core.inference import RANK_GUESSED, infer_shapes
from onnax.core.opsets import DEFAULT_OPSET, MIN_OPSET
from onnax.core.produced import unedited
from onnax.core.registry import jvp_rules, lowerings
from onnax.core.skeleton import skeleton_proto
from onnax.core.traverse import all_nodes
from onnax.errors import InvalidModelError
from onnax.passes.clone import clone_model
from onnax.passes.inline_if import SimplifyControlFlow
from onnax.passes.steps import Steps
from onnax.passes.upgrade import UpgradeOpset
from onnax.rules import collect

# infer_shapes and RANK_GUESSED live in onnax.core.inference; they are re-exported here for
# the modules and tests that import them from their old place.
__all__ = [
    "MIN_OPSET",
    "RANK_GUESSED",
    "CheckModel",
    "CloneSource",
    "DefaultDomainImport",
    "InferShapes",
    "InlineFunctions",
    "Prepare",
    "TypeInterface",
    "infer_shapes",
    "prepare",
]

logger = logging.getLogger(__name__)


def prepare(model: ir.Model, transform: str) -> ir.Model:
    """Returns an independent, checked, inlined, sorted and shape-inferred copy of ``model``.

    The copy's tensors are views of the data of ``model``'s (data is never written to).

    Args:
        model: The source model; it is not modified.
        transform: The name of the transform, for error messages.

    Raises:
        TypeError: If ``model`` is not an ``onnx_ir.Model``.
        InvalidModelError: If the model fails onnx.checker or its opset cannot be served.
    """
    return Prepare(transform)(model).model


class Prepare(Steps):
    """The steps of :func:`prepare` as one functional pass (the source is not modified).

    A source that is a transform's result, unedited since (:func:`onnax.core.produced.unedited`),
    skips :class:`CheckModel`: it passed the check as it was returned, and the check would
    find what it found then (on a chain such as ``jvp(grad(m))``, an eighth of the second
    transform went into checking the first one's result again).

    Args:
        transform: The name of the transform, for error messages.
    """

    def __init__(self, transform: str) -> None:
        super().__init__(
            CloneSource(transform),
            TypeInterface(),
            DefaultDomainImport(),
            CheckModel(transform),
            UpgradeOpset(transform),
            InlineFunctions(),
            SimplifyControlFlow(),
            InferShapes(),
        )

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the steps on ``model``, without the check if it is an unedited result."""
        if not (isinstance(model, ir.Model) and unedited(model)):
            return super().call(model)
        unchecked = [step for step in self.passes if not isinstance(step, CheckModel)]
        return Steps(*unchecked)(model)


class CloneSource(passes.FunctionalPass):
    """Refuses a source that no transform could serve, and returns an independent copy.

    Args:
        transform: The name of the transform, for error messages.
    """

    def __init__(self, transform: str) -> None:
        self.transform = transform

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        transform = self.transform
        if not isinstance(model, ir.Model):
            raise TypeError(
                f"{transform}: expected an onnx_ir.Model, got {type(model).__name__}. Load a "
                "file with onnx_ir.load(path) or convert a proto with onnx_ir.from_proto(proto)."
            )
        if len(model.graph.outputs) == 0:
            # onnx.checker accepts such a graph, but onnxruntime refuses to load it (and every
            # node of it is dead), so no transform of it could run.
            raise InvalidModelError(
                f"{transform}: the graph {model.graph.name!r} has no outputs, expected at least "
                "one: onnxruntime cannot load such a model and nothing in it can be "
                "differentiated or batched. Add the values you need to model.graph.outputs."
            )
        return passes.PassResult(clone_model(model), modified=False)


class TypeInterface(passes.InPlacePass):
    """Infers shapes when a graph input or output has no type: the checker wants them all."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        graph = model.graph
        if not any(v.type is None for v in (*graph.inputs, *graph.outputs)):
            return passes.PassResult(model, modified=False)
        infer_shapes(model)
        return passes.PassResult(model, modified=True)


class DefaultDomainImport(passes.InPlacePass):
    """Gives the model the default-domain import under its canonical name ``""``.

    Must run before the check: a model of other domains only (ai.onnx.ml, say) gets one, at a
    version every supported runtime has, as the derivative nodes need it. A model importing
    the default domain as ``"ai.onnx"`` gets it renamed, nodes included, as every pass reads
    ``opset_imports[""]`` and emits nodes in the ``""`` domain.
    """

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        imports = model.opset_imports
        if "" in imports:
            return passes.PassResult(model, modified=False)
        imports[""] = imports.pop("ai.onnx", DEFAULT_OPSET)
        for node in model.graph.all_nodes():
            if node.domain == "ai.onnx":
                node.domain = ""
        return passes.PassResult(model, modified=True)


class CheckModel(passes.InPlacePass):
    """Runs onnx.checker's full check on the model's skeleton; changes nothing.

    Args:
        transform: The name of the transform, for error messages.
    """

    def __init__(self, transform: str) -> None:
        self.transform = transform

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        proto, _ = skeleton_proto(model)
        _hide_schemaless(proto, model)
        _check(proto, self.transform)
        return passes.PassResult(model, modified=False)


_UNCHECKED = "onnax.unchecked"
"""The domain that default-domain nodes without an ONNX schema move to, in the checker's copy."""


def _hide_schemaless(proto: onnx.ModelProto, model: ir.Model) -> None:
    """Moves default-domain nodes without an ONNX schema, but with onnax rules, out of the way.

    In the checker's copy only (``proto``, serialised from ``model``): nodes that onnx has no
    schema for at the model's opset but onnax has a lowering or rule for move into a private
    domain.

    onnxruntime registers some of its operators in the default domain and writes them into the
    models it saves (SimplifiedLayerNormalization; LayerNormalization before opset 17): onnx's
    checker refuses them, yet the expansion pass lowers them to ONNX operators. As a custom
    domain's nodes, the checker passes over them and checks everything else.
    """
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    collect()
    # The operators are found on the model, not the proto: reading a proto node's fields from
    # Python costs a few microseconds each (the walk over the proto was nearly as long as the
    # check itself), and the proto is walked only when one of them is to be moved, which in
    # most models none is.
    op_types = {n.op_type for n in all_nodes(model.graph) if n.domain in ("", "ai.onnx")}
    hidden = {
        op_type
        for op_type in op_types
        if schema_at("", op_type, opset) is None
        and (lowerings.lookup("", op_type, opset) or jvp_rules.lookup("", op_type, opset))
        is not None
    }
    if not hidden:
        return

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)
            if node.domain in ("", "ai.onnx") and node.op_type in hidden:
                node.domain = _UNCHECKED

    visit(proto.graph)
    proto.opset_import.append(onnx.helper.make_opsetid(_UNCHECKED, 1))


class InlineFunctions(passes.InPlacePass):
    """Inlines the model-local functions (``onnx_ir``'s ``InlinePass``), when there are any."""

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        if not model.functions:
            return passes.PassResult(model, modified=False)
        return passes.PassResult(model, modified=common.InlinePass()(model).modified)


class InferShapes(passes.InPlacePass):
    """Sorts the graph and runs shape inference (:func:`onnax.core.inference.infer_shapes`).

    Args:
        complete: Whether to complete onnx_shape_inference's answers.
    """

    def __init__(self, *, complete: bool = True) -> None:
        self.complete = complete

    def call(self, model: ir.Model) -> passes.PassResult:
        """Runs the step on ``model``."""
        # Recorded: the transform infers again after adding its nodes, passing over these.
        infer_shapes(model, complete=self.complete, record=True)
        return passes.PassResult(model, modified=True)


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
