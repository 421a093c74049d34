"""onnax.unroll: Scan and Loop of a known trip count replaced by copies of their body.

Every unrolled model is run in onnxruntime against the original on the same inputs, and must
contain no Scan/Loop (where the trip count is known) or keep them (where it is not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from onnax.passes.unroll import UnrollPass
from oracles import run
from rules.test_recurrent import lower, make_feeds, make_model


def _ops(model: ir.Model) -> list[str]:
    return [n.op_type for g in model.graphs() for n in g]


def _check(
    text: str, feeds: dict[str, np.ndarray], *, unrolled: bool = True, **kwargs: int
) -> ir.Model:
    model = ir.from_onnx_text(text)
    result = onnax.unroll(model, **kwargs)
    onnx.checker.check_model(ir.to_proto(result), full_check=True)
    ops = _ops(result)
    if unrolled:
        assert "Scan" not in ops and "Loop" not in ops, ops
    expected, got = run(model, feeds), run(result, feeds)
    assert list(got) == list(expected)
    for name, value in expected.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    assert [v.name for v in result.graph.inputs] == [v.name for v in model.graph.inputs]
    return result


def _rand(*shape: int, dtype: type = np.float32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(dtype)


HEADER = '<ir_version: 10, opset_import: ["" : {opset}]>\n'

SCAN_FORWARD = """
g ({T}[2] s0, {T}[2, 3] p0, {T}[5, 2] X, {T}[2] W) => ({T}[2] s, {T}[2, 3] p, {T}[5, 2] Ys, {T}[5, 2, 3] Yp) {
  s, p, Ys, Yp = Scan <num_scan_inputs = 1, body = step ({T}[2] s_in, {T}[2, 3] p_in, {T}[2] x) => ({T}[2] s_out, {T}[2, 3] p_out, {T}[2] y1, {T}[2, 3] y2) {
    sx = Add(s_in, x)
    s_out = Mul(sx, W)
    ax = Constant <value = int64[1] {1}> ()
    xu = Unsqueeze(x, ax)
    p_out = Add(p_in, xu)
    y1 = Tanh(sx)
    y2 = Sin(p_out)
  }> (s0, p0, X)
}
"""


@pytest.mark.parametrize("opset", [13, 16, 21])
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_scan_forward_states_and_outputs(opset: int, dtype: str) -> None:
    text = HEADER.format(opset=opset) + SCAN_FORWARD.replace("{T}", dtype)
    np_dtype = np.float32 if dtype == "float" else np.float64
    feeds = {
        "s0": _rand(2, dtype=np_dtype),
        "p0": _rand(2, 3, dtype=np_dtype),
        "X": _rand(5, 2, dtype=np_dtype),
        "W": _rand(2, dtype=np_dtype, seed=1) * 0.5,
    }
    result = _check(text, feeds)
    assert _ops(result).count("Tanh") == 5


SCAN_DIRECTIONS = """
g (float[3] h0, float[3, 4] A, float[4, 2, 3] B) => (float[3] h, float[3, 4] Y1, float[4, 3, 2] Y2) {
  h, Y1, Y2 = Scan <num_scan_inputs = 2, scan_input_axes = [1, 0], scan_input_directions = [1, 0],
                    scan_output_axes = [-1, 0], scan_output_directions = [0, 1],
                    body = step (float[3] h_in, float[3] a, float[2, 3] b) => (float[3] h_out, float[3] y1, float[3, 2] y2) {
    r = ReduceSum <keepdims = 0> (b)
    t = Add(h_in, a)
    h_out = Mul(t, r)
    y1 = Identity(h_in)
    y2 = Transpose <perm = [1, 0]> (b)
  }> (h0, A, B)
}
"""


def test_scan_directions_and_axes() -> None:
    text = HEADER.format(opset=13) + SCAN_DIRECTIONS
    feeds = {"h0": _rand(3), "A": _rand(3, 4), "B": _rand(4, 2, 3) * 0.3}
    _check(text, feeds)


SCAN_PASSTHROUGH = """
g (float[3] h0, float[2, 3] X) => (float[3] h, float[2, 3] Y) {
  h, Y = Scan <num_scan_inputs = 1, body = step (float[3] h_in, float[3] x) => (float[3] h_out, float[3] y) {
    h_out = Identity(h_in)
    y = Identity(x)
  }> (h0, X)
}
"""


def test_scan_state_passes_through_to_a_graph_output() -> None:
    # The final state is the initial one, a graph input: the output must stay its own value.
    text = HEADER.format(opset=18) + SCAN_PASSTHROUGH
    _check(text, {"h0": _rand(3), "X": _rand(2, 3)})


SCAN_DYNAMIC = """
g (float[3] h0, float[N, 3] X) => (float[3] h) {
  h = Scan <num_scan_inputs = 1, body = step (float[3] h_in, float[3] x) => (float[3] h_out) {
    h_out = Add(h_in, x)
  }> (h0, X)
}
"""


def test_scan_of_unknown_length_is_left_in_place() -> None:
    text = HEADER.format(opset=18) + SCAN_DYNAMIC
    result = _check(text, {"h0": _rand(3), "X": _rand(4, 3)}, unrolled=False)
    assert _ops(result).count("Scan") == 1


LOOP = """
g (float[2] v0, float[2] c) => (float[2] v, float[4, 2] S, int64[4] I) {
  M = Constant <value = int64 {4}> ()
  T = Constant <value = bool {1}> ()
  v, S, I = Loop (M, T, v0) <body = body (int64 i, bool cond, float[2] v_in) => (bool cond_out, float[2] v_out, float[2] s, int64 i_out) {
    f = Cast <to = 1> (i)
    w = Mul(v_in, c)
    v_out = Add(w, f)
    s = Cos(v_out)
    i_out = Identity(i)
    cond_out = Identity(cond)
  }>
}
"""


@pytest.mark.parametrize("opset", [11, 13, 16, 21])
def test_loop_constant_trip_count(opset: int) -> None:
    text = HEADER.format(opset=opset) + LOOP
    result = _check(text, {"v0": _rand(2), "c": _rand(2, seed=3) * 0.5})
    assert _ops(result).count("Cos") == 4


LOOP_CONST_TRUE = """
g (float[2] v0) => (float[2] v) {
  M = Constant <value = int64 {3}> ()
  v = Loop (M, , v0) <body = body (int64 i, bool cond, float[2] v_in) => (bool cond_out, float[2] v_out) {
    cond_out = Constant <value = bool {1}> ()
    v_out = Sin(v_in)
  }>
}
"""


def test_loop_without_condition_and_constant_true_body_condition() -> None:
    result = _check(HEADER.format(opset=18) + LOOP_CONST_TRUE, {"v0": _rand(2)})
    assert _ops(result).count("Sin") == 3


LOOP_DATA_DEPENDENT = """
g (float[2] v0, int64 n) => (float[2] v) {
  M = Constant <value = int64 {10}> ()
  T = Constant <value = bool {1}> ()
  v = Loop (M, T, v0) <body = body (int64 i, bool cond, float[2] v_in) => (bool cond_out, float[2] v_out) {
    cond_out = Less(i, n)
    v_out = Sin(v_in)
  }>
}
"""

LOOP_RUNTIME_COUNT = """
g (float[2] v0, int64 n) => (float[2] v) {
  T = Constant <value = bool {1}> ()
  v = Loop (n, T, v0) <body = body (int64 i, bool cond, float[2] v_in) => (bool cond_out, float[2] v_out) {
    cond_out = Identity(cond)
    v_out = Sin(v_in)
  }>
}
"""

LOOP_FALSE_START = """
g (float[2] v0) => (float[2] v) {
  M = Constant <value = int64 {3}> ()
  F = Constant <value = bool {0}> ()
  v = Loop (M, F, v0) <body = body (int64 i, bool cond, float[2] v_in) => (bool cond_out, float[2] v_out) {
    cond_out = Identity(cond)
    v_out = Sin(v_in)
  }>
}
"""


@pytest.mark.parametrize(
    "text", [LOOP_DATA_DEPENDENT, LOOP_RUNTIME_COUNT, LOOP_FALSE_START], ids=["cond", "m", "false"]
)
def test_loop_that_may_stop_early_is_left_in_place(text: str) -> None:
    model_text = HEADER.format(opset=18) + text
    result = _check(model_text, {"v0": _rand(2), "n": np.array(3, np.int64)}, unrolled=False)
    assert _ops(result).count("Loop") == 1
    assert "Sin" in _ops(result)


NESTED = """
g (float[2] v0, float[3, 2] X, bool flag) => (float[2] v, float[2, 2] S, float[2] z) {
  M = Constant <value = int64 {2}> ()
  T = Constant <value = bool {1}> ()
  v, S = Loop (M, T, v0) <body = outer (int64 i, bool cond, float[2] v_in) => (bool cond_out, float[2] v_out, float[2] s) {
    cond_out = Identity(cond)
    acc, ys = Scan <num_scan_inputs = 1, body = inner (float[2] a_in, float[2] x) => (float[2] a_out, float[2] y) {
      a_out = Add(a_in, x)
      y = Mul(a_out, v_in)
    }> (v_in, X)
    a0 = Constant <value = int64[1] {0}> ()
    r = ReduceSum <keepdims = 0> (ys, a0)
    v_out = Tanh(acc)
    s = Add(r, acc)
  }>
  z = If (flag) <then_branch = yes () => (float[2] z_then) {
    N = Constant <value = int64 {2}> ()
    z_then = Loop (N, , v0) <body = b1 (int64 j, bool c1, float[2] w) => (bool c1_out, float[2] w_out) {
      c1_out = Identity(c1)
      w_out = Cos(w)
    }>
  }, else_branch = no () => (float[2] z_else) {
    z_else = Neg(v0)
  }>
}
"""


@pytest.mark.parametrize("flag", [True, False])
def test_nested_loops_and_if_branches(flag: bool) -> None:
    text = HEADER.format(opset=13) + NESTED
    feeds = {"v0": _rand(2), "X": _rand(3, 2) * 0.5, "flag": np.array(flag)}
    result = _check(text, feeds)
    assert _ops(result).count("Cos") == 2 and _ops(result).count("Tanh") == 2


def test_max_steps_leaves_long_loops() -> None:
    text = HEADER.format(opset=18) + LOOP
    result = _check(text, {"v0": _rand(2), "c": _rand(2)}, unrolled=False, max_steps=3)
    assert _ops(result).count("Loop") == 1


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_unrolled_recurrent_lowering_matches_onnxruntime(op: str) -> None:
    feeds = make_feeds(op, 2, lengths=[4, 1, 3])
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    model = make_model(op, {"hidden_size": 5, "direction": "bidirectional"}, feeds, outputs)
    flat = onnax.unroll(lower(model))
    assert "Scan" not in _ops(flat)
    expected, got = run(model, feeds), run(flat, feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5, err_msg=name)


def test_model_without_loops_is_unchanged() -> None:
    model = ir.from_onnx_text(
        HEADER.format(opset=18) + "g (float[2] x) => (float[2] y) { y = Sin(x) }"
    )
    result = UnrollPass()(model)
    assert not result.modified
    assert _ops(result.model) == ["Sin"]


def test_unrolled_gradient_of_a_torch_lstm() -> None:
    # grad's forward Scans record states that its backward Scans (reverse directions, captured
    # weights) read: the unrolled model computes the same loss and gradient without loops.
    model = ir.load(str(Path(__file__).parent / "data" / "torch_lstm_2layer_bidir.onnx"))
    grad = onnax.grad(model)
    assert "Scan" in _ops(grad)
    flat = onnax.unroll(grad)
    assert "Scan" not in _ops(flat) and "Loop" not in _ops(flat)
    feeds = {"x": _rand(5, 2, 3)}
    expected, got = run(grad, feeds), run(flat, feeds)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
