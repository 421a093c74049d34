"""The one-walk copy of a flat model (``onnax.passes.clone._clone_flat``) against the general path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from onnax.passes.clone import _clone_flat, _own_tensors, clone_model

DATA = Path(__file__).parent.parent / "data"


def _general(model: ir.Model) -> ir.Model:
    copy = model.clone()
    _own_tensors(copy)
    return copy


def _state(model: ir.Model) -> list[object]:
    """What serialisation drops but a transform reads: constants carried, meta, tensor names."""
    state: list[object] = []
    graph = model.graph
    for value in (
        *graph.inputs,
        *graph.initializers.values(),
        *(o for n in graph for o in n.outputs),
    ):
        tensor = value.const_value
        state.append(
            (
                value.name,
                None if tensor is None else (tensor.name, tensor.tobytes()),
                dict(value.meta),
                value.is_initializer(),
            )
        )
    state.extend(dict(n.meta) for n in graph)
    state.append(dict(graph.meta))
    return state


def _model() -> ir.Model:
    """Constants, an initializer that is also an input, metadata, docs, meta and shapes."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["N", 3]))
    w = ir.Value(name="w", const_value=ir.tensor(np.ones((3, 3), np.float32), name="w"))
    w.type, w.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([3, 3])
    b = ir.Value(name="b", const_value=ir.tensor(np.ones(3, np.float32), name="b"))
    b.type, b.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([3])
    const = ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(2.0))})
    mm = ir.node("MatMul", [x, w], name="mm", doc_string="the product")
    mm.metadata_props["k"] = "v"
    mm.meta["seen"] = True
    mm.outputs[0].metadata_props["out"] = "1"
    mm.outputs[0].shape = ir.Shape(["N", 3], denotations=["DATA_BATCH", None])
    add = ir.node("Add", [mm.outputs[0], b])
    mul = ir.node("Mul", [add.outputs[0], const.outputs[0]])
    y = mul.outputs[0]
    y.name, y.type, y.shape = "y", ir.TensorType(ir.DataType.FLOAT), ir.Shape(["N", 3])
    graph = ir.Graph(
        [x, b], [y], nodes=[const, mm, add, mul], initializers=[w, b], opset_imports={"": 21}
    )
    graph.metadata_props["g"] = "1"
    graph.meta["flag"] = 1
    model = ir.Model(graph, ir_version=10, producer_name="test", doc_string="doc")
    model.metadata_props["m"] = "2"
    return model


@pytest.mark.parametrize(
    "load",
    [
        _model,
        lambda: ir.load(DATA / "torch_transformer_encoder.onnx"),
        lambda: ir.load(DATA / "torch_gru_2layer_bidir.onnx"),
        lambda: onnax.vjp(ir.load(DATA / "torch_mlp.onnx")),
    ],
    ids=["built", "transformer", "gru", "vjp_mlp"],
)
def test_flat_copy_is_the_general_copy(load: object) -> None:
    model = load()  # type: ignore[operator]
    before = ir.to_proto(model).SerializeToString()
    flat = _clone_flat(model)
    assert flat is not None
    general = _general(model)
    assert ir.to_proto(flat).SerializeToString() == ir.to_proto(general).SerializeToString()
    assert _state(flat) == _state(general)
    assert ir.to_proto(model).SerializeToString() == before


def test_flat_copy_owns_types_shapes_and_tensors() -> None:
    model = _model()
    copy = _clone_flat(model)
    assert copy is not None
    pairs = [
        (a, b)
        for a, b in zip(
            (*model.graph.inputs, *(o for n in model.graph for o in n.outputs)),
            (*copy.graph.inputs, *(o for n in copy.graph for o in n.outputs)),
            strict=True,
        )
    ]
    for source, copied in pairs:
        assert copied is not source
        if source.type is None:
            continue
        assert copied.type is not source.type
        assert copied.shape is not source.shape
        copied.dtype = ir.DataType.DOUBLE
        assert source.dtype == ir.DataType.FLOAT
    w, w_copy = model.graph.initializers["w"], copy.graph.initializers["w"]
    assert w_copy.const_value is not w.const_value
    w_copy.const_value.name = "renamed"  # type: ignore[union-attr]
    assert w.const_value.name == "w"  # type: ignore[union-attr]
    # A Constant's output carries its attribute's (own) tensor.
    const = next(n for n in copy.graph if n.op_type == "Constant")
    assert const.outputs[0].const_value is const.attributes["value"].value
    source_const = next(n for n in model.graph if n.op_type == "Constant")
    assert const.attributes["value"].value is not source_const.attributes["value"].value


def test_models_that_are_not_flat_take_the_general_path() -> None:
    model = _model()
    x = model.graph.inputs[0]
    branches = [
        ir.Graph([], [ir.node("Identity", [x]).outputs[0]], nodes=[], name=name)
        for name in ("then", "else")
    ]
    for branch in branches:
        out = branch.outputs[0]
        node = out.producer()
        assert node is not None
        branch.append(node)
        out.type, out.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(["N", 3])
    cond = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    model.graph.inputs.append(cond)
    model.graph.append(
        ir.node("If", [cond], attributes={"then_branch": branches[0], "else_branch": branches[1]})
    )
    assert _clone_flat(model) is None
    assert clone_model(model) is not model


def test_an_unsorted_model_takes_the_general_path() -> None:
    model = _model()
    nodes = list(model.graph)
    model.graph.remove(nodes[0])
    model.graph.append(nodes[0])  # the Constant after its consumer
    assert _clone_flat(model) is None
    copy = clone_model(model)
    assert [n.op_type for n in copy.graph] == [n.op_type for n in model.graph]
