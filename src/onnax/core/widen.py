"""A half-precision model re-typed in FLOAT: the reference a derivative of it is checked against.

Finite differences of a FLOAT16 model in FLOAT16 measure its rounding, not its derivative (a step
of 1e-3 is one FLOAT16 ulp near 1). The same model in FLOAT, fed the same (exactly widened)
values, is the function the half model approximates, with a usable step.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from onnax.core.selection import HALF_TYPES

__all__ = ["holds_half", "widen_half"]

_DTYPE_ATTRS = frozenset({"to", "dtype", "output_dtype"})


def holds_half(model: ir.Model) -> bool:
    """Whether a graph input or output of ``model`` is FLOAT16 or BFLOAT16."""
    graph = model.graph
    return any(v.dtype in HALF_TYPES for v in (*graph.inputs, *graph.outputs))


def _widened(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    if tensor.dtype not in HALF_TYPES:
        return tensor
    return ir.tensor(tensor.numpy().astype(np.float32), name=tensor.name)


def widen_half(model: ir.Model) -> ir.Model:
    """A copy of ``model`` with every FLOAT16/BFLOAT16 type, tensor and dtype attribute in FLOAT.

    Covers graph inputs, outputs, initializers and node outputs of every graph (subgraphs
    included), tensor attributes (``Constant``, ``ConstantOfShape``) and the INT attributes
    ``to``/``dtype``/``output_dtype`` (``Cast``, ``EyeLike``, ``RandomNormal``...).
    """
    copy = ir.from_proto(ir.to_proto(model))
    for graph in copy.graphs():
        values = [
            *graph.inputs,
            *graph.initializers.values(),
            *(o for n in graph for o in n.outputs),
        ]
        for v in values:
            if v.dtype in HALF_TYPES:
                v.dtype = ir.DataType.FLOAT
            if v.const_value is not None:
                v.const_value = _widened(v.const_value)
        for node in graph:
            for name, attr in list(node.attributes.items()):
                if attr.type == ir.AttributeType.TENSOR:
                    node.attributes[name] = ir.AttrTensor(name, _widened(attr.as_tensor()))
                elif (
                    attr.type == ir.AttributeType.INT
                    and name in _DTYPE_ATTRS
                    and attr.as_int() in HALF_TYPES
                ):
                    node.attributes[name] = ir.AttrInt64(name, ir.DataType.FLOAT)
    return copy
