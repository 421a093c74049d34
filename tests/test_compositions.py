"""Transforms of transformed models, against finite differences of the inner model."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from oracles import check_adjoint, check_jvp, check_model_valid, fd_jvp, run

MLP = """
<ir_version: 10, opset_import: ["" : {opset}]>
mlp ({T}[N, 4] x, {T}[N, 2] target) => ({T} loss)
  <{T}[4, 8] w1 = {w1}, {T}[8] b1 = {b1}, {T}[8, 2] w2 = {w2}, {T}[2] b2 = {b2}> {{
    h0 = MatMul(x, w1)
    h1 = Add(h0, b1)
    h = Tanh(h1)
    o0 = MatMul(h, w2)
    o = Add(o0, b2)
    e = Sub(o, target)
    se = Mul(e, e)
    loss = ReduceMean <keepdims = 0> (se)
}}
"""


def mlp(dtype: str = "double", opset: int = 18) -> ir.Model:
    rng = np.random.default_rng(42)

    def arr(*shape: int) -> str:
        return "{" + ", ".join(f"{v:.6f}" for v in rng.standard_normal(shape).reshape(-1)) + "}"

    return ir.from_onnx_text(
        MLP.format(T=dtype, opset=opset, w1=arr(4, 8), b1=arr(8), w2=arr(8, 2), b2=arr(2))
    )


def feeds(dtype=np.float64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "x": rng.standard_normal((5, 4)).astype(dtype),
        "target": rng.standard_normal((5, 2)).astype(dtype),
    }


PARAMS = ["w1", "b1", "w2", "b2"]


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_hvp_of_mlp_matches_fd_of_gradient(opset: int) -> None:
    m = mlp(opset=opset)
    g = onnax.grad(m, inputs=PARAMS, output="loss")
    hvp = onnax.jvp(g, inputs=PARAMS, outputs=[f"grad_{p}" for p in PARAMS])
    check_model_valid(hvp)
    rng = np.random.default_rng(0)
    inits = {n: v.const_value.numpy() for n, v in m.graph.initializers.items()}
    direction = {p: rng.standard_normal(inits[p].shape) for p in PARAMS}
    got = run(hvp, {**feeds(), **{f"fwd_{p}": direction[p] for p in PARAMS}})
    want = fd_jvp(g, feeds(), direction, [f"grad_{p}" for p in PARAMS])
    for p in PARAMS:
        np.testing.assert_allclose(got[f"fwd_grad_{p}"], want[f"grad_{p}"], rtol=1e-6, atol=1e-8)


def test_gradient_of_mlp_matches_fd() -> None:
    m = mlp()
    check_jvp(m, feeds(), inputs=["x", *PARAMS])
    g = onnax.grad(m, inputs=["x", *PARAMS])
    rng = np.random.default_rng(1)
    inits = {n: v.const_value.numpy() for n, v in m.graph.initializers.items()}
    res = run(g, feeds())
    for p in ["x", *PARAMS]:
        ref = feeds()[p] if p == "x" else inits[p]
        d = rng.standard_normal(ref.shape)
        fd = fd_jvp(m, feeds(), {p: d}, ["loss"])["loss"]
        np.testing.assert_allclose(np.sum(res[f"grad_{p}"] * d), fd, rtol=1e-6, atol=1e-9)


def test_float32_mlp_grad() -> None:
    m = mlp("float")
    g = onnax.grad(m, inputs=PARAMS)
    check_model_valid(g)
    f64 = run(onnax.grad(mlp("double"), inputs=PARAMS), feeds())
    f32 = run(g, feeds(np.float32))
    for p in PARAMS:
        assert f32[f"grad_{p}"].dtype == np.float32
        np.testing.assert_allclose(f32[f"grad_{p}"], f64[f"grad_{p}"], rtol=1e-4, atol=1e-5)


def test_second_order_compositions_agree() -> None:
    m = mlp()
    j = onnax.jvp(m, inputs=["x"])
    check_jvp(j, {**feeds(), "fwd_x": np.ones((5, 4))}, inputs=["x", "fwd_x"])
    check_adjoint(j, {**feeds(), "fwd_x": np.ones((5, 4))}, inputs=["x", "fwd_x"])
    v = onnax.vjp(m, inputs=["x"])
    check_jvp(v, {**feeds(), "adj_loss": np.array(1.3)}, inputs=["x", "adj_loss"])


def test_readme_example_runs() -> None:
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S)
    assert block is not None
    import os
    import tempfile

    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            namespace: dict[str, object] = {}
            exec(compile(block.group(1), "README.md", "exec"), namespace)
        finally:
            os.chdir(cwd)
    hvp = namespace["hvp"]
    check_model_valid(hvp)
    per_example = namespace["per_example"]
    check_model_valid(per_example)
    xs = np.array([[1.0, 2.0], [3.0, -1.0]], np.float32)
    w0 = np.array([0.5, -1.0], np.float32)
    got = run(per_example, {"x": xs, "weight": w0})["grad_weight"]
    np.testing.assert_allclose(got, 2 * xs * xs * w0, rtol=1e-6)
    x, w, v = (
        np.array([1.0, 2.0], np.float32),
        np.array([0.5, -1.0], np.float32),
        np.array([1.0, 0.0], np.float32),
    )
    res = run(hvp, {"x": x, "weight": w, "fwd_weight": v})
    np.testing.assert_allclose(res["grad_weight"], 2 * x * x * w, rtol=1e-6)
    np.testing.assert_allclose(res["fwd_grad_weight"], 2 * x * x * v, rtol=1e-6)
