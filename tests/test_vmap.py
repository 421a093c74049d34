"""vmap: the pass, its diagnostics, its compositions, and what is built from it."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from oracles import check_model_valid, check_vmap, fd_jvp, run

MLP = """
<ir_version: 10, opset_import: ["" : 18]>
mlp (double[4] x, double[2] target) => (double loss, double[2] out)
  <double[4, 3] w1 = {w1}, double[3] b1 = {b1}, double[3, 2] w2 = {w2}> {{
    h0 = MatMul(x, w1)
    h1 = Add(h0, b1)
    h = Tanh(h1)
    out = MatMul(h, w2)
    e = Sub(out, target)
    se = Mul(e, e)
    loss = ReduceSum <keepdims = 0> (se)
}}
"""


def mlp() -> ir.Model:
    rng = np.random.default_rng(0)

    def arr(*shape: int) -> str:
        return "{" + ", ".join(f"{v:.5f}" for v in rng.standard_normal(shape).reshape(-1)) + "}"

    return ir.from_onnx_text(MLP.format(w1=arr(4, 3), b1=arr(3), w2=arr(3, 2)))


def example() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal(4), "target": rng.standard_normal(2)}


def stacked(batch: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {"x": rng.standard_normal((batch, 4)), "target": rng.standard_normal((batch, 2))}


def inits(m: ir.Model) -> dict[str, np.ndarray]:
    return {n: v.const_value.numpy() for n, v in m.graph.initializers.items()}


# ------------------------------------------------------------------------- the pass
@pytest.mark.parametrize("in_axes", [0, (0, None), {"x": 0}, (1, 1)])
def test_mlp_against_loop(in_axes) -> None:
    feeds = example()
    check_vmap(mlp(), feeds, in_axes=in_axes, out_axes=0)
    check_vmap(mlp(), feeds, in_axes=in_axes, out_axes=(0, -1))


def test_batch_dimension_is_symbolic_unless_axis_size_is_given() -> None:
    v = onnax.vmap(mlp(), in_axes=(0, None))
    assert not isinstance(v.graph.inputs[0].shape[0], int)
    assert v.graph.inputs[0].shape[1] == 4
    assert [d for d in v.graph.outputs[1].shape.dims][1] == 2
    v = onnax.vmap(mlp(), in_axes=(0, None), axis_size=5)
    assert v.graph.inputs[0].shape[0] == 5
    check_vmap(mlp(), example(), in_axes=(0, None), axis_size=3, batch=3)


def test_source_untouched_and_deterministic() -> None:
    m = mlp()
    before = ir.to_proto(m).SerializeToString()
    a, b = onnax.vmap(m), onnax.vmap(m)
    assert ir.to_proto(m).SerializeToString() == before
    assert ir.to_proto(a).SerializeToString() == ir.to_proto(b).SerializeToString()


def test_hard_coded_reshape_is_batched() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[2, 3] x) => (double[3, 2] y) {
          s = Constant <value = int64[2] {3, 2}> ()
          r = Reshape(x, s)
          y = Relu(r)
        }"""
    )
    check_vmap(m, {"x": np.random.default_rng(0).standard_normal((2, 3))})


def test_reshape_from_computed_shape() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[N, 6] x) => (double[N, 2, 3] y) {
          sh = Shape(x)
          n = Slice(sh, zero, one)
          tail = Constant <value = int64[2] {2, 3}> ()
          zero = Constant <value = int64[1] {0}> ()
          one = Constant <value = int64[1] {1}> ()
          target = Concat <axis = 0> (n, tail)
          y = Reshape(x, target)
        }"""
    )
    m.graph.sort()
    check_vmap(m, {"x": np.random.default_rng(0).standard_normal((4, 6))})


# --------------------------------------------------------------------- diagnostics
def test_in_axes_length_mismatch_lists_inputs() -> None:
    with pytest.raises(onnax.SelectionError) as err:
        onnax.vmap(mlp(), in_axes=(0, None, 0))
    assert "3 entries" in str(err.value) and "['x', 'target']" in str(err.value)


def test_axis_out_of_range_names_input_rank_and_axis() -> None:
    with pytest.raises(onnax.SelectionError) as err:
        onnax.vmap(mlp(), in_axes=(2, None))
    msg = str(err.value)
    assert "'x'" in msg and "rank 1" in msg and "axis 2" in msg and "[-2, 1]" in msg


def test_axis_size_sets_a_static_batch_dimension() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[3] a, double[4, 3] b) => (double[4, 3] y) { y = Add(a, b) }"""
    )
    v = onnax.vmap(m, in_axes=(0, 1), axis_size=2)
    assert v.graph.inputs[0].shape.dims == (2, 3) and v.graph.inputs[1].shape.dims == (4, 2, 3)
    with pytest.raises(ValueError, match="positive int"):
        onnax.vmap(m, axis_size=0)


