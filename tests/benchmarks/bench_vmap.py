"""vmap benchmarks: batched models from ``onnax.vmap`` against native batching and Python loops.

Usage::

    uv run python tests/benchmarks/bench_vmap.py [--batch 64] [--threads 1] [--runs 200]
        [--width 256] [--skip-cnn]

For an MLP (3 blocks of MatMul+Add+Tanh, width 256, float32, weights and biases as initializers;
the unbatched model takes ``x`` of shape [256]) and, if onnax has batch rules for ``Conv`` and
pooling, a small CNN (Conv, Relu, MaxPool, Conv, Relu, AveragePool, Flatten, Gemm; the unbatched
model takes ``x`` of shape [1, 3, 16, 16]), the script prints:

1. ``vmap(m)`` at batch 64 against the same network written natively with a batch dimension
   (target: vmap / native <= 1.2).
2. ``vmap(m)`` against 64 separate ``session.run`` calls of the unbatched model (a Python loop
   over pre-built feeds, followed by ``np.stack`` of the results, so both sides deliver the same
   array).
3. ``vmap(grad(m))`` against 64 separate runs of ``grad(m)``: per-example gradients of a squared
   error ``sum((f(x) - t)^2)`` with respect to every weight and bias (selected by name); ``x``
   and the target ``t`` are batched, the weights are initializers and so are shared.

It also prints node and operator counts of every model, the time to build ``vmap(m)``,
``grad(m)`` and ``vmap(grad(m))`` (medians of process CPU time), and checks once, outside the
timing, that the vmap results equal the stacked loop results (and the native batched outputs).

Every model runs with the same onnxruntime session options: ``intra_op_num_threads=1`` (by
default; ``--threads``), ``inter_op_num_threads=1``, ``ORT_ENABLE_ALL``, CPU provider. The
contenders of one comparison run interleaved after a warm-up so that noise on the shared machine
hits them alike; with one intra-op thread onnxruntime computes on the calling thread, so the
medians of the thread's CPU time (which exclude waiting for a core) are the figures the ratios
use; wall-clock medians are printed next to them.
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

import onnax
import onnax.rules
from onnax.core.registry import batch_rules

OPSET = 21
TARGET_NATIVE = 1.2


# --------------------------------------------------------------------------------------------
# models


def _init(tape: ir.tape.Tape, name: str, array: np.ndarray) -> ir.Value:
    return tape.initializer(ir.tensor(array.astype(np.float32), name=name))


def _model(
    tape: ir.tape.Tape, inputs: list[ir.Value], outputs: list[ir.Value], name: str
) -> ir.Model:
    graph = ir.Graph(
        inputs=inputs,
        outputs=outputs,
        nodes=tape.nodes,
        initializers=tape.initializers,
        opset_imports={"": OPSET},
        name=name,
    )
    return ir.Model(graph, ir_version=10)


def _squared_error(tape: ir.tape.Tape, y: ir.Value, shape: Sequence[int | None]) -> ir.Value:
    """Returns ``t`` (a new graph input of ``shape``); names ``L = sum((y - t)^2)``."""
    t = ir.val("t", ir.DataType.FLOAT, list(shape))
    d = tape.op("Sub", [y, t])
    loss = tape.op("ReduceSum", [tape.op("Mul", [d, d])], attributes={"keepdims": 0})
    loss.name = "L"
    return t


def mlp(width: int, depth: int, batch: int | None, loss: bool = False, seed: int = 0) -> ir.Model:
    """``x -> tanh(x W_0 + b_0) -> ... -> y``, x of shape [width] or [batch, width].

    With ``loss`` the model takes a target ``t`` shaped like ``y`` as well and returns only
    ``L = sum((y - t)^2)``.
    """
    rng = np.random.default_rng(seed)
    shape = [width] if batch is None else [batch, width]
    x = ir.val("x", ir.DataType.FLOAT, shape)
    tape = ir.tape.Tape()
    h = x
    for i in range(depth):
        w = _init(tape, f"W{i}", rng.standard_normal((width, width)) / np.sqrt(width))
        b = _init(tape, f"b{i}", rng.standard_normal(width) * 0.1)
        h = tape.op("Tanh", [tape.op("Add", [tape.op("MatMul", [h, w]), b])])
    if loss:
        t = _squared_error(tape, h, shape)
        return _model(tape, [x, t], [tape.nodes[-1].outputs[0]], "mlp_loss")
    h.name = "y"
    return _model(tape, [x], [h], "mlp")


CNN_CLASSES = 10


def cnn(batch: int | None, loss: bool = False, seed: int = 0) -> ir.Model:
    """Conv(3->8, 3x3) Relu MaxPool(2) Conv(8->16, 3x3) Relu AveragePool(2) Flatten Gemm(->10).

    ``x`` is [1, 3, 16, 16] unbatched (Conv needs its N axis) or [batch, 3, 16, 16]; ``y`` is
    [1, 10] or [batch, 10]. ``loss`` as in :func:`mlp`.
    """
    rng = np.random.default_rng(seed)
    n = 1 if batch is None else batch
    x = ir.val("x", ir.DataType.FLOAT, [n, 3, 16, 16])
    tape = ir.tape.Tape()
    w0 = _init(tape, "C0", rng.standard_normal((8, 3, 3, 3)) / np.sqrt(27))
    c0 = _init(tape, "c0", rng.standard_normal(8) * 0.1)
    w1 = _init(tape, "C1", rng.standard_normal((16, 8, 3, 3)) / np.sqrt(72))
    c1 = _init(tape, "c1", rng.standard_normal(16) * 0.1)
    wd = _init(tape, "D", rng.standard_normal((16 * 4 * 4, CNN_CLASSES)) / 16.0)
    bd = _init(tape, "d", rng.standard_normal(CNN_CLASSES) * 0.1)
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    h = tape.op("Relu", [tape.op("Conv", [x, w0, c0], attributes=conv)])
    h = tape.op("MaxPool", [h], attributes=pool)
    h = tape.op("Relu", [tape.op("Conv", [h, w1, c1], attributes=conv)])
    h = tape.op("AveragePool", [h], attributes=pool)
    h = tape.op("Flatten", [h], attributes={"axis": 1})
    h = tape.op("Gemm", [h, wd, bd])
    if loss:
        t = _squared_error(tape, h, [n, CNN_CLASSES])
        return _model(tape, [x, t], [tape.nodes[-1].outputs[0]], "cnn_loss")
    h.name = "y"
    return _model(tape, [x], [h], "cnn")


CNN_PARAMS = ["C0", "c0", "C1", "c1", "D", "d"]


# --------------------------------------------------------------------------------------------
# measurement helpers


def op_counts(model: ir.Model) -> str:
    counts = collections.Counter(n.op_type for n in model.graph)
    return ", ".join(
        f"{op} {k}" for op, k in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    )


def describe(name: str, model: ir.Model) -> None:
    print(f"  {name:<24} {len(model.graph):>4} nodes: {op_counts(model)}")


def session(model: ir.Model, threads: int) -> ort.InferenceSession:
    """The one session configuration used for every model."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def transform_time(fn: Callable[[], ir.Model], repeats: int = 5) -> tuple[float, ir.Model]:
    """Median process CPU seconds of building a model, and the model."""
    times = []
    out = fn()  # warm-up: rule collection and imports are not the transform's cost
    for _ in range(repeats):
        gc.collect()
        start = time.process_time()
        out = fn()
        times.append(time.process_time() - start)
    return statistics.median(times), out


