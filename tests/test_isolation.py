"""Source isolation beyond bytes: editing a derived model must not edit its source."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import pytest

import onnax

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("transform", ["grad", "jvp", "vjp"])
def test_retyping_the_result_leaves_the_source_alone(transform: str) -> None:
    """onnx_ir's clone shared the type objects and ``Value.dtype`` edits them in place: setting
    a dtype on the result (as a float64 twin does) retyped the caller's model."""
    source = ir.load(DATA / "torch_gru_2layer_bidir.onnx")
    derived = getattr(onnax, transform)(source)
    for graph in derived.graphs():
        for value in (*graph.inputs, *(o for n in graph for o in n.outputs)):
            if value.dtype == ir.DataType.FLOAT:
                value.dtype = ir.DataType.DOUBLE
    kinds = {
        v.dtype for g in source.graphs() for v in (*g.inputs, *(o for n in g for o in n.outputs))
    }
    assert ir.DataType.DOUBLE not in kinds
