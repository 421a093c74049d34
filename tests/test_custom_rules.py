"""The public rule API (onnax.rules.register and its helpers) on custom-domain operators.

onnxruntime has no kernels for a custom domain, so the models run in onnx's reference evaluator
with Python implementations of the operators; the oracles are float64 central finite
differences of those runs, the adjoint identity, and a loop of single runs for vmap.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import onnax
from onnax.core.registry import DuplicateRuleError, OpRules, jvp_rules
from onnax.errors import UnsupportedOperatorError
from onnax.rules import register, register_elementwise, register_linear, register_zero_derivative

DOMAIN = "test.custom"


class Swishy(OpRun):
    op_domain = DOMAIN

    def _run(self, x):  # type: ignore[no-untyped-def]
        return (x / (1.0 + np.exp(-x)),)


class Scale(OpRun):
    """``y = x * s`` for a fixed per-column ``s`` (second input): linear in x, self-adjoint."""

    op_domain = DOMAIN

    def _run(self, x, s):  # type: ignore[no-untyped-def]
        return (x * s,)


class RollRight(OpRun):
    """Rolls the last axis by one to the right; its transpose rolls it left."""

    op_domain = DOMAIN

    def _run(self, x):  # type: ignore[no-untyped-def]
        return (np.roll(x, 1, axis=-1),)


class RollLeft(OpRun):
    op_domain = DOMAIN

    def _run(self, x):  # type: ignore[no-untyped-def]
        return (np.roll(x, -1, axis=-1),)


class Snap(OpRun):
    """Rounds to a grid of 0.5: piecewise constant."""

    op_domain = DOMAIN

    def _run(self, x):  # type: ignore[no-untyped-def]
        return (np.round(2 * x) / 2,)


class Cube(OpRun):
    """``y = x**3``, registered through the full ``register`` form with a jvp rule."""

    op_domain = DOMAIN

    def _run(self, x):  # type: ignore[no-untyped-def]
        return (x**3,)


CUSTOM_OPS = [Swishy, Scale, RollRight, RollLeft, Snap, Cube]


def _swish_derivative(em: onnax.core.emit.Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    # d/dx x s(x) = s + x s (1 - s) = s + y (1 - s)
    s = em.op("Sigmoid", [x])
    return em.op("Add", [s, em.op("Mul", [y, em.op("Sub", [em.scalar(1.0, like=x), s])])])


def _cube_jvp(
    em: onnax.core.emit.Emitter, node: ir.Node, tangents: object
) -> list[ir.Value | None]:
    (t,) = tangents  # type: ignore[misc]
    if t is None:
        return [None]
    x = node.inputs[0]
    assert x is not None
    square = em.op("Mul", [x, x])
    return [em.op("Mul", [t, em.op("Mul", [em.scalar(3.0, like=x), square])])]


register_elementwise(DOMAIN, "Swishy", _swish_derivative)
register_linear(DOMAIN, "Scale").batch(onnax.rules._patterns.broadcasting_batch)
register_linear(DOMAIN, "RollRight", transpose_op="RollLeft", elementwise=False).batch(
    onnax.rules._patterns.vectorized_batch
)
register_linear(DOMAIN, "RollLeft", transpose_op="RollRight", elementwise=False).batch(
    onnax.rules._patterns.vectorized_batch
)
register_zero_derivative(DOMAIN, "Snap")
register(
    DOMAIN,
    "Cube",
    jvp=_cube_jvp,
    batch=onnax.rules._patterns.vectorized_batch,
    shape=onnax.rules.custom.like_first_input,
)

MODEL = f"""
<ir_version: 10, opset_import: ["" : 21, "{DOMAIN}": 1]>
net (double[N, 3] X, double[3, 3] W, double[3] S) => (double L, double[N, 3] Y) {{
  H = MatMul(X, W)
  A = {DOMAIN}.Swishy(H)
  B = {DOMAIN}.Scale(A, S)
  C = {DOMAIN}.RollRight(B)
  D = {DOMAIN}.Snap(H)
  E = Add(C, D)
  Y = {DOMAIN}.Cube(E)
  L = ReduceSum<keepdims=0>(Y)
}}
"""


def model() -> ir.Model:
    return ir.from_proto(onnx.parser.parse_model(MODEL))


def run(m: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    proto = ir.to_proto(m)
    evaluator = ReferenceEvaluator(proto, new_ops=CUSTOM_OPS)
    names = [o.name for o in proto.graph.output]
    return dict(zip(names, evaluator.run(None, feeds), strict=True))


def feeds(batch: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, 3))
    w = rng.uniform(-1, 1, (3, 3))
    return {"X": x, "W": w, "S": rng.uniform(0.5, 1.5, 3)}


def central_difference(
    fn: Callable[[dict[str, np.ndarray]], np.ndarray],
    base: dict[str, np.ndarray],
    name: str,
    direction: np.ndarray,
    eps: float = 1e-6,
) -> np.ndarray:
    plus = {**base, name: base[name] + eps * direction}
    minus = {**base, name: base[name] - eps * direction}
    return (fn(plus) - fn(minus)) / (2 * eps)


def snap_safe(f: dict[str, np.ndarray], eps: float = 1e-3) -> bool:
    """No element of H = XW within eps of a jump of Snap (odd multiples of 0.25)."""
    r = (f["X"] @ f["W"] - 0.25) / 0.5
    return bool(np.all(np.abs(r - np.round(r)) * 0.5 > eps))


def safe_feeds(batch: int = 4) -> dict[str, np.ndarray]:
    for seed in range(100):
        f = feeds(batch, seed)
        if snap_safe(f):
            return f
    raise AssertionError("no seed keeps XW away from Snap's jumps")


def test_grad_matches_finite_differences() -> None:
    m, f = model(), safe_feeds()
    g = onnax.grad(m, inputs=["X", "W"], output="L")
    out = run(g, f)
    rng = np.random.default_rng(1)
    for name in ("X", "W"):
        direction = rng.standard_normal(f[name].shape)
        expected = central_difference(lambda q: run(m, q)["L"], f, name, direction)
        got = float(np.sum(out[f"grad_{name}"] * direction))
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8, err_msg=name)


def test_jvp_and_vjp_satisfy_the_adjoint_identity() -> None:
    m, f = model(), safe_feeds()
    rng = np.random.default_rng(2)
    v = {k: rng.standard_normal(f[k].shape) for k in ("X", "W")}
    u = rng.standard_normal((4, 3))
    fwd = run(onnax.jvp(m, inputs=["X", "W"], outputs="Y"), {**f, "fwd_X": v["X"], "fwd_W": v["W"]})
    expected = central_difference(lambda q: run(m, q)["Y"], f, "X", v["X"]) + central_difference(
        lambda q: run(m, q)["Y"], f, "W", v["W"]
    )
    np.testing.assert_allclose(fwd["fwd_Y"], expected, rtol=1e-6, atol=1e-8)
    rev = run(onnax.vjp(m, inputs=["X", "W"], outputs="Y"), {**f, "adj_Y": u})
    lhs = float(np.sum(u * fwd["fwd_Y"]))
    rhs = float(np.sum(rev["adj_X"] * v["X"]) + np.sum(rev["adj_W"] * v["W"]))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-10)


def test_vmap_matches_a_loop_of_single_runs() -> None:
    m = model()
    batched = onnax.vmap(m, in_axes={"X": 0, "W": None, "S": None})
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (5, 2, 3))
    f = {"W": rng.uniform(-1, 1, (3, 3)), "S": rng.uniform(0.5, 1.5, 3)}
    got = run(batched, {**f, "X": x})
    for k in range(5):
        single = run(m, {**f, "X": x[k]})
        np.testing.assert_allclose(got["Y"][k], single["Y"], rtol=1e-12)
        np.testing.assert_allclose(got["L"][k], single["L"], rtol=1e-12)


def test_hessian_vector_product_of_registered_rules() -> None:
    """jvp(grad): the rules' tangent computations are differentiated again (closure)."""
    m, f = model(), safe_feeds()
    g = onnax.grad(m, inputs="X", output="L")
    hvp = onnax.jvp(g, inputs="X", outputs="grad_X")
    v = np.random.default_rng(4).standard_normal(f["X"].shape)
    got = run(hvp, {**f, "fwd_X": v})["fwd_grad_X"]
    expected = central_difference(lambda q: run(g, q)["grad_X"], f, "X", v, eps=1e-5)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_per_example_gradients() -> None:
    """vmap(grad): per-example weight gradients against a loop of single gradients."""
    m = model()
    g = onnax.grad(m, inputs="W", output="L")
    per_example = onnax.vmap(g, in_axes={"X": 0, "W": None, "S": None})
    f = safe_feeds(batch=3)
    x = np.stack([f["X"]] * 2) + np.array([0.0, 1e-3])[:, None, None]
    got = run(per_example, {**f, "X": x})["grad_W"]
    for k in range(2):
        np.testing.assert_allclose(got[k], run(g, {**f, "X": x[k]})["grad_W"], rtol=1e-12)


