"""Control-flow benchmark: reverse mode through an LSTM of 100 steps.

Usage::

    uv run python tests/benchmarks/bench_control_flow.py [--steps 100] [--input 32]
        [--hidden 64] [--batch 8] [--runs 50] [--threads 1]

One ONNX ``LSTM`` node (forward direction, biases, initial states; W, R, B, X and the initial
states are graph inputs, float32) is differentiated by ``onnax.vjp``: the expansion pass lowers
the node to a ``Scan`` (onnax.rules.recurrent) and reverse mode records the state each step
starts from, then runs a backward ``Scan`` over the records. Printed side by side:

1. **Run time.** Medians over ``--runs`` interleaved runs (after a warm-up) of the primal model
   (onnxruntime's fused LSTM kernel), the same model lowered to Scan, and the vjp models (w.r.t.
   X and all weights, and w.r.t. X only), as in bench_core: with one intra-op thread onnxruntime
   computes on the calling thread, so the thread CPU-time medians are the ones compared. The
   ratios vjp / primal are given against both primals.
2. **Memory of the recorded states.** The outputs of the forward Scans that the backward Scans
   read (the records, found in the vjp graph), their total size in bytes from an onnxruntime run,
   against ``T x`` the size of the state (h and c: ``2 x batch x hidden`` floats), which is what
   recording every step's state costs at the least.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper

import onnax
from onnax.core.emit import Emitter
from onnax.core.registry import lowerings
from onnax.passes.prepare import infer_shapes
from onnax.rules import collect

OPSET = 21


def lstm_model(steps: int, inputs: int, hidden: int, batch: int) -> ir.Model:
    """``Y, Y_h, Y_c = LSTM(X, W, R, B, , initial_h, initial_c)``; every input a graph input."""
    shapes = {
        "X": [steps, batch, inputs],
        "W": [1, 4 * hidden, inputs],
        "R": [1, 4 * hidden, hidden],
        "B": [1, 8 * hidden],
        "initial_h": [1, batch, hidden],
        "initial_c": [1, batch, hidden],
    }
    names = ["X", "W", "R", "B", "", "initial_h", "initial_c"]
    node = helper.make_node("LSTM", names, ["Y", "Y_h", "Y_c"], hidden_size=hidden)
    state = [1, batch, hidden]
    graph = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [steps, 1, batch, hidden]),
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, state),
            helper.make_tensor_value_info("Y_c", TensorProto.FLOAT, state),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    proto.ir_version = 10
    onnx.checker.check_model(proto)
    return ir.from_proto(proto)


def lowered(model: ir.Model) -> ir.Model:
    """The model with its LSTM replaced by the Scan of its lowering."""
    collect()
    model = ir.from_proto(ir.to_proto(model))
    infer_shapes(model)
    graph = model.graph
    for node in list(graph):
        rule = lowerings.lookup(node.domain, node.op_type, OPSET)
        if rule is None:
            continue
        em = Emitter(OPSET)
        outs = rule(em, node)
        graph.insert_before(node, em.take())
        for old, new in zip(node.outputs, outs, strict=True):
            assert new is not None
            name, old.name = old.name, None
            old.replace_all_uses_with(new, replace_graph_outputs=True)
            new.name = name
        graph.remove(node, safe=True)
    return model


def records(model: ir.Model) -> list[ir.Value]:
    """Scan outputs of the main graph read by another Scan: the states reverse mode recorded."""
    graph = model.graph
    scans = [n for n in graph if n.op_type == "Scan"]
    found = []
    for node in scans:
        n_state = len(node.inputs) - node.attributes.get_int("num_scan_inputs", 0)
        for out in node.outputs[n_state:]:
            if any(u.node.op_type == "Scan" and u.node is not node for u in out.uses()):
                found.append(out)
    return found


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
    return {
        i.name: (rng.standard_normal(i.shape) * 0.3).astype(np.float32) for i in sess.get_inputs()
    }


def recorded_bytes(model: ir.Model, threads: int) -> tuple[int, list[tuple[str, list[int]]]]:
    """Total bytes of the records in one run of ``model``, and each record's name and shape."""
    copy = ir.from_proto(ir.to_proto(model))
    found = records(copy)
    copy.graph.outputs.extend(v for v in found if not v.is_graph_output())
    sess = _session(copy, threads)
    names = {str(v.name) for v in found}
    outs = sess.run(None, _feeds(sess, np.random.default_rng(0)))
    arrays = [(o.name, a) for o, a in zip(sess.get_outputs(), outs, strict=True) if o.name in names]
    return sum(a.nbytes for _, a in arrays), [(n, list(a.shape)) for n, a in arrays]


def bench(steps: int, inputs: int, hidden: int, batch: int, runs: int, threads: int) -> None:
    print(
        f"== LSTM T={steps}, input {inputs}, hidden {hidden}, batch {batch}, float32, "
        f"intra_op_num_threads={threads}, {runs} runs =="
    )
    primal = lstm_model(steps, inputs, hidden, batch)
    models = {
        "primal (LSTM kernel)": primal,
        "primal (Scan)": lowered(primal),
        "vjp (X + weights)": onnax.vjp(primal),
        "vjp (X)": onnax.vjp(primal, inputs=["X"]),
    }
    for name, m in models.items():
        ops = sorted({n.op_type for n in m.graph})
        print(f"  {name:<22} {len(m.graph):>4} nodes ({', '.join(ops)})")
    rng = np.random.default_rng(0)
    sessions = {name: _session(m, threads) for name, m in models.items()}
    feeds = {name: _feeds(s, rng) for name, s in sessions.items()}
    for name, s in sessions.items():
        for _ in range(3):
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
    primary = med_cpu if threads == 1 else med_wall
    kernel, scan = primary["primal (LSTM kernel)"], primary["primal (Scan)"]
    print(
        f"\n  {'model':<22} {'wall ms':>8} {'cpu ms':>8} {'/ LSTM kernel':>14} {'/ Scan primal':>14}"
        f"  ({'cpu' if threads == 1 else 'wall'} medians)"
    )
    for name in sessions:
        print(
            f"  {name:<22} {med_wall[name] * 1e3:>8.2f} {med_cpu[name] * 1e3:>8.2f} "
            f"{primary[name] / kernel:>14.2f} {primary[name] / scan:>14.2f}"
        )

    state_bytes = 2 * batch * hidden * 4  # h and c, float32
    print(f"\n  recorded states (T x state = {steps} x {state_bytes} B = {steps * state_bytes} B)")
    print(f"  {'model':<22} {'records':>8} {'bytes':>10} {'/ (T x state)':>14}  shapes")
    for name in ("vjp (X + weights)", "vjp (X)"):
        total, shapes = recorded_bytes(models[name], threads)
        print(
            f"  {name:<22} {len(shapes):>8} {total:>10} {total / (steps * state_bytes):>14.2f}  "
            + ", ".join(str(s) for _, s in shapes)
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--input", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    bench(args.steps, args.input, args.hidden, args.batch, args.runs, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
