"""Reverse mode on real networks: gradients w.r.t. every weight, against the primal and PyTorch.

Usage::

    uv run python tests/benchmarks/bench_training.py [--torch-python /path/to/venv/bin/python]
        [--models resnet18,gpt2,bert,vit_s16,convnext_tiny] [--batches 1,8] [--rounds 7]
        [--cache /tmp/onnax-bench-training] [--tiny] [--corpus] [--skip vmap_grad,jvp_grad]
        [--run-time-batch]
        [--ortt-python /tmp/ortt/bin/python [--ortt-pythonpath DIR]]

The networks (resnet18 at 224 px, a GPT-2-small-shaped decoder of 6 layers x 512 at sequence
128, a BERT-base-shaped encoder, ViT-S/16 and convnext-tiny; random seeded weights, eval mode)
are built and exported by ``training_torch.py`` in a Python that has torch, transformers and
timm; make one with ``python -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.13.0
transformers timm onnxscript`` (torch is a CPU wheel on this machine's local index). The exports
and PyTorch's own timings land in ``--cache`` and are reused on the next run. ``--corpus`` adds
the small real-model corpus of ``tests/data/real`` (its TorchScript exports, batch 2, with the
loss ``sum(y * r)`` of its references), which needs no torch. ``--run-time-batch`` adds, for
every batch above 1, the same export with its batch dimension made symbolic (the way users'
exports with a dynamic batch axis come; the rules then take their run-time-batch forms), timed
at the same batch.

Per model and batch it prints, all at one onnxruntime thread, medians over rounds interleaved
with the primal's:

* primal time, and each derivative's time over the primal's: ``grad_all`` (the loss w.r.t.
  every float initializer but BatchNormalization's running statistics: the parameters that
  PyTorch's backward, which it is compared with, differentiates; not the input),
  ``grad_in`` (w.r.t. the input), ``vjp`` (of ``y`` w.r.t. the input), ``jvp_grad`` (forward
  over reverse w.r.t. the input: a Hessian-vector product) and ``vmap_grad`` (per-example
  gradients of every weight: vmap of the batch-1 model's grad over the batch);
* node counts of the primal and of each derivative;
* the floor of ``grad_all``: Conv, Gemm and MatMul take a share ``s`` of the primal's kernel
  time (onnxruntime's profiler), and the weight and the data gradients each run products of
  the same FLOPs once more (the first layer's data gradient aside), so no gradient model of the
  network runs in much less than ``1 + 2 s`` times the primal with these kernels;
* the measured floor of ``grad_all`` and ``jvp_grad``: the kernel time of the derivative's own
  products (Conv, ConvTranspose, Gemm, MatMul and onnxruntime's fusions of them), its other
  kernels and the time between its kernels (allocation, the executor), each as its share of
  the derivative's profiled run times the derivative's timed ratio to the primal. The products, in the forms onnax emits (the
  fastest bench_conv_grad.py measured), are work no better graph of the same forms avoids,
  but they run slower than the estimate above (a weight gradient's product has no prepacked
  weight, a data gradient's ConvTranspose is no forward Conv), so this is the floor as measured;
  the other two are what a better graph could still win;
* the peak activation memory of the onnxruntime session for the primal and for ``grad_all``
  (the peak of the resident set during a run over the one before it, with onnxruntime's arena
  off, in a fresh process each: the peak of the tensors alive at once);
* head to head against PyTorch eager on the same weights, where ``--torch-python`` is given:
  onnax time / torch time for the forward, ``grad_all`` (against forward + backward of every
  parameter), ``grad_in``, ``jvp_grad`` (``torch.func.jvp`` of ``torch.func.grad``) and
  ``vmap_grad`` (``torch.func.vmap(torch.func.grad)``). PyTorch runs in a worker process
  (``torch_worker.py``) that rebuilds the exported network (the zoo's: converts it with
  onnx2torch) and checks its loss against onnxruntime's; each round runs PyTorch's forward and
  its counterpart of the derivative right after onnxruntime's, so the ratio is side by side.
  Without ``--torch-python`` the timings the export run saved are used, and the report says so.

* the activations PyTorch's autograd keeps for the backward of every parameter (``torch
  saved``), beside onnxruntime's peak for ``grad_all``;
* head to head against onnxruntime-training 1.19.2's gradient graph, where ``--ortt-python``
  names an interpreter that has it (see ``training_ortt.py`` for how to make one) and
  ``generate_artifacts`` builds: its train step (forward + gradient graph w.r.t. every weight)
  and onnax's gradient w.r.t. the same weights, both timed in onnxruntime-training's own
  onnxruntime, interleaved, with their ratio. onnxruntime-training imports torch; with
  ``--torch-python`` given, a directory of links to that torch (without its onnx, onnxruntime
  and numpy) is put on its path.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

import onnax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ortt_worker import against_ortt, report_ortt, torch_only_path
from torch_worker import TorchWorker
from training_memory import output_bytes, peak_memory
from training_zoo import ZOO_MODELS, write_zoo

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "data" / "real"
MODELS = ("resnet18", "gpt2", "bert", "vit_s16", "convnext_tiny")
DERIVATIVES = ("grad_all", "grad_in", "vjp", "jvp_grad", "vmap_grad")
# onnax derivative -> the PyTorch timing it is compared with (training_torch.py's names)
TORCH_OF = {
    "primal": "forward",
    "grad_all": "backward_params",
    "grad_in": "backward_input",
    "jvp_grad": "hvp",
    "vmap_grad": "per_example",
}


@dataclass
class Bench:
    """One model at one batch size: the primal and its derivatives with their feeds."""

    name: str
    models: dict[str, ir.Model] = field(default_factory=dict)
    feeds: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    torch: dict[str, float] = field(default_factory=dict)
    torch_source: str = ""  # how the PyTorch timings were taken, for the report


def _count(model: ir.Model) -> int:
    return sum(1 for g in model.graphs() for _ in g)


def _running_statistic(value: ir.Value) -> bool:
    """Whether every use of ``value`` is as a BatchNormalization's running mean or variance."""
    uses = value.uses()
    return bool(uses) and all(
        use.node.op_type == "BatchNormalization" and use.idx in (3, 4) for use in uses
    )