def test_no_batched_input() -> None:
    with pytest.raises(onnax.SelectionError, match="no input is batched"):
        onnax.vmap(mlp(), in_axes=None)


def test_missing_batch_rule_names_op_node_input_and_remedy() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18, "my.ops" : 1]>
        g (double[3] a) => (double[3] y) { y = my.ops.Foo(a) }"""
    )
    m.graph[0].name = "foo_node"
    m.graph.outputs[0].type = ir.TensorType(ir.DataType.DOUBLE)
    m.graph.outputs[0].shape = ir.Shape([3])
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m)
    msg = str(err.value)
    assert "my.ops::Foo" in msg and "'foo_node'" in msg and "'a'" in msg and "in_axes None" in msg


# --------------------------------------------------------------------- randomness
RANDOM = """<ir_version: 10, opset_import: ["" : 18]>
g (double[3] a) => (double[3] y) {{ r = {op}(a)
 y = Add(a, r) }}"""


def test_random_op_refused_by_default() -> None:
    m = ir.from_onnx_text(RANDOM.format(op="RandomNormalLike"))
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m)
    assert "randomness='different'" in str(err.value) and "randomness='same'" in str(err.value)


def test_randomness_different_and_same() -> None:
    m = ir.from_onnx_text(RANDOM.format(op="RandomUniformLike"))
    a = np.zeros((4, 3))
    diff = run(onnax.vmap(m, randomness="different"), {"a": a})["y"]
    assert diff.shape == (4, 3) and len({tuple(r) for r in diff}) == 4
    same = run(onnax.vmap(m, randomness="same"), {"a": a})["y"]
    assert same.shape == (4, 3) and len({tuple(r) for r in same}) == 1
    shared = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[3] a) => (double[3] y) { r = RandomNormal <shape = [3], dtype = 11> ()
         y = Add(a, r) }"""
    )
    diff = run(onnax.vmap(shared, randomness="different"), {"a": a})["y"]
    assert len({tuple(r) for r in diff}) == 4
    same = run(onnax.vmap(shared, randomness="same"), {"a": a})["y"]
    assert len({tuple(r) for r in same}) == 1


# -------------------------------------------------------------------- compositions
def test_per_example_gradients_with_respect_to_initializers() -> None:
    m = mlp()
    g = onnax.grad(m, inputs=["w1", "b1", "w2"], output="loss")
    pe = onnax.vmap(g, in_axes=(0, 0))
    check_model_valid(pe)
    batch = stacked()
    got = run(pe, batch)
    for b in range(5):
        single = run(g, {"x": batch["x"][b], "target": batch["target"][b]})
        for p in ("w1", "b1", "w2"):
            np.testing.assert_allclose(
                got[f"grad_{p}"][b], single[f"grad_{p}"], rtol=1e-10, atol=1e-12
            )
    # and against finite differences of the loss of one example
    w = inits(m)
    d = np.random.default_rng(3).standard_normal(w["w1"].shape)
    fd = fd_jvp(m, {"x": batch["x"][2], "target": batch["target"][2]}, {"w1": d}, ["loss"])["loss"]
    np.testing.assert_allclose(np.sum(got["grad_w1"][2] * d), fd, rtol=1e-6)


