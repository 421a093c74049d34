"""Peak memory and time of ``grad`` w.r.t. every weight under each ``remat=`` policy.

Usage::

    uv run python tests/benchmarks/bench_remat.py [--models resnet18,gpt2] [--batch 2]
        [--size 112] [--rounds 3]

The networks are built here with onnx (random seeded weights): resnet18 (BasicBlocks, inference
BatchNormalization) at ``--size`` px, and a GPT-2-shaped decoder of 6 layers x 512 hidden, 8
heads, sequence 128, causal attention and a 2048-wide MLP (``x * sigmoid(1.702 x)``), on
embedded inputs. The loss is ``mean(y * y)``. Policies: ``store``, ``recompute``,
``["Conv", "MatMul", "Gemm"]`` and a budget of half the residual bytes that ``store`` keeps.

Per model and policy it prints, at one onnxruntime thread (default optimization level, less
``SkipLayerNormFusion``: see ``DISABLED``), the
median time of one run over interleaved rounds, the node count, and the peak memory of the
session's runs: the growth of the resident set's high-water mark over the resident set after
loading (``/proc/self/clear_refs`` resets the mark), measured in a fresh process per policy with
onnxruntime's arena off and glibc's mmap threshold fixed at 64 KiB, so that the resident set
follows the live buffers; once with onnxruntime's default execution order (``peak``) and once
with ``ExecutionOrder.PRIORITY_BASED`` (``prio``): the default order computes some weight
gradients late, which keeps their inputs alive and hides much of what recomputation saves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnax.passes import GradPass

DISABLED = ["SkipLayerNormFusion"]
"""onnxruntime 1.32's SkipLayerNormFusion (ORT_ENABLE_EXTENDED and above) gave gradients 3 %
off on the recompute model of the decoder (exact at ORT_ENABLE_BASIC, and with this fusion
off; not reduced to a small case yet): off for every policy, so all run the same rewrites."""

_MEMORY_CHILD = r"""
import ctypes
import sys
import numpy as np
import onnxruntime as ort

DISABLED = ["SkipLayerNormFusion"]

def status(key):
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith(key)).split()[1]) * 1024

