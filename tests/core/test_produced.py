"""A transform's unedited result skips the check in the next transform; any edit brings it back."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from onnax.core.produced import fingerprint, remember, unedited
from onnax.errors import InvalidModelError
from onnax.passes import prepare as prepare_module
from oracles import serialized

MLP = """<ir_version: 10, opset_import: ["" : 21]>
g (float[N, 3] x) => (float loss) {
    w = Constant <value = float[3, 4] {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}> ()
    h = MatMul(x, w)
    u = Transpose <perm = [1, 0]> (h)
    t = Tanh(u)
    loss = ReduceSum <keepdims = 0> (t)
}"""


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The transforms whose prepare ran onnx.checker, in order."""
    ran: list[str] = []
    check = prepare_module._check

    def counted(proto: object, transform: str) -> None:
        ran.append(transform)
        check(proto, transform)  # type: ignore[arg-type]

    monkeypatch.setattr(prepare_module, "_check", counted)
    yield ran


def _mlp() -> ir.Model:
    model = ir.from_onnx_text(MLP)
    model.graph.outputs[0].shape = ir.Shape([])  # the text syntax has no rank-0 shape
    return model


def _gradient() -> ir.Model:
    return onnax.grad(_mlp(), inputs="x")


def test_a_chain_checks_the_source_once_and_gives_the_same_model(checks: list[str]) -> None:
    gradient = _gradient()
    assert checks == ["grad"]
    before = serialized(gradient)
    chained = onnax.jvp(gradient, inputs="x")
    assert checks == ["grad"]  # the gradient was not checked again
    assert serialized(gradient) == before  # and not changed
    reloaded = ir.from_proto(ir.to_proto(gradient))  # the same model, not remembered
    assert serialized(onnax.jvp(reloaded, inputs="x")) == serialized(chained)
    assert checks == ["grad", "jvp"]
    # The chain's own result is remembered too, and a second reader skips as the first did.
    onnax.vjp(chained, inputs="x")
    onnax.vjp(gradient, inputs="x")
    assert checks == ["grad", "jvp"]


def _perm(model: ir.Model) -> None:
    node = next(n for n in model.graph if n.op_type == "Transpose")
    node.attributes["perm"] = ir.AttrInt64s("perm", [0, 0])


def _retype(model: ir.Model) -> None:
    model.graph.outputs[0].dtype = ir.DataType.DOUBLE


def _reshape(model: ir.Model) -> None:
    value = model.graph.outputs[0]
    assert value.shape is not None
    value.shape = ir.Shape([*value.shape.dims, 5])


def _rewire(model: ir.Model) -> None:
    node = next(n for n in model.graph if n.op_type == "MatMul")
    node.replace_input_with(0, model.graph.outputs[0])


def _bad_node(model: ir.Model) -> None:
    x = model.graph.inputs[0]
    node = ir.Node("", "Transpose", [x], attributes=[ir.AttrInt64s("perm", [0, 0])])
    model.graph.append(node)


def _opset(model: ir.Model) -> None:
    model.opset_imports[""] = 1


EDITS: dict[str, Callable[[ir.Model], None]] = {
    "attribute": _perm,
    "output dtype in place": _retype,
    "output shape": _reshape,
    "input wiring": _rewire,
    "new node": _bad_node,
    "opset": _opset,
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edit_after_the_transform_is_checked(edit: str, checks: list[str]) -> None:
    gradient = _gradient()
    assert any(n.op_type == "Transpose" for n in gradient.graph)
    EDITS[edit](gradient)
    assert not unedited(gradient)
    with pytest.raises(InvalidModelError, match=r"jvp: the model fails onnx\.checker"):
        onnax.jvp(gradient, inputs="x")
    assert checks == ["grad", "jvp"]


def test_each_kind_of_edit_changes_the_fingerprint() -> None:
    gradient = _gradient()
    key = fingerprint(gradient)
    assert key is not None and unedited(gradient)
    node = next(n for n in gradient.graph if n.op_type == "Tanh")
    node.name = "renamed"
    assert fingerprint(gradient) != key
    remember(gradient)
    node.outputs[0].name = "renamed_value"
    assert not unedited(gradient)
    remember(gradient)
    constant = next(n for n in gradient.graph if n.op_type == "Constant")
    tensor = constant.attributes["value"].as_tensor()
    before = tensor.tobytes()
    data = tensor.numpy()
    if data.flags.writeable:
        data.reshape(-1)[0] = data.reshape(-1)[0] + np.ones((), data.dtype)
    if tensor.tobytes() != before:  # where numpy() is the tensor's own data, not a copy
        assert not unedited(gradient)
    remember(gradient)
    gradient.graph.remove(gradient.graph.node(len(gradient.graph) - 1), safe=False)
    assert not unedited(gradient)


def test_a_copy_of_a_result_is_checked(checks: list[str]) -> None:
    gradient = _gradient()
    onnax.jvp(gradient.clone(), inputs="x")
    assert checks == ["grad", "jvp"]


def test_models_the_user_made_are_never_remembered() -> None:
    model = _mlp()
    assert not unedited(model)
    onnax.grad(model, inputs="x")
    assert not unedited(model)  # the source, read by a transform, is not its result


def test_an_intermediate_value_retyped_or_reshaped_changes_the_fingerprint() -> None:
    # The walk reads the outputs' type and shape slots: an edit of either must count.
    gradient = _gradient()
    outputs = set(gradient.graph.outputs)
    value = next(
        o
        for n in gradient.graph
        for o in n.outputs
        if o not in outputs and o.type is not None and o.shape is not None
    )
    key = fingerprint(gradient)
    assert value.type is not None
    value.type.dtype = ir.DataType.DOUBLE  # in place: the same type object
    assert fingerprint(gradient) != key
    remember(gradient)
    assert value.shape is not None
    value.shape = ir.Shape([*value.shape.dims, 3])
    assert not unedited(gradient)
    remember(gradient)
    value.shape = None
    assert not unedited(gradient)