def test_emitted_operators_have_rules() -> None:
    """The closure of the registered rules: every operator their derivatives emit has rules."""
    m = model()
    derived = onnax.jvp(onnax.grad(m, inputs=["X", "W"], output="L"), inputs="X")
    for node in derived.graph.all_nodes():
        if node.domain == DOMAIN:
            continue
        assert jvp_rules.lookup(node.domain, node.op_type, 21) is not None, node.op_type


def test_linear_declaration_covers_the_first_input_only() -> None:
    """Scale is declared linear in X; a derivative w.r.t. its factor S is refused, not zero."""
    with pytest.raises(UnsupportedOperatorError) as info:
        onnax.grad(model(), inputs="S", output="L")
    message = str(info.value)
    assert "test.custom::Scale" in message and "input 1" in message
    assert "register_linear" in message and "onnax.rules.register('test.custom', 'Scale'" in message


def test_duplicate_registration_raises() -> None:
    with pytest.raises(DuplicateRuleError, match=r"test\.custom::Swishy since_version 1"):
        register_elementwise(DOMAIN, "Swishy", _swish_derivative)


def test_register_needs_a_rule() -> None:
    with pytest.raises(ValueError, match=r"no rule given for test\.custom::Nothing.*jvp="):
        register(DOMAIN, "Nothing")


def test_registered_ops_are_owned_by_the_public_api() -> None:
    assert OpRules.owners()[(DOMAIN, "Swishy")] == {"onnax.rules.custom"}


def test_unknown_custom_op_points_to_the_public_api() -> None:
    text = MODEL.replace(f"{DOMAIN}.Cube(E)", f"{DOMAIN}.Unknown(E)")
    m = ir.from_proto(onnx.parser.parse_model(text))
    with pytest.raises(UnsupportedOperatorError) as info:
        onnax.grad(m, inputs="X", output="L")
    message = str(info.value)
    assert "test.custom::Unknown" in message
    assert "onnax.rules.register(" in message
    with pytest.raises(UnsupportedOperatorError) as info:
        onnax.vmap(m, in_axes={"X": 0, "W": None, "S": None})
    assert "test.custom::Unknown" in str(info.value)
    assert "onnax.rules.register(" in str(info.value)
