"""Transform speed at scale: a generated residual network of 1k, 10k and 100k nodes.

Usage::

    uv run python tests/benchmarks/bench_scale.py [--sizes 1000,10000,100000]
        [--transforms jvp,vjp,grad,jvp_grad] [--budget 600] [--floor] [--profile grad@10000]

The network repeats a transformer-like residual block at a small hidden size (8): LayerNorm,
MatMul + Add, Gelu or Tanh (alternating), MatMul, a Reshape/Transpose/Reshape round trip, a
Slice/Slice/Concat rotation and the residual Add, 12 nodes a block, weights as initializers,
batch dimension symbolic, opset 21, and a ReduceSum loss at the end. For each size it prints,
per transform, the process CPU time (the transforms are single-threaded Python, so CPU time is
the cost on a shared machine), microseconds per primal node, and the result's nodes over the
primal's; then the log-log slope of CPU time against size (1.0 = linear).

Transforms: ``jvp`` and ``vjp`` w.r.t. the input, ``grad`` of the loss w.r.t. every weight and
the input, and ``jvp_grad`` (forward over reverse: a Hessian-vector product w.r.t. the input).
A size whose projected time exceeds ``--budget`` seconds is skipped with a message.

``--floor`` also times onnx_shape_inference alone on each result (a copy, the collector
paused as in a transform), in microseconds per primal node: once over every node ("all"), and
once passing over the source's nodes ("new"), as a transform's last inference does (cleanup's
AnnotateShapes infers only the nodes added since the previous inference; see
``onnax.core.inference.infer_shapes(new_only=True)``). No transform that infers the types of
what it emits with onnx_shape_inference can take less than the "new" figure.

``--profile T@N`` runs transform T at size N under cProfile and prints where its time goes,
by onnax module and by the top functions, to see which step (inference, cloning, naming,
emission, cleanup) dominates per node.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import math
import pstats
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnx_shape_inference import infer_symbolic_shapes

import onnax
from onnax.core.inference import _infer_past_guesses

OPSET = 21
HIDDEN = 8
SEQ = 4
NODES_PER_BLOCK = 12


def residual_network(nodes: int, seed: int = 0) -> ir.Model:
    """A chain of residual blocks with about ``nodes`` nodes, and a scalar loss ``L``."""
    rng = np.random.default_rng(seed)
    h = HIDDEN
    x = ir.Value(name="X", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["N", SEQ, h]))
    graph_nodes: list[ir.Node] = []
    initializers: list[ir.Value] = []

    def weight(name: str, array: np.ndarray) -> ir.Value:
        value = ir.Value(name=name, const_value=ir.tensor(array.astype(np.float32), name=name))
        value.type = ir.TensorType(ir.DataType.FLOAT)
        value.shape = ir.Shape(array.shape)
        initializers.append(value)
        return value

    def ints(name: str, values: Sequence[int]) -> ir.Value:
        value = ir.Value(name=name, const_value=ir.tensor(np.array(values, np.int64), name=name))
        value.type = ir.TensorType(ir.DataType.INT64)
        value.shape = ir.Shape([len(values)])
        initializers.append(value)
        return value

    def op(op_type: str, inputs: Sequence[ir.Value], **attrs: Any) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attrs)
        graph_nodes.append(node)
        return node.outputs[0]

    split_shape = ints("split_shape", [0, SEQ, 2, h // 2])
    merge_shape = ints("merge_shape", [0, SEQ, h])
    lo_start, lo_end = ints("lo_start", [0]), ints("lo_end", [h // 2])
    hi_start, hi_end = ints("hi_start", [h // 2]), ints("hi_end", [h])
    last_axis = ints("last_axis", [2])
    current = x
    for b in range(max(1, nodes // NODES_PER_BLOCK)):
        gamma = weight(f"ln{b}.g", 1.0 + 0.1 * rng.standard_normal(h))
        beta = weight(f"ln{b}.b", 0.1 * rng.standard_normal(h))
        w1 = weight(f"fc{b}.w1", rng.standard_normal((h, 2 * h)) / math.sqrt(h))
        b1 = weight(f"fc{b}.b1", 0.1 * rng.standard_normal(2 * h))
        w2 = weight(f"fc{b}.w2", rng.standard_normal((2 * h, h)) / math.sqrt(2 * h))
        normed = op("LayerNormalization", [current, gamma, beta], axis=-1)
        hidden = op("Add", [op("MatMul", [normed, w1]), b1])
        hidden = op("Gelu" if b % 2 == 0 else "Tanh", [hidden])
        out = op("MatMul", [hidden, w2])
        heads = op("Transpose", [op("Reshape", [out, split_shape])], perm=[0, 2, 1, 3])
        out = op("Reshape", [heads, merge_shape])
        lo = op("Slice", [out, lo_start, lo_end, last_axis])
        hi = op("Slice", [out, hi_start, hi_end, last_axis])
        current = op("Add", [current, op("Concat", [hi, lo], axis=2)])
    loss = op("ReduceSum", [current], keepdims=0)
    loss.name = "L"
    loss.type = ir.TensorType(ir.DataType.FLOAT)
    loss.shape = ir.Shape([])
    graph = ir.Graph(
        [x],
        [loss],
        nodes=graph_nodes,
        initializers=initializers,
        opset_imports={"": OPSET},
        name="residual",
    )
    return ir.Model(graph, ir_version=10)


def _weights(model: ir.Model) -> list[str]:
    return [name for name in model.graph.initializers if "." in name]


TRANSFORMS: dict[str, Callable[[ir.Model], ir.Model]] = {
    "jvp": lambda m: onnax.jvp(m, inputs="X"),
    "vjp": lambda m: onnax.vjp(m, inputs="X"),
    "grad": lambda m: onnax.grad(m, inputs=["X", *_weights(m)]),
    "jvp_grad": lambda m: onnax.jvp(onnax.grad(m, inputs="X"), inputs="X"),
}


def _count(model: ir.Model) -> int:
    return sum(1 for g in model.graphs() for _ in g)


def _timed(fn: Callable[[], ir.Model]) -> tuple[float, ir.Model]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def _inference_seconds(result: ir.Model, source: ir.Model | None = None) -> float:
    """CPU seconds of onnx_shape_inference alone on a copy of ``result``.

    With ``source``, the nodes computing the source's values (by name: the transforms keep
    them) are passed over as ``infer_shapes(new_only=True)`` passes over known nodes.
    """
    copy = ir.from_proto(ir.to_proto(result))
    known = set() if source is None else {v.name for n in source.graph for v in n.outputs}
    skipped = [n for n in copy.graph if n.outputs and all(v.name in known for v in n.outputs)]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.process_time()
        if skipped:
            _infer_past_guesses(copy, skipped)
        else:
            infer_symbolic_shapes(copy, warn_on_missing=False)
        return time.process_time() - start
    finally:
        if was_enabled:
            gc.enable()


def bench(
    sizes: Sequence[int], transforms: Sequence[str], budget: float, floor: bool = False
) -> None:
    header = f"{'transform':<9} {'nodes':>7} {'CPU s':>8} {'us/node':>8} {'result/primal':>13}"
    print(header + (f" {'inference us/node: all':>22} {'new':>5}" if floor else ""))
    timings: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
    for size in sizes:
        model = residual_network(size)
        primal = _count(model)
        for name in transforms:
            past = timings[name]
            if past:
                projected = past[-1][1] * primal / past[-1][0]
                if projected > budget:
                    print(f"{name:<9} {primal:>7} skipped: projected {projected:.0f} s > budget")
                    continue
            transform = TRANSFORMS[name]
            seconds, result = _timed(lambda: transform(model))  # noqa: B023 (called at once)
            timings[name].append((primal, seconds))
            ratio = _count(result) / primal
            row = (
                f"{name:<9} {primal:>7} {seconds:>8.2f} {1e6 * seconds / primal:>8.0f} "
                f"{ratio:>13.2f}"
            )
            if floor:
                full = _inference_seconds(result)
                new = _inference_seconds(result, model)
                row += f" {1e6 * full / primal:>22.0f} {1e6 * new / primal:>5.0f}"
            print(row, flush=True)
    print("\nlog-log slope of CPU time against size (1.0 = linear):")
    for name, points in timings.items():
        if len(points) >= 2:
            xs = np.log([n for n, _ in points])
            ys = np.log([max(s, 1e-6) for _, s in points])
            slope = float(np.polyfit(xs, ys, 1)[0])
            print(f"  {name:<9} {slope:.2f}")


def profile(spec: str, top: int = 25) -> None:
    name, _, size = spec.partition("@")
    model = residual_network(int(size or 10000))
    profiler = cProfile.Profile()
    profiler.enable()
    TRANSFORMS[name](model)
    profiler.disable()
    stats = pstats.Stats(profiler)
    by_module: collections.Counter[str] = collections.Counter()
    total = 0.0
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        if "/onnax/" in filename:
            key = "onnax/" + filename.split("/onnax/", 1)[1]
        elif "site-packages/" in filename:
            key = filename.split("site-packages/", 1)[1].split("/", 1)[0]
        else:
            key = "other"
        by_module[key] += tottime
    print(f"{name} at {_count(model)} nodes: {total:.2f} s of own time, by module:")
    for key, seconds in by_module.most_common(20):
        print(f"  {seconds:8.2f} s {100 * seconds / total:5.1f} %  {key}")
    print()
    stats.sort_stats("cumulative").print_stats(top)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--transforms", default=",".join(TRANSFORMS))
    parser.add_argument("--budget", type=float, default=600.0)
    parser.add_argument("--profile", default=None, help="T@N: profile transform T at N nodes")
    parser.add_argument(
        "--floor", action="store_true", help="also time shape inference alone on each result"
    )
    args = parser.parse_args(argv)
    if args.profile:
        profile(args.profile)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    transforms = args.transforms.split(",")
    unknown = [t for t in transforms if t not in TRANSFORMS]
    if unknown:
        parser.error(f"unknown transforms {unknown}; choose from {list(TRANSFORMS)}")
    bench(sizes, transforms, args.budget, args.floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
