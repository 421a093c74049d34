"""Bringing a user's model into the form every transform starts from.

The source model is copied through its serialised form, so nothing a transform or shape inference
does (they write into tensors and shapes) can reach the caller's model.
"""

from __future__ import annotations

import logging

import onnx
import onnx.version_converter
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnx_shape_inference import infer_symbolic_shapes

from onnax.core.opsets import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from onnax.errors import InvalidModelError

__all__ = ["MIN_OPSET", "infer_shapes", "prepare"]

logger = logging.getLogger(__name__)


def infer_shapes(model: ir.Model) -> None:
    """Runs symbolic shape inference in place (sorting first, as inference walks in list order)."""
    model.graph.sort()
    infer_symbolic_shapes(model, warn_on_missing=False)


def _has_untyped_io(model: ir.Model) -> bool:
    return any(v.type is None for v in (*model.graph.inputs, *model.graph.outputs))


def _check(model: ir.Model, transform: str) -> ir.Model:
    """Runs onnx.checker on an independent copy, inferring missing types first if needed."""
    proto = ir.to_proto(model)
    copy = ir.from_proto(proto)
    try:
        if _has_untyped_io(copy):
            infer_shapes(copy)
            proto = ir.to_proto(copy)
            copy = ir.from_proto(proto)
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        raise InvalidModelError(
            f"{transform}: the model fails onnx.checker: {str(err).strip().splitlines()[0]} "
            "Fix the model first; onnx.checker.check_model(onnx_ir.to_proto(model)) reproduces it."
        ) from err
    return copy


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


def _upgrade(model: ir.Model, opset: int, transform: str) -> ir.Model:
    try:
        converted = onnx.version_converter.convert_version(ir.to_proto(model), MIN_OPSET)
    except Exception as err:
        raise InvalidModelError(
            f"{transform}: the model uses opset {opset}, older than the oldest supported {MIN_OPSET}, "
            f"and onnx.version_converter could not convert it: {err}. Convert the model to opset "
            f"{MIN_OPSET} or newer before transforming it."
        ) from err
    return ir.from_proto(converted)


def prepare(model: ir.Model, transform: str) -> ir.Model:
    """Returns an independent, checked, inlined, sorted and shape-inferred copy of ``model``.

    Raises:
        InvalidModelError: If the model fails onnx.checker or its opset cannot be served.
    """
    if not isinstance(model, ir.Model):
        raise TypeError(
            f"{transform}: expected an onnx_ir.Model, got {type(model).__name__}. "
            "Load a file with onnx_ir.load(path) or convert a proto with onnx_ir.from_proto(proto)."
        )
    copy = _check(model, transform)
    opset = _opset(copy, transform)
    if opset < MIN_OPSET:
        copy = _upgrade(copy, opset, transform)
    if copy.functions:
        common.InlinePass()(copy)
    infer_shapes(copy)
    return copy
