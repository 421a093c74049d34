"""``linearize``: a forward model (primal outputs + residuals) and a linear model (J·v).

Oracles, none of which knows the rules:

* the linear model fed the forward model's residuals equals the independently built jvp model,
  and both agree with float64/float32 central differences of the primal model;
* linearity: ``L(a v + b w) = a L(v) + b L(w)``;
* the forward model's primal outputs equal the primal model's;
* structure: every node of the linear model reads a tangent input (constants excepted), it holds
  no nonlinear primal operator, and the weights it multiplies by are not residuals;
* source isolation and determinism, as ``oracles.contract_checked`` checks them.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
import zoo
from cases import Case
from onnax.cli.linearize import add_parser
from onnax.cli.linearize import run as run_cli
from onnax.core.subgraphs import subgraph_reads
from onnax.errors import SelectionError
from onnax.linearization import linearize
from oracles import check_model_valid, fd_jvp, run, serialized, tolerances
from rules.test_control_flow import CASES, PASSTHROUGH_CASES

DATA = Path(__file__).parent / "data"

Models = tuple[ir.Model, ir.Model]


def linearized(
    model: ir.Model, inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
) -> Models:
    """``linearize(model)`` with the transform contract checked on both halves."""
    before = serialized(model)
    fwd, lin = linearize(model, inputs, outputs)
    assert serialized(model) == before, "linearize changed its source model"
    again = linearize(model, inputs, outputs)
    assert [serialized(m) for m in again] == [serialized(fwd), serialized(lin)], "not deterministic"
    reloaded = linearize(ir.from_proto(onnx.load_from_string(before)), inputs, outputs)
    assert [serialized(m) for m in reloaded] == [serialized(fwd), serialized(lin)]
    check_model_valid(fwd)
    check_model_valid(lin)
    for half in (fwd, lin):
        # Read back from the bytes: uses() of the returned objects could be stale.
        graph = ir.from_proto(ir.to_proto(half)).graph
        outputs = set(graph.outputs)
        dead = [n for n in graph if not any(o.uses() or o in outputs for o in n.outputs)]
        assert not dead, f"nodes nothing reads: {[n.op_type for n in dead]}"
    return fwd, lin


def apply_linear(
    fwd: ir.Model, lin: ir.Model, feeds: dict[str, np.ndarray], tangents: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Runs the forward model once and the linear model on its residuals."""
    forward = run(fwd, feeds)
    residuals = {v.name: forward[v.name] for v in lin.graph.inputs if v.name in forward}
    return forward, run(lin, {**residuals, **tangents})


