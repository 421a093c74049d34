"""100 Jacobian-vector products: ``linearize`` (forward once + 100 linear runs) against 100 jvp runs.

Usage::

    uv run python tests/benchmarks/bench_linearize.py [--products 100] [--trials 7] [--threads 1]

Models, float32, run by onnxruntime on the CPU with ``--threads`` intra-op threads (default 1,
so that the calling thread's CPU time is the cost even on a loaded machine):

* **MLP**: width 512, depth 8, Tanh, batch 64 (``bench_core.mlp``);
* **CNN**: batch 8, 3x32x32 images, three 3x3 Conv+Tanh layers (16, 32, 32 channels, the last two
  with stride 2), global average pooling and a dense layer to 10 logits;
* **LSTM** (extra): ``tests/data/torch_lstm_2layer_bidir.onnx``, whose linear Scans read the
  gates stacked by the forward model's residual Scans.

One trial of the linearize path runs the forward model once and the linear model ``--products``
times on its residuals, with a new tangent each time; one trial of the jvp path runs the jvp
model ``--products`` times on the same tangents. The two paths alternate trial by trial
(interleaved, after a warm-up) so that machine noise hits both alike; the medians over trials
of the wall-clock and thread CPU time are printed with their ratio jvp / linearize (above 1:
linearize is faster).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

import onnax
from onnax.linearization import linearize

sys.path.insert(0, str(Path(__file__).parent))
from bench_core import mlp

OPSET = 21


def cnn(batch: int = 8, seed: int = 0) -> ir.Model:
    """A small image classifier: 3 Conv+Tanh layers, global average pool, dense to 10 logits."""
    rng = np.random.default_rng(seed)
    x = ir.val("X", ir.DataType.FLOAT, [batch, 3, 32, 32])
    tape = ir.tape.Tape()
    h = x
    channels = 3
    for i, (out, stride) in enumerate(((16, 1), (32, 2), (32, 2))):
        scale = 1.0 / np.sqrt(channels * 9)
        w = tape.initializer(
            ir.tensor(
                (rng.standard_normal((out, channels, 3, 3)) * scale).astype(np.float32),
                name=f"K{i}",
            )
        )
        b = tape.initializer(ir.tensor(np.zeros(out, np.float32), name=f"c{i}"))
        conv = tape.op(
            "Conv", [h, w, b], attributes={"pads": [1, 1, 1, 1], "strides": [stride, stride]}
        )
        h = tape.op("Tanh", [conv])
        channels = out
    pooled = tape.op("GlobalAveragePool", [h])
    flat = tape.op("Flatten", [pooled], attributes={"axis": 1})
    dense = tape.initializer(
        ir.tensor((rng.standard_normal((channels, 10)) * 0.2).astype(np.float32), name="D")
    )
    y = tape.op("MatMul", [flat, dense])
    y.name = "Y"
    graph = ir.Graph(
        [x],
        [y],
        nodes=tape.nodes,
        initializers=tape.initializers,
        opset_imports={"": OPSET},
        name="cnn",
    )
    return ir.Model(graph, ir_version=10)


def session(model: ir.Model, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def bench(name: str, model: ir.Model, products: int, trials: int, threads: int) -> None:
    fwd, lin = linearize(model)
    jvp = onnax.jvp(model)
    s_fwd, s_lin, s_jvp = (session(m, threads) for m in (fwd, lin, jvp))
    rng = np.random.default_rng(0)
    x = model.graph.inputs[0]
    shape = [int(d) for d in x.shape.dims]
    feeds = {str(x.name): rng.standard_normal(shape).astype(np.float32)}
    t_name = f"fwd_{x.name}"
    tangents = [rng.standard_normal(shape).astype(np.float32) for _ in range(products)]
    residual_names = [str(v.name) for v in lin.graph.inputs][:-1]

    def with_linearize() -> None:
        out = s_fwd.run(None, feeds)
        residuals = dict(zip(residual_names, out[len(model.graph.outputs) :], strict=True))
        for v in tangents:
            s_lin.run(None, {**residuals, t_name: v})

    def with_jvp() -> None:
        for v in tangents:
            s_jvp.run(None, {**feeds, t_name: v})

    # The two paths agree before they are timed.
    out = s_fwd.run(None, feeds)
    residuals = dict(zip(residual_names, out[len(model.graph.outputs) :], strict=True))
    got = s_lin.run(None, {**residuals, t_name: tangents[0]})[0]
    want = s_jvp.run(None, {**feeds, t_name: tangents[0]})[1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with_linearize()
    with_jvp()
    lin_times, jvp_times = [], []
    for _ in range(trials):
        lin_times.append(timed(with_linearize))
        jvp_times.append(timed(with_jvp))
    lw, lc = (statistics.median(t[k] for t in lin_times) for k in (0, 1))
    jw, jc = (statistics.median(t[k] for t in jvp_times) for k in (0, 1))
    residual_bytes = sum(a.nbytes for a in residuals.values())
    print(
        f"{name}: nodes primal {len(model.graph)}, jvp {len(jvp.graph)}, forward {len(fwd.graph)}, "
        f"linear {len(lin.graph)}; {len(residual_names)} residuals, {residual_bytes / 1e6:.2f} MB"
    )
    print(
        f"  {products} J·v  linearize: wall {lw * 1e3:8.1f} ms  cpu {lc * 1e3:8.1f} ms | "
        f"jvp: wall {jw * 1e3:8.1f} ms  cpu {jc * 1e3:8.1f} ms | "
        f"ratio jvp/linearize: wall {jw / lw:.2f}  cpu {jc / lc:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=100)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    print(
        f"onnxruntime {ort.__version__}, {args.threads} intra-op thread(s), medians of "
        f"{args.trials} interleaved trials"
    )
    bench("MLP 512x8, batch 64", mlp(512, 8, 64), args.products, args.trials, args.threads)
    bench("CNN 3 conv, batch 8x3x32x32", cnn(), args.products, args.trials, args.threads)
    lstm = ir.load(Path(__file__).parents[1] / "data" / "torch_lstm_2layer_bidir.onnx")
    bench(
        "LSTM 2 layers bidirectional (tests/data)", lstm, args.products, args.trials, args.threads
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
