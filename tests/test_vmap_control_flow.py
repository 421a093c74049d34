"""vmap through control flow: If, Scan and Loop, nested, with implicit capture.

The oracle is a loop of single-example onnxruntime runs of the original model, stacked
(``check_vmap`` for perturbed copies of one example, ``check_examples`` for hand-picked examples
that take different branches or run different numbers of iterations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from oracles import check_jvp, check_model_valid, check_vjp, check_vmap, fd_jvp, run

DTYPES = ("float", "double")
OPSETS = (11, 13, 16, 21)
NP = {"float": np.float32, "double": np.float64}


def build(text: str, dtype: str, opset: int) -> ir.Model:
    header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
    return ir.from_onnx_text(header + text.replace("{T}", dtype))


def check_examples(
    model: ir.Model,
    examples: Sequence[Mapping[str, np.ndarray]],
    in_axes: Mapping[str, int | None],
    randomness: str = "error",
) -> dict[str, np.ndarray]:
    """vmap against single runs of hand-picked examples; returns the single results stacked.

    Inputs missing from ``in_axes`` are shared and must be equal in every example.
    """
    vm = onnax.vmap(model, in_axes=dict(in_axes), out_axes=0, randomness=randomness)
    check_model_valid(vm)
    feeds: dict[str, np.ndarray] = {}
    for name in examples[0]:
        axis = in_axes.get(name)
        if axis is None:
            for ex in examples[1:]:
                np.testing.assert_array_equal(ex[name], examples[0][name])
            feeds[name] = np.asarray(examples[0][name])
        else:
            feeds[name] = np.stack([np.asarray(ex[name]) for ex in examples], axis=axis)
    got = run(vm, feeds)
    singles = [run(model, dict(ex)) for ex in examples]
    stacked = {}
    for name in singles[0]:
        want = np.stack([s[name] for s in singles])
        assert got[name].shape == want.shape, (name, got[name].shape, want.shape)
        if np.issubdtype(want.dtype, np.floating):
            tol = 1e-10 if want.dtype == np.float64 else 1e-5
            np.testing.assert_allclose(got[name], want, rtol=tol, atol=tol, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], want, err_msg=name)
        stacked[name] = want
    return stacked


def params(opsets: Sequence[int] = OPSETS) -> list[tuple[str, int]]:
    return [(d, o) for o in opsets for d in DTYPES]


# ------------------------------------------------------------------------------------ If
IF_SHARED_COND = """
g (bool c, {T}[N, 3] x, {T}[3] w) => ({T}[N, 3] y, {T}[3] z) {
  y, z = If (c) <
    then_branch = t () => ({T}[N, 3] a, {T}[3] p) { a = Mul(x, w)
       p = Sin(w) },
    else_branch = e () => ({T}[N, 3] b, {T}[3] q) { b = Cos(x)
       q = Constant <value = {T}[3] {1, 2, 3}> () }
  >
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params())
def test_if_with_shared_condition(dtype: str, opset: int) -> None:
    m = build(IF_SHARED_COND, dtype, opset)
    rng = np.random.default_rng(0)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": rng.standard_normal((2, 3)).astype(NP[dtype])}
        feeds["w"] = rng.standard_normal(3).astype(NP[dtype])
        # w is read by the branches only (implicit capture): batched and shared.
        check_vmap(m, feeds, in_axes=(None, 0, None))
        check_vmap(m, feeds, in_axes=(None, 1, 0))
        # z is batched in one branch and a constant in the other.
        check_vmap(m, feeds, in_axes=(None, None, 0), out_axes=(0, -1))


