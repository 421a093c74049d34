"""On-device fine-tuning in a pure onnxruntime loop: a small CNN and a small transformer.

Usage::

    uv run python examples/train_on_device.py [--steps 40] [--batch 16]
        [--torch-python /path/to/python-with-torch]

Each model is built with ``onnx.helper`` from seeded random weights. ``onnax.training`` appends a
cross-entropy loss and turns it into one training-step model (AdamW) that fine-tunes the last
layers only (the earlier ones stay frozen initializers). The loop runs that model with IO binding:
parameters, optimizer state and step count live in onnxruntime ``OrtValue`` buffers; each step's
outputs are bound to a second set of buffers and the two sets swap, so nothing goes through numpy
between steps except the batch in and the loss out. The script checks that the loss falls.

Where torch is importable (or ``--torch-python`` names an interpreter that has it), the same
layers are written with ``torch.nn.functional`` from the same initial weights, trained with
``torch.optim.AdamW`` on the same batches, and the trained weights are compared with the ONNX
loop's. The torch part imports only numpy and torch, so it also runs as
``python train_on_device.py --torch-reference IN.npz OUT.npz`` in another environment.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = 4
LR, WEIGHT_DECAY = 1e-2, 1e-2
# Float32 rounding differs between the two runtimes (reduction orders, fused kernels); over a
# few dozen Adam steps those one-ulp differences stay at the 1e-5 level relative to the weights.
RTOL, ATOL = 1e-4, 1e-5


# The two models, as ONNX graphs with the weights they start from.


def cnn_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "conv1.weight": rng.normal(0, 0.4, (8, 1, 3, 3)),
        "conv1.bias": rng.normal(0, 0.1, 8),
        "conv2.weight": rng.normal(0, 0.15, (16, 8, 3, 3)),
        "conv2.bias": rng.normal(0, 0.1, 16),
        "fc.weight": rng.normal(0, 0.3, (CLASSES, 16)),
        "fc.bias": np.zeros(CLASSES),
    }


def cnn_model(weights: dict[str, np.ndarray]) -> Any:
    """conv(1->8) relu maxpool conv(8->16) relu global-avg-pool linear(16->4); x: [N, 1, 8, 8]."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1),
    ]
    return _model(nodes, "x", TensorProto.FLOAT, ["N", 1, 8, 8], weights)


D, HEADS, T, VOCAB = 16, 2, 6, 12


