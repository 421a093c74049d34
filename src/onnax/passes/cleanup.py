"""Tidying a transformed model: dead code, order, types, names, validity."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common

__all__ = ["cleanup"]


def cleanup(model: ir.Model) -> ir.Model:
    """Removes dead nodes, sorts and makes every name unique.

    The primal part of a derivative model is kept whole (its outputs are still outputs); what
    goes is the forward work that no requested derivative needs.
    """
    common.RemoveUnusedNodesPass()(model)
    common.CommonSubexpressionEliminationPass()(model)
    common.RemoveUnusedNodesPass()(model)
    # No shape inference here: the new graph outputs carry their types already, and the next
    # transform infers anyway. Skipping it saves a quarter of a transform's time on big graphs.
    model.graph.sort()
    common.OutputFixPass()(model)
    common.NameFixPass()(model)
    if not model.graph.name:
        model.graph.name = "main"
    return model
