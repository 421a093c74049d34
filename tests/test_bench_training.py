"""bench_training.py's harness on a small CNN: what it differentiates, times and reports.

The benchmark compares ``grad_all`` with PyTorch's backward of the parameters, so it must
differentiate the weights and nothing else (not the input, not BatchNormalization's running
statistics); it times every derivative interleaved with the primal, one session at a time; and
its memory line separates the outputs' own bytes (the gradients) from the peak.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

BENCH = Path(__file__).parent / "benchmarks"


def _bench_training():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_training", BENCH / "bench_training.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_training"] = module
    spec.loader.exec_module(module)
    return module


def _cnn(batch: int) -> ir.Model:
    """Conv -> BatchNormalization -> Relu -> mean, with ``y`` and the loss ``sum(y * y)``."""
    rng = np.random.default_rng(0)
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[{batch}, 2, 6, 6] x) => (float[{batch}, 3] y, float loss) {{
        c = Conv<pads = [1, 1, 1, 1]>(x, w, b)
        n = BatchNormalization(c, s, t, m, v)
        r = Relu(n)
        y = ReduceMean<axes = [2, 3], keepdims = 0>(r)
        sq = Mul(y, y)
        loss = ReduceSum<keepdims = 0>(sq)
    }}
    """
    proto = onnx.parser.parse_model(text)
    arrays = {
        "w": rng.standard_normal((3, 2, 3, 3)),
        "b": rng.standard_normal(3),
        "s": rng.standard_normal(3),
        "t": rng.standard_normal(3),
        "m": rng.standard_normal(3),
        "v": np.abs(rng.standard_normal(3)) + 0.5,
    }
    for name, array in arrays.items():
        proto.graph.initializer.append(onnx.numpy_helper.from_array(array.astype(np.float32), name))
    return ir.from_proto(proto)


@pytest.fixture(scope="module")
def bt():  # type: ignore[no-untyped-def]
    return _bench_training()


def test_grad_all_is_the_gradient_of_the_weights_only(bt) -> None:  # type: ignore[no-untyped-def]
    primal = _cnn(2)
    assert bt._float_initializers(primal) == ["w", "b", "s", "t"]  # not m, v (running stats)
    x = np.random.default_rng(1).standard_normal((2, 2, 6, 6)).astype(np.float32)
    bench = bt.derive(primal, x, _cnn(1), {"grad_in", "vjp", "jvp_grad"})
    outputs = [v.name for v in bench.models["grad_all"].graph.outputs]
    assert outputs == ["y", "loss", "grad_w", "grad_b", "grad_s", "grad_t"], outputs
    # y [2, 3], the scalar loss and the gradients of w [3, 2, 3, 3], b, s and t [3]
    assert bt.output_bytes(bench.models["grad_all"]) == 4 * (6 + 1 + 54 + 3 + 3 + 3)
    times = bt.time_models(bench, rounds=2)
    assert set(times) == {"primal", "grad_all", "vmap_grad"}
    assert all(t > 0 for t in times.values())