IF_BATCHED_COND = """
g ({T}[N, 2] x, {T}[2] w) => ({T}[N, 2] y, {T}[2] z, int64 k, bool f) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  y, z, k, f = If (c) <
    then_branch = t () => ({T}[N, 2] a, {T}[2] p, int64 ka, bool fa) { a = Mul(x, w)
       p = Constant <value = {T}[2] {5, 6}> ()
       ka = Constant <value = int64 {1}> ()
       fa = Constant <value = bool {1}> () },
    else_branch = e () => ({T}[N, 2] b, {T}[2] q, int64 kb, bool fb) { b = Exp(x)
       q = Neg(w)
       kb = Constant <value = int64 {2}> ()
       fb = Constant <value = bool {0}> () }
  >
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params())
def test_if_with_batched_condition(dtype: str, opset: int) -> None:
    m = build(IF_BATCHED_COND, dtype, opset)
    t = NP[dtype]
    x = np.array([[0.5, 1.0], [0.2, -0.3]], t)
    examples = [{"x": x, "w": np.array([1.5, -2.0], t)}, {"x": -x, "w": np.array([0.5, 3.0], t)}]
    examples.append({"x": x * 2, "w": np.array([0.1, 0.2], t)})
    got = check_examples(m, examples, {"x": 0, "w": 0})
    assert list(got["k"]) == [1, 2, 1]  # the examples take different branches
    assert list(got["f"]) == [True, False, True]
    check_examples(m, examples, {"x": 1, "w": 0})
    shared_w = [{**ex, "w": examples[0]["w"]} for ex in examples]
    check_examples(m, shared_w, {"x": 0})


NESTED_IF = """
g ({T}[2] x) => ({T}[2] y) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  y = If (c) <
    then_branch = t () => ({T}[2] a) {
      f = ReduceMax <keepdims = 0> (x)
      one = Constant <value = {T} {1}> ()
      d = Less(f, one)
      a = If (d) <
        then_branch = tt () => ({T}[2] a1) { a1 = Sin(x) },
        else_branch = te () => ({T}[2] a2) { a2 = Sqrt(x) }
      >
    },
    else_branch = e () => ({T}[2] b) { b = Neg(x) }
  >
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params((13, 21)))
def test_nested_if_with_batched_conditions(dtype: str, opset: int) -> None:
    m = build(NESTED_IF, dtype, opset)
    t = NP[dtype]
    xs = [np.array(v, t) for v in ([0.2, 0.3], [1.5, 2.0], [-1.0, -2.0], [0.1, 4.0])]
    check_examples(m, [{"x": x} for x in xs], {"x": 0})


# ---------------------------------------------------------------------------------- Scan
SCAN = """
g ({T}[2] a0, {T}[3] b0, {T}[4, 2] xs, {T}[3, 4] zs) => ({T}[2] a, {T}[3] b, int64 k, {T}[2, 4] ys, {T}[4, 3] ws) {
  k0 = Constant <value = int64 {0}> ()
  a, b, k, ys, ws = Scan <
    num_scan_inputs = 2, scan_input_axes = [0, -1], scan_input_directions = [0, 1],
    scan_output_axes = [1, 0], scan_output_directions = [1, 0],
    body = body ({T}[2] ai, {T}[3] bi, int64 ki, {T}[2] x, {T}[3] z) => ({T}[2] ao, {T}[3] bo, int64 ko, {T}[2] y, {T}[3] w) {
      ao = Add(ai, x)
      t = ReduceSum <keepdims = 1> (ao)
      h = Constant <value = {T} {0.5}> ()
      bh = Mul(bi, h)
      zt = Mul(z, t)
      bs = Add(bh, zt)
      bo = Tanh(bs)
      one = Constant <value = int64 {1}> ()
      ko = Add(ki, one)
      y = Sin(ao)
      w = Mul(bo, h)
    }
  > (a0, b0, k0, xs, zs)
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params())
def test_scan_states_directions_and_axes(dtype: str, opset: int) -> None:
    m = build(SCAN, dtype, opset)
    rng = np.random.default_rng(1)
    t = NP[dtype]
    feeds = {
        "a0": rng.standard_normal(2).astype(t),
        "b0": rng.standard_normal(3).astype(t),
        "xs": rng.standard_normal((4, 2)).astype(t),
        "zs": rng.standard_normal((3, 4)).astype(t),
    }
    check_vmap(m, feeds, in_axes=0)
    check_vmap(m, feeds, in_axes=(1, 1, 1, 1))
    check_vmap(m, feeds, in_axes=(0, 0, 2, -1), out_axes=(1, 0, 0, -1, 2))
    # Only xs batched: a becomes batched through its update, then b through a (a fixpoint),
    # while the counter k stays shared.
    vm = check_vmap(m, feeds, in_axes=(None, None, 0, None))
    assert vm is not None
    # Only a scan input that no state reads: the states stay shared.
    check_vmap(m, feeds, in_axes=(None, None, None, 1))


SCAN_CAPTURE = """
g ({T}[2] s0, {T}[5, 2] xs, {T}[2] w) => ({T}[2] s, {T}[5, 2] ys) {
  s, ys = Scan <num_scan_inputs = 1, body = b ({T}[2] si, {T}[2] xi) => ({T}[2] so, {T}[2] yi) {
    m = Mul(si, w)
    so = Add(m, xi)
    yi = Mul(so, w)
  }> (s0, xs)
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params((11, 21)))
def test_scan_reading_a_batched_outer_value(dtype: str, opset: int) -> None:
    m = build(SCAN_CAPTURE, dtype, opset)
    rng = np.random.default_rng(2)
    t = NP[dtype]
    feeds = {
        "s0": rng.standard_normal(2).astype(t),
        "xs": rng.standard_normal((5, 2)).astype(t),
        "w": rng.uniform(0.2, 0.9, 2).astype(t),
    }
    check_vmap(m, feeds, in_axes=(None, None, 0))
    check_vmap(m, feeds, in_axes=(None, 1, 0))
    check_vmap(m, feeds, in_axes=(0, None, None))


