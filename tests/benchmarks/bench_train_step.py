"""Training-step benchmark: onnax step models against the forward pass, torch.optim + autograd,
and onnxruntime-training 1.19.2 artifacts.

Usage::

    uv run python tests/benchmarks/bench_train_step.py [--repeats 50] [--batch 8]
        [--torch-python /work/torchvenv/bin/python] [--ortt-python /tmp/ortt/bin/python]
        [--ortt-pythonpath DIR:DIR]

Models (float32, every weight trained, AdamW, cross-entropy, batch 8, one thread):

* ``mlp``: 784 -> 512 -> 512 -> 10 with Relu (MatMul/Add);
* ``cnn`` and ``transformer``: the two models of ``examples/train_on_device.py`` (Conv/MaxPool/
  GlobalAveragePool/Gemm; embedding, 2-head attention, LayerNormalization, mean pool).

For each model it prints the median time of one onnxruntime run of the inference model and of
the step model (interleaved after a warm-up, so machine noise hits both alike), wall-clock and
calling-thread CPU time (with one intra-op thread onnxruntime computes on the calling thread, so
CPU time excludes waiting for a core on a loaded machine); the same for a torch loop
(``zero_grad``, forward, ``cross_entropy``, ``backward``, ``AdamW.step``; torch threads = 1) and,
when its interpreter is given, for onnxruntime-training's ``Module`` + ``Optimizer`` on artifacts
from ``generate_artifacts``. Node counts: forward, step (onnax), training + optimizer graphs
(onnxruntime-training, with their non-default domains). Peak memory: growth of the peak resident
set (``VmHWM``) from just before the session (or torch model) is made to the end of the timed
runs, each measured in a fresh process.

The torch and onnxruntime-training parts run in other interpreters (``--torch-python``,
``--ortt-python``) through this file's ``--worker`` mode, which imports only numpy and the
framework. onnxruntime-training 1.19.2 imports torch at import time; ``--ortt-pythonpath`` can put
an existing torch install on its path (see the report in docs/training.md).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_on_device.py"
LR, WD = 1e-3, 1e-2


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_on_device", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_on_device"] = module
    spec.loader.exec_module(module)
    return module


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _start_peak() -> int:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def _peak_growth(before: int) -> int:
    return max(_status_bytes("VmHWM") - before, 0)


def _timed(fn: Any) -> tuple[float, float]:
    w, c = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - w, time.thread_time() - c


def _medians(samples: list[tuple[float, float]]) -> dict[str, float]:
    return {
        "wall_ms": 1e3 * statistics.median(s[0] for s in samples),
        "cpu_ms": 1e3 * statistics.median(s[1] for s in samples),
    }


# The models and their data.

MLP_SIZES = (784, 512, 512, 10)


def mlp_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w = {}
    for i, (a, b) in enumerate(itertools.pairwise(MLP_SIZES)):
        w[f"fc{i}.weight"] = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        w[f"fc{i}.bias"] = np.zeros(b, np.float32)
    return w


def mlp_model(weights: dict[str, np.ndarray]) -> Any:
    import onnx
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    nodes, h = [], "x"
    n = len(MLP_SIZES) - 1
    for i in range(n):
        nodes.append(helper.make_node("MatMul", [h, f"fc{i}.weight"], [f"m{i}"]))
        out = "logits" if i == n - 1 else f"a{i}"
        nodes.append(
            helper.make_node("Add", [f"m{i}", f"fc{i}.bias"], [out if i == n - 1 else f"z{i}"])
        )
        if i < n - 1:
            nodes.append(helper.make_node("Relu", [f"z{i}"], [out]))
        h = out
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", MLP_SIZES[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", MLP_SIZES[-1]])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 10
    onnx.checker.check_model(proto)
    return ir.from_proto(proto)


def _setups(batch: int) -> dict[str, dict[str, Any]]:
    ex = _example()
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, Any]] = {}
    w = mlp_weights(rng)
    out["mlp"] = {
        "weights": w,
        "model": mlp_model(w),
        "x": rng.standard_normal((batch, MLP_SIZES[0])).astype(np.float32),
        "y": rng.integers(0, MLP_SIZES[-1], batch).astype(np.int64),
        "frozen": [],
    }
    for kind in ("cnn", "transformer"):
        raw = ex.cnn_weights(rng) if kind == "cnn" else ex.transformer_weights(rng)
        w = {k: v if v.dtype == np.int64 else v.astype(np.float32) for k, v in raw.items()}
        x, y = ex.batches(kind, 1, batch, seed=1)
        out[kind] = {
            "weights": w,
            "model": ex.cnn_model(w) if kind == "cnn" else ex.transformer_model(w),
            "x": x[0],
            "y": y[0],
            "frozen": ["scale"] if kind == "transformer" else [],
        }
    return out


# onnax / onnxruntime in this process.


def _session(data: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _op_counts(model: Any) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in model.graph.all_nodes()))


def bench_onnax(name: str, setup: dict[str, Any], repeats: int, tmp: Path) -> dict[str, Any]:
    import onnx_ir as ir

    from onnax import training

    model = setup["model"]
    t0 = time.perf_counter()
    step = training.step(
        training.add_loss(model, "logits", "cross_entropy"),
        frozen=setup["frozen"],
        optimizer=training.AdamW(lr=LR, weight_decay=WD),
    )
    build_s = time.perf_counter() - t0
    fwd_bytes = ir.to_proto(model).SerializeToString()
    step_bytes = ir.to_proto(step).SerializeToString()
    (tmp / f"{name}.onnx").write_bytes(fwd_bytes)
    x_name = str(model.graph.inputs[0].name)
    fwd_feeds = {x_name: setup["x"]}
    step_feeds = {x_name: setup["x"], "target": setup["y"], **training.initial_state(step)}
    fwd, st = _session(fwd_bytes), _session(step_bytes)
    fwd_run = lambda: fwd.run(None, fwd_feeds)  # noqa: E731
    # Each run feeds the step's outputs back, as a training loop does.
    pairs = training.carry(step)
    names = [o.name for o in st.get_outputs()]

    def step_run() -> None:
        out = dict(zip(names, st.run(None, step_feeds), strict=True))
        step_feeds.update({i: out[o] for i, o in pairs})

    for _ in range(5):
        fwd_run()
        step_run()
    f_samples, s_samples = [], []
    for _ in range(repeats):
        f_samples.append(_timed(fwd_run))
        s_samples.append(_timed(step_run))
    peaks = {}
    for kind, data, feeds in (("forward", fwd_bytes, fwd_feeds), ("step", step_bytes, step_feeds)):
        path = tmp / f"{name}.{kind}.onnx"
        path.write_bytes(data)
        np.savez(tmp / f"{name}.{kind}.npz", **feeds)
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "peak",
            str(path),
            str(tmp / f"{name}.{kind}.npz"),
        ]
        peaks[kind] = int(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {
        "build_s": build_s,
        "forward": _medians(f_samples),
        "step": _medians(s_samples),
        "forward_nodes": len(list(model.graph.all_nodes())),
        "step_nodes": len(list(step.graph.all_nodes())),
        "step_ops": _op_counts(step),
        "peak": peaks,
        "params": sum(int(np.prod(v.shape)) for k, v in setup["weights"].items()
                      if v.dtype == np.float32 and k not in setup["frozen"]),
    }  # fmt: skip


# Workers for other interpreters: numpy plus one framework.


def worker_peak(model_path: str, feeds_path: str) -> None:
    import onnxruntime as ort

    data = Path(model_path).read_bytes()
    with np.load(feeds_path) as f:
        feeds = {k: f[k] for k in f.files}
    before = _start_peak()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    for _ in range(20):
        sess.run(None, feeds)
    print(_peak_growth(before))


def _torch_mlp(p: dict[str, Any], x: Any) -> Any:
    import torch

    n = len(MLP_SIZES) - 1
    for i in range(n):
        x = x @ p[f"fc{i}.weight"] + p[f"fc{i}.bias"]
        if i < n - 1:
            x = torch.relu(x)
    return x


def _torch_case(name: str, item: dict[str, Any], repeats: int, ex: Any) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    with np.load(item["data"]) as f:
        data = {k: f[k] for k in f.files}
    before = _start_peak()
    p = {k[2:]: torch.tensor(v) for k, v in data.items() if k.startswith("w/")}
    trained = [k for k, v in p.items() if v.is_floating_point() and k not in item["frozen"]]
    for k in trained:
        p[k].requires_grad_(True)
    opt = torch.optim.AdamW([p[k] for k in trained], lr=LR, weight_decay=WD)
    x, y = torch.tensor(data["x"]), torch.tensor(data["y"])

    def forward() -> Any:
        return _torch_mlp(p, x) if name == "mlp" else ex.torch_forward(name, p, x)

    def fwd() -> None:
        with torch.no_grad():
            forward()

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(forward(), y).backward()
        opt.step()

    for _ in range(5):
        fwd()
        step()
    f_s, s_s = [], []
    for _ in range(repeats):
        f_s.append(_timed(fwd))
        s_s.append(_timed(step))
    return {"forward": _medians(f_s), "step": _medians(s_s), "peak": _peak_growth(before)}


def worker_torch(spec_path: str, repeats: int) -> None:
    import torch

    torch.set_num_threads(1)
    ex = _example()
    spec = json.loads(Path(spec_path).read_text())
    print(json.dumps({name: _torch_case(name, item, repeats, ex) for name, item in spec.items()}))


def _ortt_case(name: str, item: dict[str, Any], repeats: int) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort
    from onnxruntime.training import artifacts
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    # training_ortt.py, beside this file: the Sum and LayerNormalization forms ortt 1.19.2
    # builds gradients for (the transformer's LayerNormalization failed to build before).
    from training_ortt import respelled

    model = respelled(onnx.load(item["model"]))
    floats = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
    trained = [n for n in floats if n not in item["frozen"]]
    out_dir = Path(item["model"]).parent / f"ortt_{name}"
    out_dir.mkdir(exist_ok=True)
    try:
        artifacts.generate_artifacts(
            model,
            requires_grad=trained,
            frozen_params=[n for n in floats if n not in trained],
            loss=artifacts.LossType.CrossEntropyLoss,
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=str(out_dir),
        )
    except Exception as err:  # the point is to report what does not build
        return {"error": f"generate_artifacts: {type(err).__name__}: {err}"[:400]}
    counts = {}
    for part in ("training_model", "optimizer_model"):
        g = onnx.load(str(out_dir / f"{part}.onnx")).graph
        domains = collections.Counter(n.domain or "ai.onnx" for n in g.node)
        counts[part] = {"nodes": len(g.node), "domains": dict(domains)}
    with np.load(item["data"]) as f:
        x, y = f["x"], f["y"]
    before = _start_peak()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    state = CheckpointState.load_checkpoint(str(out_dir / "checkpoint"))
    module = Module(str(out_dir / "training_model.onnx"), state,
                    str(out_dir / "eval_model.onnx"), session_options=options)  # fmt: skip
    opt = Optimizer(str(out_dir / "optimizer_model.onnx"), module)
    opt.set_learning_rate(LR)
    module.train()

    def step() -> None:
        module(x, y)
        opt.step()
        module.lazy_reset_grad()

    for _ in range(5):
        step()
    samples = [_timed(step) for _ in range(repeats)]
    return {"step": _medians(samples), "peak": _peak_growth(before), "graphs": counts}


def worker_ortt(spec_path: str, repeats: int) -> None:
    spec = json.loads(Path(spec_path).read_text())
    print(json.dumps({name: _ortt_case(name, item, repeats) for name, item in spec.items()}))


def _run_worker(python: str, mode: str, spec: Path, repeats: int, env: dict[str, str]) -> Any:
    cmd = [python, __file__, "--worker", mode, str(spec), str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--torch-python", default="/work/torchvenv/bin/python")
    parser.add_argument("--ortt-python", default="/tmp/ortt/bin/python")
    parser.add_argument("--ortt-pythonpath", default=None)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        mode, *rest = args.worker
        if mode == "peak":
            worker_peak(*rest)
        elif mode == "torch":
            worker_torch(rest[0], int(rest[1]))
        else:
            worker_ortt(rest[0], int(rest[1]))
        return 0
    print(f"load average at start: {os.getloadavg()}")
    setups = _setups(args.batch)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ours = {name: bench_onnax(name, s, args.repeats, tmp) for name, s in setups.items()}
        spec = {}
        for name, s in setups.items():
            np.savez(tmp / f"{name}.data.npz", x=s["x"], y=s["y"],
                     **{f"w/{k}": v for k, v in s["weights"].items()})  # fmt: skip
            spec[name] = {"data": str(tmp / f"{name}.data.npz"), "model": str(tmp / f"{name}.onnx"),
                          "frozen": s["frozen"]}  # fmt: skip
        (tmp / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        torch_r = ortt_r = None
        if args.torch_python and Path(args.torch_python).exists():
            torch_r = _run_worker(args.torch_python, "torch", tmp / "spec.json", args.repeats, env)
        if args.ortt_python and Path(args.ortt_python).exists():
            ortt_env = dict(env)
            if args.ortt_pythonpath:
                ortt_env["PYTHONPATH"] = args.ortt_pythonpath
            ortt_r = _run_worker(
                args.ortt_python, "ortt", tmp / "spec.json", args.repeats, ortt_env
            )
    print(f"load average at end: {os.getloadavg()}")
    print(f"batch {args.batch}, 1 thread, AdamW, median of {args.repeats} runs; times in ms "
          "(calling-thread CPU / wall)")  # fmt: skip
    head = (
        "| model | params | forward | onnax step | step/fwd | torch fwd | torch step | "
        "ortt step | nodes fwd/step | ortt nodes train+optim | peak MB fwd/step/torch/ortt |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, r in ours.items():
        t = (torch_r or {}).get(name, {}) if isinstance(torch_r, dict) else {}
        o = (ortt_r or {}).get(name, {}) if isinstance(ortt_r, dict) else {}

        def cell(d: dict[str, Any], key: str) -> str:
            return f"{d[key]['cpu_ms']:.3f} / {d[key]['wall_ms']:.3f}" if key in d else "-"

        ratio = r["step"]["cpu_ms"] / r["forward"]["cpu_ms"]
        graphs = o.get("graphs")
        ortt_nodes = (f"{graphs['training_model']['nodes']}+{graphs['optimizer_model']['nodes']}"
                      if graphs else ("failed, below" if "error" in o else "-"))  # fmt: skip
        print(f"| {name} | {r['params']} | {cell(r, 'forward')} | {cell(r, 'step')} | {ratio:.1f} | "
              f"{cell(t, 'forward')} | {cell(t, 'step')} | {cell(o, 'step')} | "
              f"{r['forward_nodes']}/{r['step_nodes']} | {ortt_nodes} | "
              f"{_mb(r['peak']['forward'])}/{_mb(r['peak']['step'])}/{_mb(t.get('peak'))}/"
              f"{_mb(o.get('peak'))} |")  # fmt: skip
    for name, r in ours.items():
        print(f"{name}: step built in {r['build_s']:.2f} s; step ops {r['step_ops']}")
        o = (ortt_r or {}).get(name, {}) if isinstance(ortt_r, dict) else {}
        if "graphs" in o:
            print(f"{name}: onnxruntime-training graphs {o['graphs']}")
        elif "error" in o:
            print(f"{name}: onnxruntime-training {o['error']}")
    for label, res in (("torch", torch_r), ("onnxruntime-training", ortt_r)):
        if res is None:
            print(f"{label}: not run (interpreter not found)")
        elif "error" in res:
            print(f"{label}: failed: {res['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
