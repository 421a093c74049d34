"""Transform cost and derivative-model runtime on the nine light-zoo models, onnax vs onnx-ad.

For every model (tests/zoo.py: seeded random weights; converted to opset 17; batch 1) and each
tool, a fresh subprocess per (tool, mode) loads the model, times the transform and records its
peak memory (growth of the peak resident set over the loaded state), then times the primal and
the derivative model in onnxruntime (CPU, one thread, runs alternating between the two, medians
of --repeats runs after a warm-up). Both tools differentiate the image input and the
class-probability output.

The column ``floor`` is one plus the share of the primal's time spent in Conv, Gemm and MatMul
(onnxruntime's profiler): a jvp or an input vjp runs each of them a second time at the same cost,
so no derivative model of these networks can run faster than that multiple of the primal.

    uv run --group benchmark python tests/benchmarks/bench_zoo.py [--models vgg19 ...] [--repeats 5]

onnx-ad 0.3.0 (PyPI) lives in the ``benchmark`` dependency group, never in the runtime
dependencies; without it the table shows onnax alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

OPSET = 17
TOOLS = ("onnax", "onnx-ad")
MODES = ("jvp", "vjp")


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _start_peak() -> int:
    """Resets the peak resident set (loading the model peaks higher than a transform); returns
    the current resident set."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def _peak_growth(before: int) -> int:
    return max(_status_bytes("VmHWM") - before, 0)


def _session(path_or_bytes: str | bytes):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(path_or_bytes, options, providers=["CPUExecutionProvider"])


def _time_pair(primal, primal_feeds, derived, feeds, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median seconds of the primal and the derived model, run alternately.

    Alternating keeps a change in the machine's load (it is shared) from landing on one of the
    two only, which moved the ratios by 10 % when the runs were sequential.
    """
    primal.run(None, primal_feeds)  # warm-up
    derived.run(None, feeds)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for sess, f, out in ((primal, primal_feeds, times[0]), (derived, feeds, times[1])):
            start = time.perf_counter()
            sess.run(None, f)
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


# The kernels linear in the activations: a derivative model runs each of them once more.
_PRODUCT_KERNELS = frozenset({"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"})


def product_share(path: str | bytes, feeds: dict[str, np.ndarray], runs: int = 5) -> float:
    """The share of the primal's kernel time spent in Conv, Gemm and MatMul (onnxruntime's
    profiler).

    A jvp runs each of these twice, on the primal and on the tangent, with the same kernel and
    FLOPs (a Conv on a batch of two costs twice one on a batch of one in onnxruntime: measured
    1.97-2.01x on VGG-sized layers), so ``1 + product_share`` is a floor for jvp/primal; likewise
    for an input vjp, whose transposed products have the FLOPs of the forward ones.
    """
    import json as json_module

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "primal")
        sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            sess.run(None, feeds)
        events = json_module.loads(Path(sess.end_profiling()).read_text())
    product = total = 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            total += event["dur"]
            if event["args"]["op_name"] in _PRODUCT_KERNELS:
                product += event["dur"]
    return product / total if total else 0.0


def _feeds(sess, rng: np.random.Generator) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


_WARM_UP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 2, 6, 6] x) => (float[1, 2] y) {
    w = Constant <value = float[2, 2, 3, 3] {1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                             1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9}> ()
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    r = Relu (c)
    p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (r)
    s = GlobalAveragePool (p)
    f = Flatten (s)
    y = Softmax (f)
}
"""


def _warm_up(tool: str, mode: str) -> None:
    """One transform of a tiny model first: the first call pays for lazy imports."""
    import onnx_ir as ir

    tiny = ir.from_onnx_text(_WARM_UP)
    if tool == "onnax":
        import onnax

        (onnax.jvp if mode == "jvp" else onnax.vjp)(tiny)
    else:
        from onnx_ad import forward, reverse

        (forward if mode == "jvp" else reverse)(ir.to_proto(tiny), layout="onnx")


def measure(tool: str, mode: str, path: str, image: str, output: str, repeats: int) -> dict:
    """Runs in a subprocess of its own: transform, then runtimes."""
    import onnx
    import onnx_ir as ir

    _warm_up(tool, mode)
    if tool == "onnax":
        import onnax

        model = ir.load(path)
        fn = onnax.jvp if mode == "jvp" else onnax.vjp
        before = _start_peak()
        start = time.perf_counter()
        result = fn(model, [image], [output])
        seconds = time.perf_counter() - start
        peak = _peak_growth(before)
        proto = ir.to_proto(result)
    else:
        from onnx_ad import forward, reverse

        model_proto = onnx.load(path)
        fn = forward if mode == "jvp" else reverse
        before = _start_peak()
        start = time.perf_counter()
        proto = fn(model_proto, inputs=[image], outputs=[output], layout="onnx")
        seconds = time.perf_counter() - start
        peak = _peak_growth(before)
    rng = np.random.default_rng(0)
    primal = _session(path)
    primal_feeds = _feeds(primal, rng)
    derived = _session(proto.SerializeToString())
    feeds = {**_feeds(derived, rng), **primal_feeds}
    t_primal, t_derived = _time_pair(primal, primal_feeds, derived, feeds, repeats)
    return {
        "seconds": seconds,
        "peak_bytes": peak,
        "ratio": t_derived / t_primal,
        "primal_s": t_primal,
        "product_share": product_share(path, primal_feeds),
    }