def test_seed_example_per_example_gradients() -> None:
    x = ir.val("x", dtype=ir.DataType.FLOAT, shape=[2])
    weight = ir.val("weight", dtype=ir.DataType.FLOAT, shape=[2])
    tape = ir.tape.Tape()
    p = tape.op("Mul", [x, weight])
    loss = tape.op("ReduceSum", [tape.op("Mul", [p, p])], {"keepdims": 0})
    loss.name = "loss"
    m = ir.Model(
        ir.Graph([x, weight], [loss], nodes=tape.nodes, opset_imports={"": 18}, name="g"),
        ir_version=10,
    )
    per_example = onnax.vmap(onnax.grad(m, inputs=["weight"], output="loss"), in_axes=(0, None))
    xs = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], np.float32)
    w = np.array([0.5, -2.0], np.float32)
    res = run(per_example, {"x": xs, "weight": w})
    np.testing.assert_allclose(res["grad_weight"], 2 * xs * xs * w, rtol=1e-6)


def test_many_seed_directions_in_one_pass() -> None:
    m = mlp()
    j = onnax.jvp(m, inputs=["x"])
    many = onnax.vmap(
        j, in_axes={"fwd_x": 0}, out_axes={"loss": None, "out": None, "fwd_loss": 0, "fwd_out": 0}
    )
    check_model_valid(many)
    seeds = np.eye(4)
    res = run(many, {**example(), "fwd_x": seeds})
    assert res["loss"].shape == ()  # the primal is shared, computed once
    for k in range(4):
        single = run(j, {**example(), "fwd_x": seeds[k]})
        np.testing.assert_allclose(res["fwd_out"][k], single["fwd_out"], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(res["fwd_loss"][k], single["fwd_loss"], rtol=1e-10, atol=1e-12)


def test_vmap_of_vmap() -> None:
    m = mlp()
    vv = onnax.vmap(onnax.vmap(m, in_axes=(0, None)), in_axes=(1, None))
    check_model_valid(vv)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((3, 2, 4))  # [inner batch, outer batch, 4]
    res = run(vv, {"x": xs, "target": example()["target"]})
    assert res["out"].shape == (2, 3, 2)
    for i in range(3):
        for o in range(2):
            single = run(m, {"x": xs[i, o], "target": example()["target"]})
            np.testing.assert_allclose(res["out"][o, i], single["out"], rtol=1e-10)


def test_jvp_of_vmap() -> None:
    m = mlp()
    v = onnax.vmap(m, in_axes=(0, 0))
    jv = onnax.jvp(v, inputs=["x"])
    check_model_valid(jv)
    batch = stacked()
    t = np.random.default_rng(6).standard_normal(batch["x"].shape)
    got = run(jv, {**batch, "fwd_x": t})
    fd = fd_jvp(v, batch, {"x": t}, ["out", "loss"])
    np.testing.assert_allclose(got["fwd_out"], fd["out"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got["fwd_loss"], fd["loss"], rtol=1e-6, atol=1e-9)


def test_grad_of_reduced_vmap() -> None:
    m = mlp()
    v = onnax.vmap(m, in_axes=(0, 0), out_axes=(0, 0))
    reduced = v.clone()
    loss = reduced.graph.outputs[0]
    total = ir.node("ReduceSum", [loss], attributes={"keepdims": 0})
    reduced.graph.append(total)
    total.outputs[0].name = "total"
    total.outputs[0].dtype = ir.DataType.DOUBLE
    total.outputs[0].shape = ir.Shape([])
    reduced.graph.outputs.append(total.outputs[0])
    g = onnax.grad(reduced, inputs=["w1", "x"], output="total")
    check_model_valid(g)
    batch = stacked()
    got = run(g, batch)
    d = np.random.default_rng(7).standard_normal((4, 3))
    fd = fd_jvp(reduced, batch, {"w1": d}, ["total"])["total"]
    np.testing.assert_allclose(np.sum(got["grad_w1"] * d), fd, rtol=1e-6)
    dx = np.random.default_rng(8).standard_normal(batch["x"].shape)
    fd = fd_jvp(reduced, batch, {"x": dx}, ["total"])["total"]
    np.testing.assert_allclose(np.sum(got["grad_x"] * dx), fd, rtol=1e-6)


# --------------------------------------------------------- jacobians and hessians
def fd_jacobian(m: ir.Model, feeds, x: str, y: str) -> np.ndarray:
    base = feeds[x] if x in feeds else inits(m)[x]
    cols = []
    for k in range(base.size):
        e = np.zeros(base.size)
        e[k] = 1.0
        cols.append(fd_jvp(m, feeds, {x: e.reshape(base.shape)}, [y])[y])
    out = np.stack(cols, axis=-1)
    return out.reshape(out.shape[:-1] + base.shape)


@pytest.mark.parametrize("fn", ["jacfwd", "jacrev"])
def test_jacobians_match_finite_differences(fn: str) -> None:
    m = mlp()
    jm = getattr(onnax, fn)(m, inputs=["x", "w2"], outputs=["out", "loss"])
    check_model_valid(jm)
    names = [v.name for v in jm.graph.outputs]
    assert names == ["loss", "out", "jac_out_x", "jac_out_w2", "jac_loss_x", "jac_loss_w2"]
    assert [v.name for v in jm.graph.inputs] == ["x", "target"]
    got = run(jm, example())
    for y in ("out", "loss"):
        for x in ("x", "w2"):
            want = fd_jacobian(m, example(), x, y)
            assert got[f"jac_{y}_{x}"].shape == want.shape
            np.testing.assert_allclose(got[f"jac_{y}_{x}"], want, rtol=1e-6, atol=1e-8)
    # the basis is generated in the graph, not stored
    assert all(
        v.const_value is None or v.const_value.size < 16
        for v in jm.graph.initializers.values()
        if v.name not in inits(m)
    )


def test_jacobian_with_symbolic_dimension() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[N, 2] x) => (double[N, 2] y) { y = Tanh(x) }"""
    )
    jm = onnax.jacfwd(m)
    x = np.random.default_rng(0).standard_normal((3, 2))
    got = run(jm, {"x": x})["jac_y_x"]
    assert got.shape == (3, 2, 3, 2)
    np.testing.assert_allclose(got, fd_jacobian(m, {"x": x}, "x", "y"), rtol=1e-6, atol=1e-9)


def test_hessian_matches_finite_differences_of_gradient() -> None:
    m = mlp()
    h = onnax.hessian(m, inputs=["x", "w2"], output="loss")
    check_model_valid(h)
    assert [v.name for v in h.graph.outputs] == [
        "loss",
        "out",
        "hess_loss_x_x",
        "hess_loss_x_w2",
        "hess_loss_w2_x",
        "hess_loss_w2_w2",
    ]
    got = run(h, example())
    g = onnax.grad(m, inputs=["x", "w2"], output="loss")
    for a in ("x", "w2"):
        for b in ("x", "w2"):
            want = fd_jacobian(g, example(), b, f"grad_{a}")
            np.testing.assert_allclose(got[f"hess_loss_{a}_{b}"], want, rtol=1e-5, atol=1e-8)
    # symmetry of mixed partials
    np.testing.assert_allclose(
        got["hess_loss_x_w2"], np.moveaxis(got["hess_loss_w2_x"], -1, 0), rtol=1e-10
    )


def test_batch_sizes_that_disagree_are_reported_with_axis_size() -> None:
    # With axis_size the batch dimension is declared static on every batched input, so a feed
    # whose batch size disagrees is rejected at the boundary, naming the input and the axis.
    import onnxruntime as ort

    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (double[3] a, double[2, 3] b) => (double[2, 3] y) { y = Add(a, b) }"""
    )
    v = onnax.vmap(m, in_axes=(0, 1), axis_size=4)
    assert run(v, {"a": np.ones((4, 3)), "b": np.ones((2, 4, 3))})["y"].shape == (4, 2, 3)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument) as err:
        run(v, {"a": np.ones((4, 3)), "b": np.ones((2, 5, 3))})
    assert "input: b" in str(err.value) and "Got: 5 Expected: 4" in str(err.value)