# ---------------------------------------------------------------------------------- Loop
LOOP_FIXED = """
g (int64 M, {T}[2] x, {T}[2] w) => ({T}[2] y, {T}[2] u, {T}[K, 2] ys) {
  c = Constant <value = bool {1}> ()
  y, u, ys = Loop <body = b (int64 i, bool ci, {T}[2] v, {T}[2] p) => (bool co, {T}[2] v2, {T}[2] p2, {T}[2] si) {
     vw = Mul(v, w)
     v2 = Add(vw, x)
     p2 = Identity(p)
     si = Sin(v2)
     co = Identity(ci)
  }> (M, c, x, w)
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params())
def test_loop_with_shared_trip_count(dtype: str, opset: int) -> None:
    m = build(LOOP_FIXED, dtype, opset)
    rng = np.random.default_rng(3)
    t = NP[dtype]
    for trips in (3, 0):
        feeds = {
            "M": np.array(trips),
            "x": rng.standard_normal(2).astype(t),
            "w": rng.uniform(0.2, 0.9, 2).astype(t),
        }
        check_vmap(m, feeds, in_axes=(None, 0, None))
        check_vmap(m, feeds, in_axes=(None, None, 0), out_axes=(0, 0, 1))
        check_vmap(m, feeds, in_axes=(None, 0, 0), out_axes=(0, 0, 2))


LOOP_WHILE = """
g (int64 M, bool c, {T}[2] x, {T} limit) => ({T}[2] y, int64 n, {T}[2] w) {
  zero = Constant <value = int64 {0}> ()
  y, n, w = Loop <body = b (int64 i, bool ci, {T}[2] v, int64 k, {T}[2] p) => (bool co, {T}[2] v2, int64 k2, {T}[2] p2) {
     g = Constant <value = {T} {1.5}> ()
     d = Constant <value = {T} {0.25}> ()
     vg = Mul(v, g)
     v2 = Add(vg, d)
     s = ReduceSum <keepdims = 0> (v2)
     co = Less(s, limit)
     one = Constant <value = int64 {1}> ()
     k2 = Add(k, one)
     p2 = Identity(p)
  }> (M, c, x, zero, x)
}
"""


def while_examples(dtype: str) -> list[dict[str, np.ndarray]]:
    t = NP[dtype]
    rows = [
        (10, True, [0.1, 0.2]),  # 4 iterations
        (10, True, [2.0, 3.0]),  # stops after one iteration
        (2, True, [-1.0, -1.0]),  # stopped by the trip count
        (0, True, [1.0, 0.5]),  # zero iterations (2 with M = 10)
        (10, False, [-3.0, -3.0]),  # zero iterations: the condition is false (10 when true)
    ]
    return [
        {"M": np.array(m), "c": np.array(c), "x": np.array(x, t), "limit": np.array(4.0, t)}
        for m, c, x in rows
    ]


@pytest.mark.parametrize(("dtype", "opset"), params())
def test_loop_with_batched_termination(dtype: str, opset: int) -> None:
    m = build(LOOP_WHILE, dtype, opset)
    examples = while_examples(dtype)
    got = check_examples(m, examples, {"M": 0, "c": 0, "x": 0})
    assert got["n"].tolist() == [4, 1, 2, 0, 0]  # different numbers of iterations
    # Termination batched through the data only (shared trip count and condition).
    same = [{**ex, "M": np.array(10), "c": np.array(True)} for ex in examples]
    got = check_examples(m, same, {"x": 0})
    assert got["n"].tolist() == [4, 1, 10, 2, 10]
    # Through a batched limit read by the body (implicit capture).
    limits = [{**same[0], "limit": np.array(v, NP[dtype])} for v in (1, 4, 8, 20, 50)]
    got = check_examples(m, limits, {"limit": 0})
    assert got["n"].tolist() == [2, 4, 5, 7, 10]
    # Trip count alone batched.
    trips = [{**same[0], "M": np.array(v)} for v in (0, 1, 2, 3)]
    got = check_examples(m, trips, {"M": 0})
    assert got["n"].tolist() == [0, 1, 2, 3]


def test_loop_with_batched_termination_and_scan_outputs_is_refused() -> None:
    m = build(LOOP_FIXED, "double", 16)
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m, in_axes=(0, None, None))
    msg = str(err.value)
    assert "ai.onnx::Loop" in msg and "batched trip count" in msg and "'ys'" in msg
    assert "Remedy" in msg and "in_axes None" in msg


# ------------------------------------------------------------------------------- nesting
NESTED = """
g ({T}[2] x, {T}[3, 2] xs, {T}[2] w) => ({T}[2] y) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  M = Constant <value = int64 {2}> ()
  t = Constant <value = bool {1}> ()
  y = If (c) <
    then_branch = tb () => ({T}[2] r) {
      r = Loop <body = lb (int64 i, bool ci, {T}[2] v) => (bool co, {T}[2] vo) {
        co = Identity(ci)
        vo, acc = Scan <num_scan_inputs = 1, body = sb ({T}[2] st, {T}[2] xi) => ({T}[2] so, {T}[2] yi) {
          m = Mul(st, w)
          a = Add(m, xi)
          so = Tanh(a)
          yi = Identity(so)
        }> (v, xs)
      }> (M, t, x)
    },
    else_branch = eb () => ({T}[2] r2) { r2 = Mul(x, w) }
  >
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params((11, 16, 21)))
def test_scan_inside_loop_inside_if(dtype: str, opset: int) -> None:
    m = build(NESTED, dtype, opset)
    rng = np.random.default_rng(4)
    t = NP[dtype]
    xs = rng.standard_normal((3, 2)).astype(t)
    w = rng.uniform(0.2, 0.9, 2).astype(t)
    examples = [
        {"x": np.array(x, t), "xs": xs, "w": w} for x in ([0.5, 0.2], [-1.0, 0.3], [0.1, 0.1])
    ]
    check_examples(m, examples, {"x": 0})  # batched condition
    check_examples(m, examples[:1] * 3, {"w": 0})  # shared condition, w captured two levels down
    moved = [{**ex, "xs": xs + 0.1 * k} for k, ex in enumerate(examples)]
    check_examples(m, moved, {"x": 0, "xs": 1, "w": 0})