def test_report_prints_every_model(bt, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    primal = _cnn(2)
    x = np.ones((2, 2, 6, 6), np.float32)
    bench = bt.derive(primal, x, None, set())
    times = bt.time_models(bench, rounds=1)
    bench.torch = {"forward": 1.0, "backward_params": 2.0, "saved_bytes": 1000}
    bt.report("cnn", bench, times, {"primal": 100, "grad_all": 2000})
    out = capsys.readouterr().out
    for key in ("primal", "grad_all", "grad_in", "vjp", "jvp_grad", "of which the outputs"):
        assert key in out, (key, out)


def test_peak_memory_counts_the_outputs_once(bt, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The outputs come back as copies of the arena's buffers: the last run's copies must not be
    kept while measuring, or a model whose working memory is its output measures twice that."""
    n = 16 * 2**20  # 64 MiB of float32, far above everything else the child process allocates
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[{n}] x) => (float[{n}] y) {{
        y = Add(x, x)
    }}
    """
    model = ir.from_proto(onnx.parser.parse_model(text))
    peak = bt.peak_memory(model, {"x": np.ones(n, np.float32)}, tmp_path)
    assert 0.9 * 4 * n < peak < 1.4 * 4 * n, peak / 2**20


def test_run_time_batch_twin_gives_the_same_gradients(bt) -> None:  # type: ignore[no-untyped-def]
    """--run-time-batch's twin has a symbolic batch, keeps the source as it was, and its
    gradient model computes what the static one does (at the batch measured and another)."""
    import onnxruntime as ort

    primal = _cnn(2)
    before = primal.graph.inputs[0].shape
    twin = bt.run_time_batch(primal)
    assert primal.graph.inputs[0].shape == before  # the source is untouched
    dims = twin.graph.inputs[0].shape.dims
    assert isinstance(dims[0], ir.SymbolicDim) and list(dims[1:]) == [2, 6, 6]
    assert isinstance(twin.graph.outputs[0].shape.dims[0], ir.SymbolicDim)
    x = np.random.default_rng(2).standard_normal((2, 2, 6, 6)).astype(np.float32)
    static = bt.derive(primal, x, None, {"grad_in", "vjp", "jvp_grad"}).models["grad_all"]
    dynamic = bt.derive(twin, x, None, {"grad_in", "vjp", "jvp_grad"}).models["grad_all"]

    def run(model: ir.Model, feed: np.ndarray) -> list[np.ndarray]:
        proto = ir.serde.serialize_model(model).SerializeToString()
        sess = ort.InferenceSession(proto, providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": feed})

    for got, want in zip(run(dynamic, x), run(static, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # And it runs at another batch: the first two examples' outputs are the batch-2 ones.
    x3 = np.concatenate([x, np.zeros_like(x[:1])])
    three = run(dynamic, x3)
    assert three[0].shape == (3, 3)
    np.testing.assert_allclose(three[0][:2], run(static, x)[0], rtol=1e-5, atol=1e-6)


def test_models_with_external_weights_open_from_bytes(bt, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The corpus's exports keep their weights in a data file; the sessions here open models
    from bytes, which must not need that file (nor the working directory) any more."""
    path = tmp_path / "cnn.onnx"
    ir.save(_cnn(2), path, external_data="cnn.onnx.data", size_threshold_bytes=0)
    monkeypatch.chdir(tmp_path.parent)  # not where the data file is
    model = bt._read(path)
    x = np.ones((2, 2, 6, 6), np.float32)
    y = bt._session(model).run(None, {"x": x})
    want = bt._session(_cnn(2)).run(None, {"x": x})
    for got, expected in zip(y, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    grad = bt.derive(model, x, None, {"grad_in", "vjp", "jvp_grad"}).models["grad_all"]
    assert bt._session(grad).run(None, {"x": x})


class _FakeTorch:
    """Stands in for torch_worker.TorchWorker: records what is timed, in order."""

    def __init__(self, loss: float, log: list[str]) -> None:
        self.cases = ["forward", "backward_params"]
        self.saved_bytes = 123
        self.loss = loss
        self.log = log

    def time(self, case: str) -> float:
        self.log.append(f"torch {case}")
        return {"forward": 0.5, "backward_params": 2.0}[case]


def test_torch_is_timed_side_by_side(bt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With a PyTorch worker, each round times PyTorch right after onnxruntime, and bench.torch
    takes those medians; a worker whose loss is not onnxruntime's is dropped, not compared."""
    primal = _cnn(2)
    x = np.random.default_rng(1).standard_normal((2, 2, 6, 6)).astype(np.float32)
    bench = bt.derive(primal, x, None, {"grad_in", "vjp", "jvp_grad"})
    loss = float(bt._session(primal).run(["loss"], {"x": x})[0])
    log: list[str] = []
    real_session = bt._session

    def session(model):  # type: ignore[no-untyped-def]
        sess = real_session(model)
        name = "primal" if model is primal else "grad_all"
        run = sess.run

        class Logged:
            def __getattr__(self, key):  # type: ignore[no-untyped-def]
                return getattr(sess, key)

            def run(self, *args):  # type: ignore[no-untyped-def]
                log.append(name)
                return run(*args)

        return Logged()

    monkeypatch.setattr(bt, "_session", session)
    times = bt.time_models(bench, rounds=3, torch_side=_FakeTorch(loss * (1 + 1e-6), log))
    assert set(times) == {"primal", "grad_all"}
    assert bench.torch == {"forward": 0.5, "backward_params": 2.0, "saved_bytes": 123}
    assert bench.torch_source == "side by side"
    timed = log[log.index("torch forward") - 2 :]  # after the warm-up runs and the loss check
    assert timed == ["primal", "grad_all", "torch forward", "torch backward_params"] * 3

    other = bt.derive(primal, x, None, {"grad_in", "vjp", "jvp_grad"})
    log.clear()
    bt.time_models(other, rounds=2, torch_side=_FakeTorch(loss + 1.0, log))
    assert not any(entry.startswith("torch") for entry in log)
    assert other.torch == {} and other.torch_source == ""
