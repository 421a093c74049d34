"""Cleanup's shape annotation skips the sort: the steps before it leave the model sorted."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import pytest

import onnax
from onnax.passes import cleanup

_DATA = Path(__file__).parent.parent / "data"
_MODELS = ["torch_mlp.onnx", "torch_gru_2layer_bidir.onnx", "torch_transformer_encoder.onnx"]


@pytest.mark.parametrize("name", _MODELS)
@pytest.mark.parametrize("transform", ["jvp", "vjp"])
def test_annotation_finds_the_model_sorted(
    name: str, transform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sort where AnnotateShapes runs with ``presorted`` changes no order and no name."""
    seen: list[bool] = []
    annotate = cleanup._annotate

    def checked(model: ir.Model, *, presorted: bool = False) -> None:
        if presorted:
            graphs = list(model.graphs())
            before = [[(n, n.name, [v.name for v in n.outputs]) for n in g] for g in graphs]
            model.graph.sort()
            after = [[(n, n.name, [v.name for v in n.outputs]) for n in g] for g in graphs]
            seen.append(before == after)
        annotate(model, presorted=presorted)

    monkeypatch.setattr(cleanup, "_annotate", checked)
    model = ir.load(_DATA / name)
    getattr(onnax, transform)(model)
    assert seen and all(seen)
