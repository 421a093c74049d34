"""``stop_gradient`` by name, against oracles that cut the stopped value out of the model.

The oracle model feeds the stopped value ``s`` from a graph input instead of computing it; its
value comes from a separate run of the source. Central differences of that cut model are the
derivatives with ``s`` held constant, which is what ``stop_gradient=[s]`` promises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from onnax.cli import main
from onnax.errors import SelectionError
from onnax.passes import GradPass, JvpPass, VjpPass
from oracles import contract_checked, fd_jvp, run, serialized, tolerances

Feeds = Mapping[str, np.ndarray]

# loss = sum((f(x; w) - stop(f(x2; w)))^2), f = tanh(x @ w): a target network sharing weights.
TARGET = """
<ir_version: 10, opset_import: ["" : 21]>
target (double[N, 3] x, double[N, 3] x2, double[3, 4] w) => (double loss) {
    h = MatMul(x, w)
    q = Tanh(h)
    h2 = MatMul(x2, w)
    tq = Tanh(h2)
    d = Sub(q, tq)
    dd = Mul(d, d)
    loss = ReduceSum <keepdims = 0> (dd)
}
"""

# y = x + stop(round(x) - x): rounds forward, passes the gradient straight through.
STRAIGHT_THROUGH = """
<ir_version: 10, opset_import: ["" : 21]>
ste (double[2, 3] x, double[2, 3] c) => (double[2, 3] y, double loss) {
    r = Round(x)
    delta = Sub(r, x)
    y = Add(x, delta)
    yc = Mul(y, c)
    sq = Mul(yc, yc)
    loss = ReduceSum <keepdims = 0> (sq)
}
"""

# A gated CNN whose second convolution's output is stopped: W2 only shapes the primal. FLOAT,
# as onnxruntime's CPU Conv has no DOUBLE kernel.
CNN = """
<ir_version: 10, opset_import: ["" : 21]>
cnn (float[1, 2, 5, 5] x, float[3, 2, 3, 3] w1, float[3, 3, 3, 3] w2) => (float loss, float[1, 3, 5, 5] z) {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
    h = Relu(c1)
    a = Conv <pads = [1, 1, 1, 1]> (h, w2)
    s = Sigmoid(a)
    z = Mul(h, s)
    zz = Mul(z, z)
    loss = ReduceSum <keepdims = 0> (zz)
}
"""

# Small and smooth for second derivatives: loss = sum(sin(x) * stop(x * x) + x * x * x). The
# second x * x is a value of its own, not stopped (common-subexpression elimination must not
# merge it into the stopped one before the walk).
SCALAR = """
<ir_version: 10, opset_import: ["" : 21]>
scalar (double[3] x) => (double loss) {
    sx = Sin(x)
    xx = Mul(x, x)
    p = Mul(sx, xx)
    x2 = Mul(x, x)
    cube = Mul(x2, x)
    t = Add(p, cube)
    loss = ReduceSum <keepdims = 0> (t)
}
"""


def _typed(model: ir.Model) -> ir.Model:
    """A copy whose intermediate values carry inferred types and shapes."""
    return ir.from_proto(onnx.shape_inference.infer_shapes(ir.to_proto(model), strict_mode=True))


def _value(graph: ir.Graph, name: str) -> ir.Value:
    return next(o for n in graph for o in n.outputs if o.name == name)


def stopped_value(model: ir.Model, feeds: Feeds, name: str) -> np.ndarray:
    """The value ``name`` takes in a run of ``model`` on ``feeds``."""
    probe = _typed(model)
    probe.graph.outputs.append(_value(probe.graph, name))
    return run(probe, feeds)[name]


def cut(model: ir.Model, names: Sequence[str]) -> ir.Model:
    """A copy where each named intermediate value is a graph input of the same name."""
    copy = _typed(model)
    g = copy.graph
    for name in names:
        v = _value(g, name)
        fed = ir.Value(name=name, type=v.type, shape=v.shape.copy() if v.shape else None)
        v.name = f"{name}__cut"
        v.replace_all_uses_with(fed, replace_graph_outputs=True)
        g.inputs.append(fed)
    return copy


def cut_feeds(model: ir.Model, feeds: Feeds, names: Sequence[str]) -> dict[str, np.ndarray]:
    return {**feeds, **{n: stopped_value(model, feeds, n) for n in names}}


def random_feeds(model: ir.Model, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        v.name: rng.standard_normal([d if isinstance(d, int) else 2 for d in v.shape.dims]).astype(
            v.dtype.numpy()
        )
        for v in model.graph.inputs
    }


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, **tolerances(np.asarray(got).dtype), err_msg=what)


def check_grad_against_cut(
    model: ir.Model, feeds: Feeds, inputs: Sequence[str], loss: str, stop: Sequence[str]
) -> ir.Model:
    """grad(model, stop_gradient=stop) against central differences of the cut model."""
    gm = contract_checked(lambda m: onnax.grad(m, inputs, loss, stop_gradient=stop), model)
    onnx.checker.check_model(ir.to_proto(gm), full_check=True)
    got = run(gm, feeds)
    oracle, fed = cut(model, stop), cut_feeds(model, feeds, stop)
    primal = run(model, feeds)
    for y, want in primal.items():
        assert_close(got[y], want, f"primal {y}")
    rng = np.random.default_rng(7)
    for x in inputs:
        direction = rng.standard_normal(feeds[x].shape)
        fd = fd_jvp(oracle, fed, {x: direction}, [loss])[loss]
        lhs = float(np.sum(got[f"grad_{x}"] * direction))
        assert lhs == pytest.approx(float(fd), rel=1e-6, abs=1e-7), x
    return gm


def test_target_network_grad_holds_the_target_constant() -> None:
    model = ir.from_onnx_text(TARGET)
    feeds = random_feeds(model, 0)
    gm = check_grad_against_cut(model, feeds, ["w", "x"], "loss", ["tq"])
    # Without the stop the gradient differs: the target's path contributes.
    plain = run(onnax.grad(model, ["w", "x"], "loss"), feeds)["grad_w"]
    assert not np.allclose(run(gm, feeds)["grad_w"], plain)
    # x2 reaches the loss only through the target: its gradient is exactly zero.
    g2 = run(onnax.grad(model, ["x2"], "loss", stop_gradient=["tq"]), feeds)["grad_x2"]
    np.testing.assert_array_equal(g2, np.zeros_like(feeds["x2"]))


def test_straight_through_estimator() -> None:
    model = ir.from_onnx_text(STRAIGHT_THROUGH)
    feeds = random_feeds(model, 1)
    feeds["x"] = feeds["x"] * 3  # away from the .5 ties of Round
    check_grad_against_cut(model, feeds, ["x", "c"], "loss", ["delta"])
    jm = contract_checked(lambda m: onnax.jvp(m, ["x"], ["y"], stop_gradient=["delta"]), model)
    t = np.random.default_rng(2).standard_normal((2, 3))
    got = run(jm, {**feeds, "fwd_x": t})
    np.testing.assert_array_equal(got["y"], np.round(feeds["x"]))
    # The straight-through derivative is the identity, where Round's own is zero.
    assert_close(got["fwd_y"], t, "fwd_y")


def test_cnn_intermediate_jvp_vjp_against_cut_and_adjoint() -> None:
    model = ir.from_onnx_text(CNN)
    feeds = random_feeds(model, 3)
    inputs, outputs, stop = ["x", "w1", "w2"], ["loss", "z"], ["a"]
    oracle, fed = cut(model, stop), cut_feeds(model, feeds, stop)
    rng = np.random.default_rng(4)
    tangents = {x: rng.standard_normal(feeds[x].shape).astype(np.float32) for x in inputs}
    seeds = {
        "loss": np.asarray(rng.standard_normal(()), np.float32),
        "z": rng.standard_normal((1, 3, 5, 5)).astype(np.float32),
    }

    jm = contract_checked(lambda m: onnax.jvp(m, inputs, outputs, stop_gradient=stop), model)
    jv = run(jm, {**feeds, **{f"fwd_{x}": t for x, t in tangents.items()}})
    fd = fd_jvp(oracle, fed, tangents, outputs)
    for y in outputs:
        assert_close(jv[f"fwd_{y}"], fd[y], f"fwd_{y}")

    vm = contract_checked(lambda m: onnax.vjp(m, inputs, outputs, stop_gradient=stop), model)
    vj = run(vm, {**feeds, **{f"adj_{y}": s for y, s in seeds.items()}})
    # W2 feeds only the stopped value: no cotangent reaches it.
    np.testing.assert_array_equal(vj["adj_w2"], np.zeros_like(feeds["w2"]))
    # The adjoint identity <u, J v> = <J^T u, v> between the two stopped models.
    lhs = sum(float(np.sum(seeds[y].astype(np.float64) * jv[f"fwd_{y}"])) for y in outputs)
    rhs = sum(float(np.sum(vj[f"adj_{x}"].astype(np.float64) * tangents[x])) for x in inputs)
    assert lhs == pytest.approx(rhs, rel=1e-5)
    # And J^T u against the cut model's differences, one direction per input.
    for x in inputs:
        d = fd_jvp(oracle, fed, {x: tangents[x]}, outputs)
        want = sum(float(np.sum(seeds[y] * d[y])) for y in outputs)
        got = float(np.sum(vj[f"adj_{x}"].astype(np.float64) * tangents[x]))
        assert got == pytest.approx(want, rel=3e-2, abs=3e-3), x


def test_jacobians_with_stop() -> None:
    model = ir.from_onnx_text(STRAIGHT_THROUGH)
    feeds = random_feeds(model, 5)
    for jac in (onnax.jacfwd, onnax.jacrev):
        jm = contract_checked(lambda m, j=jac: j(m, ["x"], ["y"], stop_gradient=["delta"]), model)
        got = run(jm, feeds)["jac_y_x"]
        assert_close(got, np.eye(6).reshape(2, 3, 2, 3), jac.__name__)


def _second_differences(model: ir.Model, feeds: Feeds, x: str, loss: str, h: float) -> np.ndarray:
    """The Hessian of ``loss`` in ``x`` by central second differences (float64)."""
    n = feeds[x].size
    hess = np.zeros((n, n))

    def f(di: int, si: float, dj: int, sj: float) -> float:
        shifted = feeds[x].astype(np.float64).ravel().copy()
        shifted[di] += si * h
        shifted[dj] += sj * h
        return float(run(model, {**feeds, x: shifted.reshape(feeds[x].shape)})[loss])

    for i in range(n):
        for j in range(n):
            hess[i, j] = (f(i, 1, j, 1) - f(i, 1, j, -1) - f(i, -1, j, 1) + f(i, -1, j, -1)) / (
                4 * h * h
            )
    return hess


def test_hessian_holds_the_stopped_value_constant() -> None:
    model = ir.from_onnx_text(SCALAR)
    feeds = {"x": np.array([0.3, -1.2, 0.7])}
    hm = contract_checked(lambda m: onnax.hessian(m, ["x"], "loss", stop_gradient=["xx"]), model)
    got = run(hm, feeds)["hess_loss_x_x"]
    oracle, fed = cut(model, ["xx"]), cut_feeds(model, feeds, ["xx"])
    want = _second_differences(oracle, fed, "x", "loss", 1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The analytic check of the oracle itself: d²/dx² (sin(x) x0² + x³) = -sin(x) x0² + 6x.
    x = feeds["x"]
    np.testing.assert_allclose(want, np.diag(-np.sin(x) * x * x + 6 * x), atol=1e-5)


def test_hvp_jvp_of_grad_with_stop_at_both_levels() -> None:
    model = ir.from_onnx_text(TARGET)
    feeds = random_feeds(model, 6)
    gm = onnax.grad(model, ["w"], "loss", stop_gradient=["tq"])
    hvp = contract_checked(lambda m: onnax.jvp(m, ["w"], stop_gradient=["tq"]), gm)
    v = np.random.default_rng(8).standard_normal((3, 4))
    got = run(hvp, {**feeds, "fwd_w": v})
    # The oracle: differences of the gradient of the cut model (itself checked against
    # differences in the target-network test), with the target fed, not recomputed.
    oracle, fed = cut(model, ["tq"]), cut_feeds(model, feeds, ["tq"])
    cut_grad = onnax.grad(oracle, ["w"], "loss")
    want = fd_jvp(cut_grad, fed, {"w": v}, ["grad_w"])["grad_w"]
    assert_close(got["fwd_grad_w"], want, "fwd_grad_w")


def test_stopped_output_has_zero_derivative_and_primal_is_unchanged() -> None:
    model = ir.from_onnx_text(CNN)
    feeds = random_feeds(model, 9)
    jm = onnax.jvp(model, ["x"], ["z"], stop_gradient=["z"])
    t = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    got = run(jm, {**feeds, "fwd_x": t})
    np.testing.assert_array_equal(got["fwd_z"], np.zeros((1, 3, 5, 5), np.float32))
    assert_close(got["z"], run(model, feeds)["z"], "z")
    assert_close(got["loss"], run(model, feeds)["loss"], "loss")


def test_stopped_inputs_leave_the_default_selection() -> None:
    model = ir.from_onnx_text(TARGET)
    gm = onnax.grad(model, stop_gradient=["x2", "x"])
    outputs = [v.name for v in gm.graph.outputs]
    assert outputs == ["loss", "grad_w"]
    vm = VjpPass(stop_gradient="x")(model).model
    assert [v.name for v in vm.graph.outputs] == ["loss", "adj_x2", "adj_w"]


def test_selected_and_stopped_is_refused() -> None:
    model = ir.from_onnx_text(TARGET)
    for build in (
        lambda: onnax.grad(model, ["w"], "loss", stop_gradient=["w"]),
        lambda: JvpPass(["x", "w"], stop_gradient=["w"])(model),
        lambda: onnax.jacrev(model, ["w"], stop_gradient="w"),
    ):
        with pytest.raises(SelectionError) as err:
            build()
        message = str(err.value)
        assert "'w' is both a selected input and in stop_gradient" in message
        assert "Remove it from `inputs`" in message and "or from `stop_gradient`" in message


def test_unknown_name_lists_close_matches_and_names() -> None:
    model = ir.from_onnx_text(TARGET)
    with pytest.raises(SelectionError) as err:
        onnax.vjp(model, ["w"], stop_gradient=["tqq"])
    message = str(err.value)
    assert message.startswith("vjp: stop_gradient names 'tqq', which is no value of the main")
    assert "Did you mean ['tq'" in message
    for name in ("x", "x2", "w", "h", "q", "h2", "tq", "d", "dd", "loss"):
        assert repr(name) in message
    assert "Pass one of those names." in message
    with pytest.raises(SelectionError, match=r"grad: stop_gradient must be value names \(str\)"):
        GradPass(["w"], stop_gradient=[3])(model)  # type: ignore[list-item]
    with pytest.raises(
        SelectionError, match=r"jvp: stop_gradient must be a name or a list of names, got int"
    ):
        onnax.jvp(model, ["w"], stop_gradient=3)  # type: ignore[arg-type]


def test_a_subgraph_value_is_refused() -> None:
    model = ir.from_onnx_text("""