def transformer_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    s = 1 / np.sqrt(D)
    return {
        "embed": rng.normal(0, 1, (VOCAB, D)),
        "pos": rng.normal(0, 0.1, (T, D)),
        "attn.q": rng.normal(0, s, (D, D)),
        "attn.k": rng.normal(0, s, (D, D)),
        "attn.v": rng.normal(0, s, (D, D)),
        "attn.o": rng.normal(0, s, (D, D)),
        "ln1.weight": np.ones(D),
        "ln1.bias": np.zeros(D),
        "mlp.w1": rng.normal(0, s, (D, 2 * D)),
        "mlp.b1": np.zeros(2 * D),
        "mlp.w2": rng.normal(0, 1 / np.sqrt(2 * D), (2 * D, D)),
        "mlp.b2": np.zeros(D),
        "ln2.weight": np.ones(D),
        "ln2.bias": np.zeros(D),
        "head.weight": rng.normal(0, s, (D, CLASSES)),
        "head.bias": np.zeros(CLASSES),
        "heads_shape": np.array([0, T, HEADS, D // HEADS], np.int64),
        "merge_shape": np.array([0, T, D], np.int64),
        "scale": np.array(1 / np.sqrt(D // HEADS)),
        "pool_axes": np.array([1], np.int64),
    }


def transformer_model(weights: dict[str, np.ndarray]) -> Any:
    """Token classifier: embedding + positions, one post-norm encoder block, mean pool, linear.

    tokens: [N, 6] int64. Attention has 2 heads (Reshape/Transpose/MatMul/Softmax).
    """
    from onnx import TensorProto, helper

    def mm(a: str, b: str, out: str) -> Any:
        return helper.make_node("MatMul", [a, b], [out])

    def heads(src: str, out: str) -> list[Any]:
        return [
            helper.make_node("Reshape", [src, "heads_shape"], [out + "_r"]),
            helper.make_node("Transpose", [out + "_r"], [out], perm=[0, 2, 1, 3]),
        ]

    nodes = [
        helper.make_node("Gather", ["embed", "tokens"], ["e"]),
        helper.make_node("Add", ["e", "pos"], ["h0"]),
        mm("h0", "attn.q", "q0"), mm("h0", "attn.k", "k0"), mm("h0", "attn.v", "v0"),
        *heads("q0", "q"), *heads("k0", "k"), *heads("v0", "v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        mm("q", "kt", "s0"),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["a"], axis=-1),
        mm("a", "v", "ctx0"),
        helper.make_node("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx1", "merge_shape"], ["ctx"]),
        mm("ctx", "attn.o", "att"),
        helper.make_node("Add", ["h0", "att"], ["h1"]),
        helper.make_node("LayerNormalization", ["h1", "ln1.weight", "ln1.bias"], ["h2"], axis=-1),
        mm("h2", "mlp.w1", "m0"),
        helper.make_node("Add", ["m0", "mlp.b1"], ["m1"]),
        helper.make_node("Relu", ["m1"], ["m2"]),
        mm("m2", "mlp.w2", "m3"),
        helper.make_node("Add", ["m3", "mlp.b2"], ["m4"]),
        helper.make_node("Add", ["h2", "m4"], ["h3"]),
        helper.make_node("LayerNormalization", ["h3", "ln2.weight", "ln2.bias"], ["h4"], axis=-1),
        helper.make_node("ReduceMean", ["h4", "pool_axes"], ["pooled"], keepdims=0),
        mm("pooled", "head.weight", "l0"),
        helper.make_node("Add", ["l0", "head.bias"], ["logits"]),
    ]  # fmt: skip
    return _model(nodes, "tokens", TensorProto.INT64, ["N", T], weights)


def _model(nodes: list[Any], x: str, x_type: int, x_shape: list[Any], w: dict[str, Any]) -> Any:
    import onnx
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
        for k, v in w.items()
    ]
    graph = helper.make_graph(
        nodes,
        "model",
        [helper.make_tensor_value_info(x, x_type, x_shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 10
    onnx.checker.check_model(proto, full_check=True)
    return ir.from_proto(proto)


# Synthetic tasks with a learnable rule, and the batches (shared with torch through a file).


def batches(kind: str, steps: int, batch: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "cnn":
        x = rng.normal(0, 1, (steps, batch, 1, 8, 8)).astype(np.float32)
        # The class is the quadrant with the largest mean intensity.
        quads = x.reshape(steps, batch, 2, 4, 2, 4).mean(axis=(3, 5)).reshape(steps, batch, 4)
        return x, quads.argmax(axis=-1).astype(np.int64)
    tokens = rng.integers(0, VOCAB, (steps, batch, T)).astype(np.int64)
    # The class is the most frequent token among 0..3 (ties to the smallest).
    counts = np.stack([(tokens == c).sum(axis=-1) for c in range(CLASSES)], axis=-1)
    return tokens, counts.argmax(axis=-1).astype(np.int64)


FROZEN = {"cnn": ["conv1.*"], "transformer": ["embed", "pos", "scale", "attn.*", "ln1.*"]}


# The onnxruntime loop with IO binding.


def train_onnx(kind: str, weights: dict[str, np.ndarray], xs: np.ndarray, ys: np.ndarray
               ) -> tuple[list[float], dict[str, np.ndarray], float, float]:  # fmt: skip
    import onnx_ir as ir
    import onnxruntime as ort

    from onnax import training

    model = cnn_model(weights) if kind == "cnn" else transformer_model(weights)
    t0 = time.perf_counter()
    with_loss = training.add_loss(model, "logits", "cross_entropy")
    step_model = training.step(
        with_loss, frozen=FROZEN[kind], optimizer=training.AdamW(lr=LR, weight_decay=WEIGHT_DECAY)
    )
    build = time.perf_counter() - t0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    sess = ort.InferenceSession(
        ir.to_proto(step_model).SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    pairs = training.carry(step_model)
    x_name = sess.get_inputs()[0].name
    # Two buffer sets owned by onnxruntime: a step reads one and writes the other, then they
    # swap. (``ortvalue_from_numpy`` would only borrow the numpy array's memory.)
    initial = training.initial_state(step_model)
    current, spare = {}, {}
    for inp, out in pairs:
        array = initial[inp]
        current[inp] = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cpu")
        current[inp].update_inplace(array)
        spare[out] = ort.OrtValue.ortvalue_from_shape_and_type(array.shape, array.dtype, "cpu")
    binding = sess.io_binding()
    losses = []
    t0 = time.perf_counter()
    for s in range(len(xs)):
        binding.bind_cpu_input(x_name, xs[s])
        binding.bind_cpu_input("target", ys[s])
        binding.bind_output("loss", "cpu")  # first bound output: get_outputs()[0]
        for inp, out in pairs:
            binding.bind_ortvalue_input(inp, current[inp])
            binding.bind_ortvalue_output(out, spare[out])
        sess.run_with_iobinding(binding)
        losses.append(float(binding.get_outputs()[0].numpy()))
        old = current
        current = {inp: spare[out] for inp, out in pairs}
        spare = {out: old[inp] for inp, out in pairs}
    loop = time.perf_counter() - t0
    params = {
        record["param"]: current[name].numpy()
        for name, record in training.layout(step_model)["params"].items()
    }
    # The fine-tuned inference model runs like the original.
    trained = training.trained_model(model, params)
    check = ort.InferenceSession(ir.to_proto(trained).SerializeToString(),
                                 providers=["CPUExecutionProvider"])  # fmt: skip
    check.run(None, {x_name: xs[0]})
    return losses, params, build, loop


# The same training in torch (imports numpy and torch only).


def torch_forward(kind: str, p: dict[str, Any], x: Any) -> Any:
    import torch
    import torch.nn.functional as F

    if kind == "cnn":
        h = F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=1))
        h = F.max_pool2d(h, 2)
        h = F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"], padding=1))
        return F.linear(h.mean(dim=(2, 3)), p["fc.weight"], p["fc.bias"])
    n = x.shape[0]
    h0 = p["embed"][x] + p["pos"]

    def heads(t: Any) -> Any:
        return t.reshape(n, T, HEADS, D // HEADS).transpose(1, 2)

    q, k, v = heads(h0 @ p["attn.q"]), heads(h0 @ p["attn.k"]), heads(h0 @ p["attn.v"])
    a = torch.softmax((q @ k.transpose(-1, -2)) * p["scale"], dim=-1)
    ctx = (a @ v).transpose(1, 2).reshape(n, T, D)
    h2 = F.layer_norm(h0 + ctx @ p["attn.o"], (D,), p["ln1.weight"], p["ln1.bias"])
    m = F.relu(h2 @ p["mlp.w1"] + p["mlp.b1"]) @ p["mlp.w2"] + p["mlp.b2"]
    h4 = F.layer_norm(h2 + m, (D,), p["ln2.weight"], p["ln2.bias"])
    return h4.mean(dim=1) @ p["head.weight"] + p["head.bias"]


def train_torch(kind: str, weights: dict[str, np.ndarray], xs: np.ndarray, ys: np.ndarray,
                trained: list[str]) -> tuple[list[float], dict[str, np.ndarray]]:  # fmt: skip
    import torch
    import torch.nn.functional as F

    p = {
        k: torch.tensor(
            v if v.dtype == np.int64 else v.astype(np.float32), requires_grad=k in trained
        )
        for k, v in weights.items()
    }
    opt = torch.optim.AdamW([p[k] for k in trained], lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for s in range(len(xs)):
        opt.zero_grad()
        loss = F.cross_entropy(torch_forward(kind, p, torch.tensor(xs[s])), torch.tensor(ys[s]))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: p[k].detach().numpy() for k in trained}


def torch_reference(src: Path, dst: Path) -> None:
    """The ``--torch-reference`` mode: read the runs from ``src``, write torch's to ``dst``."""
    with np.load(src) as f:
        data = {k: f[k] for k in f.files}
    spec = json.loads(str(data.pop("spec")))
    out: dict[str, np.ndarray] = {}
    for kind in spec:
        weights = {k[len(kind) + 1 :]: v for k, v in data.items() if k.startswith(f"{kind}/w/")}
        weights = {k[2:]: v for k, v in weights.items()}
        losses, params = train_torch(kind, weights, data[f"{kind}/x"], data[f"{kind}/y"],
                                     spec[kind])  # fmt: skip
        out[f"{kind}/losses"] = np.array(losses)
        out.update({f"{kind}/p/{k}": v for k, v in params.items()})
    np.savez(dst, **out)  # type: ignore[arg-type]


def torch_runs(runs: dict[str, Any], torch_python: str | None) -> dict[str, Any] | None:
    """torch's losses and weights per model: in process, through another Python, or None."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if torch_python is None:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
            arrays: dict[str, Any] = {
                "spec": json.dumps({k: sorted(r["params"]) for k, r in runs.items()})
            }
            for kind, r in runs.items():
                arrays.update({f"{kind}/w/{k}": v for k, v in r["weights"].items()})
                arrays[f"{kind}/x"], arrays[f"{kind}/y"] = r["x"], r["y"]
            np.savez(src, **arrays)
            cmd = [torch_python, __file__, "--torch-reference", str(src), str(dst)]
            subprocess.run(cmd, check=True)
            with np.load(dst) as f:
                got = {k: f[k] for k in f.files}
        return {
            kind: (list(got[f"{kind}/losses"]),
                   {k: got[f"{kind}/p/{k}"] for k in runs[kind]["params"]})
            for kind in runs
        }  # fmt: skip
    return {
        kind: train_torch(kind, r["weights"], r["x"], r["y"], sorted(r["params"]))
        for kind, r in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--torch-python", default=None, help="a Python with torch, for the check")
    parser.add_argument("--torch-reference", nargs=2, type=Path, metavar=("IN", "OUT"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.torch_reference:
        torch_reference(*args.torch_reference)
        return 0
    runs: dict[str, Any] = {}
    for seed, kind in enumerate(("cnn", "transformer")):
        rng = np.random.default_rng(seed)
        weights = cnn_weights(rng) if kind == "cnn" else transformer_weights(rng)
        weights = {
            k: v if v.dtype == np.int64 else v.astype(np.float32) for k, v in weights.items()
        }
        x, y = batches(kind, args.steps, args.batch, seed=10 + seed)
        losses, params, build, loop = train_onnx(kind, weights, x, y)
        first, last = np.mean(losses[:5]), np.mean(losses[-5:])
        print(f"{kind}: trained {sorted(params)}")
        print(f"{kind}: loss {first:.4f} -> {last:.4f} over {args.steps} steps "
              f"(build {build:.2f} s, loop {1e3 * loop / args.steps:.2f} ms/step)")  # fmt: skip
        if not last < first:
            print(f"{kind}: FAILED, the loss did not fall", file=sys.stderr)
            return 1
        runs[kind] = {"weights": weights, "x": x, "y": y, "params": params, "losses": losses}
    reference = torch_runs(runs, args.torch_python)
    if reference is None:
        print("torch is not importable (try --torch-python): skipped the torch.optim comparison")
        return 0
    for kind, (t_losses, t_params) in reference.items():
        np.testing.assert_allclose(runs[kind]["losses"], t_losses, rtol=RTOL, atol=ATOL)
        worst = 0.0
        for k, v in t_params.items():
            np.testing.assert_allclose(runs[kind]["params"][k], v, rtol=RTOL, atol=ATOL, err_msg=k)
            worst = max(worst, float(np.max(np.abs(runs[kind]["params"][k] - v))))
        print(f"{kind}: matches torch.optim.AdamW (max |weight difference| {worst:.2e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