def _prepare_model(name: str, folder: str) -> tuple[str, str, str, int]:
    """Writes the opset-17 model with random weights; returns path, image, output, node count."""
    import onnx_ir as ir

    import zoo
    from onnax.passes.prepare import prepare

    model = prepare(zoo.load(name), "bench")
    assert model.opset_imports[""] == OPSET, model.opset_imports
    graph = model.graph
    # A current-IR model: weights are initializers only, not graph inputs as in IR version 3.
    for v in list(graph.inputs):
        if v.name in graph.initializers:
            graph.inputs.remove(v)
    model.ir_version = 8
    for v in [*(o for n in graph for o in n.outputs)]:
        if not v.is_graph_output():
            v.shape = None  # as a user's file: no value_info
            v.type = None
    path = os.path.join(folder, f"{name}.onnx")
    ir.save(model, path)
    image = str(zoo.image_input(model).name)
    output = str(next(iter(graph.outputs)).name)
    return path, image, output, len(graph)


def _have_onnx_ad() -> bool:
    try:
        import onnx_ad  # noqa: F401
    except ImportError:
        return False
    return True


def _run_child(args: list[str]) -> dict | None:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail[:80]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fmt(cell: dict | None, key: str, fmt: str) -> str:
    if cell is None:
        return "-"
    if "error" in cell:
        return "error"
    value = cell[key]
    if key == "peak_bytes":
        return f"{value / 2**20:.0f} MB"
    return format(value, fmt)


def main() -> None:
    """Prints the table (and the targets) for the selected models."""
    import zoo

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(zoo.LIGHT_MODELS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the measurements here")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tool, mode, path, image, output, repeats = args.child
        print(json.dumps(measure(tool, mode, path, image, output, int(repeats))))
        return
    tools = [t for t in TOOLS if t == "onnax" or _have_onnx_ad()]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models:
            path, image, output, nodes = _prepare_model(name, folder)
            row: dict = {"nodes": nodes}
            for tool in tools:
                for mode in MODES:
                    row[f"{tool}/{mode}"] = _run_child(
                        [tool, mode, path, image, output, str(args.repeats)]
                    )
            results[name] = row
            os.remove(path)
            print(f"measured {name}", file=sys.stderr, flush=True)
    header = ["model", "nodes", "floor"]
    for tool in tools:
        header += [
            f"{tool} jvp s",
            f"{tool} vjp s",
            f"{tool} jvp/primal",
            f"{tool} vjp/primal",
            f"{tool} jvp mem",
            f"{tool} vjp mem",
        ]
    rows = []
    floors: dict[str, float] = {}
    for name, row in results.items():
        shares = [
            cell["product_share"]
            for cell in row.values()
            if isinstance(cell, dict) and "product_share" in cell
        ]
        if shares:
            floors[name] = 1 + statistics.median(shares)
        floor = f"{floors[name]:.2f}" if shares else "-"
        line = [name, str(row["nodes"]), floor]
        for tool in tools:
            j, v = row.get(f"{tool}/jvp"), row.get(f"{tool}/vjp")
            line += [
                _fmt(j, "seconds", ".2f"),
                _fmt(v, "seconds", ".2f"),
                _fmt(j, "ratio", ".2f"),
                _fmt(v, "ratio", ".2f"),
                _fmt(j, "peak_bytes", ""),
                _fmt(v, "peak_bytes", ""),
            ]
        rows.append(line)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    for tool in tools:
        ratios = {
            m: [
                results[n][f"{tool}/{m}"]["ratio"]
                for n in results
                if results[n].get(f"{tool}/{m}") and "ratio" in results[n][f"{tool}/{m}"]
            ]
            for m in MODES
        }
        secs = [
            results[n][f"{tool}/{m}"]["seconds"]
            for n in results
            for m in MODES
            if results[n].get(f"{tool}/{m}") and "seconds" in results[n][f"{tool}/{m}"]
        ]
        if ratios["vjp"] and ratios["jvp"] and floors:
            print(
                f"{tool}: vjp/primal median {statistics.median(ratios['vjp']):.2f} "
                f"(max {max(ratios['vjp']):.2f}; targets <= 2.5 median, <= 3 each), "
                f"jvp/primal max {max(ratios['jvp']):.2f} (target <= 2; floors up to "
                f"{max(floors.values()):.2f}), "
                f"transform max {max(secs):.2f} s (target <= 0.5 s)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
