"""Small models and torch-reference helpers shared by the training tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

DATA = Path(__file__).resolve().parent / "data" / "training"


def mlp(
    n_in: int = 4,
    hidden: int = 5,
    n_out: int = 3,
    seed: int = 0,
    dtype: type = np.float32,
    opset: int = 17,
    init: dict[str, np.ndarray] | None = None,
) -> ir.Model:
    """``Y = Tanh(X W1 + b1) W2 + b2`` with random weights (or ``init``); ``X`` is ``[N, n_in]``."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weights = init or {
        "fc1.weight": rng.standard_normal((n_in, hidden)) / np.sqrt(n_in),
        "fc1.bias": 0.1 * rng.standard_normal(hidden),
        "fc2.weight": rng.standard_normal((hidden, n_out)) / np.sqrt(hidden),
        "fc2.bias": 0.1 * rng.standard_normal(n_out),
    }
    inits = [numpy_helper.from_array(v.astype(dtype), k) for k, v in weights.items()]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "unused_int"))
    nodes = [
        helper.make_node("MatMul", ["X", "fc1.weight"], ["h0"]),
        helper.make_node("Add", ["h0", "fc1.bias"], ["h1"]),
        helper.make_node("Tanh", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "fc2.weight"], ["h3"]),
        helper.make_node("Add", ["h3", "fc2.bias"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("X", elem, ["N", n_in])],
        [helper.make_tensor_value_info("Y", elem, ["N", n_out])],
        inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 10
    onnx.checker.check_model(proto)
    return ir.from_proto(proto)


def session(model: ir.Model) -> ort.InferenceSession:
    """A CPU session; unlike ``oracles.run``, callers may feed inputs that have defaults."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    proto = ir.to_proto(model).SerializeToString()
    return ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])


def run_all(model: ir.Model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs ``model`` on ``feeds`` (inputs with stored defaults included) and names the results."""
    sess = session(model)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds), strict=True))


def weights(model: ir.Model) -> dict[str, np.ndarray]:
    """Float initializers by name."""
    return {
        name: np.array(v.const_value.numpy())
        for name, v in model.graph.initializers.items()
        if v.const_value is not None and v.dtype is not None and v.dtype.is_floating_point()
    }


def load_refs(name: str) -> dict[str, np.ndarray]:
    """A reference archive made by ``tests/data/training/make_refs.py``."""
    with np.load(DATA / f"{name}.npz") as f:
        return {k: f[k] for k in f.files}


def load_meta(name: str) -> dict[str, object]:
    meta: dict[str, object] = json.loads((DATA / f"{name}.json").read_text())
    return meta


__all__ = ["DATA", "TensorProto", "load_meta", "load_refs", "mlp", "run_all", "session", "weights"]