SCAN_IF = """
g ({T}[2] s0, {T}[4, 2] xs) => ({T}[2] s, {T}[4, 2] ys) {
  s, ys = Scan <num_scan_inputs = 1, body = b ({T}[2] si, {T}[2] xi) => ({T}[2] so, {T}[2] yi) {
    r = ReduceSum <keepdims = 0> (xi)
    z = Constant <value = {T} {0}> ()
    c = Greater(r, z)
    so = If (c) <
      then_branch = t () => ({T}[2] a) { a = Add(si, xi) },
      else_branch = e () => ({T}[2] b) { b = Mul(si, xi) }
    >
    yi = Identity(so)
  }> (s0, xs)
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params((11, 21)))
def test_if_with_batched_condition_inside_a_scan(dtype: str, opset: int) -> None:
    m = build(SCAN_IF, dtype, opset)
    rng = np.random.default_rng(5)
    t = NP[dtype]
    examples = [
        {"s0": rng.standard_normal(2).astype(t), "xs": rng.standard_normal((4, 2)).astype(t)}
        for _ in range(4)
    ]
    check_examples(m, examples, {"s0": 0, "xs": 0})
    check_examples(m, [{**ex, "s0": examples[0]["s0"]} for ex in examples], {"xs": 1})


LOOP_NESTED = """
g ({T}[2] x, {T}[3, 2] xs, {T} limit) => ({T}[2] y, int64 n) {
  M = Constant <value = int64 {20}> ()
  go = Constant <value = bool {1}> ()
  k0 = Constant <value = int64 {0}> ()
  y, n = Loop <body = lb (int64 i, bool ci, {T}[2] v, int64 k) => (bool co, {T}[2] vo, int64 ko) {
    s = ReduceSum <keepdims = 0> (v)
    one = Constant <value = {T} {1}> ()
    big = Greater(s, one)
    u = If (big) <
      then_branch = tb () => ({T}[2] a) {
        a, acc = Scan <num_scan_inputs = 1, body = sb ({T}[2] st, {T}[2] xi) => ({T}[2] so, {T}[2] yi) {
          m = Mul(st, xi)
          w = Add(m, v)
          so = Tanh(w)
          yi = Identity(so)
        }> (v, xs)
      },
      else_branch = eb () => ({T}[2] b) { b = Sin(v) }
    >
    step = Constant <value = {T} {0.1}> ()
    g = Sigmoid(u)
    inc = Add(g, step)
    vo = Add(v, inc)
    t = ReduceSum <keepdims = 0> (vo)
    co = Less(t, limit)
    k1 = Constant <value = int64 {1}> ()
    ko = Add(k, k1)
  }> (M, go, x, k0)
}
"""


@pytest.mark.parametrize(("dtype", "opset"), params((13, 16)))
def test_if_and_scan_inside_a_loop_with_batched_termination(dtype: str, opset: int) -> None:
    m = build(LOOP_NESTED, dtype, opset)
    rng = np.random.default_rng(6)
    t = NP[dtype]
    xs = rng.standard_normal((3, 2)).astype(t)
    starts = ([0.0, 0.1], [-2.0, -1.0], [1.5, 1.0], [-0.5, 0.2])
    examples = [{"x": np.array(x, t), "xs": xs, "limit": np.array(6.0, t)} for x in starts]
    got = check_examples(m, examples, {"x": 0})
    assert len(set(got["n"].tolist())) >= 3
    moved = [{**ex, "xs": xs * (1 + 0.2 * k)} for k, ex in enumerate(examples)]
    check_examples(m, moved, {"x": 0, "xs": 2})


# ---------------------------------------------------------------------------- randomness
RANDOM_IF = """
g ({T}[4] x) => ({T}[4] y) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  y = If (c) <
    then_branch = t () => ({T}[4] a) { a = RandomUniformLike(x) },
    else_branch = e () => ({T}[4] b) { b = Neg(x) }
  >
}
"""


def test_random_draws_under_a_batched_condition_follow_the_policy() -> None:
    m = build(RANDOM_IF, "double", 18)
    m.graph[-1].name = "pick"
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m)
    msg = str(err.value)
    assert "ai.onnx::If" in msg and "'pick'" in msg and "batched condition" in msg
    assert "ai.onnx::RandomUniformLike" in msg and "then_branch" in msg
    assert "randomness='different'" in msg and "randomness='same'" in msg
    x = np.array([[1.0, 2, 3, 4], [-1, -2, -3, -4], [2, 1, 0, 1], [3, 3, 3, 3]])
    taken = x.sum(axis=1) > 0
    for policy in ("different", "same"):
        y = run(onnax.vmap(m, randomness=policy), {"x": x})["y"]
        np.testing.assert_array_equal(y[~taken], -x[~taken])
        draws = y[taken]
        assert np.all((draws >= 0) & (draws < 1))
        distinct = len({tuple(r) for r in draws})
        assert distinct == (len(draws) if policy == "different" else 1)


RANDOM_LOOP = """
g ({T}[3] x) => ({T}[3] y) {
  M = Constant <value = int64 {2}> ()
  c = Constant <value = bool {1}> ()
  z = Constant <value = {T}[3] {0, 0, 0}> ()
  r = Loop <body = b (int64 i, bool ci, {T}[3] v) => (bool co, {T}[3] vo) {
    co = Identity(ci)
    u = RandomUniformLike(v)
    vo = Add(v, u)
  }> (M, c, z)
  y = Add(x, r)
}
"""


def test_random_draws_in_a_shared_loop_follow_the_policy() -> None:
    # Nothing batched reaches the loop: only the policy decides whether its draws differ.
    m = build(RANDOM_LOOP, "double", 18)
    x = np.zeros((4, 3))
    y = run(onnax.vmap(m, randomness="different"), {"x": x})["y"]
    assert y.shape == (4, 3) and len({tuple(r) for r in y}) == 4
    y = run(onnax.vmap(m, randomness="same"), {"x": x})["y"]
    assert y.shape == (4, 3) and len({tuple(r) for r in y}) == 1


# ------------------------------------------------------------------------------ refusals
IF_SHAPES = """
g ({T}[2] x) => ({T}[N] y) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  y = If (c) <
    then_branch = t () => ({T}[2] a) { a = Sin(x) },
    else_branch = e () => ({T}[3] b) { b = Constant <value = {T}[3] {1, 2, 3}> () }
  >
}
"""


def test_batched_condition_with_branch_shapes_that_differ_is_refused() -> None:
    m = build(IF_SHAPES, "double", 18)
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m)
    msg = str(err.value)
    assert "ai.onnx::If" in msg and "'y'" in msg and "same shape" in msg
    assert "[2]" in msg and "[3]" in msg and "Remedy" in msg
    # With a shared condition nothing needs the shapes to agree.
    m2 = build(IF_SHAPES.replace("c = Greater(s, zero)", "c = Greater(zero, zero)"), "double", 18)
    check_vmap(m2, {"x": np.array([0.3, 0.4])})


# --------------------------------------------------------------------------- composition
GRAD_SCAN = """
g ({T}[4, 2] xs, {T}[2] w, {T}[2] s0) => ({T} loss) {
  s, ys = Scan <num_scan_inputs = 1, scan_input_directions = [1], body = b ({T}[2] si, {T}[2] xi) => ({T}[2] so, {T}[2] yi) {
    m = Mul(si, w)
    a = Add(m, xi)
    so = Tanh(a)
    yi = Mul(so, xi)
  }> (s0, xs)
  q = Mul(ys, ys)
  l1 = ReduceSum <keepdims = 0> (q)
  l2 = ReduceSum <keepdims = 0> (s)
  loss = Add(l1, l2)
}
"""

GRAD_LOOP_IF = """
g ({T}[2] x, {T}[2] w) => ({T} loss) {
  M = Constant <value = int64 {3}> ()
  c = Constant <value = bool {1}> ()
  v, vs = Loop <body = b (int64 i, bool ci, {T}[2] v) => (bool co, {T}[2] vo, {T}[2] so) {
    co = Identity(ci)
    s = ReduceSum <keepdims = 0> (v)
    z = Constant <value = {T} {0}> ()
    p = Greater(s, z)
    vo = If (p) <
      then_branch = t () => ({T}[2] a) { m = Mul(v, w)
        a = Sin(m) },
      else_branch = e () => ({T}[2] b) { b = Add(v, w) }
    >
    so = Identity(vo)
  }> (M, c, x)
  q = Mul(vs, vs)
  l = ReduceSum <keepdims = 0> (q)
  loss = Add(l, l)
}
"""

GRAD_IF = """
g ({T}[2] x, {T}[2] w) => ({T} loss) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  y = If (c) <
    then_branch = t () => ({T}[2] a) { m = Mul(x, w)
      a = Tanh(m) },
    else_branch = e () => ({T}[2] b) { b = Mul(w, w) }
  >
  loss = ReduceSum <keepdims = 0> (y)
}
"""


@pytest.mark.parametrize("text", [GRAD_SCAN, GRAD_LOOP_IF, GRAD_IF], ids=["scan", "loop_if", "if"])
@pytest.mark.parametrize(("dtype", "opset"), params((13, 21)))
def test_per_example_gradients_through_control_flow(text: str, dtype: str, opset: int) -> None:
    m = build(text, dtype, opset)
    data = "xs" if "xs" in text else "x"
    g = onnax.grad(m, inputs=["w"], output="loss")
    rng = np.random.default_rng(7)
    t = NP[dtype]
    feeds = {v.name: rng.uniform(0.2, 1, list(v.shape.dims)).astype(t) for v in m.graph.inputs}
    # Examples on both sides of the branch conditions (sum(x) > 0, sum(v) > 0).
    scales = (1.0, -1.0, 0.5, -2.0)
    examples = [{**feeds, data: (feeds[data] * k).astype(t)} for k in scales]
    # Per-example gradients with respect to the shared w, against single grad runs.
    check_examples(g, examples, {data: 0})
    moved = [{**ex, "w": (ex["w"] + 0.1 * k).astype(t)} for k, ex in enumerate(examples)]
    check_examples(g, moved, {data: 0, "w": 0})


def test_operator_without_batch_rule_inside_a_body_is_named() -> None:
    m = ir.from_onnx_text(
        """<ir_version: 10, opset_import: ["" : 18, "my.ops" : 1]>
        g (int64 M, bool c, double[2] x) => (double[2] y) {
          y = Loop <body = b (int64 i, bool ci, double[2] v) => (bool co, double[2] vo) {
            co = Identity(ci)
            vo = my.ops.Foo(v)
          }> (M, c, x)
        }"""
    )
    m.graph[0].name = "outer_loop"
    body = m.graph[0].attributes["body"].as_graph()
    body[1].name = "foo_node"
    body.outputs[1].shape = ir.Shape([2])
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m, in_axes=(None, None, 0))
    msg = str(err.value)
    assert "ai.onnx::Loop" in msg and "'outer_loop'" in msg
    assert "my.ops::Foo" in msg and "'foo_node'" in msg and "in_axes None" in msg


GROWING = """
g (int64 M, {T}[1] x) => ({T}[K] y) {
  c = Constant <value = bool {1}> ()
  y = Loop <body = b (int64 i, bool ci, {T}[L] v) => (bool co, {T}[L2] vo) {
    co = Identity(ci)
    vo = Concat <axis = 0> (v, v)
  }> (M, c, x)
}
"""


def test_masked_loop_with_a_state_that_changes_shape_is_refused() -> None:
    m = build(GROWING, "double", 18)
    m.graph[-1].name = "grow"
    with pytest.raises(onnax.UnsupportedOperatorError) as err:
        onnax.vmap(m, in_axes=(0, None))
    msg = str(err.value)
    assert "ai.onnx::Loop" in msg and "'grow'" in msg and "batched trip count" in msg
    assert "'x'" in msg and "changes shape" in msg and "Remedy" in msg
    # A shared trip count runs the same iterations for every example: no masking needed.
    check_vmap(m, {"M": np.array(3), "x": np.array([0.5])}, in_axes=(None, 0))


IF_RUNTIME_SHAPE = """
g ({T}[2] x, {T}[P] w, int64[1] sh) => ({T}[Q] y) {
  s = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = {T} {0}> ()
  c = Greater(s, zero)
  y = If (c) <
    then_branch = t () => ({T}[2] a) { a = Sin(x) },
    else_branch = e () => ({T}[R] b) { b = Reshape(w, sh) }
  >
}
"""


def test_batched_condition_with_shapes_known_at_run_time_only() -> None:
    m = build(IF_RUNTIME_SHAPE, "double", 18)
    w, sh = np.array([0.5, -0.25]), np.array([2])
    examples = [
        {"x": np.array(x), "w": w, "sh": sh} for x in ([1.0, 2.0], [-1.0, 0.5], [-3.0, 1.0])
    ]
    check_examples(m, examples, {"x": 0})
    # Sizes that disagree fail at run time instead of broadcasting one branch silently.
    vm = onnax.vmap(m, in_axes=(0, None, None))
    with pytest.raises(Exception, match=r"[Rr]eshape"):
        run(
            vm,
            {"x": np.array([[1.0, 2.0], [-1.0, 0.5]]), "w": np.array([0.5]), "sh": np.array([1])},
        )


@pytest.mark.parametrize("fn", ["jacfwd", "jacrev"])
@pytest.mark.parametrize(
    "text", [GRAD_SCAN, GRAD_LOOP_IF, LOOP_WHILE], ids=["scan", "loop_if", "while"]
)
def test_jacobians_through_control_flow(text: str, fn: str) -> None:
    # jacfwd/jacrev map the derivative over seeds only: the primal loop stays shared.
    m = build(text, "double", 16)
    x, y = ("w", "loss") if "loss" in text else ("x", "y")
    rng = np.random.default_rng(8)
    feeds = {v.name: rng.uniform(0.2, 1, list(v.shape.dims)) for v in m.graph.inputs}
    if "limit" in feeds:
        feeds.update(M=np.array(10), c=np.array(True), limit=np.array(6.0))
    jm = getattr(onnax, fn)(m, inputs=[x], outputs=[y])
    check_model_valid(jm)
    got = run(jm, feeds)[f"jac_{y}_{x}"]
    base = feeds[x]
    columns = []
    for k in range(base.size):
        e = np.zeros(base.size)
        e[k] = 1.0
        columns.append(fd_jvp(m, feeds, {x: e.reshape(base.shape)}, [y])[y])
    want = np.stack(columns, axis=-1).reshape(got.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_vmap_of_vmap_through_a_loop_with_batched_termination() -> None:
    # The outer map masks the inner map's loop, whose mask is a boolean state.
    m = build(LOOP_WHILE, "double", 16)
    inner = onnax.vmap(m, in_axes={"M": 0, "c": 0, "x": 0})
    twice = onnax.vmap(inner, in_axes={"M": 1, "c": 1, "x": 1})
    check_model_valid(twice)
    examples = while_examples("double")
    trips = np.stack([[e["M"] for e in examples], [max(int(e["M"]) - 1, 0) for e in examples]], 1)
    conds = np.stack([[e["c"] for e in examples]] * 2, 1)
    xs = np.stack([[e["x"] for e in examples], [e["x"] * 0.5 for e in examples]], 1)
    limit = np.array(4.0)
    got = run(twice, {"M": trips, "c": conds, "x": xs, "limit": limit})
    counts = set()
    for i in range(len(examples)):
        for o in range(2):
            one = {"M": trips[i, o], "c": conds[i, o], "x": xs[i, o], "limit": limit}
            single = run(m, {k: np.asarray(v) for k, v in one.items()})
            for name, want in single.items():
                np.testing.assert_allclose(got[name][o, i], want, rtol=1e-12, atol=1e-12)
            counts.add(int(single["n"]))
    assert len(counts) >= 4


MAPPED = {
    "while": (LOOP_WHILE, {"M": 0, "c": 0, "x": 0}),
    "scan": (SCAN, 0),
    "if": (IF_BATCHED_COND, {"x": 0, "w": 0}),
    "nested": (LOOP_NESTED, {"x": 0}),
}


@pytest.mark.parametrize("name", list(MAPPED))
def test_derivatives_of_mapped_control_flow(name: str) -> None:
    # jvp and vjp of the batched models (masked loops, inlined branches) against differences.
    text, axes = MAPPED[name]
    mapped = onnax.vmap(build(text, "double", 16), in_axes=axes)
    rng = np.random.default_rng(9)
    feeds: dict[str, np.ndarray] = {}
    for v in mapped.graph.inputs:
        shape = [d if isinstance(d, int) else 4 for d in v.shape.dims]
        if v.dtype == ir.DataType.BOOL:
            feeds[v.name] = np.ones(shape, bool)
        elif v.dtype == ir.DataType.INT64:
            feeds[v.name] = np.array([5, 1, 0, 3]).reshape(shape)
        else:
            feeds[v.name] = rng.uniform(-0.5, 0.5, shape)
    if "limit" in feeds:
        feeds["limit"] = np.array(6.0 if name == "nested" else 4.0)
    check_jvp(mapped, feeds)
    check_vjp(mapped, feeds)