def tangents_for(lin: ir.Model, feeds: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """One random direction per tangent input, shaped like its primal's feed."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in lin.graph.inputs:
        if v.name.startswith("fwd_"):
            primal = feeds.get(v.name[len("fwd_") :])
            shape = primal.shape if primal is not None else [int(d) for d in v.shape.dims]
            out[v.name] = rng.standard_normal(shape).astype(v.dtype.numpy())
    return out


def check_against_oracles(
    model: ir.Model,
    feeds: dict[str, np.ndarray],
    inputs: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
) -> Models:
    """Linear model == jvp model == central differences; forward model == primal."""
    fwd, lin = linearized(model, inputs, outputs)
    tangents = tangents_for(lin, feeds, seed=1)
    forward, got = apply_linear(fwd, lin, feeds, tangents)
    primal = run(model, feeds)
    assert [v.name for v in fwd.graph.outputs][: len(primal)] == list(primal)
    for y, value in primal.items():
        np.testing.assert_allclose(forward[y], value, rtol=1e-6, atol=1e-6, err_msg=y)
    reference = run(onnax.jvp(model, inputs, outputs), {**feeds, **tangents})
    assert list(got) == [v.name for v in lin.graph.outputs]
    assert set(got) <= set(reference)
    directions = {t[len("fwd_") :]: v for t, v in tangents.items()}
    fd = fd_jvp(model, feeds, directions, [t[len("fwd_") :] for t in got])
    for t, value in got.items():
        np.testing.assert_allclose(value, reference[t], rtol=1e-6, atol=1e-7, err_msg=t)
        np.testing.assert_allclose(value, fd[t[4:]], **tolerances(value.dtype), err_msg=t)
    return fwd, lin


def assert_linear_structure(lin: ir.Model) -> None:
    """Every node reads a tangent input (directly or through what its subgraphs capture).

    Constants (Constant nodes and what they alone compute) are the exception: they move with the
    linear part instead of becoming residuals.
    """
    graph = lin.graph
    tangent = {v for v in graph.inputs if v.name.startswith("fwd")}
    constant = {v for v in graph.initializers.values() if v not in set(graph.inputs)}
    for node in graph:
        reads = [v for v in (*node.inputs, *subgraph_reads(node)) if v is not None]
        if any(v in tangent for v in reads):
            tangent.update(node.outputs)
        else:
            assert all(v in constant for v in reads), (
                f"{node.op_type} {node.name!r} computes from residuals alone: primal work"
            )
            constant.update(node.outputs)


def torch_model(name: str) -> tuple[ir.Model, dict[str, np.ndarray]]:
    model = ir.load(DATA / f"torch_{name}.onnx")
    rng = np.random.default_rng(0)
    feeds = {
        str(v.name): rng.standard_normal([int(d) for d in v.shape.dims]).astype(np.float32)
        for v in model.graph.inputs
        if v.name not in model.graph.initializers
    }
    return model, feeds


NONLINEAR = {"Relu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Div", "Pow", "Softmax", "LSTM"}


@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "lstm_2layer_bidir"])
def test_torch_models_against_jvp_and_differences(name: str) -> None:
    model, feeds = torch_model(name)
    _fwd, lin = check_against_oracles(model, feeds)
    assert_linear_structure(lin)
    primal_ops = {n.op_type for n in model.graph.all_nodes()}
    assert not {n.op_type for n in lin.graph.all_nodes()} & primal_ops & NONLINEAR
    # The primal inputs are not inputs of the linear model: it reads residuals only.
    assert not {v.name for v in lin.graph.inputs} & set(feeds)


@pytest.mark.parametrize("name", ["mlp", "cnn_bn"])
def test_linearity(name: str) -> None:
    model, feeds = torch_model(name)
    fwd, lin = linearize(model)
    v, w = tangents_for(lin, feeds, seed=2), tangents_for(lin, feeds, seed=3)
    a, b = np.float32(0.7), np.float32(-1.9)
    combined = {k: a * v[k] + b * w[k] for k in v}
    _, lv = apply_linear(fwd, lin, feeds, v)
    _, lw = apply_linear(fwd, lin, feeds, w)
    _, lc = apply_linear(fwd, lin, feeds, combined)
    for y in lc:
        np.testing.assert_allclose(lc[y], a * lv[y] + b * lw[y], rtol=1e-4, atol=1e-6)


CONTROL_FLOW = [*CASES, *PASSTHROUGH_CASES]


@pytest.mark.parametrize("case", CONTROL_FLOW, ids=[c.name for c in CONTROL_FLOW])
def test_control_flow_against_jvp_and_differences(case: Case) -> None:
    model = case.model("double", case.opsets[-1])
    _fwd, lin = check_against_oracles(model, case.feeds(model), case.inputs)
    assert_linear_structure(lin)


MATMUL = """
<ir_version: 10, opset_import: ["" : 18]>
agraph (float[2, 3] x) => (float[2, 4] y)
<float[3, 4] W = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}> {
    y = MatMul(x, W)
}
"""


def test_weights_move_with_the_linear_part() -> None:
    """A linear map needs no residual: the weight is copied, not passed through."""
    model = ir.from_onnx_text(MATMUL)
    fwd, lin = linearized(model)
    assert [v.name for v in fwd.graph.outputs] == ["y"]
    assert [v.name for v in lin.graph.inputs] == ["fwd_x"]
    assert list(lin.graph.initializers) == ["W"]


def test_the_structure_check_sees_primal_work() -> None:
    """The structural oracle refuses a jvp model, whose primal nodes read no tangent."""
    model, _ = torch_model("mlp")
    with pytest.raises(AssertionError, match="computes from residuals alone"):
        assert_linear_structure(onnax.jvp(model))


MULTI = """
<ir_version: 10, opset_import: ["" : 18]>
agraph (double[3] a, double[3] b, double[3] c) => (double[3] p, double[3] q, double[3] r) {
    ab = Mul(a, b)
    p = Tanh(ab)
    q = Mul(a, a)
    r = Sin(c)
}
"""


def test_several_inputs_and_outputs() -> None:
    """Residuals include primal graph inputs (``a`` in ``q = a * a``); ``r`` has a zero tangent."""
    model = ir.from_onnx_text(MULTI)
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(3) for k in "abc"}
    fwd, lin = check_against_oracles(model, feeds, ["a", "b"], ["p", "q", "r"])
    assert [v.name for v in lin.graph.outputs] == ["fwd_p", "fwd_q", "fwd_r"]
    n_res = len(fwd.graph.outputs) - 3
    names = [v.name for v in lin.graph.inputs]
    assert names == [f"res_{i}" for i in range(n_res)] + ["fwd_a", "fwd_b"]
    assert [v.name for v in fwd.graph.outputs][3:] == names[:n_res]
    # r's tangent is zero whatever the direction.
    _, got = apply_linear(fwd, lin, feeds, tangents_for(lin, feeds, 5))
    np.testing.assert_array_equal(got["fwd_r"], np.zeros(3))


def test_residual_names_avoid_the_models_names() -> None:
    text = MULTI.replace("ab", "res_0")
    model = ir.from_onnx_text(text)
    fwd, _lin = linearized(model, ["a"], ["p"])
    residuals = [v.name for v in fwd.graph.outputs][3:]
    assert residuals and all(n.startswith("res2_") for n in residuals)


def test_hessian_vector_products_of_a_grad_model() -> None:
    """linearize(grad(m)): the linear model computes H·v, as jvp(grad(m)) and differences say."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    agraph (double[2, 3] x) => (double L)
    <double[3, 2] W = {0.1, -0.4, 0.7, 0.2, -0.3, 0.5}> {
        h = MatMul(x, W)
        t = Tanh(h)
        sq = Mul(t, t)
        L = ReduceSum <keepdims = 0> (sq)
    }
    """
    model = ir.from_onnx_text(text)
    g = onnax.grad(model, inputs=["W"], output="L")
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3))}
    _fwd, lin = check_against_oracles(g, feeds, ["W"])
    assert [v.name for v in lin.graph.outputs] == ["fwd_grad_W"]
    assert_linear_structure(lin)


def test_unknown_names_are_refused_with_the_choices() -> None:
    model = ir.from_onnx_text(MULTI)
    with pytest.raises(SelectionError) as info:
        linearize(model, inputs=["nope"])
    message = str(info.value)
    assert message.startswith("linearize: no graph input or initializer named 'nope'")
    assert "['a', 'b', 'c']" in message
    with pytest.raises(SelectionError) as info:
        linearize(model, outputs=["z"])
    message = str(info.value)
    assert message.startswith("linearize: no graph output named 'z'")
    assert "['p', 'q', 'r']" in message


def cli_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="onnax")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_command_line_writes_both_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "m.onnx"
    ir.save(ir.from_onnx_text(MULTI), source)
    out = tmp_path / "out"
    status = run_cli(cli_args(["linearize", str(source), str(out), "--inputs", "a,b"]))
    assert status == 0
    fwd, lin = ir.load(out / "forward.onnx"), ir.load(out / "linear.onnx")
    expected = linearize(ir.load(source), ["a", "b"])
    assert [serialized(m) for m in (fwd, lin)] == [serialized(m) for m in expected]
    printed = capsys.readouterr().out
    assert "forward.onnx" in printed and "linear.onnx" in printed and "res_0" in printed


def test_command_line_refuses_to_overwrite_a_file(tmp_path: Path) -> None:
    source = tmp_path / "m.onnx"
    ir.save(ir.from_onnx_text(MULTI), source)
    with pytest.raises(onnax.OnnaxError) as info:
        run_cli(cli_args(["linearize", str(source), str(source)]))
    message = str(info.value)
    assert "is a file, expected a directory" in message and "Give a directory" in message


SYMBOLIC = """
<ir_version: 10, opset_import: ["" : 18]>
agraph (double[N] a, double[N] c) => (double[N] p, double[N] r) {
    p = Tanh(a)
    r = Sin(c)
}
"""


def test_zero_tangent_of_symbolic_shape_keeps_its_name() -> None:
    """``fwd_r`` is zeros shaped like ``r`` at run time: the forward model makes them, and the
    linear model passes that residual on as ``fwd_r`` (the output once took the residual's name).
    """
    model = ir.from_onnx_text(SYMBOLIC)
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal(4), "c": rng.standard_normal(4)}
    fwd, lin = check_against_oracles(model, feeds, ["a"])
    assert [v.name for v in lin.graph.outputs] == ["fwd_p", "fwd_r"]
    # The residual inputs keep the symbolic batch dimension of the forward outputs.
    assert [str(v.shape) for v in lin.graph.inputs] == ["[N]"] * len(lin.graph.inputs)
    _, got = apply_linear(fwd, lin, feeds, tangents_for(lin, feeds, 1))
    np.testing.assert_array_equal(got["fwd_r"], np.zeros(4))


IR3 = """
<ir_version: 3, opset_import: ["" : 8]>
agraph (float[2, 3] x, float[3, 4] W, float[4] b) => (float[2, 4] y)
<float[3, 4] W = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, float[4] b = {1, -1, 2, -2}> {
    h = MatMul(x, W)
    a = Add(h, b)
    y = Tanh(a)
}
"""


def test_ir3_weights_stay_weights() -> None:
    """IR 3 lists every initializer as an input: W is still a weight of the linear model, not a
    residual, and listed as its input with its stored value, as IR 3 requires (onnxruntime
    refused the linear model before)."""
    model = ir.from_onnx_text(IR3)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)}
    fwd, lin = check_against_oracles(model, feeds, ["x"])
    assert [v.name for v in fwd.graph.outputs] == ["y", "res_0"]
    assert [v.name for v in lin.graph.inputs] == ["res_0", "fwd_x", "W"]
    assert list(lin.graph.initializers) == ["W"]


def test_real_cnn_against_jvp() -> None:
    """SqueezeNet (light zoo, IR 3, opset 8 converted): by image and a weight, against jvp (which
    test_zoo checks against float64 differences), and linear in the direction."""
    model = zoo.load("squeezenet")
    image_value = zoo.image_input(model)
    image = str(image_value.name)
    weight = zoo.weight_names(model)[0]
    x = np.random.default_rng(0).standard_normal([int(d) for d in image_value.shape.dims])
    feeds = {image: x.astype(np.float32)}
    fwd, lin = linearized(model, [image, weight])
    assert_linear_structure(lin)
    jvp = onnax.jvp(model, [image, weight])
    init = {weight: model.graph.initializers[weight].const_value.numpy()}
    v, w = tangents_for(lin, {**feeds, **init}, 1), tangents_for(lin, {**feeds, **init}, 2)
    _, got_v = apply_linear(fwd, lin, feeds, v)
    _, got_w = apply_linear(fwd, lin, feeds, w)
    _, got_sum = apply_linear(fwd, lin, feeds, {k: v[k] + 2 * w[k] for k in v})
    want = run(jvp, {**feeds, **v})
    for y, value in got_v.items():
        scale = np.abs(want[y]).max()
        np.testing.assert_allclose(value, want[y], rtol=1e-4, atol=1e-5 * scale, err_msg=y)
        np.testing.assert_allclose(
            got_sum[y], value + 2 * got_w[y], rtol=1e-4, atol=1e-5 * scale, err_msg=y
        )


@pytest.mark.parametrize(
    "name",
    ["scan_matmul_weight", "scan_states_axes_directions", "lstm", "gru", "if_then", "if_else"],
)
def test_bodies_do_not_recompute_the_primal(name: str) -> None:
    """A linear Scan reads the per-iteration primal values (``1 - tanh²``, the LSTM gates) that a
    residual Scan of the forward model stacked; a linear If reads its branch's ``cos(x)`` or
    ``1 - tanh²`` from a residual If: no activation is left in the linear model."""
    if name in ("lstm", "gru"):
        model, feeds = torch_model(f"{name}_2layer_bidir")
    else:
        case = next(c for c in CASES if c.name == name)
        model = case.model("double", 21)
        feeds = case.feeds(model)
    fwd, lin = check_against_oracles(model, feeds)
    op = "If" if name.startswith("if") else "Scan"
    assert op in {n.op_type for n in lin.graph}
    assert not {n.op_type for n in lin.graph.all_nodes()} & {"Tanh", "Sigmoid", "Sin", "Cos"}
    # One residual node in the forward model beside each primal one.
    assert sum(n.op_type == op for n in fwd.graph) == 2 * sum(n.op_type == op for n in lin.graph)


def test_the_linear_model_composes_with_vmap_and_vjp() -> None:
    """The linear model is a model like any other: vmap over the tangent gives J·V (against a
    loop of single runs), and its vjp is Jᵀ (the adjoint identity <u, J v> = <Jᵀ u, v>)."""
    model, feeds = torch_model("mlp")
    fwd, lin = linearize(model)
    forward = run(fwd, feeds)
    residuals = {v.name: forward[v.name] for v in lin.graph.inputs if v.name in forward}
    axes = {str(v.name): (0 if v.name == "fwd_x" else None) for v in lin.graph.inputs}
    batched = onnax.vmap(lin, in_axes=axes)
    directions = [tangents_for(lin, feeds, seed)["fwd_x"] for seed in range(3)]
    got = run(batched, {**residuals, "fwd_x": np.stack(directions)})
    (y,) = got
    for k, v in enumerate(directions):
        single = run(lin, {**residuals, "fwd_x": v})[y]
        np.testing.assert_allclose(got[y][k], single, rtol=1e-5, atol=1e-6)
    transpose = onnax.vjp(lin, inputs=["fwd_x"], outputs=[y])
    rng = np.random.default_rng(9)
    u = rng.standard_normal(got[y][0].shape).astype(np.float32)
    v = directions[0]
    jv = run(lin, {**residuals, "fwd_x": v})[y]
    jtu = run(transpose, {**residuals, "fwd_x": v, f"adj_{y}": u})["adj_fwd_x"]
    lhs, rhs = float(np.vdot(u, jv)), float(np.vdot(jtu, v))
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs)), (lhs, rhs)
