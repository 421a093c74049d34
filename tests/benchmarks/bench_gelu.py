"""GELU inside reverse mode: the primal, ``grad`` w.r.t. every weight and the input, per kernel.

Usage::

    uv run python tests/benchmarks/bench_gelu.py [--shapes vit,convnext,gpt2] [--rounds 7]
        [--profile-runs 3] [--save DIR] [--against DIR]

To compare two versions of onnax side by side in one run, save the gradients of one (say
``git archive main src | tar -x -C /tmp/base`` and ``PYTHONPATH=/tmp/base/src ... --save
/tmp/base-grads``) and pass ``--against /tmp/base-grads`` to the other.

Each model, built with onnx_ir at opset 18, is ``MatMul -> Add -> GELU -> MatMul -> Add`` (the
exports' biases) with the loss ``sum(o * o)`` of its output ``o``, the GELU in an exporter's
primitives: torch's exact ``0.5 * (x * (1 + erf(x / sqrt 2)))`` (``vit``: 197 tokens x batch 8,
384 -> 1536 -> 384, as ViT-S's MLP; ``convnext``: 56 x 56 positions x batch 8 channels-last,
96 -> 384 -> 96, as convnext-tiny's first stage) and GPT-2's tanh form (``gpt2``: 128 tokens x
batch 8, 512 -> 2048 -> 512). Random seeded weights and input.

It prints, at one onnxruntime thread and ``ORT_ENABLE_ALL``, the medians of CPU time over
interleaved rounds of the primal and of ``onnax.grad`` w.r.t. every weight and bias and the
input (and of ``grad_ref``, see ``--against``), with their ratios to the primal; then
onnxruntime's profile of each (``SessionOptions.enable_profiling``): the kernel time per op type
per run, the GELU-related time (every kernel but the products and ReduceSum: the GELU's, the
bias Add's and the loss's small Mul) and the op types of the optimized graph (a ``Gelu`` or
``FastGelu`` there shows that onnxruntime fused the forward chain).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

import onnax

SHAPES: dict[str, tuple[str, int, int, int]] = {
    # name: (form, rows, width, hidden)
    "vit": ("erf", 197 * 8, 384, 1536),
    "convnext": ("erf", 56 * 56 * 8, 96, 384),
    "gpt2": ("tanh", 128 * 8, 512, 2048),
}
MATMULS = {"MatMul", "Gemm", "FusedMatMul", "ReduceSum", "MatMulScaleFusion"}


def _const(value: float) -> ir.Value:
    node = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(value, np.float32))})
    return node.outputs[0]


class _Builder:
    """Collects the nodes of one graph."""

    def __init__(self) -> None:
        self.nodes: list[ir.Node] = []

    def op(self, op_type: str, inputs: Sequence[ir.Value], **attrs: int) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attrs)
        self.nodes.append(node)
        return node.outputs[0]

    def c(self, value: float) -> ir.Value:
        v = _const(value)
        producer = v.producer()
        assert producer is not None
        self.nodes.append(producer)
        return v


def _gelu(b: _Builder, x: ir.Value, form: str) -> ir.Value:
    if form == "erf":
        s = b.op("Add", [b.op("Erf", [b.op("Div", [x, b.c(math.sqrt(2.0))])]), b.c(1.0)])
        return b.op("Mul", [b.op("Mul", [x, s]), b.c(0.5)])
    hx = b.op("Mul", [x, b.c(0.5)])
    cube = b.op("Mul", [b.op("Pow", [x, b.c(3.0)]), b.c(0.044715)])
    u = b.op("Mul", [b.op("Add", [x, cube]), b.c(math.sqrt(2.0 / math.pi))])
    return b.op("Mul", [hx, b.op("Add", [b.op("Tanh", [u]), b.c(1.0)])])


def mlp(form: str, rows: int, width: int, hidden: int) -> ir.Model:
    """``sum(o * o)``, ``o = gelu(X W1 + B1) W2 + B2``, the GELU in ``form``'s primitives."""
    rng = np.random.default_rng(0)
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([rows, width]))
    shapes = {"W1": (width, hidden), "B1": (hidden,), "W2": (hidden, width), "B2": (width,)}
    inits = {}
    for name, shape in shapes.items():
        data = (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)
        inits[name] = ir.Value(
            name=name,
            type=ir.TensorType(ir.DataType.FLOAT),
            shape=ir.Shape(shape),
            const_value=ir.tensor(data, name=name),
        )
    b = _Builder()
    h = _gelu(b, b.op("Add", [b.op("MatMul", [x, inits["W1"]]), inits["B1"]]), form)
    out = b.op("Add", [b.op("MatMul", [h, inits["W2"]]), inits["B2"]])
    # sum(out * out), not sum(out): with a constant seed onnxruntime would fold the cotangent
    # of the hidden layer (ones @ W2^T) at load time and leave one product out of the backward.
    y = b.op("ReduceSum", [b.op("Mul", [out, out])], keepdims=0)
    y.name = "loss"
    y.dtype = ir.DataType.FLOAT
    y.shape = ir.Shape([])
    graph = ir.Graph(
        [x],
        [y],
        nodes=b.nodes,
        initializers=list(inits.values()),
        opset_imports={"": 18},
        name="mlp",
    )
    return ir.Model(graph, ir_version=9)