options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.enable_cpu_mem_arena = False
options.log_severity_level = 3
options.execution_order = getattr(ort.ExecutionOrder, sys.argv[3])
sess = ort.InferenceSession(
    sys.argv[1], options, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED
)
feeds = dict(np.load(sys.argv[2]))
# What session creation freed goes back to the system, so the runs' buffers show.
ctypes.CDLL("libc.so.6").malloc_trim(0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
for _ in range(2):
    sess.run(None, feeds)
print(status("VmHWM:") - before)
"""


class _Net:
    """A small graph builder on onnx.helper with seeded weights."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def name(self, base: str) -> str:
        self.k += 1
        return f"{base}{self.k}"

    def weight(self, shape: tuple[int, ...], fan_in: int, base: str = "w") -> str:
        name = self.name(base)
        data = self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        self.inits.append(numpy_helper.from_array(data.astype(np.float32), name))
        return name

    def const(self, array: np.ndarray, base: str = "c") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def loss(self, y: str) -> None:
        sq = self.op("Mul", [y, y])
        self.nodes.append(helper.make_node("ReduceMean", [sq], ["loss"], keepdims=0))

    def model(self, x: str, shape: list[int]) -> ir.Model:
        graph = helper.make_graph(
            self.nodes,
            "net",
            [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
            self.inits,
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        proto.ir_version = 10
        return ir.from_proto(proto)


def _conv_bn(net: _Net, x: str, c_in: int, c_out: int, k: int, stride: int, relu: bool) -> str:
    w = net.weight((c_out, c_in, k, k), c_in * k * k)
    y = net.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4)
    scale = net.const(
        np.ones(c_out, np.float32) + 0.1 * net.rng.standard_normal(c_out).astype(np.float32)
    )
    bias = net.const(0.1 * net.rng.standard_normal(c_out).astype(np.float32))
    mean = net.const(0.1 * net.rng.standard_normal(c_out).astype(np.float32))
    var = net.const(np.ones(c_out, np.float32))
    y = net.op("BatchNormalization", [y, scale, bias, mean, var])
    return net.op("Relu", [y]) if relu else y


def resnet18(batch: int, size: int) -> ir.Model:
    """resnet18's structure (BasicBlocks [2, 2, 2, 2], widths 64..512), 1000 classes."""
    net = _Net(0)
    y = _conv_bn(net, "x", 3, 64, 7, 2, True)
    y = net.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, width in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            h = _conv_bn(net, y, c_in, width, 3, stride, True)
            h = _conv_bn(net, h, width, width, 3, 1, False)
            short = (
                y
                if stride == 1 and c_in == width
                else _conv_bn(net, y, c_in, width, 1, stride, False)
            )
            y = net.op("Relu", [net.op("Add", [h, short])])
            c_in = width
    y = net.op("Flatten", [net.op("GlobalAveragePool", [y])])
    y = net.op(
        "Gemm", [y, net.weight((1000, 512), 512), net.const(np.zeros(1000, np.float32))], transB=1
    )
    net.loss(y)
    return net.model("x", [batch, 3, size, size])


def gpt2(
    batch: int, layers: int = 6, hidden: int = 512, heads: int = 8, seq: int = 128
) -> ir.Model:
    """A GPT-2-shaped decoder on embedded inputs ``x: [batch, seq, hidden]``."""
    net = _Net(1)
    d = hidden // heads
    mask = net.const(np.triu(np.full((seq, seq), -1e4, np.float32), 1), "mask")
    split = net.const(np.array([batch, seq, heads, d], np.int64), "shape")
    merge = net.const(np.array([batch, seq, hidden], np.int64), "shape")
    scale = net.const(np.array(1 / np.sqrt(d), np.float32), "scale")
    quick = net.const(np.array(1.702, np.float32), "quick")

    def norm(x: str, affine: bool = False) -> str:
        g, b = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
        if affine:
            # The loss is the mean square of the last norm's output: with unit scale and no
            # shift that is var / (var + eps) per row, nearly constant, and every gradient
            # would be rounding noise.
            g = (1 + 0.5 * net.rng.standard_normal(hidden)).astype(np.float32)
            b = (0.5 * net.rng.standard_normal(hidden)).astype(np.float32)
        return net.op(
            "LayerNormalization", [x, net.const(g, "ln_g"), net.const(b, "ln_b")], axis=-1
        )

    def dense(x: str, n_in: int, n_out: int) -> str:
        y = net.op("MatMul", [x, net.weight((n_in, n_out), n_in)])
        return net.op("Add", [y, net.const(np.zeros(n_out, np.float32), "b")])

    def heads_of(x: str) -> str:
        return net.op("Transpose", [net.op("Reshape", [x, split])], perm=[0, 2, 1, 3])

    h = "x"
    for _ in range(layers):
        n = norm(h)
        q, k, v = (heads_of(dense(n, hidden, hidden)) for _ in range(3))
        s = net.op(
            "Mul", [net.op("MatMul", [q, net.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]
        )
        p = net.op("Softmax", [net.op("Add", [s, mask])], axis=-1)
        o = net.op("Transpose", [net.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
        h = net.op("Add", [h, dense(net.op("Reshape", [o, merge]), hidden, hidden)])
        m = dense(norm(h), hidden, 4 * hidden)
        m = net.op("Mul", [m, net.op("Sigmoid", [net.op("Mul", [m, quick])])])
        h = net.op("Add", [h, dense(m, 4 * hidden, hidden)])
    net.loss(norm(h, affine=True))
    return net.model("x", [batch, seq, hidden])


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED
    )


def _peak(path: Path, feeds_path: Path, order: str = "DEFAULT") -> int:
    # A fixed mmap threshold: every large buffer is mapped on allocation and unmapped when
    # freed, so the resident set follows the live buffers (glibc's adaptive threshold would
    # keep freed buffers in the heap and hide the next ones).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(path), str(feeds_path), order],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return int(out.stdout.strip().splitlines()[-1])


def bench(name: str, model: ir.Model, rounds: int, scratch: Path) -> None:
    weights = [n for n, v in model.graph.initializers.items() if v.dtype == ir.DataType.FLOAT]
    weights = [n for n in weights if v_size(model, n) > 1]
    probe = GradPass(weights, "loss", remat=1 << 62)
    probe(model)
    residual = probe.remat_stats.residual_bytes
    policies: dict[str, object] = {
        "store": "store",
        "recompute": "recompute",
        "Conv,MatMul,Gemm": ["Conv", "MatMul", "Gemm"],
        f"budget {residual // 2 / 2**20:.0f} MiB": residual // 2,
    }
    x = model.graph.inputs[0]
    shape = tuple(int(d) for d in x.shape.numpy())  # type: ignore[union-attr]
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    feeds_path = scratch / f"{name}.npz"
    np.savez(feeds_path, **feeds)  # type: ignore[arg-type]
    paths: dict[str, Path] = {}
    nodes: dict[str, int] = {}
    build: dict[str, float] = {}
    for label, policy in policies.items():
        start = time.perf_counter()
        grad = GradPass(weights, "loss", remat=policy)(model).model  # type: ignore[arg-type]
        build[label] = time.perf_counter() - start
        nodes[label] = len(grad.graph)
        paths[label] = scratch / f"{name}_{len(paths)}.onnx"
        ir.save(grad, paths[label])
    sessions = {label: _session(path) for label, path in paths.items()}
    reference = sessions["store"].run(None, feeds)
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(rounds):
        for label, sess in sessions.items():
            start = time.perf_counter()
            out = sess.run(None, feeds)
            times[label].append(time.perf_counter() - start)
            for got, want in zip(out, reference, strict=True):
                # float32 sums in another order (a fusion such as Conv+BatchNormalization
                # taken by the forward copy and not by a clone): relative to each gradient's
                # norm. The tests check exactness where onnxruntime rewrites nothing.
                error = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
                assert error < 1e-3, (label, error)
    del sessions
    memory = {label: _peak(path, feeds_path) for label, path in paths.items()}
    priority = {label: _peak(path, feeds_path, "PRIORITY_BASED") for label, path in paths.items()}
    print(f"\n{name}: residuals under store {residual / 2**20:.1f} MiB (static bytes)")
    print(
        f"  {'policy':<20} {'ms':>8} {'x store':>8} {'peak MiB':>9} {'x store':>8} "
        f"{'prio MiB':>9} {'x store':>8} {'nodes':>6}"
    )
    t0, m0, p0 = statistics.median(times["store"]), memory["store"], priority["store"]
    for label in policies:
        t, m, p = statistics.median(times[label]), memory[label], priority[label]
        print(
            f"  {label:<20} {1e3 * t:8.1f} {t / t0:8.2f} {m / 2**20:9.1f} {m / m0:8.2f} "
            f"{p / 2**20:9.1f} {p / p0:8.2f} {nodes[label]:6d}"
        )


def v_size(model: ir.Model, name: str) -> int:
    tensor = model.graph.initializers[name].const_value
    return 0 if tensor is None else tensor.size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,gpt2")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=112, help="resnet18 image size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(
        f"batch {args.batch}, resnet18 at {args.size} px, 1 onnxruntime thread, "
        f"median of {args.rounds} interleaved rounds"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = resnet18(args.batch, args.size) if name == "resnet18" else gpt2(args.batch)
            bench(name, model, args.rounds, Path(tmp))


if __name__ == "__main__":
    main()
