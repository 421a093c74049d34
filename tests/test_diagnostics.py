"""Every user-reachable error names what failed, what was found, and a remedy."""

from __future__ import annotations

import onnx_ir as ir
import pytest

import onnax
from onnax.core.registry import transpose_rules


def m(body: str, sig: str, opset: int = 18, extra: str = "") -> ir.Model:
    return ir.from_onnx_text(
        f'<ir_version: 10, opset_import: ["" : {opset}{extra}]>\ng {sig} {{\n{body}\n}}'
    )


BASIC = m(
    "y = Mul(x, w)\n s = ReduceSum <keepdims = 0> (y)\n c = Cast <to = 7> (x)",
    "(float[N, 3] x, float[3] w, int64[2] k) => (float[N, 3] y, float s, int64[N, 3] c)",
)


def test_unknown_input_lists_available_names() -> None:
    with pytest.raises(onnax.SelectionError) as err:
        onnax.jvp(BASIC, inputs=["z"])
    msg = str(err.value)
    assert "jvp" in msg and "'z'" in msg and "['x', 'w']" in msg


def test_unknown_output_lists_outputs() -> None:
    with pytest.raises(onnax.SelectionError) as err:
        onnax.vjp(BASIC, outputs=["q"])
    msg = str(err.value)
    assert "vjp" in msg and "'q'" in msg and "['y', 's', 'c']" in msg


def test_non_float_selection_states_dtype() -> None:
    with pytest.raises(onnax.SelectionError) as err:
        onnax.jvp(BASIC, inputs=["k"])
    assert "INT64" in str(err.value) and "FLOAT or DOUBLE" in str(err.value)
    with pytest.raises(onnax.SelectionError) as err:
        onnax.vjp(BASIC, outputs=["c"])
    assert "INT64" in str(err.value)


def test_positions_are_refused() -> None:
    with pytest.raises(onnax.SelectionError, match="by name, not by position"):
        onnax.jvp(BASIC, inputs=[0])  # type: ignore[list-item]


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(onnax.SelectionError, match="twice"):
        onnax.jvp(BASIC, inputs=["x", "x"])


def test_grad_on_non_scalar_output_states_shape_and_remedy() -> None:
    with pytest.raises(onnax.SelectionError) as err:
        onnax.grad(BASIC, output="y")
    msg = str(err.value)
    assert "shape [N, 3]" in msg and "expected rank 0" in msg
    assert "ReduceSum" in msg and "vjp" in msg


def test_grad_without_unique_scalar_lists_outputs() -> None:
    two = m(
        "a = ReduceSum <keepdims = 0> (x)\n b = ReduceMax <keepdims = 0> (x)",
        "(float[3] x) => (float a, float b)",
    )
    with pytest.raises(onnax.SelectionError) as err:
        onnax.grad(two)
    assert "2 rank-0" in str(err.value) and "output=" in str(err.value)
    assert "a (FLOAT" in str(err.value) and "b (FLOAT" in str(err.value)
    none = m("y = Relu(x)", "(float[3] x) => (float[3] y)")
    with pytest.raises(onnax.SelectionError, match="no rank-0"):
        onnax.grad(none)


def test_missing_rule_names_transform_op_opset_node_and_input() -> None:
    model = m("y = MyOp(x)", "(float[3] x) => (float[3] y)", extra=', "my.domain" : 1').clone()
    model.graph[0].domain = "my.domain"
    model.graph[0].name = "custom_node"
    model.graph.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    for transform in ("jvp", "vjp"):
        with pytest.raises(onnax.UnsupportedOperatorError) as err:
            getattr(onnax, transform)(model)
        msg = str(err.value)
        assert msg.startswith(f"{transform}:")
        assert "my.domain::MyOp" in msg and "opset 18" in msg
        assert "'custom_node'" in msg and "input 0 'x'" in msg and "Remedy" in msg


def test_inactive_unknown_op_does_not_block() -> None:
    model = m("y = Mul(x, x)\n z = Relu(w)", "(float[3] x, float[3] w) => (float[3] y, float[3] z)")
    out = onnax.jvp(model, inputs=["x"], outputs=["y"])
    assert [v.name for v in out.graph.outputs] == ["y", "z", "fwd_y"]


def test_random_op_on_active_path() -> None:
    model = m("r = RandomNormalLike(x)\n y = Add(x, r)", "(float[3] x) => (float[3] y)")
    with pytest.raises(onnax.UnsupportedValueError) as err:
        onnax.jvp(model)
    msg = str(err.value)
    assert "RandomNormalLike" in msg and "random" in msg and "Remedy" in msg


def test_sequence_on_active_path() -> None:
    model = m(
        "s = SequenceConstruct(x, x)\n y = ConcatFromSequence <axis = 0> (s)",
        "(float[3] x) => (float[6] y)",
    )
    with pytest.raises(onnax.UnsupportedValueError) as err:
        onnax.vjp(model)
    assert "Sequence value" in str(err.value) and "vjp" in str(err.value)


def test_optional_on_active_path() -> None:
    model = m("o = Optional(x)\n y = OptionalGetElement(o)", "(float[3] x) => (float[3] y)")
    with pytest.raises(onnax.UnsupportedValueError) as err:
        onnax.jvp(model)
    assert "Optional value" in str(err.value)


def test_unsupported_opset_states_interval() -> None:
    model = m("y = Relu(x)", "(float[3] x) => (float[3] y)", opset=99)
    with pytest.raises(onnax.InvalidModelError) as err:
        onnax.jvp(model)
    assert "99" in str(err.value)


