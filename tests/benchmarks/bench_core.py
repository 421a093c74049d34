"""Core benchmarks: transform time against model size, and run time of derivative models.

Usage::

    uv run python tests/benchmarks/bench_core.py [--sizes 1000,10000,100000] [--threads 1]
        [--runs 100] [--budget 900] [--skip-scaling] [--skip-runtime] [--activation Tanh]

1. **Transform time vs node count.** MLP chains of MatMul+Add+Tanh blocks (width 4, weights
   and biases as initializers, built with onnx_ir directly) of ~1k, 10k and 100k nodes. Times
   ``onnax.jvp``, ``onnax.vjp`` (both w.r.t. the input) and ``onnax.grad`` of a ReduceSum of the
   output, printing wall-clock and CPU seconds and microseconds per node (medians over repeats;
   the transforms are single-threaded Python, so process CPU time is the cost on a loaded
   machine), and the ratio of per-node CPU time at the largest size to the smallest (1.0 =
   linear). A size whose time, projected from the smaller sizes, exceeds ``--budget`` seconds is
   skipped with a message.
2. **Run time of the generated models.** An MLP of width 512 and depth 8 at batch 64, float32,
   run by onnxruntime with the same session options for every model: median run time of the jvp
   and vjp models divided by the primal's (targets: jvp/primal <= 2.5, vjp/primal <= 3). The vjp
   is measured with all its outputs and both w.r.t. the input and every weight and bias (selected
   by name: the training-like case) and w.r.t. the input only. The models run interleaved
   (primal, jvp, vjp, vjp...) after a warm-up, so that machine noise hits them alike. Both the
   wall-clock and the calling thread's CPU time are printed; with one intra-op thread (the
   default) onnxruntime computes on the calling thread, so the CPU-time medians, which exclude
   waiting for a core on a loaded machine, are the ones compared with the targets. The operator
   counts of each generated graph are printed as well.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

import onnax

OPSET = 21


def mlp(
    width: int,
    depth: int,
    batch: int | str,
    activation: str = "Tanh",
    reduce: bool = False,
    seed: int = 0,
) -> ir.Model:
    """``X -> act(X W_0 + b_0) -> ... -> Y`` (and ``L = ReduceSum(Y)`` if ``reduce``).

    Weights ``W_i`` [width, width] and biases ``b_i`` [width] are initializers; ``X`` is the only
    graph input, [batch, width] float32.
    """
    rng = np.random.default_rng(seed)
    x = ir.val("X", ir.DataType.FLOAT, [batch, width])
    tape = ir.tape.Tape()
    h = x
    scale = 1.0 / np.sqrt(width)
    for i in range(depth):
        w = tape.initializer(
            ir.tensor(
                (rng.standard_normal((width, width)) * scale).astype(np.float32), name=f"W{i}"
            )
        )
        b = tape.initializer(
            ir.tensor((rng.standard_normal(width) * 0.1).astype(np.float32), name=f"b{i}")
        )
        h = tape.op(activation, [tape.op("Add", [tape.op("MatMul", [h, w]), b])])
    h.name = "Y"
    outputs = [h]
    if reduce:
        loss = tape.op("ReduceSum", [h], attributes={"keepdims": 0})
        loss.name = "L"
        outputs = [loss]
    graph = ir.Graph(
        inputs=[x],
        outputs=outputs,
        nodes=tape.nodes,
        initializers=tape.initializers,
        opset_imports={"": OPSET},
        name="mlp",
    )
    return ir.Model(graph, ir_version=10)


def op_counts(model: ir.Model) -> str:
    counts = collections.Counter(n.op_type for n in model.graph)
    return ", ".join(
        f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def _median_time(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median (wall-clock, process CPU) seconds of ``fn`` over ``repeats`` calls."""
    wall, cpu = [], []
    for _ in range(repeats):
        gc.collect()
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    return statistics.median(wall), statistics.median(cpu)


# --------------------------------------------------------------------------------------------
# 1. transform time vs node count


def _call_into(fn: Callable[[], ir.Model], out: list[ir.Model]) -> None:
    out.append(fn())