def _options(profile: str | None = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if profile is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    return so


def _bytes(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


def _optimized_ops(model: ir.Model, tmp: str) -> list[str]:
    so = _options()
    path = os.path.join(tmp, "opt.onnx")
    so.optimized_model_filepath = path
    ort.InferenceSession(_bytes(model), so, providers=["CPUExecutionProvider"])
    return sorted({n.op_type for n in ir.load(path).graph})


def _profile(
    model: ir.Model, feeds: dict[str, np.ndarray], runs: int, tmp: str
) -> dict[str, float]:
    """Milliseconds per run per op type, from onnxruntime's profiler."""
    sess = ort.InferenceSession(
        _bytes(model), _options(os.path.join(tmp, "prof")), providers=["CPUExecutionProvider"]
    )
    sess.run(None, feeds)  # warm-up, counted out below
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    # A run's kernel events come before its own ``model_run`` event, which closes it.
    per_run: list[dict[str, float]] = [collections.defaultdict(float)]
    for e in events:
        if e.get("name") == "model_run":
            per_run.append(collections.defaultdict(float))
        elif e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_run[-1][e["args"]["op_name"]] += e["dur"] / 1000.0
    kept = per_run[1:-1]  # less the warm-up and the empty bucket after the last run
    ops = {op for r in kept for op in r}
    return {op: statistics.median(r.get(op, 0.0) for r in kept) for op in sorted(ops)}


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            # CPU time of this (one-threaded) process: less sensitive than wall time to the
            # other processes sharing the machine's cores.
            t0 = time.process_time()
            fn()
            times[k].append(time.process_time() - t0)
    return {k: statistics.median(v) * 1000.0 for k, v in times.items()}


def bench(
    name: str, rounds: int, profile_runs: int, save: Path | None, against: Path | None
) -> None:
    """Time and profile one shape's primal and gradient, printing a table.

    With ``save``, the gradient model is written there; with ``against``, the one saved there
    (by another checkout of onnax) is timed beside this one's, as ``grad_ref``.
    """
    form, rows, width, hidden = SHAPES[name]
    primal = mlp(form, rows, width, hidden)
    gradient = onnax.grad(primal, inputs=["X", "W1", "B1", "W2", "B2"])
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        ir.save(gradient, save / f"{name}.grad.onnx")
    x = np.random.default_rng(1).standard_normal((rows, width)).astype(np.float32)
    feeds = {"X": x}
    models = {"primal": primal, "grad": gradient}
    if against is not None:
        models["grad_ref"] = ir.load(against / f"{name}.grad.onnx")
    sessions = {
        k: ort.InferenceSession(_bytes(m), _options(), providers=["CPUExecutionProvider"])
        for k, m in models.items()
    }
    medians = _interleaved(
        {k: functools.partial(s.run, None, feeds) for k, s in sessions.items()}, rounds
    )
    print(f"\n{name} ({form}, {rows} x {width} -> {hidden} -> {width})")
    cells = "  ".join(
        f"{k} {v:.1f} ms ({v / medians['primal']:.2f})" for k, v in medians.items() if k != "primal"
    )
    print(f"  primal {medians['primal']:.1f} ms  {cells}")
    with tempfile.TemporaryDirectory() as tmp:
        for k, m in models.items():
            prof = _profile(m, feeds, profile_runs, tmp)
            gelu = sum(v for op, v in prof.items() if op not in MATMULS)
            cells = ", ".join(f"{op} {v:.1f}" for op, v in prof.items())
            print(f"  {k:8s} nodes {len(list(m.graph)):3d}  gelu-related {gelu:.1f} ms: {cells}")
            print(f"           optimized op types: {' '.join(_optimized_ops(m, tmp))}")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="vit,convnext,gpt2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile-runs", type=int, default=3)
    parser.add_argument("--save", type=Path, default=None, help="write the gradients here")
    parser.add_argument("--against", type=Path, default=None, help="time these gradients too")
    args = parser.parse_args(argv)
    for name in args.shapes.split(","):
        bench(name, args.rounds, args.profile_runs, args.save, args.against)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