<ir_version: 10, opset_import: ["" : 21]>
branchy (double[3] x, bool c) => (double[3] y) {
    y = If (c) <
        then_branch = g1 () => (double[3] t) { t = Sin(x) },
        else_branch = g2 () => (double[3] e) { e = Cos(x) }
    >
}
""")
    with pytest.raises(SelectionError) as err:
        onnax.jvp(model, ["x"], stop_gradient=["t"])
    message = str(err.value)
    assert "jvp: stop_gradient names 't', a value inside a subgraph" in message
    assert "expected a value of the main graph" in message
    # The control-flow node's output is a main-graph value and can be stopped.
    jm = onnax.jvp(model, ["x"], stop_gradient=["y"])
    x = np.array([0.1, 0.2, 0.3])
    got = run(jm, {"x": x, "c": np.array(True), "fwd_x": np.ones(3)})
    np.testing.assert_array_equal(got["fwd_y"], np.zeros(3))
    assert_close(got["y"], np.sin(x), "y")


def test_stop_changes_nothing_when_empty_and_is_deterministic() -> None:
    model = ir.from_onnx_text(CNN)
    assert serialized(onnax.grad(model, ["w1"], "loss", stop_gradient=[])) == serialized(
        onnax.grad(model, ["w1"], "loss")
    )
    first = serialized(onnax.grad(model, ["w1"], "loss", stop_gradient=["a", "a"]))
    assert first == serialized(onnax.grad(model, ["w1"], "loss", stop_gradient="a"))


def test_stop_on_the_output_of_an_expanded_operator() -> None:
    # Swish has no rule of its own: the walk differentiates its function body, which replaces
    # the node (and its output value) before the walk; the stop must survive that.
    model = ir.from_onnx_text("""