def race(
    contenders: dict[str, Callable[[], object]], runs: int, warmup: int = 10
) -> dict[str, tuple[float, float]]:
    """Median (thread CPU, wall) seconds per contender, measured interleaved."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    wall: dict[str, list[float]] = {name: [] for name in contenders}
    gc.disable()  # a collection inside one contender's sample would bias it
    try:
        for _ in range(runs):
            for name, fn in contenders.items():
                start, start_cpu = time.perf_counter(), time.thread_time()
                fn()
                cpu[name].append(time.thread_time() - start_cpu)
                wall[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    return {
        name: (statistics.median(cpu[name]), statistics.median(wall[name])) for name in contenders
    }


def print_race(
    title: str,
    medians: dict[str, tuple[float, float]],
    baseline: str,
    threads: int,
    targets: dict[str, float] | None = None,
) -> dict[str, float]:
    """Prints medians and ratios to ``baseline``; returns the primary ratios."""
    primary = 0 if threads == 1 else 1  # CPU time only means run cost on one intra-op thread
    print(f"  {title}")
    print(
        f"    {'contender':<30} {'cpu ms':>9} {'ratio':>7} {'wall ms':>9} {'ratio':>7}  "
        f"(ratios of {'cpu' if primary == 0 else 'wall'} medians are primary)"
    )
    base = medians[baseline]
    ratios = {}
    for name, (c, w) in medians.items():
        ratios[name] = (c, w)[primary] / base[primary]
        verdict = ""
        if targets and name in targets:
            ok = ratios[name] <= targets[name]
            verdict = f"  target <= {targets[name]:g}: {'ok' if ok else 'MISSED'}"
        print(
            f"    {name:<30} {c * 1e3:>9.3f} {c / base[0]:>7.2f} {w * 1e3:>9.3f} "
            f"{w / base[1]:>7.2f}{verdict}"
        )
    return ratios


def loop_runner(
    sess: ort.InferenceSession, feeds: list[dict[str, np.ndarray]]
) -> Callable[[], list[np.ndarray]]:
    """One ``session.run`` per example, then the outputs stacked along a new axis 0."""

    def run() -> list[np.ndarray]:
        outs = [sess.run(None, f) for f in feeds]
        return [np.stack([o[k] for o in outs]) for k in range(len(outs[0]))]

    return run


def check_close(what: str, got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> None:
    """Asserts equality up to float32 rounding and prints the largest difference."""
    assert len(got) == len(want), (what, len(got), len(want))
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, (what, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=what)
        worst = max(worst, float(np.max(np.abs(g - w))))
    print(f"  check {what}: equal (max |diff| {worst:.2e})")


# --------------------------------------------------------------------------------------------
# the benchmark of one network


def bench_network(
    name: str,
    make: Callable[..., ir.Model],
    params: list[str],
    x_shape: Sequence[int],
    y_shape: Sequence[int],
    batch: int,
    threads: int,
    runs: int,
    grad_runs: int,
) -> dict[str, float]:
    """Runs comparisons 1-3 for one network; returns the primary ratios by label.

    Comparison 3 is skipped with a message when ``grad`` or ``vmap(grad(m))`` cannot be built
    (e.g. batch rules of an operator landed before its jvp rule).
    """
    print(f"\n== {name}: batch {batch}, float32, opset {OPSET}, intra_op_num_threads={threads} ==")
    single = make(None)
    native = make(batch)
    loss = make(None, loss=True)

    t_vmap, batched = transform_time(lambda: onnax.vmap(single, axis_size=batch))
    print(f"  transform CPU time (median of 5): vmap(m) {t_vmap * 1e3:.1f} ms")
    g: ir.Model | None = None
    vgrad: ir.Model | None = None
    try:
        t_grad, g = transform_time(lambda: onnax.grad(loss, inputs=params))
        t_vgrad, vgrad = transform_time(
            lambda: onnax.vmap(onnax.grad(loss, inputs=params), axis_size=batch)
        )
        t_vgrad_only, _ = transform_time(lambda: onnax.vmap(g, axis_size=batch))
        print(
            f"  transform CPU time (median of 5): grad(m) {t_grad * 1e3:.1f} ms, "
            f"vmap(grad(m)) {t_vgrad * 1e3:.1f} ms (of which vmap {t_vgrad_only * 1e3:.1f} ms)"
        )
    except onnax.OnnaxError as e:
        print(f"  per-example gradients skipped: {type(e).__name__}: {e}")
    describe("m (unbatched)", single)
    describe(f"native batch {batch}", native)
    describe(f"vmap(m) batch {batch}", batched)
    if g is not None and vgrad is not None:
        describe("grad(m) (loss)", g)
        describe(f"vmap(grad(m)) batch {batch}", vgrad)

    rng = np.random.default_rng(1)
    xs = rng.standard_normal((batch, *x_shape)).astype(np.float32)
    ts = rng.standard_normal((batch, *y_shape)).astype(np.float32)
    s_single, s_native, s_batched = (session(m, threads) for m in (single, native, batched))
    # The CNN's single example is [1, 3, 16, 16]: the native model folds that 1 into the batch.
    native_x = xs.reshape(s_native.get_inputs()[0].shape)
    run_native = lambda: s_native.run(None, {"x": native_x})  # noqa: E731
    run_vmap = lambda: s_batched.run(None, {"x": xs})  # noqa: E731
    run_loop = loop_runner(s_single, [{"x": xs[i]} for i in range(batch)])

    # Correctness, once and outside the timing.
    (y_vmap,) = run_vmap()
    check_close("vmap(m) == stacked loop of m", [y_vmap], run_loop())
    (y_native,) = run_native()
    check_close("vmap(m) == native batched m", [y_vmap.reshape(y_native.shape)], [y_native])

    ratios: dict[str, float] = {}
    medians = race(
        {
            f"native batch {batch}": run_native,
            f"vmap(m) batch {batch}": run_vmap,
            f"loop of {batch} x m": run_loop,
        },
        runs,
    )
    r = print_race(
        f"1-2. forward ({runs} interleaved runs each)",
        medians,
        f"native batch {batch}",
        threads,
        targets={f"vmap(m) batch {batch}": TARGET_NATIVE},
    )
    ratios["vmap / native"] = r[f"vmap(m) batch {batch}"]
    ratios["loop / vmap"] = r[f"loop of {batch} x m"] / r[f"vmap(m) batch {batch}"]
    print(f"    => vmap(m) / native = {ratios['vmap / native']:.2f} (target <= {TARGET_NATIVE})")
    print(f"    => loop of {batch} x m / vmap(m) = {ratios['loop / vmap']:.1f}x (speed-up of vmap)")
    if g is None or vgrad is None:
        return ratios

    s_grad, s_vgrad = session(g, threads), session(vgrad, threads)
    run_vgrad = lambda: s_vgrad.run(None, {"x": xs, "t": ts})  # noqa: E731
    run_grad_loop = loop_runner(s_grad, [{"x": xs[i], "t": ts[i]} for i in range(batch)])
    check_close("vmap(grad(m)) == stacked loop of grad(m)", run_vgrad(), run_grad_loop())
    medians = race(
        {f"vmap(grad(m)) batch {batch}": run_vgrad, f"loop of {batch} x grad(m)": run_grad_loop},
        grad_runs,
    )
    r = print_race(
        f"3. per-example gradients w.r.t. {', '.join(params)} ({grad_runs} interleaved runs each)",
        medians,
        f"vmap(grad(m)) batch {batch}",
        threads,
    )
    ratios["grad loop / vmap(grad)"] = r[f"loop of {batch} x grad(m)"]
    print(
        f"    => loop of {batch} x grad(m) / vmap(grad(m)) = "
        f"{ratios['grad loop / vmap(grad)']:.1f}x (speed-up of vmap)"
    )
    return ratios


def cnn_missing() -> list[str]:
    """The CNN operators that lack a batch rule (the CNN is skipped if there are any)."""
    onnax.rules.collect()
    ops = ("Conv", "MaxPool", "AveragePool", "Flatten", "Gemm", "Relu")
    return [op for op in ops if ("", op) not in batch_rules]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per forward contender")
    parser.add_argument("--grad-runs", type=int, default=100, help="timed runs per grad contender")
    parser.add_argument("--width", type=int, default=256, help="MLP width")
    parser.add_argument("--depth", type=int, default=3, help="MLP depth (MatMul+Add+Tanh blocks)")
    parser.add_argument("--skip-cnn", action="store_true")
    args = parser.parse_args(argv)
    print(
        f"onnxruntime {ort.__version__}; session options for every model: "
        f"intra_op_num_threads={args.threads}, inter_op_num_threads=1, ORT_ENABLE_ALL, CPU"
    )
    summary: dict[str, dict[str, float]] = {}
    summary["MLP"] = bench_network(
        f"MLP (width {args.width}, depth {args.depth}, MatMul+Add+Tanh)",
        lambda batch, loss=False: mlp(args.width, args.depth, batch, loss),
        [p for i in range(args.depth) for p in (f"W{i}", f"b{i}")],
        [args.width],
        [args.width],
        args.batch,
        args.threads,
        args.runs,
        args.grad_runs,
    )
    if args.skip_cnn:
        print("\n== CNN: skipped (--skip-cnn) ==")
    elif missing := cnn_missing():
        print(
            "\n== CNN: skipped: CNN operators have not landed yet in onnax "
            f"(no batch rule for: {', '.join(missing)}) =="
        )
    else:
        summary["CNN"] = bench_network(
            "CNN",
            cnn,
            CNN_PARAMS,
            [1, 3, 16, 16],
            [1, CNN_CLASSES],
            args.batch,
            args.threads,
            args.runs,
            args.grad_runs,
        )
    print("\n== summary (primary medians) ==")
    for net, ratios in summary.items():
        print(f"  {net}: " + "; ".join(f"{k} = {v:.2f}" for k, v in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
