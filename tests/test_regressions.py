"""Regression tests for bugs found by random graphs and bad inputs (issue 12, point 6).

Each test is the minimal reproducer of one bug, checked against the oracles (onnx.checker and
onnxruntime, finite differences, vmap against a loop) or, for refusals, on the message.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto
from onnx import helper as oh

import onnax
from onnax.cli import main
from onnax.errors import InvalidModelError, SelectionError
from oracles import check_jvp, check_model_valid, check_vjp, check_vmap, fd_jvp, run, tolerances


def _text(body: str, opset: int = 18) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{body}')


# ------------------------------------------------------------------------------ external data
def _save_external(tmp_path: Path) -> Path:
    """A model whose every initializer, the small ones too, is stored in a .data file."""
    bias = ", ".join(["0.01"] * 100)  # over ir.save's 256-byte threshold for external data
    model = _text(
        "g (float[3] x) => (float[3] y) "
        f"<float[3] w = {{1, 2, 3}}, int64[1] ax = {{0}}, float[100] b = {{{bias}}}> {{"
        " p = Mul (x, w)  s = ReduceSum <keepdims = 1> (p, ax)  q = ReduceSum <keepdims = 1> (b)"
        "  r = Add (p, s)  y = Add (r, q) }"
    )
    proto = ir.to_proto(model)
    for t in proto.graph.initializer:  # raw_data, which save_as_external_data moves out
        t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t), t.name))
    folder = tmp_path / "source"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(proto, path, save_as_external_data=True, size_threshold=0)
    assert [p.suffix for p in folder.iterdir()].count(".data") == 1
    return path


def _expected_jvp(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    w = np.array([1, 2, 3], np.float32)
    return t * w + np.sum(t * w)


def _check_jvp_file(path: Path) -> None:
    """Runs the saved jvp model from its path (external data resolved beside it)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x, t = np.ones(3, np.float32), np.array([1, -1, 2], np.float32)
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(None, {"x": x, "fwd_x": t}), strict=True))
    np.testing.assert_allclose(got["fwd_y"], _expected_jvp(x, t), rtol=1e-6)