def bench_scaling(sizes: Sequence[int], width: int = 4, budget: float = 900.0) -> None:
    """Prints transform times; skips a size whose projected time exceeds ``budget`` seconds."""
    print(f"== transform time vs node count (MatMul+Add+Tanh blocks, width {width}) ==")
    print(
        f"{'nodes':>8} {'transform':>10} {'wall s':>9} {'cpu s':>9} {'us/node':>9} "
        f"{'cpu us/node':>12} {'out nodes':>10}"
    )
    per_node: dict[str, dict[int, float]] = collections.defaultdict(dict)
    for target in sizes:
        depth = max(1, target // 3)
        model = mlp(width, depth, "N")
        loss_model = mlp(width, depth, "N", reduce=True)
        n = len(model.graph)
        repeats = 5 if n <= 2_000 else 3 if n <= 20_000 else 1
        transforms: list[tuple[str, Callable[[], ir.Model]]] = [
            ("jvp", functools.partial(onnax.jvp, model)),
            ("vjp", functools.partial(onnax.vjp, model)),
            ("grad", functools.partial(onnax.grad, loss_model)),
        ]
        for name, fn in transforms:
            if per_node[name]:
                projected = max(per_node[name].values()) * 1e-6 * n
                if projected > budget:
                    print(
                        f"{n:>8} {name:>10} skipped: projected {projected:.0f} s > budget {budget:.0f} s"
                    )
                    continue
            out: list[ir.Model] = []
            wall, cpu = _median_time(functools.partial(_call_into, fn, out), repeats)
            per_node[name][n] = cpu / n * 1e6
            print(
                f"{n:>8} {name:>10} {wall:>9.2f} {cpu:>9.2f} {wall / n * 1e6:>9.1f} "
                f"{per_node[name][n]:>12.1f} {len(out[-1].graph):>10}",
                flush=True,
            )
            out.clear()
    for name, by_size in per_node.items():
        if len(by_size) > 1:
            small, large = min(by_size), max(by_size)
            print(
                f"{name}: CPU time per node at {large} nodes / at {small} nodes = "
                f"{by_size[large] / by_size[small]:.2f} (1.0 = linear)"
            )


# --------------------------------------------------------------------------------------------
# 2. run time of the derivative models


def _session(model: ir.Model, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _feeds(sess: ort.InferenceSession, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for i in sess.get_inputs():
        assert all(isinstance(d, int) for d in i.shape), (i.name, i.shape)
        feeds[i.name] = rng.standard_normal(i.shape).astype(np.float32)
    return feeds


def bench_runtime(
    width: int = 512,
    depth: int = 8,
    batch: int = 64,
    activation: str = "Tanh",
    threads: int = 1,
    runs: int = 100,
) -> dict[str, float]:
    print(
        f"\n== onnxruntime run time: MLP width {width}, depth {depth}, batch {batch}, float32, "
        f"{activation}, intra_op_num_threads={threads} =="
    )
    primal = mlp(width, depth, batch, activation)
    params = [n for i in range(depth) for n in (f"W{i}", f"b{i}")]
    models = {
        "primal": primal,
        "jvp (X)": onnax.jvp(primal),
        "vjp (X + weights)": onnax.vjp(primal, inputs=["X", *params]),
        "vjp (X)": onnax.vjp(primal),
    }
    for name, m in models.items():
        print(f"  {name:<18} {len(m.graph):>4} nodes: {op_counts(m)}")
    rng = np.random.default_rng(0)
    sessions = {name: _session(m, threads) for name, m in models.items()}
    feeds = {name: _feeds(s, rng) for name, s in sessions.items()}
    for name, s in sessions.items():  # warm-up (and check that all outputs are produced)
        for _ in range(5):
            outs = s.run(None, feeds[name])
        assert all(np.isfinite(o).all() for o in outs), name
    wall: dict[str, list[float]] = {name: [] for name in sessions}
    cpu: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, s in sessions.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            s.run(None, feeds[name])
            cpu[name].append(time.thread_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    med_wall = {name: statistics.median(t) for name, t in wall.items()}
    med_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    # With one intra-op thread onnxruntime computes on the calling thread, so the thread's CPU
    # time is the run's cost without the time spent waiting for a core on a loaded machine.
    primary = med_cpu if threads == 1 else med_wall
    targets = {"jvp (X)": 2.5, "vjp (X + weights)": 3.0, "vjp (X)": 3.0}
    print(
        f"  {'model':<18} {'wall ms':>8} {'/ primal':>9} {'cpu ms':>8} {'/ primal':>9}  "
        f"target ({'cpu' if threads == 1 else 'wall'} medians, {runs} runs)"
    )
    for name in sessions:
        target = targets.get(name)
        ratio = primary[name] / primary["primal"]
        verdict = (
            "" if target is None else f"<= {target:g}: {'ok' if ratio <= target else 'MISSED'}"
        )
        print(
            f"  {name:<18} {med_wall[name] * 1e3:>8.2f} {med_wall[name] / med_wall['primal']:>9.2f} "
            f"{med_cpu[name] * 1e3:>8.2f} {med_cpu[name] / med_cpu['primal']:>9.2f}  {verdict}"
        )
    return {name: primary[name] / primary["primal"] for name in sessions}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="node counts, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per model")
    parser.add_argument("--activation", default="Tanh", choices=["Tanh", "Relu"])
    parser.add_argument(
        "--budget", type=float, default=900.0, help="max projected seconds per transform and size"
    )
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--skip-runtime", action="store_true")
    args = parser.parse_args(argv)
    if not args.skip_scaling:
        bench_scaling([int(s) for s in args.sizes.split(",")], budget=args.budget)
    if not args.skip_runtime:
        bench_runtime(activation=args.activation, threads=args.threads, runs=args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
