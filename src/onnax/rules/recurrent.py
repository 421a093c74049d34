"""RNN, GRU and LSTM lowered to a ``Scan`` over one time step of their equations.

The recurrent operators have no derivative rules of their own: each registers a *lowering*
(:meth:`onnax.core.registry.OpRules.lowering`) that rewrites it into primitives, so that ``jvp``,
``vjp`` and ``vmap`` see a ``Scan`` of ``MatMul``/``Add``/activations, each covered by its own
rules. One ``Scan`` runs per direction:

* Outside the loop, the input projection of every step is one ``MatMul``: ``X·Wᵀ`` plus the
  biases that do not sit behind a reset gate (``Wb + Rb``; GRU with ``linear_before_reset``
  keeps ``Rbh`` inside). The weights of direction ``d`` are ``Gather(W, d)``.
* The body carries ``H`` (and ``C`` for LSTM) and reads one step of the projection; the
  recurrent weights are captured from the enclosing graph.
* ``sequence_lens`` becomes a boolean mask scanned alongside, ``step < length``: a masked step
  keeps the previous state and outputs zeros, so the final state is the last valid one, as in
  onnxruntime. A sequence of length 0 gives zero final states, again as onnxruntime does.
  The reverse direction flips the projection and the mask in time (``Slice`` with step -1) and
  flips its outputs back; with the mask, the first steps it sees are the padding, which leave
  the initial state alone, so each sequence is read backwards from its own last element.
* ``layout=1`` (batch-major) transposes ``X``, the initial states and the outputs.

Activations follow the ONNX tables (``Relu``, ``Tanh``, ``Sigmoid``, ``Affine``, ``LeakyRelu``,
``ThresholdedRelu``, ``ScaledTanh``, ``HardSigmoid``, ``Elu``, ``Softsign``, ``Softplus``,
names matched case-insensitively). ``activation_alpha``/``activation_beta`` are consumed in the
order of the activations that take them, across directions, as onnxruntime reads them; an
activation left without a value uses the default of the ONNX operator of the same name.
``clip`` bounds every activation's input (``Clip``), not the cell state fed to ``h``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import OpRules
from onnax.errors import UnsupportedOperatorError

__all__ = ["ACTIVATIONS"]

ACTIVATIONS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}
"""Activation name (lower case) -> (takes alpha, takes beta, default alpha, default beta)."""

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {
    "RNN": ("Tanh",),
    "GRU": ("Sigmoid", "Tanh"),
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
}
_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}
_INT64_MIN = int(np.iinfo(np.int64).min)


@dataclasses.dataclass(frozen=True)
class _Activation:
    name: str
    alpha: float
    beta: float


@dataclasses.dataclass
class _Config:
    """The attributes of one recurrent node, checked and with defaults filled in."""

    op: str
    hidden: int
    reverse: tuple[bool, ...]
    activations: list[list[_Activation]]  # per direction
    clip: float | None
    input_forget: bool
    linear_before_reset: bool
    batch_major: bool
    dtype: ir.DataType


def _refuse(node: ir.Node, what: str, remedy: str) -> UnsupportedOperatorError:
    # The lowering does not know which transform asked: jvp, vjp, grad and vmap all lower.
    return UnsupportedOperatorError(
        f"jvp/vjp/vmap: {op_label(node)} ({node_label(node)}) has no rule of its own and cannot "
        f"be lowered to a Scan: {what}. {remedy}"
    )


def _activations(node: ir.Node, n_dirs: int) -> list[list[_Activation]]:
    per_dir = len(_DEFAULT_ACTIVATIONS[node.op_type])
    names = list(node.attributes.get_strings("activations", ()) or ())
    if not names:
        names = list(_DEFAULT_ACTIVATIONS[node.op_type]) * n_dirs
    elif len(names) == per_dir and n_dirs == 2:
        names = names * 2
    if len(names) != per_dir * n_dirs:
        raise _refuse(
            node,
            f"attribute 'activations' has {len(names)} entries, expected {per_dir * n_dirs} "
            f"({per_dir} per direction)",
            "Give one activation per gate function and direction.",
        )
    alphas = list(node.attributes.get_floats("activation_alpha", ()) or ())
    betas = list(node.attributes.get_floats("activation_beta", ()) or ())
    out: list[_Activation] = []
    for name in names:
        key = name.lower()
        if key not in ACTIVATIONS:
            raise _refuse(
                node,
                f"attribute 'activations' names {name!r}, which is not an ONNX recurrent "
                "activation",
                "Use one of " + ", ".join(sorted(ACTIVATIONS)) + " (case-insensitive).",
            )
        takes_alpha, takes_beta, alpha, beta = ACTIVATIONS[key]
        if takes_alpha and alphas:
            alpha = alphas.pop(0)
        if takes_beta and betas:
            beta = betas.pop(0)
        out.append(_Activation(key, alpha, beta))
    return [out[d * per_dir : (d + 1) * per_dir] for d in range(n_dirs)]


def _config(node: ir.Node) -> _Config:
    attrs = node.attributes
    direction = attrs.get_string("direction", "forward")
    if direction not in _DIRECTIONS:
        raise _refuse(
            node,
            f"attribute 'direction' is {direction!r}",
            "Use 'forward', 'reverse' or 'bidirectional'.",
        )
    reverse = _DIRECTIONS[direction]
    x, r = node.inputs[0], node.inputs[2]
    hidden = attrs.get_int("hidden_size", 0)
    if hidden <= 0:
        last = r.shape[-1] if r is not None and r.shape is not None else None
        if not isinstance(last, int):
            raise _refuse(
                node,
                "attribute 'hidden_size' is missing and the last dimension of R is not static",
                "Set hidden_size on the node.",
            )
        hidden = last
    if x is None or x.dtype is None:
        raise _refuse(node, "the element type of X is unknown", "Run shape inference first.")
    clip = attrs.get_float("clip", 0.0) if "clip" in attrs else None
    return _Config(
        op=node.op_type,
        hidden=hidden,
        reverse=reverse,
        activations=_activations(node, len(reverse)),
        clip=clip,
        input_forget=bool(attrs.get_int("input_forget", 0)),
        linear_before_reset=bool(attrs.get_int("linear_before_reset", 0)),
        batch_major=bool(attrs.get_int("layout", 0)),
        dtype=x.dtype,
    )


# ------------------------------------------------------------------------------ helpers
def _activate(em: Emitter, x: ir.Value, act: _Activation, dtype: ir.DataType) -> ir.Value:
    """``act(x)`` with ONNX operators (Affine and ScaledTanh have none of their own)."""
    name, a, b = act.name, act.alpha, act.beta
    if name == "affine":
        return em.op("Add", [em.op("Mul", [x, em.scalar(a, dtype)]), em.scalar(b, dtype)])
    if name == "scaledtanh":
        inner = em.op("Tanh", [em.op("Mul", [x, em.scalar(b, dtype)])])
        return em.op("Mul", [inner, em.scalar(a, dtype)])
    ops = {
        "relu": ("Relu", {}),
        "tanh": ("Tanh", {}),
        "sigmoid": ("Sigmoid", {}),
        "leakyrelu": ("LeakyRelu", {"alpha": a}),
        "thresholdedrelu": ("ThresholdedRelu", {"alpha": a}),
        "hardsigmoid": ("HardSigmoid", {"alpha": a, "beta": b}),
        "elu": ("Elu", {"alpha": a}),
        "softsign": ("Softsign", {}),
        "softplus": ("Softplus", {}),
    }
    op_type, attributes = ops[name]
    return em.op(op_type, [x], attributes)


def _gate(em: Emitter, v: ir.Value, k: int, hidden: int, count: int = 1) -> ir.Value:
    """Gates ``k .. k+count-1`` (each ``hidden`` wide) of the last axis of ``v``."""
    return em.slice(v, [k * hidden], [(k + count) * hidden], [-1])


def _flip_time(em: Emitter, v: ir.Value) -> ir.Value:
    """``v`` reversed along axis 0 (time)."""
    return em.slice(v, [-1], [_INT64_MIN], [0], [-1])


def _pick(em: Emitter, v: ir.Value | None, d: int) -> ir.Value | None:
    """Direction ``d`` of a per-direction tensor (its leading axis removed)."""
    if v is None:
        return None
    return em.op("Gather", [v, em.const(np.array(d, np.int64))], {"axis": 0})


class _Step:
    """Builds the Scan body of one direction: ``(h, [c], xw_t, [mask_t]) -> (h, [c], [y_t])``."""

    def __init__(
        self,
        cfg: _Config,
        acts: list[_Activation],
        opset: int,
        batch: int | ir.SymbolicDim | None,
    ) -> None:
        self.cfg = cfg
        self.acts = acts
        self.em = Emitter(opset)
        self.batch = batch

    def input(self, width: int | None, dtype: ir.DataType | None = None) -> ir.Value:
        dims: list[int | ir.SymbolicDim | None] = [self.batch]
        if width is not None:
            dims.append(width)
        value = ir.Value(shape=ir.Shape(dims), type=ir.TensorType(dtype or self.cfg.dtype))
        return value

    def clipped(self, x: ir.Value) -> ir.Value:
        if self.cfg.clip is None:
            return x
        dtype = self.cfg.dtype
        lo, hi = self.em.scalar(-self.cfg.clip, dtype), self.em.scalar(self.cfg.clip, dtype)
        return self.em.op("Clip", [x, lo, hi])

    def act(self, x: ir.Value, k: int) -> ir.Value:
        return _activate(self.em, self.clipped(x), self.acts[k], self.cfg.dtype)

    def lstm(
        self, h: ir.Value, c: ir.Value, xw: ir.Value, rt: ir.Value, p: ir.Value | None
    ) -> tuple[ir.Value, ir.Value]:
        em, hid = self.em, self.cfg.hidden
        pre = em.op("Add", [xw, em.op("MatMul", [h, rt])])  # gates i, o, f, c
        pi, po, pf = (None, None, None) if p is None else (_gate(em, p, k, hid) for k in range(3))

        def peep(x: ir.Value, weight: ir.Value | None, cell: ir.Value) -> ir.Value:
            return x if weight is None else em.op("Add", [x, em.op("Mul", [weight, cell])])

        i = self.act(peep(_gate(em, pre, 0, hid), pi, c), 0)
        if self.cfg.input_forget:
            f = em.op("Sub", [em.scalar(1.0, self.cfg.dtype), i])
        else:
            f = self.act(peep(_gate(em, pre, 2, hid), pf, c), 0)
        g = self.act(_gate(em, pre, 3, hid), 1)
        c_new = em.op("Add", [em.op("Mul", [f, c]), em.op("Mul", [i, g])])
        o = self.act(peep(_gate(em, pre, 1, hid), po, c_new), 0)
        h_new = em.op("Mul", [o, _activate(em, c_new, self.acts[2], self.cfg.dtype)])
        return h_new, c_new

    def gru(self, h: ir.Value, xw: ir.Value, rt: ir.Value, rbh: ir.Value | None) -> ir.Value:
        em, hid = self.em, self.cfg.hidden
        if self.cfg.linear_before_reset:
            hr = em.op("MatMul", [h, rt])
            zr = em.op("Add", [_gate(em, xw, 0, hid, 2), _gate(em, hr, 0, hid, 2)])
        else:
            hzr = em.op("MatMul", [h, _gate(em, rt, 0, hid, 2)])
            zr = em.op("Add", [_gate(em, xw, 0, hid, 2), hzr])
        z = self.act(_gate(em, zr, 0, hid), 0)
        r = self.act(_gate(em, zr, 1, hid), 0)
        if self.cfg.linear_before_reset:
            rec = _gate(em, hr, 2, hid)
            if rbh is not None:
                rec = em.op("Add", [rec, rbh])
            rec = em.op("Mul", [r, rec])
        else:
            rec = em.op("MatMul", [em.op("Mul", [r, h]), _gate(em, rt, 2, hid)])
        cand = self.act(em.op("Add", [_gate(em, xw, 2, hid), rec]), 1)
        # (1 - z) * cand + z * h, spelled with one product fewer
        return em.op("Add", [cand, em.op("Mul", [z, em.op("Sub", [h, cand])])])

    def rnn(self, h: ir.Value, xw: ir.Value, rt: ir.Value) -> ir.Value:
        return self.act(self.em.op("Add", [xw, self.em.op("MatMul", [h, rt])]), 0)


def _name_body(body: ir.Graph) -> None:
    """Names the body's values after the graph (whose name is unique in the model).

    ``onnx_ir`` names the values of a new graph from a counter of that graph alone
    (``val_0``...), so the outer graph can later hand out the same names, which onnxruntime
    rejects as a second assignment. Every value here is new, so all are renamed.
    """
    values = [*body.inputs, *(v for n in body for v in n.outputs)]
    for k, v in enumerate(values):
        v.name = f"{body.name}_{k}"


def _direction(
    em: Emitter,
    cfg: _Config,
    prefix: str,
    d: int,
    x: ir.Value,
    inputs: dict[str, ir.Value | None],
    mask: ir.Value | None,
    want_y: bool,
) -> tuple[ir.Value | None, ir.Value, ir.Value | None]:
    """Runs direction ``d``; returns ``(Y_d [T, B, H] or None, H_d [B, H], C_d or None)``."""
    hid, gates, dtype = cfg.hidden, _GATES[cfg.op], cfg.dtype
    reverse = cfg.reverse[d]
    w, r = _pick(em, inputs["W"], d), _pick(em, inputs["R"], d)
    assert w is not None and r is not None
    xw = em.op("MatMul", [x, em.transpose(w, [1, 0])])
    bias = _pick(em, inputs["B"], d)
    rbh = None
    if bias is not None:
        wb, rb = _gate(em, bias, 0, hid, gates), _gate(em, bias, gates, hid, gates)
        if cfg.op == "GRU" and cfg.linear_before_reset:
            # Rbh sits behind the reset gate: it stays in the body, the rest moves out.
            rbh = _gate(em, rb, 2, hid)
            zr = em.op("Add", [_gate(em, wb, 0, hid, 2), _gate(em, rb, 0, hid, 2)])
            outside = em.op("Concat", [zr, _gate(em, wb, 2, hid)], {"axis": 0})
        else:
            outside = em.op("Add", [wb, rb])
        xw = em.op("Add", [xw, outside])
    rt = em.transpose(r, [1, 0])
    p = _pick(em, inputs.get("P"), d) if cfg.op == "LSTM" else None

    batch = x.shape[1] if x.shape is not None and x.shape.rank() == 3 else None
    step = _Step(cfg, cfg.activations[d], em.opset, batch)
    h_in = step.input(hid)
    c_in = step.input(hid) if cfg.op == "LSTM" else None
    xw_in = step.input(gates * hid)
    mask_in = step.input(1, ir.DataType.BOOL) if mask is not None else None
    if cfg.op == "LSTM":
        assert c_in is not None
        h_new, c_new = step.lstm(h_in, c_in, xw_in, rt, p)
    elif cfg.op == "GRU":
        h_new, c_new = step.gru(h_in, xw_in, rt, rbh), None
    else:
        h_new, c_new = step.rnn(h_in, xw_in, rt), None
    body_em = step.em
    y_t: ir.Value | None = None
    if mask_in is not None:
        h_new = body_em.op("Where", [mask_in, h_new, h_in])
        if c_new is not None and c_in is not None:
            c_new = body_em.op("Where", [mask_in, c_new, c_in])
        if want_y:
            y_t = body_em.op("Where", [mask_in, h_new, body_em.scalar(0.0, dtype)])
    elif want_y:
        # A graph output may not be listed twice: the scan output is a copy of the state.
        y_t = body_em.op("Identity", [h_new])
    body_inputs = [v for v in (h_in, c_in, xw_in, mask_in) if v is not None]
    body_outputs = [v for v in (h_new, c_new, y_t) if v is not None]
    for v in body_outputs:
        v.dtype = dtype
    body = ir.Graph(
        body_inputs,
        body_outputs,
        nodes=body_em.take(),
        opset_imports={"": em.opset},
        name=f"{prefix}_step{d}",
    )
    _name_body(body)

    h0 = _pick(em, inputs["initial_h"], d)
    c0 = _pick(em, inputs.get("initial_c"), d) if cfg.op == "LSTM" else None
    zeros = None
    if h0 is None or (cfg.op == "LSTM" and c0 is None):
        state_shape = em.op(
            "Concat", [em.slice(em.shape(x), [1], [2], [0]), em.ints([hid])], {"axis": 0}
        )
        zeros = em.op("Expand", [em.scalar(0.0, dtype), state_shape])
    h0 = h0 if h0 is not None else zeros
    scan_states = [h0] + ([c0 if c0 is not None else zeros] if cfg.op == "LSTM" else [])
    scanned = [xw] + ([mask] if mask is not None else [])
    if reverse:
        scanned = [_flip_time(em, v) for v in scanned]
    n_out = len(body_outputs)
    outs = em.op_multi(
        "Scan",
        [*scan_states, *scanned],
        {"body": body, "num_scan_inputs": len(scanned)},
        num_outputs=n_out,
    )
    h_last = outs[0]
    c_last = outs[1] if cfg.op == "LSTM" else None
    y = outs[-1] if want_y else None
    if y is not None and reverse:
        y = _flip_time(em, y)
    return y, h_last, c_last


_INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def _used(node: ir.Node, i: int) -> bool:
    """Whether output ``i`` is present: named, used or a graph output (an omitted one is not).

    The expansion pass lowers a detached copy of the node whose outputs have names but no uses,
    and drops the results nothing reads.
    """
    if i >= len(node.outputs):
        return False
    v = node.outputs[i]
    return bool(v.name) or bool(v.uses()) or v.is_graph_output()


# 14 added `layout`, 22 bfloat16; one lowering reads the attributes of all versions.
recurrent = OpRules(("RNN", "GRU", "LSTM"), since=7)


@recurrent.lowering
def _lower(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    """Lowers one RNN/GRU/LSTM node to one Scan per direction (see the module docstring)."""
    cfg = _config(node)
    inputs: dict[str, ir.Value | None] = {
        name: node.inputs[i] if i < len(node.inputs) else None
        for i, name in enumerate(_INPUT_NAMES)
    }
    x = inputs["X"]
    assert x is not None
    if cfg.batch_major:
        x = em.transpose(x, [1, 0, 2])
        for name in ("initial_h", "initial_c"):
            v = inputs[name]
            inputs[name] = None if v is None else em.transpose(v, [1, 0, 2])
    if x.shape is None and inputs["X"] is not None and inputs["X"].shape is not None:
        dims = list(inputs["X"].shape.dims)
        x.shape = ir.Shape([dims[1], dims[0], dims[2]] if cfg.batch_major else dims)

    mask = lengths = None
    if inputs["sequence_lens"] is not None:
        lengths = em.op("Cast", [inputs["sequence_lens"]], {"to": ir.DataType.INT64})
        t_dim = x.shape[0] if x.shape is not None else None
        if isinstance(t_dim, int):
            steps = em.const(np.arange(t_dim, dtype=np.int64))
        else:
            count = em.op("Gather", [em.shape(x), em.const(np.array(0, np.int64))], {"axis": 0})
            zero, one = em.const(np.array(0, np.int64)), em.const(np.array(1, np.int64))
            steps = em.op("Range", [zero, count, one])
        mask = em.op("Less", [em.unsqueeze(steps, [1]), em.unsqueeze(lengths, [0])])
        mask = em.unsqueeze(mask, [2])  # [T, B, 1]: broadcasts over the hidden axis

    want_y = _used(node, 0)
    # The first named output is unique in the model: it names the bodies (see _name_body).
    anchor = node.name or next((v.name for v in node.outputs if v.name), "") or "recurrent"
    prefix = f"{anchor}_{cfg.op.lower()}"
    ys, hs, cs = [], [], []
    for d in range(len(cfg.reverse)):
        y, h, c = _direction(em, cfg, prefix, d, x, inputs, mask, want_y)
        ys.append(y)
        hs.append(h)
        cs.append(c)

    def stack(parts: Sequence[ir.Value | None], axis: int) -> ir.Value:
        expanded = [em.unsqueeze(p, [axis]) for p in parts if p is not None]
        if len(expanded) == 1:
            return expanded[0]
        return em.op("Concat", expanded, {"axis": axis})

    def final_state(parts: Sequence[ir.Value | None]) -> ir.Value:
        state = stack(parts, 0)  # [D, B, H]
        if lengths is not None:
            # onnxruntime returns zeros, not the initial state, for an empty sequence.
            valid = em.unsqueeze(em.op("Greater", [lengths, em.const(np.array(0, np.int64))]), [1])
            state = em.op("Where", [valid, state, em.scalar(0.0, cfg.dtype)])
        return em.transpose(state, [1, 0, 2]) if cfg.batch_major else state

    results: list[ir.Value | None] = [None] * len(node.outputs)
    if want_y:
        y_all = stack(ys, 1)  # [T, D, B, H]
        results[0] = em.transpose(y_all, [2, 0, 1, 3]) if cfg.batch_major else y_all
    if _used(node, 1):
        results[1] = final_state(hs)
    if cfg.op == "LSTM" and _used(node, 2):
        results[2] = final_state(cs)
    for out, new in zip(node.outputs, results, strict=True):
        if new is not None:
            new.dtype = cfg.dtype
            if out.shape is not None:
                new.shape = out.shape
    return results