def _float_initializers(model: ir.Model) -> list[str]:
    """The weights a training step updates: float initializers but BatchNormalization's running
    statistics (buffers, not parameters, in PyTorch, whose backward it is compared with)."""
    return [
        name
        for name, v in model.graph.initializers.items()
        if v.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)
        and v.const_value is not None
        and v.const_value.size > 1
        and not _running_statistic(v)
    ]


def _session(model: ir.Model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    proto = ir.serde.serialize_model(model)
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _feeds_for(sess: ort.InferenceSession, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The given feeds, and ones for every other input (seeds and tangents)."""
    rng = np.random.default_rng(0)
    feeds = {}
    types = {"tensor(float)": np.float32, "tensor(double)": np.float64}
    for arg in sess.get_inputs():
        if arg.name in given:
            feeds[arg.name] = given[arg.name]
            continue
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        feeds[arg.name] = rng.standard_normal(shape).astype(types.get(arg.type, np.float32))
    return feeds


def derive(primal: ir.Model, x: np.ndarray, single: ir.Model | None, skip: set[str]) -> Bench:
    """The primal's derivative models, each with its feeds."""
    bench = Bench("")
    weights = _float_initializers(primal)
    floating = np.issubdtype(x.dtype, np.floating)
    bench.models["primal"] = primal
    bench.feeds["primal"] = {"x": x}
    builders: dict[str, Callable[[], ir.Model]] = {
        # The weights only, as PyTorch's backward_params: the input's gradient is grad_in.
        "grad_all": lambda: onnax.grad(primal, inputs=weights, output="loss"),
    }
    if floating:
        builders["grad_in"] = lambda: onnax.grad(primal, inputs="x", output="loss")
        builders["vjp"] = lambda: onnax.vjp(primal, inputs="x", outputs="y")
        builders["jvp_grad"] = lambda: onnax.jvp(
            onnax.grad(primal, inputs="x", output="loss"), inputs="x"
        )
    if single is not None and x.shape[0] > 1:
        single_weights = _float_initializers(single)
        builders["vmap_grad"] = lambda: onnax.vmap(
            onnax.grad(single, inputs=single_weights, output="loss"), in_axes=0
        )
    for name, build in builders.items():
        if name in skip:
            continue
        start = time.process_time()
        try:
            bench.models[name] = build()
        except onnax.OnnaxError as error:  # report and go on: one refusal is a finding
            print(f"  {name}: refused: {str(error).splitlines()[0]}")
            continue
        print(f"  {name}: transform {time.process_time() - start:.1f} s CPU", flush=True)
        feeds = {"x": x[:, None] if name == "vmap_grad" else x}
        bench.feeds[name] = feeds
    return bench


def time_models(
    bench: Bench, rounds: int, torch_side: TorchWorker | None = None
) -> dict[str, float]:
    """Median run time of every model of ``bench``, each derivative interleaved with the primal.

    One derivative's session at a time, in rounds alternating with the primal's, then dropped:
    the sessions of all of convnext-tiny's derivatives at batch 8 held at once outgrew the
    machine's 24 GiB. The primal's time is the median over all its rounds.

    With ``torch_side`` (a worker that has loaded the same network), every round also runs
    PyTorch's forward and its computation of the round's derivative, each right after
    onnxruntime's, and ``bench.torch`` gets their medians: a side-by-side ratio. The worker's
    loss must equal onnxruntime's primal loss first (the same network and weights), or the
    head-to-head is dropped with a message.

    The warm-up is two runs: onnxruntime's first run records the memory pattern and the second
    allocates its block, page faults and all (a convnext-tiny gradient at batch 1: 918, 933,
    then 367 ms a run), so a single warm-up left one slow run among the timed rounds.
    """

    def timed(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> float:
        start = time.perf_counter()
        sess.run(None, feeds)
        return time.perf_counter() - start

    def warm(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
        for _ in range(2):
            sess.run(None, feeds)

    primal = _session(bench.models["primal"])
    primal_feeds = _feeds_for(primal, bench.feeds["primal"])
    warm(primal, primal_feeds)
    if torch_side is not None and not _same_network(primal, primal_feeds, torch_side):
        torch_side = None
    samples: dict[str, list[float]] = {"primal": []}
    torch_samples: dict[str, list[float]] = {}

    def torch_round(name: str) -> None:
        for key in ("forward", TORCH_OF.get(name)):
            if torch_side is not None and key in torch_side.cases:
                torch_samples.setdefault(key, []).append(torch_side.time(key))

    derivatives = [name for name in bench.models if name != "primal"]
    for name in derivatives:
        sess = _session(bench.models[name])
        feeds = _feeds_for(sess, bench.feeds[name])
        warm(sess, feeds)
        samples[name] = []
        for _ in range(rounds):
            samples["primal"].append(timed(primal, primal_feeds))
            samples[name].append(timed(sess, feeds))
            torch_round(name)
        del sess  # its arena goes with it
    if not derivatives:
        for _ in range(rounds):
            samples["primal"].append(timed(primal, primal_feeds))
            torch_round("primal")
    if torch_side is not None:
        bench.torch = {k: statistics.median(v) for k, v in torch_samples.items()}
        bench.torch["saved_bytes"] = torch_side.saved_bytes
        bench.torch_source = "side by side"
    return {name: statistics.median(s) for name, s in samples.items()}


def _same_network(
    primal: ort.InferenceSession, feeds: dict[str, np.ndarray], torch_side: TorchWorker
) -> bool:
    """Whether PyTorch's loss at the example equals onnxruntime's (float32 rounding aside)."""
    names = [o.name for o in primal.get_outputs()]
    if "loss" not in names:
        print("  PyTorch head to head dropped: the primal has no output 'loss' to compare")
        return False
    ours = float(primal.run(["loss"], feeds)[0])
    if abs(ours - torch_side.loss) <= 1e-3 * max(1.0, abs(ours)):
        return True
    print(
        f"  PyTorch head to head dropped: its loss {torch_side.loss:.6g} is not onnxruntime's"
        f" {ours:.6g}, so the two sides do not run the same network"
    )
    return False


# The kernels of products in onnxruntime's profile (its fusions and layouts included), with the
# ConvTranspose of strided data gradients: the work no spelling of a derivative can avoid.
PRODUCT_KERNELS = frozenset(
    {"Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"}
)


RUN = "(run)"  # kernel_times' key of a whole run's seconds


def kernel_times(model: ir.Model, feeds: dict[str, np.ndarray], runs: int = 3) -> dict[str, float]:
    """Seconds a run spends in each operator's kernels (onnxruntime's profiler, one thread),
    and under :data:`RUN` the seconds of the whole run (kernels and what runs between them).

    Two runs warm up first (see :func:`time_models`); the profile covers the ``runs`` after.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_profiling = True
    proto = ir.serde.serialize_model(model).SerializeToString()
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "profile")
        sess = ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
        all_feeds = _feeds_for(sess, feeds)
        for _ in range(2):
            sess.run(None, all_feeds)
        for _ in range(runs):
            sess.run(None, all_feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    # The warm-up runs are in the profile too: count from the first timed run's start.
    timed = [e for e in events if e.get("name") == "model_run"][-runs:]
    began = timed[0]["ts"]
    by_op: dict[str, float] = {RUN: sum(e["dur"] for e in timed) * 1e-6 / runs}
    for event in events:
        if (
            event.get("cat") == "Node"
            and event["name"].endswith("_kernel_time")
            and event["ts"] >= began
        ):
            op = event["args"]["op_name"]
            by_op[op] = by_op.get(op, 0.0) + event["dur"] * 1e-6 / runs
    return by_op


def _products(by_op: dict[str, float]) -> float:
    return sum(t for op, t in by_op.items() if op in PRODUCT_KERNELS)


def report(name: str, bench: Bench, times: dict[str, float], memory: dict[str, int]) -> None:
    primal = times["primal"]
    nodes = _count(bench.models["primal"])
    print(f"{name}: primal {1e3 * primal:.1f} ms, {nodes} nodes", end="")
    if memory:
        print(f", peak activations primal {memory['primal'] / 2**20:.0f} MiB", end="")
    print()
    print(f"  {'model':<10} {'ms':>9} {'/primal':>8} {'nodes':>7} {'/primal':>8} {'vs torch':>9}")
    if bench.torch_source:
        print(f"  (vs torch: onnax time / PyTorch time, PyTorch timed {bench.torch_source})")
    for key in ("primal", *DERIVATIVES):
        if key not in times:
            continue
        torch_key = TORCH_OF.get(key)
        vs = (
            f"{times[key] / bench.torch[torch_key]:>9.2f}"
            if torch_key and torch_key in bench.torch
            else f"{'-':>9}"
        )
        n = _count(bench.models[key])
        print(
            f"  {key:<10} {1e3 * times[key]:>9.1f} {times[key] / primal:>8.2f} {n:>7} "
            f"{n / nodes:>8.2f} {vs}"
        )
    kernels = kernel_times(bench.models["primal"], bench.feeds["primal"])
    share = _products(kernels) / (sum(kernels.values()) - kernels[RUN])
    print(
        f"  floor: Conv/Gemm/MatMul are {100 * share:.0f} % of the primal's kernel time, so a"
        f" gradient w.r.t. the weights costs about {1 + 2 * share:.2f}x the primal"
    )
    for key in ("grad_all", "jvp_grad"):
        if key in bench.models:
            theirs = kernel_times(bench.models[key], bench.feeds[key])
            products = _products(theirs)
            other = sum(theirs.values()) - theirs[RUN] - products
            # Shares of the derivative's own profiled run, scaled to its timed ratio: a profile
            # taken minutes from the timed rounds on a shared machine moves by 10 %, a share
            # within one profile far less.
            ratio = times[key] / primal if key in times else theirs[RUN] / kernels[RUN]
            print(
                f"  measured floor of {key}: of its {ratio:.2f}x the primal, its products take"
                f" {ratio * products / theirs[RUN]:.2f}x, its other kernels"
                f" {ratio * other / theirs[RUN]:.2f}x, the time between kernels"
                f" {ratio * (theirs[RUN] - products - other) / theirs[RUN]:.2f}x"
            )
    if "grad_all" in memory:
        ratio = memory["grad_all"] / max(memory["primal"], 1)
        # The outputs hold gradients the size of the weights (bert-base's: 420 MiB), which the
        # peak includes and torch's saved tensors do not: compare what is left.
        outputs = output_bytes(bench.models["grad_all"])
        working = memory["grad_all"] - outputs
        print(
            f"  peak activations grad_all {memory['grad_all'] / 2**20:.0f} MiB ({ratio:.1f}x"
            f" primal), of which the outputs (gradients, y) {outputs / 2**20:.0f} MiB",
            end="",
        )
        saved = bench.torch.get("saved_bytes")
        if saved:
            print(
                f"; torch autograd saves {saved / 2**20:.0f} MiB"
                f" (onnax peak less outputs / torch saved = {working / saved:.2f})",
                end="",
            )
        print()


def _export(
    torch_python: str, cache: Path, models: Sequence[str], batches: str, tiny: bool, rounds: int
) -> None:
    command = [
        torch_python,
        str(HERE / "training_torch.py"),
        "--out",
        str(cache),
        "--models",
        ",".join(models),
        "--batches",
        batches,
        "--rounds",
        str(rounds),
    ]
    if tiny:
        command.append("--tiny")
    subprocess.run(command, check=True)


# name, primal, input, batch-1 twin, PyTorch timings from the export run, and what the PyTorch
# worker loads to time the same network side by side (training_torch.serve's "load")
Case = tuple[str, ir.Model, np.ndarray, ir.Model | None, dict[str, float], dict[str, object] | None]


def _read(path: Path) -> ir.Model:
    """The model at ``path`` with every weight in memory.

    The sessions here are opened from serialized bytes, against which onnxruntime cannot
    resolve an external data file (the corpus's TorchScript exports keep their weights in one).
    """
    return ir.external_data.load_to_model(ir.load(path))


def _load(
    cache: Path, models: Sequence[str], batches: Sequence[str], tiny: bool, converted: bool
) -> list[Case]:
    """The exports in ``cache`` with their inputs, batch-1 twins and PyTorch timings (if any).

    PyTorch's side of a case is the network the export came from, or with ``converted`` (the
    zoo's models, which no PyTorch code built) the file converted by onnx2torch.
    """
    cases: list[Case] = []
    for m in models:
        single_path = cache / f"{m}.b1.onnx"
        single = _read(single_path) if single_path.exists() else None
        for b in batches:
            stem = cache / f"{m}.b{b}"
            timed = stem.with_name(stem.name + ".torch.json")
            torch_times = json.loads(timed.read_text()) if timed.exists() else {}
            x = np.load(stem.with_name(stem.name + ".npz"))["x"]
            path = stem.with_name(stem.name + ".onnx")
            model = _read(path)
            spec: dict[str, object] = (
                {"onnx": str(path)}
                if converted
                else {"model": m, "batch": int(b), "tiny": tiny, "x": f"{stem}.npz"}
            )
            cases.append((f"{m} batch {b}", model, x, single, torch_times, spec))
    return cases


def run_time_batch(model: ir.Model) -> ir.Model:
    """A copy of ``model`` whose input ``x`` has a symbolic batch dimension.

    The outputs' leading dimension goes symbolic with it, and every other value's shape is
    cleared for the transforms' inference to find again (from the symbolic batch).
    """
    copy = ir.from_proto(ir.serde.serialize_model(model))
    graph = copy.graph
    x = next(v for v in graph.inputs if v.name == "x")
    assert x.shape is not None and x.shape.rank() > 0, "x needs a batch dimension"
    batch = x.shape.dims[0]
    x.shape = ir.Shape([ir.SymbolicDim("batch"), *x.shape.dims[1:]])
    for node in graph:
        for out in node.outputs:
            if not out.is_graph_output():
                out.shape = None
            elif out.shape is not None and out.shape.rank() and out.shape.dims[0] == batch:
                out.shape = ir.Shape([ir.SymbolicDim("batch"), *out.shape.dims[1:]])
    return copy


def _with_run_time_batch(cases: list[Case]) -> list[Case]:
    """Every case, each one at a batch above 1 followed by its :func:`run_time_batch` twin."""
    out = []
    for name, model, x, single, torch_times, spec in cases:
        out.append((name, model, x, single, torch_times, spec))
        if x.shape[0] > 1:
            twin = run_time_batch(model)
            out.append((f"{name} (run-time batch)", twin, x, single, torch_times, spec))
    return out


def _corpus() -> list[tuple[str, ir.Model, np.ndarray]]:
    """The real-model corpus's TorchScript exports with the loss ``sum(y * r)`` appended."""
    found = []
    for path in sorted(REAL.glob("*.torchscript.onnx")):
        arch = path.name.split(".")[0]
        refs = np.load(REAL / f"{arch}.npz")
        model = _read(path)
        inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
        if len(inputs) != 1 or len(model.graph.outputs) != 1:
            continue  # the head-to-head harness feeds one input ``x``
        inputs[0].name = "x"
        y = model.graph.outputs[0]
        y.name = "y"
        r = ir.Value(
            name="loss_weights", const_value=ir.tensor(refs["loss_weights"].astype(np.float32))
        )
        r.type, r.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(refs["loss_weights"].shape)
        model.graph.register_initializer(r)
        product = ir.node("Mul", [y, r])
        total = ir.node("ReduceSum", [product.outputs[0]], attributes={"keepdims": 0})
        total.outputs[0].name = "loss"
        total.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        total.outputs[0].shape = ir.Shape([])
        model.graph.extend([product, total])
        model.graph.outputs.append(total.outputs[0])
        x = next(refs[k] for k in refs.files if k.startswith("input/")).astype(np.float32)
        found.append((f"{arch} (corpus)", model, x))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--torch-python", default=None)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("/tmp/onnax-bench-training"),
        help="the exports go to its full/ (tiny/ with --tiny); that folder itself is accepted",
    )
    parser.add_argument("--tiny", action="store_true", help="narrow networks: a quick check")
    parser.add_argument("--corpus", action="store_true", help="add tests/data/real")
    parser.add_argument("--zoo", action="store_true", help="add " + ", ".join(ZOO_MODELS))
    parser.add_argument("--skip", default="", help="derivatives to skip, e.g. vmap_grad")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--run-time-batch", action="store_true", help="add each batch above 1 made symbolic"
    )
    parser.add_argument("--ortt-python", default=None, help="a Python with onnxruntime-training")
    parser.add_argument("--ortt-pythonpath", type=Path, default=None)
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    # The exports live in --cache's full/ (or tiny/): a --cache naming that folder itself is
    # taken as it is, not given a second full/ to export everything into again.
    sizes = "tiny" if args.tiny else "full"
    cache = args.cache if args.cache.name == sizes else args.cache / sizes
    missing = [
        m
        for m in models
        for b in args.batches.split(",")
        if not (cache / f"{m}.b{b}.onnx").exists()
    ]
    if missing and args.torch_python:
        _export(args.torch_python, cache, models, args.batches, args.tiny, args.rounds)
    elif missing:
        print(f"no exports for {sorted(set(missing))} in {cache}: pass --torch-python (see --help)")
        models = [m for m in models if m not in missing]
    skip = set(args.skip.split(",")) - {""}
    batches = args.batches.split(",")
    cases = _load(cache, models, batches, args.tiny, converted=False)
    if args.zoo:
        zoo_dir = args.cache / "zoo"
        write_zoo(zoo_dir, [int(b) for b in batches], args.torch_python, args.rounds)
        cases.extend(_load(zoo_dir, ZOO_MODELS, batches, args.tiny, converted=True))
    if args.corpus:
        cases.extend((name, model, x, None, {}, None) for name, model, x in _corpus())
    if args.run_time_batch:
        cases = _with_run_time_batch(cases)
    ortt_cases: dict[str, tuple[ir.Model, np.ndarray, list[str]]] = {}
    worker = TorchWorker(args.torch_python) if args.torch_python else None
    for name, primal, x, single, torch_times, spec in cases:
        print(f"\n{name}", flush=True)
        bench = derive(primal, x, single, skip)
        side = None
        if worker is not None and spec is not None:
            worker.load(spec)
            side = worker
        else:
            bench.torch = torch_times
            bench.torch_source = "from the export run" if torch_times else ""
        times = time_models(bench, args.rounds, side)
        memory: dict[str, int] = {}
        if not args.no_memory:
            for key in ("primal", "grad_all"):
                if key in bench.models:
                    model = bench.models[key]
                    feeds = _feeds_for(_session(model), bench.feeds[key])
                    memory[key] = peak_memory(model, feeds, cache / "scratch")
        report(name, bench, times, memory)
        if args.ortt_python and "grad_all" not in skip:
            weights = [
                w
                for w in _float_initializers(primal)
                if primal.graph.initializers[w].dtype == ir.DataType.FLOAT
            ]
            ortt_cases[name] = (primal, x, weights)
    if worker is not None:
        worker.close()
    if ortt_cases and args.ortt_python:
        pythonpath = args.ortt_pythonpath
        if pythonpath is None and args.torch_python:
            pythonpath = torch_only_path(args.torch_python, cache / "torch-only")
        report_ortt(
            against_ortt(ortt_cases, args.ortt_python, pythonpath, args.rounds, cache / "ortt")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