def test_not_a_model() -> None:
    with pytest.raises(TypeError, match=r"onnx_ir\.Model"):
        onnax.jvp("model.onnx")  # type: ignore[arg-type]


@pytest.mark.parametrize("transform", ["jvp", "vjp", "grad"])
def test_refusal_of_a_jvp_rule_names_the_transform_called(transform: str) -> None:
    # The refusal is raised by Dropout's jvp rule, which also serves vjp and grad.
    model = ir.from_onnx_text(
        '<ir_version: 8, opset_import: ["" : 13]>\n'
        "g (float[4] x, bool t) => (float y) {\n"
        "  r = Constant<value = float {0.5}>()\n"
        "  d = Dropout(x, r, t)\n"
        "  y = ReduceSum<keepdims = 0>(d)\n"
        "}"
    )
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        getattr(onnax, transform)(model, ["x"])
    message = str(info.value)
    assert message.startswith(f"{transform}: "), message
    assert "::Dropout" in message and "training" in message, message


@pytest.mark.parametrize("transform", ["vjp", "grad"])
def test_refusal_of_a_transpose_rule_names_the_transform(
    transform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A transpose rule that refuses, worded as transpose rules word it (they do not know the
    # transform that runs them).
    def refuse(*_: object) -> list[ir.Value | None]:
        raise onnax.errors.UnsupportedOperatorError("ai.onnx::Neg (node n): cannot. Remedy: none.")

    lookup = transpose_rules.lookup
    monkeypatch.setattr(
        transpose_rules,
        "lookup",
        lambda domain, op, opset: refuse if op == "Neg" else lookup(domain, op, opset),
    )
    model = ir.from_onnx_text(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        "g (float[3] x) => (float y) {\n  n = Neg(x)\n  y = ReduceSum<keepdims = 0>(n)\n}"
    )
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        getattr(onnax, transform)(model, ["x"])
    assert str(info.value) == f"{transform}: ai.onnx::Neg (node n): cannot. Remedy: none."


def test_grad_remedy_fits_the_case() -> None:
    """With no rank-0 output, "Pass output=<name>" cannot help: the remedy is a scalar loss."""
    none = m("y = Relu(x)", "(float[3] x) => (float[3] y)")
    with pytest.raises(onnax.SelectionError) as err:
        onnax.grad(none)
    msg = str(err.value)
    assert "no rank-0" in msg and "y (FLOAT, shape [3])" in msg
    assert "output=" not in msg
    assert "ReduceSum or ReduceMean with keepdims=0" in msg and "vjp(model, outputs=[...])" in msg
    two = m(
        "a = ReduceSum <keepdims = 0> (x)\n b = ReduceMax <keepdims = 0> (x)",
        "(float[3] x) => (float a, float b)",
    )
    with pytest.raises(onnax.SelectionError) as err:
        onnax.grad(two)
    assert "Pass output=<name> (--output on the command line)" in str(err.value)
    assert "['a', 'b']" in str(err.value)


def test_hessian_errors_say_hessian() -> None:
    """They started with "grad:" or "jacrev:", the inner steps of jacfwd(jacrev(model))."""
    with pytest.raises(onnax.SelectionError) as err:
        onnax.hessian(BASIC, inputs=["z"], output="s")
    msg = str(err.value)
    assert msg.startswith("hessian: ") and "'z'" in msg and "['x', 'w']" in msg
    assert "jacrev:" not in msg and "(in the jacrev step of jacfwd(jacrev(model)))" in msg
    none = m("y = Relu(x)", "(float[3] x) => (float[3] y)")
    with pytest.raises(onnax.SelectionError) as err:
        onnax.hessian(none)
    assert str(err.value).startswith("hessian: the model has no rank-0")


def test_vmap_remedy_names_the_registration_api() -> None:
    from onnax.rules import register

    model = m("y = MyOp(x)", "(float[3] x) => (float[3] y)", extra=', "my.domain" : 1').clone()
    model.graph[0].domain = "my.domain"
    model.graph.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(model)
    msg = str(err.value)
    assert msg.startswith("vmap: no batch rule for my.domain::MyOp")
    assert "onnax.rules.register('my.domain', 'MyOp', batch=...)" in msg
    assert "batch_rules.register" not in msg
    assert "batch" in register.__kwdefaults__  # the API named is the real one


def test_pass_classes_run_in_a_pass_manager(tmp_path: object) -> None:
    from pathlib import Path

    from oracles import serialized

    model = m(
        "y = Mul(x, w)\n t = Tanh(y)\n s = ReduceSum <keepdims = 0> (t)",
        "(double[3] x, double[3] w) => (double s)",
    )
    for cls, function in (
        (onnax.JacfwdPass, onnax.jacfwd),
        (onnax.JacrevPass, onnax.jacrev),
        (onnax.HessianPass, onnax.hessian),
    ):
        got = ir.passes.PassManager([onnax.UnrollPass(), cls(["w"])])(model).model
        assert serialized(got) == serialized(function(model, ["w"]))
    target = Path(str(tmp_path)) / "f.onnx"
    family = onnax.FamilyPass(target, kinds=["adj"])
    result = ir.passes.PassManager([family])(model)
    assert result.model is model and not result.modified
    assert family.family is not None and target.exists() and (target.parent / "adj_f.onnx").exists()
