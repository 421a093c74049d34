"""``remat=`` in reverse mode: the same gradients for less stored memory.

Oracles: the ``remat="store"`` model (today's reverse mode) run through onnxruntime, float64
central differences, and the structure of the result read off the graph alone: the forward sweep
is what the primal outputs depend on, and under ``"recompute"`` nothing outside it reads one of
its tensors (only inputs, initializers, constants and shape arithmetic).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.parser
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnax
from onnax.core.subgraphs import graph_attributes
from onnax.passes import GradPass, VjpPass
from onnax.passes.remat import RematError
from oracles import check_grad, run, serialized, session
from zoo import float64_twin

POLICIES: list[object] = ["recompute", ["MatMul", "Conv", "Gemm"], 0, 4096]
POLICY_IDS = ["recompute", "ops", "budget0", "budget4k"]


def _model(text: str, weights: dict[str, tuple[int, ...]], dtype: type = np.float32) -> ir.Model:
    rng = np.random.default_rng(0)
    if dtype is np.float64:
        text = text.replace("float", "double")
    proto = onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 17]>\n' + text)
    for name, shape in weights.items():
        data = (rng.standard_normal(shape) / np.sqrt(shape[-1] if shape else 1)).astype(dtype)
        if name.startswith("var"):
            data = 1.0 + np.abs(data)  # a variance
        proto.graph.initializer.append(onnx.numpy_helper.from_array(data, name))
    return ir.from_proto(proto)


MLP = """
mlp (float[4,8] x) => (float loss) {
  h1 = MatMul(x, w1)
  a1 = Add(h1, b1)
  t1 = Tanh(a1)
  h2 = MatMul(t1, w2)
  a2 = Add(h2, b2)
  t2 = Sigmoid(a2)
  h3 = MatMul(t2, w3)
  e = Exp(h3)
  s = Mul(e, h3)
  loss = ReduceSum <keepdims=0> (s)
}"""
MLP_W = {"w1": (8, 16), "b1": (16,), "w2": (16, 16), "b2": (16,), "w3": (16, 3)}

CNN = """
cnn (float[2,3,8,8] x) => (float loss) {
  c1 = Conv <pads=[1,1,1,1]> (x, k1)
  n1 = BatchNormalization (c1, g1, be1, mu1, var1)
  m1 = MaxPool <kernel_shape=[2,2], strides=[2,2]> (n1)
  r1 = Relu(m1)
  c2 = Conv <pads=[1,1,1,1]> (r1, k2)
  r2 = Relu(c2)
  gp = GlobalAveragePool(r2)
  f = Flatten(gp)
  y = Gemm <transB=1> (f, fc, fcb)
  s = Mul(y, y)
  loss = ReduceSum <keepdims=0> (s)
}"""
CNN_W = {"k1": (4, 3, 3, 3), "g1": (4,), "be1": (4,), "mu1": (4,), "var1": (4,)}
CNN_W |= {"k2": (5, 4, 3, 3)}
CNN_W |= {"fc": (3, 5), "fcb": (3,)}

TRANSFORMER = """
block (float[6,8] x) => (float loss) {
  n = LayerNormalization <axis=-1> (x, ln_g, ln_b)
  q = MatMul(n, wq)
  k = MatMul(n, wk)
  v = MatMul(n, wv)
  kt = Transpose <perm=[1,0]> (k)
  s = MatMul(q, kt)
  p = Softmax <axis=-1> (s)
  o = MatMul(p, v)
  h = Add(x, o)
  m = MatMul(h, w1)
  g = Tanh(m)
  z = MatMul(g, w2)
  zz = Mul(z, z)
  loss = ReduceSum <keepdims=0> (zz)
}"""
TRANSFORMER_W = {"ln_g": (8,), "ln_b": (8,), "wq": (8, 8), "wk": (8, 8), "wv": (8, 8)}
TRANSFORMER_W |= {"w1": (8, 16), "w2": (16, 8)}

IF = """
branchy (float[4,6] x, bool c) => (float loss) {
  h = MatMul(x, w)
  t = Tanh(h)
  y = If (c) <
    then_branch = g1 () => (float[4,6] a) { a = Sin(t) },
    else_branch = g2 () => (float[4,6] b) { b = Mul(t, t) }
  >
  e = Exp(y)
  loss = ReduceSum <keepdims=0> (e)
}"""
IF_W = {"w": (6, 6)}

LSTM = """
recurrent (float[5,2,3] x) => (float loss) {
  u = Tanh(x)
  ys, yh, yc = LSTM <hidden_size=4> (u, W, R)
  z = Sigmoid(ys)
  loss = ReduceSum <keepdims=0> (z)
}"""
LSTM_W = {"W": (1, 16, 3), "R": (1, 16, 4)}

SCAN = """
rnn (float[5,3] x, float[3] h0) => (float loss) {
  u = Tanh(x)
  hT, hs = Scan <num_scan_inputs=1, body=step (float[3] h, float[3] xt) => (float[3] hn, float[3] ho) {
    p = MatMul(h, R)
    q = Add(p, xt)
    hn = Tanh(q)
    ho = Identity(hn)
  }> (h0, u)
  z = Sigmoid(hs)
  loss = ReduceSum <keepdims=0> (z)
}"""
SCAN_W = {"R": (3, 3)}


def _feeds(model: ir.Model, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for v in model.graph.inputs:
        assert v.shape is not None and v.dtype is not None
        shape = tuple(int(d) for d in v.shape.numpy())
        if v.dtype == ir.DataType.BOOL:
            feeds[str(v.name)] = np.array(True)
        else:
            feeds[str(v.name)] = rng.standard_normal(shape).astype(v.dtype.numpy())
    return feeds


SOURCES = {
    "mlp": (MLP, MLP_W),
    "cnn": (CNN, CNN_W),
    "transformer": (TRANSFORMER, TRANSFORMER_W),
    "if": (IF, IF_W),
    "lstm": (LSTM, LSTM_W),
    "scan": (SCAN, SCAN_W),
}


def _build(name: str, dtype: type = np.float32) -> ir.Model:
    if name == "cnn" and dtype is np.float64:
        # onnxruntime has no float64 Conv or MaxPool: the twin lowers them.
        return float64_twin(_model(*SOURCES[name]))
    return _model(*SOURCES[name], dtype)


def _weights(model: ir.Model) -> list[str]:
    floats = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)
    inputs = [str(v.name) for v in model.graph.inputs if v.dtype in floats]
    return inputs + [n for n in model.graph.initializers if n not in ("mu1", "var1")]


def _swept(model: ir.Model) -> set[ir.Node]:
    """The nodes depending on a cotangent seed (an ``adj_`` input): the reverse sweep."""
    values = {v for v in model.graph.inputs if str(v.name).startswith("adj_")}
    nodes: set[ir.Node] = set()
    for node in model.graph:
        inner = [i for g in graph_attributes(node) for n in g.all_nodes() for i in n.inputs]
        if any(v is not None and v in values for v in [*node.inputs, *inner]):
            nodes.add(node)
            values.update(node.outputs)
    return nodes


def _foldable(value: ir.Value) -> bool:
    """Constants, shape arithmetic and what weights alone make (onnxruntime folds it)."""
    node = value.producer()
    if node is None:
        return value.is_initializer()
    if node.op_type in ("Constant", "Shape", "Size"):
        return True
    return all(i is None or _foldable(i) for i in node.inputs)


def _backward_reads(model: ir.Model) -> set[ir.Value]:
    """Forward tensors that the reverse sweep reads (not foldable ones, not primal outputs).

    The primal outputs live to the end of a run anyway.
    """
    swept = _swept(model)
    n_primal = sum(not str(v.name).startswith("adj_") for v in model.graph.outputs)
    outputs = set(model.graph.outputs[:n_primal])
    reads: set[ir.Value] = set()
    for node in swept:
        inner = [i for g in graph_attributes(node) for n in g.all_nodes() for i in n.inputs]
        for v in [*node.inputs, *inner]:
            if v is None or v in outputs or _foldable(v) or v.producer() in swept:
                continue
            if v.producer() is not None and v.producer().graph is model.graph:  # type: ignore[union-attr]
                reads.add(v)
    return reads


def _vjp(model: ir.Model, remat: object = "store") -> ir.Model:
    return onnax.vjp(model, _weights(model), ["loss"], remat=remat)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
@pytest.mark.parametrize("name", list(SOURCES))
def test_gradients_equal_the_store_model_and_finite_differences(name: str, policy: object) -> None:
    # float64, as the finite differences; onnxruntime has no float64 LSTM (the Scan case
    # covers finite differences through a recurrence).
    model = _build(name, np.float32 if name == "lstm" else np.float64)
    feeds = _feeds(model)
    inputs = _weights(model)
    store = run(onnax.grad(model, inputs), feeds)
    remat = onnax.grad(model, inputs, remat=policy)  # type: ignore[arg-type]
    got = run(remat, feeds)
    assert got.keys() == store.keys()
    for key, want in store.items():
        # onnxruntime's default level may fuse a clone differently from its forward copy
        # (Conv+BatchNormalization): float32 rounding, not a different result.
        np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-6, err_msg=key)
    if name != "lstm":
        check_grad(model, feeds, inputs, transformed=remat)


@pytest.mark.parametrize("name", list(SOURCES))
def test_recompute_reads_no_forward_intermediate(name: str) -> None:
    model = _build(name)
    assert _backward_reads(_vjp(model)), "the oracle sees the residuals of the store model"
    remat = _vjp(model, "recompute")
    # Control flow keeps its outputs stored (a second run of a loop is not a recomputation).
    allowed = {
        o for node in remat.graph if node.op_type in ("If", "Scan", "Loop") for o in node.outputs
    }
    assert _backward_reads(remat) <= allowed


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_a_policy_stores_only_the_listed_operators_outputs(name: str) -> None:
    model = _build(name)
    ops = ["MatMul", "Conv"]
    reads = _backward_reads(_vjp(model, ops))
    assert reads, "the listed operators' outputs are read"
    assert {v.producer().op_type for v in reads} <= set(ops)  # type: ignore[union-attr]


def test_store_is_byte_identical_to_the_default() -> None:
    for name in ("mlp", "cnn", "if"):
        model = _build(name)
        inputs = _weights(model)
        assert serialized(onnax.grad(model, inputs, remat="store")) == serialized(
            onnax.grad(model, inputs)
        )
        assert serialized(onnax.vjp(model, inputs, remat="store")) == serialized(
            onnax.vjp(model, inputs)
        )


def test_vjp_recompute_equals_store() -> None:
    model = _build("transformer")
    feeds = _feeds(model) | {"adj_loss": np.array(0.75, np.float32)}
    store = run(onnax.vjp(model, ["x", "wq", "w1"]), feeds)
    got = run(onnax.vjp(model, ["x", "wq", "w1"], remat="recompute"), feeds)
    for key, want in store.items():
        np.testing.assert_allclose(got[key], want, rtol=1e-6, atol=1e-7, err_msg=key)


def test_budget_keeps_the_most_expensive_per_byte_first() -> None:
    """A budget with room for the loss and one [4,3] activation keeps the MatMul output h3,
    not its elementwise neighbour e = Exp(h3) of the same size; a budget for everything reads
    what store reads."""
    model = _build("mlp")
    (kept,) = _backward_reads(_vjp(model, 4 + 4 * 3 * 4))
    assert kept.name == "h3"
    everything = {v.name for v in _backward_reads(_vjp(model, 1 << 40))}
    assert everything == {v.name for v in _backward_reads(_vjp(model))}


def _optimized(model: ir.Model, level: ort.GraphOptimizationLevel, feeds: dict[str, np.ndarray]):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        sess = ort.InferenceSession(
            ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        wanted = {i.name for i in sess.get_inputs()}
        outs = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
        nodes = Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
    return outs, nodes


LEVELS = [
    ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
]
CONTRACTIONS = ("MatMul", "Gemm", "FusedGemm", "FusedMatMul", "Conv", "FusedConv")


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("level", LEVELS, ids=lambda lv: str(lv).rsplit("_", 1)[-1])
def test_onnxruntime_keeps_the_recomputation(name: str, level: ort.GraphOptimizationLevel) -> None:
    """At every optimization level the results equal store's exactly, and the optimized
    session model still holds the recomputed contractions (CSE did not merge them back)."""
    model = _build(name)
    feeds = _feeds(model)
    inputs = _weights(model)
    store_out, store_nodes = _optimized(onnax.grad(model, inputs), level, feeds)
    remat_out, remat_nodes = _optimized(onnax.grad(model, inputs, remat="recompute"), level, feeds)
    for got, want in zip(remat_out, store_out, strict=True):
        if level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
            np.testing.assert_array_equal(got, want)
        else:
            # A fusion may apply to the forward copy and not to the clone (or the reverse).
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    count = sum(store_nodes[op] for op in CONTRACTIONS)
    assert sum(remat_nodes[op] for op in CONTRACTIONS) > count, (store_nodes, remat_nodes)


def test_recomputation_is_exact_with_inf_and_nan() -> None:
    """The gate is Where(c, a, a), exact whatever c: an inf in the input stays inf (a + 0 * g
    would turn it into NaN) and a NaN in the cotangent changes nothing."""
    model = _build("mlp")
    feeds = _feeds(model)
    feeds["x"][0, 0] = np.inf
    feeds["x"][1, 1] = np.nan
    inputs = _weights(model)
    store = run(onnax.grad(model, inputs), feeds)
    got = run(onnax.grad(model, inputs, remat="recompute"), feeds)
    for key, want in store.items():
        np.testing.assert_array_equal(got[key], want, err_msg=key)


def test_half_precision() -> None:
    model = _model(MLP.replace("float", "float16"), MLP_W, np.float16)
    feeds = _feeds(model)
    inputs = _weights(model)
    for accumulate in ("model", "float32"):
        store = run(onnax.grad(model, inputs, accumulate=accumulate), feeds)
        for policy in ("recompute", ["MatMul"]):
            got = run(onnax.grad(model, inputs, accumulate=accumulate, remat=policy), feeds)
            for key, want in store.items():
                np.testing.assert_array_equal(got[key], want, err_msg=f"{policy} {key}")


def test_hvp_and_per_example_gradients_compose() -> None:
    """jvp(grad(remat="recompute")) is the store model's Hessian-vector product, and vmap of it
    the store model's per-example gradients."""
    model = _build("mlp")
    feeds = _feeds(model)
    store = onnax.grad(model, ["w1", "w2"])
    remat = onnax.grad(model, ["w1", "w2"], remat="recompute")
    rng = np.random.default_rng(3)
    tangents = {f"fwd_{w}": rng.standard_normal(MLP_W[w]).astype(np.float32) for w in ("w1", "w2")}
    want = run(onnax.jvp(store, ["w1", "w2"]), feeds | tangents)
    got = run(onnax.jvp(remat, ["w1", "w2"]), feeds | tangents)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)
    batch = {"x": rng.standard_normal((3, 4, 8)).astype(np.float32)}
    want_b = run(onnax.vmap(store, in_axes={"x": 0}), batch)
    got_b = run(onnax.vmap(remat, in_axes={"x": 0}), batch)
    for key in want_b:
        np.testing.assert_allclose(got_b[key], want_b[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_stop_gradient_with_remat() -> None:
    model = _build("mlp")
    feeds = _feeds(model)
    inputs = ["w1", "w2", "w3"]
    store = run(onnax.grad(model, inputs, stop_gradient=["t2"]), feeds)
    got = run(onnax.grad(model, inputs, stop_gradient=["t2"], remat="recompute"), feeds)
    for key, want in store.items():
        np.testing.assert_allclose(got[key], want, rtol=1e-6, atol=1e-7, err_msg=key)
    assert not np.any(got["grad_w1"])


@pytest.mark.parametrize(
    ("remat", "parts"),
    [
        ("recomput", ["remat='recomput'", "did you mean 'recompute'", "a budget in bytes"]),
        (["MatMull", "Relu"], ["'MatMull'", "not an ONNX operator type", "'MatMul'"]),
        (-5, ["-5 bytes", "expected an int >= 0", "non-negative"]),
        (2.5, ["got float 2.5", "remat=['MatMul']"]),
        (True, ["got bool True"]),
        ([3], ["lists 3 (int)", "as strings"]),
    ],
)
def test_bad_remat_values_are_refused(remat: object, parts: Sequence[str]) -> None:
    model = _build("mlp")
    for transform in ("grad", "vjp"):
        with pytest.raises(RematError) as err:
            getattr(onnax, transform)(model, ["w1"], remat=remat)
        message = str(err.value)
        assert message.startswith(f"{transform}: "), message
        for part in parts:
            assert part in message, (part, message)
    with pytest.raises(ValueError, match="remat"):
        GradPass(remat=-1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="remat"):
        VjpPass(remat=1.0)  # type: ignore[arg-type]


def test_the_result_loads_in_onnxruntime_and_passes_the_checker() -> None:
    model = _build("cnn")
    remat = onnax.grad(model, _weights(model), remat=["Conv"])
    onnx.checker.check_model(ir.to_proto(remat), full_check=True)
    session(remat)


def test_the_command_line_takes_remat(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from onnax.cli import main

    model = _build("mlp", np.float64)
    source = tmp_path / "mlp.onnx"
    ir.save(model, source)
    feeds = _feeds(model)
    store = run(onnax.grad(model, _weights(model)), feeds)
    for flag in ("recompute", "MatMul,Gemm", "100"):
        out = tmp_path / f"grad_{flag.replace(',', '_')}.onnx"
        argv = ["grad", str(source), str(out), "--inputs", "x,w1", "--remat", flag, "--check"]
        assert main(argv) == 0, flag
        result = ir.load(out)
        assert "Where" in {n.op_type for n in result.graph}, flag
        got = run(result, feeds)
        for key in ("grad_x", "grad_w1"):
            np.testing.assert_allclose(got[key], store[key], rtol=1e-12, atol=1e-14)
    out = tmp_path / "vjp.onnx"
    assert main(["vjp", str(source), str(out), "--remat", "recompute"]) == 0
    capsys.readouterr()
    assert main(["grad", str(source), str(tmp_path / "bad.onnx"), "--remat", "MatMull"]) == 2
    err = capsys.readouterr().err
    assert "onnax grad: remat lists 'MatMull'" in err and "'MatMul'" in err, err


LOOP_LOSS = """
loopy (float[3] x, float s0) => (float loss) {
  t = Tanh(x)
  n = Constant <value = int64 {3}> ()
  c = Constant <value = bool {1}> ()
  loss = Loop (n, c, s0) <body = b (int64 i, bool cin, float s) => (bool cout, float sn) {
      cout = Identity(cin)
      r = ReduceSum <keepdims = 0> (t)
      m = Mul(s, r)
      sn = Sin(m)
  }>
}"""


def test_a_loss_made_by_a_loop() -> None:
    """Reverse mode replaces the Loop producing the loss (it gains an iteration counter): the
    first gate is the replacement's output, not the removed one's (the model did not load)."""
    model = _model(LOOP_LOSS, {})
    feeds = {"x": np.array([0.3, -0.2, 0.5], np.float32), "s0": np.array(0.7, np.float32)}
    store = run(onnax.grad(model, ["x", "s0"]), feeds)
    got = run(onnax.grad(model, ["x", "s0"], remat="recompute"), feeds)
    for key, want in store.items():
        np.testing.assert_array_equal(got[key], want, err_msg=key)


@pytest.mark.parametrize("policy", ["store", "recompute"])
def test_vjp_of_a_model_without_float_outputs(policy: str) -> None:
    # no float output: no cotangent seed and no reverse sweep (regression: seeds[0] crashed)
    model = ir.from_proto(
        onnx.parser.parse_model(
            """<ir_version: 10, opset_import: ["" : 21]>
            g (float[3] x) => (int32[3] y) { y = Cast <to = 6> (x) }"""
        )
    )
    out = onnax.vjp(model, remat=policy)
    assert [v.name for v in out.graph.outputs] == ["y", "adj_x"]
    adj = run(out, {"x": np.ones(3, np.float32)})["adj_x"]
    np.testing.assert_array_equal(adj, np.zeros(3, np.float32))