def test_external_data_from_another_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _save_external(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = onnax.jvp(ir.load(path))
    out = tmp_path / "result" / "jvp.onnx"
    out.parent.mkdir()
    ir.save(result, out, external_data="jvp.onnx.data")
    session_dir = tmp_path / "third"
    session_dir.mkdir()
    monkeypatch.chdir(session_dir)
    _check_jvp_file(out)


def test_cli_external_data_result_saved_beside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _save_external(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "result" / "jvp.onnx"
    out.parent.mkdir()
    assert main(["jvp", str(path), str(out), "--check"]) == 0, capsys.readouterr().err
    assert "fwd_y" in capsys.readouterr().out  # the --check table, from sessions of both models
    written = onnx.load(out, load_external_data=False)
    locations = {
        e.value for t in written.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {"jvp.onnx.data"}
    assert (out.parent / "jvp.onnx.data").is_file()
    # Runs from yet another folder: every reference resolves beside the result.
    monkeypatch.chdir(tmp_path)
    _check_jvp_file(out)


# ------------------------------------------------------------------------- opset imports
def _one_node(op: str, domain: str, imports: dict[str, int]) -> ir.Model:
    graph = oh.make_graph(
        [oh.make_node(op, ["x"], ["y"], domain=domain)],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [oh.make_opsetid(d, v) for d, v in imports.items()]
    return ir.from_proto(oh.make_model(graph, opset_imports=opsets, ir_version=10))


def test_model_of_ai_onnx_ml_only() -> None:
    model = _one_node("Binarizer", "ai.onnx.ml", {"ai.onnx.ml": 3})
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    result = check_vmap(model, feeds)
    assert result.opset_imports[""] >= 11 and "" not in model.opset_imports


@pytest.mark.parametrize("domain", ["", "ai.onnx"])
def test_default_domain_imported_as_ai_onnx(domain: str) -> None:
    model = _one_node("Sin", domain, {"ai.onnx": 18})
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_vmap(model, feeds)
    assert dict(model.opset_imports) == {"ai.onnx": 18}


# -------------------------------------------------------------------------- refused inputs
def test_full_check_on_input() -> None:
    model = _text("g (float[3, 3] x) => (float[3, 3] y) { y = Transpose <perm = [0, 0]> (x) }")
    with pytest.raises(InvalidModelError) as err:
        onnax.jvp(model)
    message = str(err.value)
    assert message.startswith("jvp: the model fails onnx.checker")
    assert "perm" in message and "repeated value" in message and "full_check=True" in message


def test_full_check_passes_over_onnx_errors_in_function_bodies() -> None:
    # onnx's strict inference of MeanVarianceNormalization-13 fails inside its own function
    # body (a Constant reading an absent attribute); the model is valid.
    model = _text(
        "g (float[2, 3, 2, 2] x) => (float[2, 3, 2, 2] y) { y = MeanVarianceNormalization (x) }",
        opset=13,
    )
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    t = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    jm = onnax.jvp(model)
    # The result keeps the primal node, so it too is held to the structural check only.
    onnx.checker.check_model(ir.to_proto(jm))
    got = run(jm, {"x": x, "fwd_x": t})["fwd_y"]
    want = fd_jvp(model, {"x": x}, {"x": t}, ["y"])["y"]
    np.testing.assert_allclose(got, want, **tolerances(got.dtype))


def test_graph_without_outputs_is_refused() -> None:
    model = _text("g (float[3] x) => () { y = Sin (x) }")
    for transform in (onnax.jvp, onnax.vjp, onnax.vmap):
        with pytest.raises(InvalidModelError) as err:
            transform(model)
        message = str(err.value)
        assert message.startswith(f"{transform.__name__}: the graph 'g' has no outputs")
        assert "model.graph.outputs" in message


def test_graph_passing_its_input_through() -> None:
    model = _text("g (float[3] x) => (float[3] x) { }")
    feeds = {"x": np.array([1, 2, 3], np.float32)}
    jm = check_jvp(model, feeds)
    assert [v.name for v in jm.graph.outputs] == ["x", "fwd_x"]
    vm = check_vjp(model, feeds)
    assert [v.name for v in vm.graph.inputs] == ["x", "adj_x"]
    check_vmap(model, feeds)
    for jacobian in (onnax.jacfwd, onnax.jacrev):
        jac = jacobian(model)
        check_model_valid(jac)
        np.testing.assert_array_equal(run(jac, feeds)["jac_x_x"], np.eye(3, dtype=np.float32))
    scalar = _text("g (float x) => (float x) { }")
    hess = onnax.hessian(scalar)
    assert run(hess, {"x": np.array(2.0, np.float32)})["hess_x_x_x"] == 0.0


def test_output_that_is_an_input_with_other_consumers() -> None:
    model = _text("g (float[3] x) => (float[3] x, float[3] y) { y = Sin (x) }")
    check_jvp(model, {"x": np.array([1, 2, 3], np.float32)})
    with pytest.raises(SelectionError) as err:
        onnax.vjp(model)
    message = str(err.value)
    assert message.startswith("vjp: the derivative of 'x' would be named 'adj_x'")
    assert "Identity(x)" in message


def test_vmap_randomness_policy_is_validated() -> None:
    model = _text("g (float[3] x) => (float[3] y) { y = Sin (x) }")
    with pytest.raises(SelectionError) as err:
        onnax.vmap(model, randomness="sometimes")  # type: ignore[arg-type]
    message = str(err.value)
    assert "randomness='sometimes'" in message
    assert all(f"'{p}'" in message for p in ("error", "different", "same"))
    with pytest.raises(SelectionError, match=r"axis_size must be a positive int or None"):
        onnax.vmap(model, axis_size=0)


def test_vmap_messages_say_inputs_and_outputs() -> None:
    model = _text("g (float[3] x) => (float[3] y) { y = Sin (x) }")
    with pytest.raises(SelectionError) as err:
        onnax.vmap(model, in_axes={"q": 0})
    assert "which are not graph inputs. Graph inputs: ['x']" in str(err.value)
    with pytest.raises(SelectionError) as err:
        onnax.vmap(model, out_axes=(0, 0))
    assert "the model has 1 outputs ['y']. Give one entry per output" in str(err.value)


# ------------------------------------------------------------------------------------- CLI
def test_cli_refuses_to_overwrite_its_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.onnx"
    ir.save(_text("g (float[3] x) => (float[3] y) { y = Sin (x) }"), path)
    before = path.read_bytes()
    alias = tmp_path / "." / "m.onnx"
    assert main(["jvp", str(path), str(alias)]) == 2
    err = capsys.readouterr().err
    assert "is the input model" in err and "overwrite the source" in err
    assert "another file name" in err
    assert path.read_bytes() == before
    assert main(["family", str(path), str(path)]) == 2
    assert "overwrite the source" in capsys.readouterr().err
    sibling = tmp_path / "adj_f.onnx"
    ir.save(_text("g (float[3] x) => (float[3] y) { y = Sin (x) }"), sibling)
    assert main(["family", str(sibling), str(tmp_path / "f.onnx")]) == 2
    assert "overwrite the source" in capsys.readouterr().err
    assert sibling.is_file()


def test_cli_names_a_duplicate_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = oh.make_graph(
        [oh.make_node("Sin", ["x"], ["y"]), oh.make_node("Cos", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    path = tmp_path / "dup.onnx"
    onnx.save_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), path)
    assert main(["jvp", str(path), str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert "the value name 'y' is defined twice in graph 'g'" in err
    assert "Rename one of the two definitions" in err


# ------------------------------------------------------------------ the seed contract of HVPs
def _linear_loss() -> ir.Model:
    """The README's model: loss = sum((x * weight)^2)."""
    return _text(
        "linear_loss (float[2] x, float[2] weight) => (float loss) {"
        " p = Mul (x, weight)  q = Mul (p, p)  loss = ReduceSum <keepdims = 0> (q) }"
    )


def test_jvp_of_grad_differentiates_the_gradient_only() -> None:
    model = _linear_loss()
    gradient = onnax.grad(model, inputs=["weight"], output="loss")
    hvp = onnax.jvp(gradient, inputs=["weight"])
    assert [v.name for v in hvp.graph.inputs] == ["x", "weight", "fwd_weight"]
    assert [v.name for v in hvp.graph.outputs] == ["loss", "grad_weight", "fwd_grad_weight"]
    x = np.array([0.5, -2.0], np.float32)
    w = np.array([1.5, 0.25], np.float32)
    v = np.array([1.0, -3.0], np.float32)
    got = run(hvp, {"x": x, "weight": w, "fwd_weight": v})
    # The Hessian of sum((x w)^2) in w is diag(2 x^2).
    np.testing.assert_allclose(got["fwd_grad_weight"], 2 * x * x * v, rtol=1e-6)
    np.testing.assert_allclose(got["grad_weight"], 2 * x * x * w, rtol=1e-6)


def test_jvp_default_outputs_of_a_primal_model_are_unchanged() -> None:
    # An output named like a derivative of nothing in the model is primal.
    model = _text(
        "g (float[2] x) => (float[2] grad_norm, float[2] y) { grad_norm = Sin (x)  y = Cos (x) }"
    )
    j = onnax.jvp(model)
    assert [v.name for v in j.graph.outputs] == ["grad_norm", "y", "fwd_grad_norm", "fwd_y"]


# --------------------------------------------------------------------------- control flow
def test_unused_loop_capturing_a_batched_value() -> None:
    model = _text(
        'g (float[3] x) => (float[3] y) <int64 m = {2}> { a = Sin (x)  d = Loop (m, "", a)'
        " <body = b (int64 i, bool c, float[?] st) => (bool c2, float[?] st2) {"
        " t = Add (st, a)  st2 = Tanh (t)  c2 = Identity (c) }>  y = Cos (a) }"
    )
    feeds = {"x": np.array([0.1, -0.4, 0.7], np.float32)}
    check_vmap(model, feeds)
    check_jvp(model, feeds)
    check_vjp(model, feeds)


def test_vmap_of_grad_with_a_batched_if_condition() -> None:
    model = _text(
        "g (float[2] x, float[2] z, bool c) => (float s) { y = If (c) <then_branch = t () =>"
        " (float[2] a) { a = Tanh (x) }, else_branch = e () => (float[2] b) { b = Add (x, z) }>"
        "  s = ReduceSum <keepdims = 0> (y) }",
        opset=21,
    )
    gradient = onnax.grad(model, inputs=["x", "z"])
    batched = onnax.vmap(gradient, in_axes=(0, 0, 0))
    check_model_valid(batched)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((2, 2)).astype(np.float32)
    zs = rng.standard_normal((2, 2)).astype(np.float32)
    cs = np.array([True, False])
    got = run(batched, {"x": xs, "z": zs, "c": cs})
    for k in range(2):
        single = run(gradient, {"x": xs[k], "z": zs[k], "c": np.array(cs[k])})
        for name, value in single.items():
            np.testing.assert_allclose(got[name][k], value, rtol=1e-6, err_msg=name)


# ------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("n", [3, 8])
def test_slice_past_a_symbolic_dimension_keeps_the_declared_dims(n: int) -> None:
    model = _text(
        "g (float[n] x) => (float[m] y) { s = Constant <value: tensor = int64[1] s {2}> ()"
        "  e = Constant <value: tensor = int64[1] e {6}> ()  y = Slice (x, s, e) }",
        opset=21,
    )
    vm = onnax.vjp(model)
    shapes = {v.name: str(v.shape) for v in (*vm.graph.inputs, *vm.graph.outputs)}
    assert shapes == {"x": "[n]", "adj_y": "[m]", "y": "[m]", "adj_x": "[n]"}
    feeds = {"x": np.linspace(-1, 1, n, dtype=np.float32)}
    check_vjp(model, feeds)  # a seed of size 1 for n = 3: [4] refused it
    check_jvp(model, feeds)
    check_vmap(model, feeds)


def test_squeeze_without_axes_then_einsum() -> None:
    model = _text(
        "g (double[N, 4, 3] x) => (double[3, 4] y) {"
        ' s = Squeeze (x)  y = Einsum <equation = "ij->ji"> (s) }',
        opset=21,
    )
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 4, 3))}
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_vmap(model, feeds)


def test_loop_tangents_through_a_guessed_broadcast() -> None:
    # Max broadcasts w[1], a Loop's state [n] and the Pad output [n + 1]: inference guessed the
    # result to be [n]-sized (the Loop's symbol), so onnxruntime reused an [n] buffer for a
    # value of size n + 1, and vjp skipped the sum of the [2] cotangent onto x[1].
    model = _text(
        "g (float[n] x, float[1] w) => (float y) <int64 m = {2}, int64[2] pads = {0, 1}> {"
        "  p = Pad (x, pads)"
        '  l1 = Loop (m, "", x) <body = b1 (int64 i, bool c, float[?] s) => (bool c1, float[?] s1)'
        " { s1 = Sin (s)  c1 = Identity (c) }>"
        "  mx = Max (w, l1, p)"
        '  l2 = Loop (m, "", mx) <body = b2 (int64 j, bool c, float[?] s) => (bool c2,'
        " float[?] s2) { t = Add (s, p)  s2 = Tanh (t)  c2 = Identity (c) }>"
        "  y = MatMul (l2, p) }"
    )
    feeds = {"x": np.array([0.3], np.float32), "w": np.array([0.1], np.float32)}
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_vmap(model, feeds)


def test_hessian_messages_name_hessian() -> None:
    model = _text("g (float[3] x) => (float[3] y) { y = Sin (x) }")
    with pytest.raises(SelectionError) as err:
        onnax.hessian(model)
    message = str(err.value)
    assert message.startswith("hessian: the model has no rank-0 FLOAT/DOUBLE outputs"), message
    assert "grad:" not in message
