"""Sequence operators under vmap (batch rules in onnax.rules.sequence).

Oracle: vmap against a loop of single-example onnxruntime runs, stacked; a batched sequence is
stacked element by element (every element carries the batch axis at 0), which is the layout a
batched ``seq(tensor)`` input or output declares. Sequence values appear as graph inputs and
outputs and in between tensors (SplitToSequence -> ConcatFromSequence). Float and double, at
opsets 11 (where the rules need no Loop), 13 (Loop carries sequences from 13 on, so a shared
sequence meeting a batched one can be broadcast), 17 (SequenceMap) and 24 (SplitToSequence's
last version). Every case runs with every float input batched, with only the first one
batched and with only the others batched (integer inputs like split sizes are parameters whose
batching is refused, tested on its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from onnax.errors import SelectionError, UnsupportedOperatorError
from oracles import check_model_valid, run

DTYPES = ("float", "double")
BATCH = 3


@dataclasses.dataclass(frozen=True)
class SeqCase:
    """A model in ONNX text (``{T}`` is the element type) and its inputs (sequences as lists)."""

    name: str
    text: str
    feeds: Mapping[str, Any]
    opsets: Sequence[int]

    def model(self, dtype: str, opset: int) -> ir.Model:
        header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
        return ir.from_onnx_text(header + self.text.replace("{T}", dtype))

    def inputs(self, dtype: str) -> dict[str, Any]:
        np_dtype = np.float32 if dtype == "float" else np.float64

        def cast(x: Any) -> Any:
            if isinstance(x, list):
                return [cast(e) for e in x]
            x = np.asarray(x)
            return x.astype(np_dtype) if x.dtype.kind == "f" else x

        return {k: cast(v) for k, v in self.feeds.items()}


def _rng_array(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def _perturb(x: Any, rng: np.random.Generator) -> Any:
    if isinstance(x, list):
        return [_perturb(e, rng) for e in x]
    if x.dtype.kind != "f":
        return x
    return (x + 0.1 * rng.standard_normal(x.shape)).astype(x.dtype)


def _stack(values: Sequence[Any]) -> Any:
    if isinstance(values[0], list):
        assert all(len(v) == len(values[0]) for v in values)
        return [_stack([v[k] for v in values]) for k in range(len(values[0]))]
    return np.stack(values, axis=0)


def _assert_same(got: Any, want: Any, name: str) -> None:
    if isinstance(want, list):
        assert isinstance(got, list), (name, type(got))
        assert len(got) == len(want), (name, len(got), len(want))
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_same(g, w, f"{name}[{k}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.shape, want.shape)
    if want.dtype.kind == "f":
        tol = 1e-10 if want.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def check_vmap_seq(model: ir.Model, feeds: Mapping[str, Any], batched: Sequence[str]) -> None:
    """vmap with ``batched`` inputs at axis 0 (the others shared) against single runs."""
    vm = onnax.vmap(model, in_axes={n: 0 for n in batched})
    check_model_valid(vm)
    rng = np.random.default_rng(7)
    examples = [dict(feeds)]
    for _ in range(BATCH - 1):
        examples.append({k: _perturb(v, rng) if k in batched else v for k, v in feeds.items()})
    stacked = {k: _stack([e[k] for e in examples]) if k in batched else v for k, v in feeds.items()}
    singles = [run(model, e) for e in examples]
    got = run(vm, stacked)
    for y in model.graph.outputs:
        _assert_same(got[y.name], _stack([s[y.name] for s in singles]), y.name)


X34 = _rng_array((3, 4), 0)
SEQ = [_rng_array((2, 3), 1), _rng_array((4, 3), 2), _rng_array((1, 3), 3)]

# Not named CASES: tests/test_closure.py derives jvp/vjp models from every module's CASES (of
# tests/cases.Case), and jvp/vjp refuse sequences on a derivative path (tested at the end).
SEQ_CASES = [
    SeqCase(
        "split_concat_axis1",
        """
        g ({T}[3, 4] x, int64[2] split) => ({T}[3, 4] y, seq({T}[3, N]) s, {T}[3, 5] z) {
            s = SplitToSequence <axis = 1> (x, split)
            t = SequenceErase (s)
            u = SequenceInsert (t, x)
            y = ConcatFromSequence <axis = 1> (s)
            z = ConcatFromSequence <axis = -1, new_axis = 0> (u)
        }
        """,
        {"x": X34, "split": np.array([1, 3], np.int64)},
        (11, 13, 18, 24),
    ),
    SeqCase(
        "split_negative_axis_nokeepdims",
        """
        g ({T}[3, 4] x) => ({T}[4, 3] y, {T}[3, 4] z, int64 n) {
            s = SplitToSequence <axis = -1, keepdims = 0> (x)
            y = ConcatFromSequence <axis = -2, new_axis = 1> (s)
            z = ConcatFromSequence <axis = -1, new_axis = 1> (s)
            n = SequenceLength (s)
        }
        """,
        {"x": X34},
        (11, 13, 24),
    ),
    SeqCase(
        "construct_at_insert_position",
        """
        g ({T}[3, 4] x, {T}[4] w) => ({T}[3, 4] y, seq({T}[M, 4]) s) {
            a = Mul (x, w)
            zero = Constant <value = int64 {0}> ()
            minus = Constant <value = int64 {-1}> ()
            s0 = SequenceConstruct (a, x)
            s = SequenceInsert (s0, x, zero)
            b = SequenceAt (s, minus)
            y = Sin (b)
        }
        """,
        {"x": X34, "w": _rng_array((4,), 4)},
        (11, 13, 18),
    ),
    SeqCase(
        "sequence_input_and_output",
        """
        g (seq({T}[N, 3]) xs, {T}[1, 3] w) => (seq({T}[N, 3]) ys, {T}[M, 3] c) {
            ys = SequenceInsert (xs, w)
            c = ConcatFromSequence <axis = 0> (xs)
        }
        """,
        {"xs": SEQ, "w": _rng_array((1, 3), 5)},
        (13, 18),
    ),
    SeqCase(
        "sequence_map_captures",
        """
        g (seq({T}[N, 3]) xs, {T}[3] w, {T}[3] v) => (seq({T}[N, 3]) ys, seq(int64[2]) shapes) {
            ys, shapes = SequenceMap (xs, w) <body = b ({T}[N, 3] x, {T}[3] u) => ({T}[N, 3] y, int64[2] sh) {
                p = Mul (x, u)
                y = Add (p, v)
                sh = Shape (x)
            }>
        }
        """,
        {"xs": SEQ, "w": _rng_array((3,), 6), "v": _rng_array((3,), 7)},
        (17, 21),
    ),
    SeqCase(
        # A shared branch's sequence is broadcast (element by element) to match the batched one.
        "if_with_sequence_outputs",
        """
        g ({T}[2, 3] x, {T}[4, 3] w, bool c) => (seq({T}[N, 3]) s, {T}[M, 3] y) {
            s = If (c) <
                then_branch = t () => (seq({T}[N, 3]) a) { a = SequenceConstruct (x, w) },
                else_branch = e () => (seq({T}[N, 3]) b) { b = SequenceConstruct (w) }
            >
            y = ConcatFromSequence <axis = 0> (s)
        }
        """,
        {"x": _rng_array((2, 3), 9), "w": _rng_array((4, 3), 10), "c": np.array(False)},
        (13, 16),
    ),
    SeqCase(
        # A Loop whose sequence state starts shared and not empty, and becomes batched.
        "loop_with_shared_initial_sequence",
        """
        g (seq({T}[N, 3]) xs, {T}[3] w) => (seq({T}[N, 3]) ys) {
            two = Constant <value = int64 {2}> ()
            cond = Constant <value = bool {1}> ()
            ys = Loop (two, cond, xs) <body = lb (int64 i, bool c, seq({T}[N, 3]) acc) => (bool c2, seq({T}[N, 3]) acc2) {
                c2 = Identity (c)
                x = SequenceAt (acc, i)
                y = Mul (x, w)
                acc2 = SequenceInsert (acc, y)
            }>
        }
        """,
        {"xs": SEQ, "w": _rng_array((3,), 11)},
        (13, 17),
    ),
    SeqCase(
        # The ONNX function body of SequenceMap: a Loop with a sequence state that starts empty.
        "loop_with_sequence_state",
        """
        g (seq({T}[N, 3]) xs, {T}[3] w) => (seq({T}[N, 3]) ys) {
            n = SequenceLength (xs)
            cond = Constant <value = bool {1}> ()
            empty = SequenceEmpty <dtype = 1> ()
            ys = Loop (n, cond, empty) <body = lb (int64 i, bool c, seq({T}[N, 3]) acc) => (bool c2, seq({T}[N, 3]) acc2) {
                c2 = Identity (c)
                x = SequenceAt (xs, i)
                y = Mul (x, w)
                acc2 = SequenceInsert (acc, y)
            }>
        }
        """,
        {"xs": SEQ, "w": _rng_array((3,), 8)},
        (13, 17),
    ),
]


def _params(cases: Sequence[SeqCase]) -> list[tuple[SeqCase, str, int]]:
    return [(c, d, o) for c in cases for o in c.opsets for d in DTYPES]


def _id(param: object) -> str:
    return param.name if isinstance(param, SeqCase) else str(param)


def _fix_dtype(text: str, dtype: str) -> str:
    return text.replace("dtype = 1", f"dtype = {1 if dtype == 'float' else 11}")


@pytest.mark.parametrize(("case", "dtype", "opset"), _params(SEQ_CASES), ids=_id)
def test_vmap(case: SeqCase, dtype: str, opset: int) -> None:
    case = dataclasses.replace(case, text=_fix_dtype(case.text, dtype))
    model = case.model(dtype, opset)
    feeds = case.inputs(dtype)
    names = [v.name for v in model.graph.inputs]
    # Integer and bool inputs (split sizes, conditions) are parameters: kept shared.
    floats = [n for n in names if _is_float(model, n)]
    check_vmap_seq(model, feeds, floats)
    check_vmap_seq(model, feeds, floats[:1])
    if len(floats) > 1:
        check_vmap_seq(model, feeds, floats[1:])


def _is_float(model: ir.Model, name: str) -> bool:
    """A float tensor or a sequence of them (``dtype`` is the element type of a sequence)."""
    value = next(v for v in model.graph.inputs if v.name == name)
    return value.dtype is not None and value.dtype.is_floating_point()


def test_sequence_input_of_unknown_element_shape() -> None:
    # Elements of different ranks: the element type declares no shape at all.
    seq = onnx.helper.make_sequence_type_proto(
        onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["xs"], ["ys"])],
        "g",
        [onnx.helper.make_value_info("xs", seq)],
        [onnx.helper.make_value_info("ys", seq)],
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 16)])
    model = ir.from_proto(proto)
    assert model.graph.inputs[0].shape is None
    feeds = {"xs": [np.ones((2, 2), np.float32), np.zeros((3,), np.float32)]}
    check_vmap_seq(model, feeds, ["xs"])


def test_batched_split_is_refused() -> None:
    model = SEQ_CASES[0].model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes=0)
    message = str(err.value)
    for part in ("ai.onnx::SplitToSequence", "batched split", "'split'", "different length"):
        assert part in message, message
    assert "in_axes None" in message


@pytest.mark.parametrize("op", ["SequenceAt", "SequenceErase", "SequenceInsert"])
def test_batched_position_is_refused(op: str) -> None:
    args = {"SequenceAt": "s, p", "SequenceErase": "s, p", "SequenceInsert": "s, x, p"}[op]
    out = "float[3]" if op == "SequenceAt" else "seq(float[3])"
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        f"g (float[3] x, int64 p) => ({out} y) {{\n"
        "  s = SequenceConstruct (x, x)\n"
        f"  y = {op} ({args})\n"
        "}"
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes=0)
    message = str(err.value)
    for part in (f"ai.onnx::{op}", "batched position", "'p'", "in_axes None"):
        assert part in message, message
    # The position shared: batched fine.
    feeds = {"x": np.arange(3, dtype=np.float32), "p": np.array(1, np.int64)}
    check_vmap_seq(model, feeds, ["x"])


def test_broadcasting_a_sequence_before_opset_13_is_refused() -> None:
    # A batched tensor inserted into a shared sequence: the sequence must be broadcast element
    # by element, in a Loop carrying a sequence, which opset 11 does not allow.
    case = SEQ_CASES[3]
    model = case.model("float", 11)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes={"w": 0})
    message = str(err.value)
    for part in ("ai.onnx::SequenceInsert", "'xs'", "opset 13", "convert the model"):
        assert part in message, message


@pytest.mark.parametrize("dtype", DTYPES)
def test_sequence_axes_other_than_zero(dtype: str) -> None:
    # The batch axis of every element moves (in a Loop over the elements): in at 1, out at -1.
    case = SEQ_CASES[3]
    model = case.model(dtype, 13)
    feeds = case.inputs(dtype)
    rng = np.random.default_rng(5)
    examples = [feeds] + [{k: _perturb(v, rng) for k, v in feeds.items()} for _ in range(2)]
    vm = onnax.vmap(model, in_axes={"xs": 1, "w": 0}, out_axes=-1)
    check_model_valid(vm)
    stacked = {
        "xs": [np.stack([e["xs"][k] for e in examples], axis=1) for k in range(len(SEQ))],
        "w": np.stack([e["w"] for e in examples]),
    }
    got = run(vm, stacked)
    singles = [run(model, e) for e in examples]
    want_ys = [np.stack([s["ys"][k] for s in singles], axis=-1) for k in range(len(SEQ) + 1)]
    _assert_same(got["ys"], want_ys, "ys")
    _assert_same(got["c"], np.stack([s["c"] for s in singles], axis=-1), "c")


def test_sequence_axes_other_than_zero_before_opset_13_are_refused() -> None:
    model = SEQ_CASES[3].model("float", 11)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes={"xs": 1, "w": None})
    message = str(err.value)
    for part in ("move the batch axis (1 -> 0)", "'xs'", "opset 13", "Remedy"):
        assert part in message, message


def test_sequence_axis_out_of_range_is_refused() -> None:
    model = SEQ_CASES[3].model("float", 13)
    with pytest.raises(SelectionError, match="out of range"):
        onnax.vmap(model, in_axes={"xs": 3})


def test_jvp_and_vjp_refuse_sequences_on_a_derivative_path() -> None:
    model = SEQ_CASES[0].model("float", 18)
    for transform in (onnax.jvp, onnax.vjp):
        with pytest.raises(onnax.OnnaxError, match="Sequence"):
            transform(model, ["x"])
