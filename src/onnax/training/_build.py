"""A small node builder for the training layer: appends plain ONNX nodes to a graph.

The training layer writes losses and optimizer updates as ordinary ONNX arithmetic; this keeps
that code readable (``b.op("Mul", a, c)``) and every generated name fresh in the whole model.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from onnax.errors import InvalidModelError

__all__ = ["Builder", "MIN_OPSET", "model_names", "opset_of"]

MIN_OPSET = 13
"""ReduceSum, Unsqueeze and Squeeze take their axes as inputs from opset 13 on."""


def model_names(model: ir.Model) -> set[str]:
    """Every value name of the model, subgraphs included."""
    names: set[str] = set()
    for graph in model.graphs():
        for v in (*graph.inputs, *graph.outputs, *graph.initializers.values()):
            if v.name:
                names.add(v.name)
        for node in graph:
            names.update(v.name for v in node.outputs if v.name)
    return names


def opset_of(model: ir.Model, what: str) -> int:
    """The default-domain opset, refused below :data:`MIN_OPSET`.

    Raises:
        InvalidModelError: With the opset found and the converter to use.
    """
    opset = model.opset_imports.get("", None)
    if opset is None or opset < MIN_OPSET:
        raise InvalidModelError(
            f"{what}: the model imports ai.onnx opset {opset}, expected {MIN_OPSET} or later "
            "(the training graph uses the opset-13 forms of ReduceSum and Unsqueeze). Remedy: "
            "convert it first with onnx.version_converter.convert_version(proto, 17)."
        )
    return opset


class Builder:
    """Appends nodes to ``graph``, naming each output ``<prefix><k>`` fresh in ``taken``.

    Args:
        graph: The graph to append to.
        taken: Names already used in the model; the builder adds the ones it creates.
        prefix: The start of every generated name.
    """

    def __init__(self, graph: ir.Graph, taken: set[str], prefix: str = "train/") -> None:
        self.graph = graph
        self.taken = taken
        self.prefix = prefix
        self._count = 0

    def fresh(self, base: str | None = None) -> str:
        """A name not used in the model yet: ``base`` itself when free."""
        if base is not None and base not in self.taken:
            self.taken.add(base)
            return base
        while True:
            self._count += 1
            name = f"{base or self.prefix}{'_' if base else ''}{self._count}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def op(self, op_type: str, *inputs: ir.Value | None, **attributes: object) -> ir.Value:
        """Appends one single-output node and returns its output."""
        node = ir.node(op_type, list(inputs), attributes or None)  # type: ignore[arg-type]
        node.outputs[0].name = self.fresh()
        self.graph.append(node)
        return node.outputs[0]

    def const(
        self, value: float | int | Iterable[int] | np.ndarray, dtype: ir.DataType
    ) -> ir.Value:
        """A ``Constant`` node holding ``value`` in ``dtype`` (rank 0 for a Python scalar)."""
        array = np.asarray(value, dtype=dtype.numpy())
        node = ir.node("Constant", [], {"value": ir.tensor(array, dtype=dtype)})
        node.outputs[0].name = self.fresh()
        self.graph.append(node)
        return node.outputs[0]

    def axes(self, *axes: int) -> ir.Value:
        """A 1-D INT64 constant, the axes input of ReduceSum/Unsqueeze/Squeeze."""
        return self.const(np.array(axes, dtype=np.int64), ir.DataType.INT64)