<ir_version: 11, opset_import: ["" : 24]>
swish (double[4] x) => (double[4] y) {
    s = Swish <alpha = 1.5> (x)
    y = Mul(s, x)
}
""")
    feeds = {"x": np.array([0.5, -1.0, 2.0, 0.1])}
    jm = contract_checked(lambda m: onnax.jvp(m, ["x"], stop_gradient=["s"]), model)
    t = np.array([1.0, -2.0, 0.5, 3.0])
    got = run(jm, {**feeds, "fwd_x": t})
    want = fd_jvp(cut(model, ["s"]), cut_feeds(model, feeds, ["s"]), {"x": t}, ["y"])["y"]
    assert_close(got["fwd_y"], want, "fwd_y")


def test_cli_stop_gradient(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = ir.from_onnx_text(TARGET)
    source, result = tmp_path / "m.onnx", tmp_path / "g.onnx"
    ir.save(model, source)
    args = ["grad", str(source), str(result), "--inputs", "w", "--output", "loss"]
    assert main([*args, "--stop-gradient", "tq"]) == 0
    expected = onnax.grad(model, ["w"], "loss", stop_gradient=["tq"])
    assert serialized(ir.load(result)) == serialized(expected)
    capsys.readouterr()
    assert main([*args, "--stop-gradient", "tq,nope"]) == 2
    assert "onnax grad: stop_gradient names 'nope'" in capsys.readouterr().err
    result.unlink()
    assert main([*args, "--stop-gradient", "tq", "--check"]) == 2
    assert "--check and --stop-gradient together" in capsys.readouterr().err
    assert not result.exists()


def test_per_example_gradients_with_stop() -> None:
    model = ir.from_onnx_text(TARGET)
    gm = onnax.grad(model, ["w"], "loss", stop_gradient=["tq"])
    per_example = contract_checked(
        lambda m: onnax.vmap(m, in_axes={"x": 0, "x2": 0, "w": None}), gm
    )
    rng = np.random.default_rng(11)
    xs, x2s, w = (
        rng.standard_normal((4, 2, 3)),
        rng.standard_normal((4, 2, 3)),
        rng.standard_normal((3, 4)),
    )
    got = run(per_example, {"x": xs, "x2": x2s, "w": w})["grad_w"]
    for k in range(4):
        # Each example against the cut model's differences, which check_grad_against_cut uses.
        feeds = {"x": xs[k], "x2": x2s[k], "w": w}
        oracle, fed = cut(model, ["tq"]), cut_feeds(model, feeds, ["tq"])
        basis = np.eye(12).reshape(12, 3, 4)
        want = [fd_jvp(oracle, fed, {"w": e}, ["loss"])["loss"] for e in basis]
        assert_close(got[k], np.reshape(want, (3, 4)), f"example {k}")


IF_MODEL = """
<ir_version: 10, opset_import: ["" : 21]>
branchy (double[3] x, bool c) => (double[3] y) {
    b = If (c) <
        then_branch = g1 () => (double[3] t) { t = Sin(x) },
        else_branch = g2 () => (double[3] e) { e = Cos(x) }
    >
    y = Mul(b, x)
}
"""


@pytest.mark.parametrize("cond", [True, False])
def test_stopped_control_flow_output_in_forward_and_reverse_mode(cond: bool) -> None:
    # Forward mode replaces the If by one computing primal and tangent; reverse mode keeps it
    # and adds a linear If beside it: both must leave the stopped output without a tangent.
    model = ir.from_onnx_text(IF_MODEL)
    feeds = {"x": np.array([0.4, -0.9, 1.3]), "c": np.array(cond)}
    oracle, fed = cut(model, ["b"]), cut_feeds(model, feeds, ["b"])
    t, u = np.array([1.0, 0.5, -2.0]), np.array([0.3, -1.0, 0.7])
    jm = contract_checked(lambda m: onnax.jvp(m, ["x"], stop_gradient=["b"]), model)
    got = run(jm, {**feeds, "fwd_x": t})["fwd_y"]
    assert_close(got, fd_jvp(oracle, fed, {"x": t}, ["y"])["y"], "fwd_y")
    vm = contract_checked(lambda m: onnax.vjp(m, ["x"], stop_gradient=["b"]), model)
    adj = run(vm, {**feeds, "adj_y": u})["adj_x"]
    assert float(adj @ t) == pytest.approx(float(u @ got), rel=1e-12)
