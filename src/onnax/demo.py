"""The built-in example behind ``onnax demo``.

It builds a small regression loss with ``onnx_ir``'s tape, derives four models from it (grad, jvp,
vjp and the Hessian-vector product jvp∘grad), runs each in onnxruntime and compares every
derivative with float64 central finite differences of the primal model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from onnax.api import grad, jvp, vjp

__all__ = ["build_loss_model", "run_demo"]

Feeds = Mapping[str, np.ndarray]


def build_loss_model(batch: int = 8, features: int = 4, hidden: int = 6) -> ir.Model:
    """A float64 two-layer network with a mean squared error: inputs x, w1, w2, target."""
    dt = ir.DataType.DOUBLE
    x = ir.val("x", dt, [batch, features])
    w1 = ir.val("w1", dt, [features, hidden])
    w2 = ir.val("w2", dt, [hidden, 1])
    target = ir.val("target", dt, [batch, 1])
    tape = ir.tape.Tape()
    h = tape.op("Tanh", [tape.op("MatMul", [x, w1])])
    pred = tape.op("MatMul", [h, w2])
    pred.name = "prediction"
    err = tape.op("Sub", [pred, target])
    loss = tape.op("ReduceMean", [tape.op("Mul", [err, err])], {"keepdims": 0})
    loss.name = "loss"
    graph = ir.Graph(
        [x, w1, w2, target], [loss, pred], nodes=tape.nodes, opset_imports={"": 18}, name="mlp_loss"
    )
    return ir.Model(graph, ir_version=10)


def _session(model: ir.Model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        ir.to_proto(model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _runner(model: ir.Model) -> Callable[[Feeds], dict[str, np.ndarray]]:
    sess = _session(model)
    names = [o.name for o in sess.get_outputs()]
    wanted = {i.name for i in sess.get_inputs()}

    def run(feeds: Feeds) -> dict[str, np.ndarray]:
        outs = sess.run(None, {k: v for k, v in feeds.items() if k in wanted})
        return dict(zip(names, outs, strict=True))

    return run


def _fd(
    f: Callable[[Feeds], dict[str, np.ndarray]],
    feeds: Feeds,
    direction: Feeds,
    out: str,
    eps: float = 1e-6,
) -> np.ndarray:
    plus = {k: v + eps * direction[k] if k in direction else v for k, v in feeds.items()}
    minus = {k: v - eps * direction[k] if k in direction else v for k, v in feeds.items()}
    return (f(plus)[out] - f(minus)[out]) / (2 * eps)


def run_demo(seed: int = 0) -> list[tuple[str, str, int, float, float]]:
    """Runs the demo and returns rows ``(transform, output, nodes, max abs error, ms)``.

    Raises:
        AssertionError: If a derivative disagrees with finite differences beyond 1e-6.
    """
    rng = np.random.default_rng(seed)
    model = build_loss_model()
    shapes = {"x": (8, 4), "w1": (4, 6), "w2": (6, 1), "target": (8, 1)}
    feeds: dict[str, np.ndarray] = {n: rng.standard_normal(s) for n, s in shapes.items()}
    primal = _runner(model)
    params = ["w1", "w2"]
    rows: list[tuple[str, str, int, float, float]] = []

    def record(
        name: str,
        out: str,
        m: ir.Model,
        got: np.ndarray | float,
        want: np.ndarray | float,
        ms: float,
    ) -> None:
        err = float(np.max(np.abs(got - want)))
        rows.append((name, out, len(m.graph), err, ms))
        if not err <= 1e-6 * max(1.0, float(np.max(np.abs(want)))):
            raise AssertionError(f"{name}: {out} differs from finite differences by {err:.3g}")

    # grad: one directional derivative per parameter, <grad, v> against FD along v.
    start = time.perf_counter()
    g = grad(model, inputs=params, output="loss")
    ms = (time.perf_counter() - start) * 1e3
    got = _runner(g)(feeds)
    for p in params:
        v = {p: rng.standard_normal(feeds[p].shape)}
        record(
            "grad",
            f"grad_{p}",
            g,
            np.sum(got[f"grad_{p}"] * v[p]),
            _fd(primal, feeds, v, "loss"),
            ms,
        )

    # jvp: tangent of both outputs along a random direction in x and w1.
    start = time.perf_counter()
    j = jvp(model, inputs=["x", "w1"])
    ms = (time.perf_counter() - start) * 1e3
    v = {"x": rng.standard_normal(feeds["x"].shape), "w1": rng.standard_normal(feeds["w1"].shape)}
    got = _runner(j)({**feeds, "fwd_x": v["x"], "fwd_w1": v["w1"]})
    for out in ("loss", "prediction"):
        record("jvp", f"fwd_{out}", j, got[f"fwd_{out}"], _fd(primal, feeds, v, out), ms)

    # vjp: <adj_x, v> = <adj_prediction, J v> for a random cotangent of the prediction.
    start = time.perf_counter()
    r = vjp(model, inputs=["x"], outputs=["prediction"])
    ms = (time.perf_counter() - start) * 1e3
    u = rng.standard_normal((8, 1))
    got = _runner(r)({**feeds, "adj_prediction": u})
    v = {"x": rng.standard_normal(feeds["x"].shape)}
    lhs = np.sum(got["adj_x"] * v["x"])
    record("vjp", "adj_x", r, lhs, np.sum(u * _fd(primal, feeds, v, "prediction")), ms)

    # jvp∘grad: the Hessian-vector product against FD of the gradient model.
    start = time.perf_counter()
    hvp = jvp(g, inputs=params, outputs=["grad_w1", "grad_w2"])
    ms = (time.perf_counter() - start) * 1e3
    v = {str(p): rng.standard_normal(feeds[p].shape) for p in params}
    got = _runner(hvp)({**feeds, "fwd_w1": v["w1"], "fwd_w2": v["w2"]})
    grad_run = _runner(g)
    for p in params:
        record(
            "jvp(grad)",
            f"fwd_grad_{p}",
            hvp,
            got[f"fwd_grad_{p}"],
            _fd(grad_run, feeds, v, f"grad_{p}"),
            ms,
        )
    return rows


def format_table(rows: list[tuple[str, str, int, float, float]]) -> str:
    """The demo's result table."""
    head = f"{'transform':<10} {'output':<16} {'nodes':>5} {'max |err| vs FD':>16} {'build ms':>9}"
    lines = [head, "-" * len(head)]
    lines += [f"{t:<10} {o:<16} {n:>5} {e:>16.2e} {ms:>9.1f}" for t, o, n, e, ms in rows]
    return "\n".join(lines)
