"""RNN, GRU and LSTM lowered to Scan (onnax.rules.recurrent).

The lowering is applied to a one-node model by a private helper (replace the node by what the
lowering emits) and the result is compared:

* with onnxruntime's own kernels, float32 only (onnxruntime 1.32 has no double kernel for any
  of the three, and refuses ``layout=1``), over a grid of directions x attribute variants
  (sequence_lens with an empty sequence, clip, peepholes, input_forget, linear_before_reset,
  no biases / no initial states, subsets of the outputs) at opsets 11 (version 7), 14 and 22,
  and every activation with alpha/beta;
* with an independent numpy loop (one sequence and one step at a time, float64) in float64 and
  for ``layout=1``; the numpy loop is itself checked against onnxruntime in the grid.

Derivatives go through the expansion pass (the node has no rules; the transforms lower it and
differentiate/batch the Scan): jvp, vjp and the adjoint identity against finite differences,
vmap against a loop of single runs, in float32 on the original node (onnxruntime's kernels are
the oracle) and in float64 on the lowered model; weights stored as initializers; the ``CASES``
of the common harness (which the closure test also enumerates) at opsets 11, 14 and 22.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.core.emit import Emitter
from onnax.core.registry import lowerings
from onnax.errors import UnsupportedOperatorError
from onnax.passes.prepare import infer_shapes
from onnax.rules import collect
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap, run

collect()

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
T, BATCH, IN, HID = 4, 3, 2, 5


# ------------------------------------------------------------------ applying the lowering
def _name_all(model: ir.Model) -> None:
    """Gives every value a name unique across all graphs (the lowered bodies are nested)."""
    used = {v.name for g in model.graphs() for v in (*g.inputs, *(o for n in g for o in n.outputs))}
    counter = itertools.count()
    for g in model.graphs():
        for v in (*g.inputs, *(o for n in g for o in n.outputs)):
            if not v.name:
                name = f"v{next(counter)}"
                while name in used:
                    name = f"v{next(counter)}"
                v.name = name
                used.add(name)


def lower(model: ir.Model) -> ir.Model:
    """A copy of ``model`` with every node that has a lowering replaced by its lowering."""
    model = ir.from_proto(ir.to_proto(model))
    infer_shapes(model)
    graph = model.graph
    opset = model.opset_imports[""]
    for node in list(graph):
        rule = lowerings.lookup(node.domain, node.op_type, opset)
        if rule is None:
            continue
        em = Emitter(opset)
        outs = rule(em, node)
        graph.insert_before(node, em.take())
        for old, new in zip(node.outputs, outs, strict=True):
            if new is None:
                continue
            if old.is_graph_output():
                name, old.name = old.name, None
                old.replace_all_uses_with(new, replace_graph_outputs=True)
                new.name = name
            else:
                old.replace_all_uses_with(new)
        graph.remove(node, safe=True)
    _name_all(model)
    return model


# ------------------------------------------------------------------------- model builders
def make_model(
    op: str,
    attrs: Mapping[str, object],
    feeds: Mapping[str, np.ndarray],
    outputs: tuple[str, ...],
    opset: int = 22,
    dims: Mapping[str, list[int | str]] | None = None,
) -> ir.Model:
    """A one-node model; ``outputs`` lists the outputs to expose ("" skips one)."""
    names = list(INPUTS if op == "LSTM" else INPUTS[:6])
    ins = [n if n in feeds else "" for n in names]
    while ins and not ins[-1]:
        ins.pop()
    node = helper.make_node(op, ins, list(outputs), **attrs)
    elem = TensorProto.DOUBLE if feeds["X"].dtype == np.float64 else TensorProto.FLOAT
    value_infos = [
        helper.make_tensor_value_info(
            n,
            TensorProto.INT32 if n == "sequence_lens" else elem,
            (dims or {}).get(n, list(feeds[n].shape)),
        )
        for n in ins
        if n
    ]
    x_dims = (dims or {}).get("X", list(feeds["X"].shape))
    steps, batch = x_dims[:2]
    if attrs.get("layout", 0):
        steps, batch = batch, steps
    d, hid = feeds["R"].shape[0], feeds["R"].shape[2]
    state = [batch, d, hid] if attrs.get("layout", 0) else [d, batch, hid]
    shapes = {
        "Y": [batch, steps, d, hid] if attrs.get("layout", 0) else [steps, d, batch, hid],
        "Y_h": state,
        "Y_c": state,
    }
    outs = [
        helper.make_tensor_value_info(o, elem, shapes[f])
        for o, f in zip(outputs, ("Y", "Y_h", "Y_c"), strict=False)
        if o
    ]
    graph = helper.make_graph([node], "g", value_infos, outs)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 10
    return ir.from_proto(proto)


def make_feeds(
    op: str,
    dirs: int,
    dtype: type = np.float32,
    *,
    bias: bool = True,
    initial: bool = True,
    peephole: bool = False,
    lengths: list[int] | None = None,
    batch_major: bool = False,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    g = GATES[op]

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.8).astype(dtype)

    feeds = {
        "X": normal(BATCH, T, IN) if batch_major else normal(T, BATCH, IN),
        "W": normal(dirs, g * HID, IN),
        "R": normal(dirs, g * HID, HID),
    }
    if bias:
        feeds["B"] = normal(dirs, 2 * g * HID)
    if lengths is not None:
        feeds["sequence_lens"] = np.array(lengths, np.int32)
    states = ["initial_h", "initial_c"] if op == "LSTM" else ["initial_h"]
    if initial:
        for s in states:
            feeds[s] = normal(BATCH, dirs, HID) if batch_major else normal(dirs, BATCH, HID)
    if peephole:
        feeds["P"] = normal(dirs, 3 * HID)
    return feeds


# ---------------------------------------------------------------------- numpy reference
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
ALPHA_BETA = {  # takes alpha, takes beta, default alpha, default beta
    "affine": (1, 1, 1.0, 0.0),
    "leakyrelu": (1, 0, 0.01, 0.0),
    "thresholdedrelu": (1, 0, 1.0, 0.0),
    "scaledtanh": (1, 1, 1.0, 1.0),
    "hardsigmoid": (1, 1, 0.2, 0.5),
    "elu": (1, 0, 1.0, 0.0),
}


def _np_act(name: str, alpha: float, beta: float):  # type: ignore[no-untyped-def]
    fns = {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "affine": lambda x: alpha * x + beta,
        "leakyrelu": lambda x: np.where(x >= 0, x, alpha * x),
        "thresholdedrelu": lambda x: np.where(x > alpha, x, 0),
        "scaledtanh": lambda x: alpha * np.tanh(beta * x),
        "hardsigmoid": lambda x: np.clip(alpha * x + beta, 0, 1),
        "elu": lambda x: np.where(x >= 0, x, alpha * (np.exp(x) - 1)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.log1p(np.exp(x)),
    }
    return fns[name]


def reference(
    op: str, attrs: Mapping[str, object], feeds: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Y, Y_h (and Y_c) by the ONNX equations, one sequence and one step at a time."""
    direction = str(attrs.get("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    hid = int(attrs["hidden_size"])  # type: ignore[call-overload]
    batch_major = bool(attrs.get("layout", 0))
    x = feeds["X"].astype(np.float64)
    get = {k: (v.astype(np.float64) if k != "sequence_lens" else v) for k, v in feeds.items()}
    if batch_major:
        x = x.transpose(1, 0, 2)
        for s in ("initial_h", "initial_c"):
            if s in get:
                get[s] = get[s].transpose(1, 0, 2)
    steps, batch = x.shape[:2]
    g = GATES[op]
    names = list(attrs.get("activations", DEFAULT_ACTS[op] * dirs))  # type: ignore[call-overload]
    # Attributes hold float32: round as the model does, so float64 can be compared exactly.
    alphas = [float(np.float32(a)) for a in attrs.get("activation_alpha", [])]  # type: ignore[attr-defined]
    betas = [float(np.float32(b)) for b in attrs.get("activation_beta", [])]  # type: ignore[attr-defined]
    acts = []
    for name in names:
        ta, tb, a, b = ALPHA_BETA.get(name.lower(), (0, 0, 0.0, 0.0))
        if ta and alphas:
            a = alphas.pop(0)
        if tb and betas:
            b = betas.pop(0)
        acts.append(_np_act(name.lower(), a, b))
    per = len(DEFAULT_ACTS[op])
    clip = None if attrs.get("clip") is None else float(np.float32(attrs["clip"]))  # type: ignore[arg-type]

    def cl(v: np.ndarray) -> np.ndarray:
        return v if clip is None else np.clip(v, -clip, clip)

    lengths = get.get("sequence_lens", np.full(batch, steps))
    y = np.zeros((steps, dirs, batch, hid))
    yh = np.zeros((dirs, batch, hid))
    yc = np.zeros((dirs, batch, hid))
    for d in range(dirs):
        f, gg, hh = (acts[d * per + k] if k < per else None for k in range(3))
        w, r = get["W"][d], get["R"][d]
        bias = get["B"][d] if "B" in get else np.zeros(2 * g * hid)
        wb, rb = bias[: g * hid], bias[g * hid :]
        p = get["P"][d] if "P" in get else np.zeros(3 * hid)
        reverse = direction == "reverse" or d == 1
        for b in range(batch):
            h = get["initial_h"][d, b] if "initial_h" in get else np.zeros(hid)
            c = get["initial_c"][d, b] if "initial_c" in get else np.zeros(hid)
            n = int(lengths[b])
            order = range(n - 1, -1, -1) if reverse else range(n)
            for t in order:
                xw = w @ x[t, b] + wb
                hr = r @ h + rb
                if op == "RNN":
                    h = f(cl(xw + hr))
                elif op == "GRU":
                    z = f(cl(xw[:hid] + hr[:hid]))
                    rr = f(cl(xw[hid : 2 * hid] + hr[hid : 2 * hid]))
                    if attrs.get("linear_before_reset", 0):
                        cand = gg(cl(xw[2 * hid :] + rr * hr[2 * hid :]))
                    else:
                        rec = r[2 * hid :] @ (rr * h) + rb[2 * hid :]
                        cand = gg(cl(xw[2 * hid :] + rec))
                    h = (1 - z) * cand + z * h
                else:
                    pre = xw + hr
                    i = f(cl(pre[:hid] + p[:hid] * c))
                    if attrs.get("input_forget", 0):
                        fg = 1 - i
                    else:
                        fg = f(cl(pre[2 * hid : 3 * hid] + p[2 * hid :] * c))
                    cc = gg(cl(pre[3 * hid :]))
                    c = fg * c + i * cc
                    o = f(cl(pre[hid : 2 * hid] + p[hid : 2 * hid] * c))
                    h = o * hh(c)
                y[t, d, b] = h
            if n > 0:  # onnxruntime gives an empty sequence zero final states
                yh[d, b], yc[d, b] = h, c
    if batch_major:
        y, yh, yc = y.transpose(2, 0, 1, 3), yh.transpose(1, 0, 2), yc.transpose(1, 0, 2)
    return {"Y": y, "Y_h": yh, "Y_c": yc}


def _compare(
    got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], rtol: float, atol: float
) -> None:
    assert got.keys() <= want.keys() or set(got) <= set(want)
    for name, value in got.items():
        assert value.shape == want[name].shape, (name, value.shape, want[name].shape)
        np.testing.assert_allclose(value, want[name], rtol=rtol, atol=atol, err_msg=name)


def _ops(model: ir.Model) -> set[str]:
    return {n.op_type for g in model.graphs() for n in g}


# -------------------------------------------------------------------------------- the grid
VARIANTS: dict[str, dict[str, object]] = {
    "plain": {},
    "seq_lens": {"lengths": [4, 2, 0]},
    "no_bias_no_initial": {"bias": False, "initial": False},
    "clip": {"clip": 0.7},
    "peephole": {"peephole": True},
    "input_forget": {"input_forget": 1, "lengths": [3, 4, 1]},
    "linear_before_reset": {"linear_before_reset": 1, "lengths": [1, 4, 2]},
    "y_only": {"outputs": ("Y",)},
    "states_only": {"outputs": ("", "Y_h", "Y_c")},
    "c_only": {"outputs": ("", "", "Y_c"), "lengths": [2, 0, 4]},
}
_APPLIES = {
    "peephole": ("LSTM",),
    "input_forget": ("LSTM",),
    "c_only": ("LSTM",),
    "linear_before_reset": ("GRU",),
}
GRID = [
    (op, direction, variant, opset)
    for op in ("RNN", "GRU", "LSTM")
    for direction in ("forward", "reverse", "bidirectional")
    for variant in VARIANTS
    for opset in ((11, 14, 22) if variant == "plain" else (22,))
    if op in _APPLIES.get(variant, (op,))
]


def _build(
    op: str, direction: str, variant: str, dtype: type = np.float32, opset: int = 22
) -> tuple[ir.Model, dict[str, object], dict[str, np.ndarray]]:
    spec = dict(VARIANTS[variant])
    dirs = 2 if direction == "bidirectional" else 1
    feeds = make_feeds(
        op,
        dirs,
        dtype,
        bias=bool(spec.pop("bias", True)),
        initial=bool(spec.pop("initial", True)),
        peephole=bool(spec.pop("peephole", False)),
        lengths=spec.pop("lengths", None),  # type: ignore[arg-type]
    )
    outputs = tuple(spec.pop("outputs", ("Y", "Y_h", "Y_c")))[: 3 if op == "LSTM" else 2]
    attrs: dict[str, object] = {"hidden_size": HID, "direction": direction, **spec}
    return make_model(op, attrs, feeds, outputs, opset), attrs, feeds  # type: ignore[arg-type]


@pytest.mark.parametrize(("op", "direction", "variant", "opset"), GRID)
def test_lowering_matches_onnxruntime(op: str, direction: str, variant: str, opset: int) -> None:
    model, attrs, feeds = _build(op, direction, variant, opset=opset)
    lowered = lower(model)
    assert op not in _ops(lowered) and "Scan" in _ops(lowered)
    expected = run(model, feeds)
    got = run(lowered, feeds)
    assert got.keys() == expected.keys()
    _compare(got, expected, rtol=1e-5, atol=1e-5)
    # The numpy loop used below for float64 and layout=1 agrees with onnxruntime too.
    _compare(expected, reference(op, attrs, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "direction", "variant"),
    [
        (op, d, v)
        for op in ("RNN", "GRU", "LSTM")
        for d in ("forward", "bidirectional")
        for v in ("plain", "seq_lens", "clip", "peephole", "linear_before_reset")
        if op in _APPLIES.get(v, (op,))
    ],
)
def test_lowering_float64_matches_reference(op: str, direction: str, variant: str) -> None:
    # onnxruntime has no double kernel for RNN, GRU or LSTM: the numpy loop is the oracle.
    model, attrs, feeds = _build(op, direction, variant, np.float64)
    got = run(lower(model), feeds)
    assert all(v.dtype == np.float64 for v in got.values())
    _compare(got, reference(op, attrs, feeds), rtol=1e-12, atol=1e-12)


ACTIVATION_NAMES = [
    "Relu",
    "Tanh",
    "Sigmoid",
    "Affine",
    "LeakyRelu",
    "ThresholdedRelu",
    "ScaledTanh",
    "HardSigmoid",
    "Elu",
    "Softsign",
    "Softplus",
]


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("activation", ACTIVATION_NAMES)
def test_activations_match_onnxruntime(op: str, activation: str) -> None:
    per = len(DEFAULT_ACTS[op])
    # The named activation takes each slot in turn, the others keep their default; alphas and
    # betas are consumed in order by the activations that take them, across both directions.
    names = [
        activation if k == slot else DEFAULT_ACTS[op][k] for slot in range(per) for k in range(per)
    ][: 2 * per]
    if per == 1:
        names = [activation, "Sigmoid"]
    attrs: dict[str, object] = {
        "hidden_size": HID,
        "direction": "bidirectional",
        "activations": names,
        "activation_alpha": [0.7, 0.3, 1.4, 0.6, 0.2, 0.9],
        "activation_beta": [0.4, 0.8, 0.25, 0.5, 0.1, 0.3],
    }
    if activation.lower() in ("relu", "affine", "thresholdedrelu", "leakyrelu", "elu", "softplus"):
        attrs["clip"] = 2.5  # unbounded activations stay in range over the steps
    feeds = make_feeds(op, 2, lengths=[4, 3, 1])
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    model = make_model(op, attrs, feeds, outputs)
    expected = run(model, feeds)
    _compare(run(lower(model), feeds), expected, rtol=2e-5, atol=2e-5)
    _compare(expected, reference(op, attrs, feeds), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layout_batch_major(op: str, dtype: type) -> None:
    # onnxruntime refuses layout=1: compare with the same model at layout 0 on transposed
    # inputs (float32) and with the numpy loop (both dtypes).
    feeds = make_feeds(op, 2, dtype, peephole=op == "LSTM", lengths=[2, 4, 3], batch_major=True)
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    attrs: dict[str, object] = {"hidden_size": HID, "direction": "bidirectional", "layout": 1}
    got = run(lower(make_model(op, attrs, feeds, outputs)), feeds)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    _compare(got, reference(op, attrs, feeds), rtol=tol, atol=tol)
    if dtype == np.float32:
        time_major = {
            k: v.transpose(1, 0, 2) if k in ("X", "initial_h", "initial_c") else v
            for k, v in feeds.items()
        }
        ort = run(make_model(op, {**attrs, "layout": 0}, time_major, outputs), time_major)
        want = {"Y": ort["Y"].transpose(2, 0, 1, 3)}
        want.update({k: ort[k].transpose(1, 0, 2) for k in ("Y_h", "Y_c") if k in ort})
        _compare(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_symbolic_dimensions(op: str) -> None:
    # Time and batch only known at run time: the mask comes from Range over Shape(X).
    feeds = make_feeds(op, 2, lengths=[3, 1, 4])
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    dims: dict[str, list[int | str]] = {
        "X": ["T", "N", IN],
        "sequence_lens": ["N"],
        "initial_h": [2, "N", HID],
        "initial_c": [2, "N", HID],
    }
    attrs = {"hidden_size": HID, "direction": "bidirectional"}
    model = make_model(op, attrs, feeds, outputs, dims=dims)
    lowered = lower(model)
    assert "Range" in _ops(lowered)
    _compare(run(lowered, feeds), run(model, feeds), rtol=1e-5, atol=1e-5)
    short = {**feeds, "X": feeds["X"][:2, :2], "sequence_lens": np.array([2, 1], np.int32)}
    short.update({k: feeds[k][:, :2] for k in ("initial_h", "initial_c") if k in feeds})
    _compare(run(lowered, short), run(model, short), rtol=1e-5, atol=1e-5)


def test_unknown_activation_is_refused() -> None:
    feeds = make_feeds("LSTM", 1)
    model = make_model(
        "LSTM", {"hidden_size": HID, "activations": ["Sigmoid", "Gelu", "Tanh"]}, feeds, ("Y",)
    )
    for transform in (lower, onnax.jvp, onnax.vmap):
        with pytest.raises(UnsupportedOperatorError) as err:
            transform(model)
        message = str(err.value)
        for part in ("ai.onnx::LSTM", "'Y'", "activations", "'Gelu'", "affine", "softplus"):
            assert part in message, (part, message)


def test_activation_count_is_refused() -> None:
    feeds = make_feeds("GRU", 2)
    attrs = {"hidden_size": HID, "direction": "bidirectional", "activations": ["Sigmoid"] * 3}
    model = make_model("GRU", attrs, feeds, ("Y",))
    with pytest.raises(UnsupportedOperatorError) as err:
        lower(model)
    message = str(err.value)
    for part in ("ai.onnx::GRU", "'Y'", "'activations' has 3 entries", "expected 4"):
        assert part in message, (part, message)


def test_lowered_model_is_valid() -> None:
    feeds = make_feeds("LSTM", 2, peephole=True, lengths=[1, 2, 3])
    attrs = {"hidden_size": HID, "direction": "bidirectional"}
    lowered = lower(make_model("LSTM", attrs, feeds, ("Y", "Y_h", "Y_c")))
    onnx.checker.check_model(ir.to_proto(lowered), full_check=True)


# ------------------------------------------------------------------------- derivatives
# jvp, vjp and vmap reach RNN/GRU/LSTM through the expansion pass, which applies the lowering
# and hands the Scan to its own rules. float32: the original node, whose float kernels
# onnxruntime runs for the finite differences and the loop of single runs; float64: the same
# model lowered first (onnxruntime has no double kernel for the node, but runs the Scan).
DERIVATIVE_CASES = [
    ("RNN", "forward", "seq_lens"),
    ("RNN", "bidirectional", "no_bias_no_initial"),
    ("GRU", "reverse", "linear_before_reset"),
    ("GRU", "bidirectional", "seq_lens"),
    ("LSTM", "bidirectional", "peephole"),
    ("LSTM", "reverse", "input_forget"),
    ("LSTM", "forward", "states_only"),
]


def _derivative_model(
    op: str, direction: str, variant: str, dtype: type
) -> tuple[ir.Model, dict[str, np.ndarray]]:
    model, _, feeds = _build(op, direction, variant, dtype)
    return (lower(model) if dtype == np.float64 else model), feeds


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float", "double"])
@pytest.mark.parametrize(("op", "direction", "variant"), DERIVATIVE_CASES)
def test_jvp_vjp(op: str, direction: str, variant: str, dtype: type) -> None:
    model, feeds = _derivative_model(op, direction, variant, dtype)
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_adjoint(model, feeds)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float", "double"])
@pytest.mark.parametrize(("op", "direction", "variant"), DERIVATIVE_CASES[::2])
def test_vmap(op: str, direction: str, variant: str, dtype: type) -> None:
    model, feeds = _derivative_model(op, direction, variant, dtype)
    inputs = [v.name for v in model.graph.inputs]
    # The sequences batched along their own batch axis, the weights shared; then everything
    # batched (lengths included: each example masks its own steps).
    check_vmap(model, feeds, in_axes={n: (1 if n == "X" else None) for n in inputs})
    check_vmap(model, feeds, in_axes=0, out_axes=-1)


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_derivatives_batch_major(op: str) -> None:
    # layout=1 has no onnxruntime kernel: the lowered model is the finite-difference oracle.
    feeds = make_feeds(op, 2, np.float64, lengths=[2, 4, 3], batch_major=True)
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    attrs = {"hidden_size": HID, "direction": "bidirectional", "layout": 1}
    model = lower(make_model(op, attrs, feeds, outputs))
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_vmap(model, feeds, in_axes=0)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_vjp_with_respect_to_initializer_weights(op: str) -> None:
    # Weights stored in the model (the usual case): the expansion must not fold them away.
    feeds = make_feeds(op, 2, peephole=op == "LSTM", lengths=[3, 4, 2])
    outputs = ("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h")
    model = make_model(op, {"hidden_size": HID, "direction": "bidirectional"}, feeds, outputs)
    weights = ["W", "R", "B", "P"] if op == "LSTM" else ["W", "R", "B"]
    graph = model.graph
    for value in [v for v in graph.inputs if v.name in weights]:
        graph.inputs.remove(value)
        value.const_value = ir.tensor(feeds.pop(str(value.name)))
        graph.register_initializer(value)
    check_vjp(model, feeds, inputs=weights)
    check_jvp(model, feeds, inputs=["X", *weights])


# ------------------------------------------------------------- cases of the common harness
# Float only: onnxruntime has no double kernel for these operators (the closure test builds
# their derivative models in double without running them).
CASES = [
    Case(
        "rnn_forward",
        "g ({T}[4, N, 2] X, {T}[1, 5, 2] W, {T}[1, 5, 5] R, {T}[1, 10] B) => "
        "({T}[4, 1, N, 5] Y, {T}[1, N, 5] Yh) {\n"
        " Y, Yh = RNN<hidden_size=5>(X, W, R, B) }",
        opsets=(11, 14, 22),
        dtypes=("float",),
    ),
    Case(
        "gru_reverse_lengths_linear_before_reset",
        "g ({T}[4, N, 2] X, {T}[1, 15, 2] W, {T}[1, 15, 5] R, {T}[1, 30] B, int32[N] L,"
        " {T}[1, N, 5] H0) => ({T}[4, 1, N, 5] Y, {T}[1, N, 5] Yh) {\n"
        ' Y, Yh = GRU<hidden_size=5, direction="reverse", linear_before_reset=1>'
        "(X, W, R, B, L, H0) }",
        opsets=(14, 22),
        fixed={"L": np.array([4, 1, 3], np.int32)},
        dtypes=("float",),
    ),
    Case(
        "lstm_bidirectional_lengths_peepholes",
        "g ({T}[4, N, 2] X, {T}[2, 20, 2] W, {T}[2, 20, 5] R, {T}[2, 40] B, int32[N] L,"
        " {T}[2, N, 5] H0, {T}[2, N, 5] C0, {T}[2, 15] P) =>"
        " ({T}[4, 2, N, 5] Y, {T}[2, N, 5] Yh, {T}[2, N, 5] Yc) {\n"
        ' Y, Yh, Yc = LSTM<hidden_size=5, direction="bidirectional">(X, W, R, B, L, H0, C0, P) }',
        opsets=(11, 22),
        fixed={"L": np.array([2, 4, 3], np.int32)},
        dtypes=("float",),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)
