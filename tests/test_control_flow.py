"""Control flow beyond single rules: composition, Jacobians, an unrolled oracle, structure.

* ``jvp(grad(m))`` through If, Scan, Loop and their nesting, against finite differences of the
  gradient model (double precision, opsets 13 and 21).
* ``jacfwd`` (many seeds carried by one Scan) against ``jacrev`` and finite differences.
* A Scan model against the same model unrolled by hand: jvp and vjp give the same numbers.
* The backward Scan of a captured weight keeps its cotangent in the scan state (O(|w|) memory),
  not in a T*|w| scan output; the forward Scan stores nothing.
* A constant-condition If is inlined before any transform, so the branch never taken is never
  differentiated; a Loop-carried value that grows is refused by reverse mode with a clear
  message and accepted by forward mode.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from cases import Case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vjp, check_vmap, fd_jvp, run, tolerances
from rules.test_control_flow import (
    CASES,
    LOOP_ADD_TEXT,
    PASSTHROUGH_CASES,
    SCAN_ADD_TEXT,
    SCAN_MATMUL_TEXT,
)


def with_loss(text: str) -> str:
    """Appends ``L = ReduceSum(first output ** 2)`` as a rank-0 output."""
    start = text.index("=> (") + 4
    end = text.index(") {", start)
    match = re.match(r"\s*\{T\}(\[[^\]]*\])?\s*(\w+)", text[start:end])
    assert match is not None
    first = match.group(2)
    text = text[:end] + ", {T} L" + text[end:]
    close = text.rstrip().rfind("}")
    loss = f"    sq = Mul({first}, {first})\n    L = ReduceSum <keepdims = 0> (sq)\n"
    return text[:close] + loss + text[close:]


COMPOSED = [(c, o) for c in CASES for o in (13, 21) if o in c.opsets]


@pytest.mark.parametrize(("case", "opset"), COMPOSED, ids=lambda p: getattr(p, "name", str(p)))
def test_jvp_of_grad(case: Case, opset: int) -> None:
    lossy = Case(case.name, with_loss(case.text), fill=case.fill, fixed=case.fixed, dims=case.dims)
    model = lossy.model("double", opset)
    feeds = lossy.feeds(model)
    gm = onnax.grad(model, output="L")
    check_jvp(gm, feeds)


@pytest.mark.parametrize(
    "name", ["scan_states_axes_directions", "loop_trip_count", "nested_scan_loop_if_then"]
)
def test_vjp_of_jvp(name: str) -> None:
    """Reverse mode through the fused forward-mode nodes (their bodies hold both parts)."""
    (case,) = [c for c in CASES if c.name == name]
    model = case.model("double", 16 if 16 in case.opsets else 13)
    feeds = case.feeds(model)
    jm = onnax.jvp(model)
    rng = np.random.default_rng(3)
    for t in list(jm.graph.inputs)[len(model.graph.inputs) :]:
        primal = feeds[str(t.name).removeprefix("fwd_")]
        feeds = {**feeds, str(t.name): rng.standard_normal(primal.shape)}
    inputs = [name for name, value in feeds.items() if value.dtype == np.float64]
    check_vjp(jm, feeds, inputs)


SCAN_CASES = [c for c in CASES if c.name.startswith("scan")]


@pytest.mark.parametrize("case", SCAN_CASES, ids=lambda c: c.name)
def test_jacfwd_jacrev_on_scan(case: Case) -> None:
    model = case.model("double", 16)
    feeds = case.feeds(model)
    fwd = run(onnax.jacfwd(model), feeds)
    rev = run(onnax.jacrev(model), feeds)
    inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
    outputs = [v.name for v in model.graph.outputs]
    rng = np.random.default_rng(5)
    for x in inputs:
        direction = rng.standard_normal(feeds[x.name].shape)
        expected = fd_jvp(model, feeds, {x.name: direction}, outputs)
        for y in outputs:
            jac = fwd[f"jac_{y}_{x.name}"]
            np.testing.assert_allclose(jac, rev[f"jac_{y}_{x.name}"], rtol=1e-9, atol=1e-10)
            contracted = np.tensordot(jac, direction, axes=direction.ndim)
            np.testing.assert_allclose(contracted, expected[y], **tolerances(np.dtype("float64")))


UNROLLED_TEXT = """
g ({T}[1, 3] H, {T}[3, 1, 3] Xs, {T}[3, 3] W) => ({T}[1, 3] Hf, {T}[3, 1, 3] Ys) {
    i0 = Constant <value = int64 {0}> ()
    i1 = Constant <value = int64 {1}> ()
    i2 = Constant <value = int64 {2}> ()
    x0 = Gather <axis = 0> (Xs, i0)
    x1 = Gather <axis = 0> (Xs, i1)
    x2 = Gather <axis = 0> (Xs, i2)
    a0 = MatMul(H, W)
    b0 = Add(a0, x0)
    h1 = Tanh(b0)
    a1 = MatMul(h1, W)
    b1 = Add(a1, x1)
    h2 = Tanh(b1)
    a2 = MatMul(h2, W)
    b2 = Add(a2, x2)
    Hf = Tanh(b2)
    axes = Constant <value = int64[1] {0}> ()
    u1 = Unsqueeze(h1, axes)
    u2 = Unsqueeze(h2, axes)
    u3 = Unsqueeze(Hf, axes)
    Ys = Concat <axis = 0> (u1, u2, u3)
}
"""


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_scan_matches_unrolled(dtype: str) -> None:
    scan = Case("scan", SCAN_MATMUL_TEXT, dims={"K": 3}).model(dtype, 13)
    unrolled = Case("unrolled", UNROLLED_TEXT).model(dtype, 13)
    feeds = Case("scan", SCAN_MATMUL_TEXT, dims={"K": 3}).feeds(scan)
    rng = np.random.default_rng(7)
    np_dtype = feeds["H"].dtype
    extra = {f"fwd_{k}": rng.standard_normal(v.shape).astype(np_dtype) for k, v in feeds.items()}
    extra["adj_Hf"] = rng.standard_normal((1, 3)).astype(np_dtype)
    extra["adj_Ys"] = rng.standard_normal((3, 1, 3)).astype(np_dtype)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == "double" else {"rtol": 1e-4, "atol": 1e-5}
    for transform in (onnax.jvp, onnax.vjp):
        got = run(transform(scan), {**feeds, **extra})
        want = run(transform(unrolled), {**feeds, **extra})
        assert got.keys() == want.keys()
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, **tol, err_msg=name)


def _static(name: str) -> Case:
    """A case of the rule tests with its trip counts made static, so that unroll applies."""
    (case,) = [c for c in CASES if c.name == name]
    steps = str(case.dims.get("K", 3))
    text = case.text.replace("[K,", f"[{steps},").replace(", K]", f", {steps}]")
    fixed = dict(case.fixed)
    if "int64 M, " in text:
        text = text.replace("int64 M, ", "", 1)
        brace = text.index(") {", text.index("=>")) + 3
        trips = int(fixed.pop("M"))
        text = text[:brace] + f"\n    M = Constant <value = int64 {{{trips}}}> ()" + text[brace:]
    return Case(name, text, fill=case.fill, fixed=fixed, dims=case.dims)


@pytest.mark.parametrize(
    "name",
    [
        "scan_states_axes_directions",
        "scan_matmul_weight",
        "scan_with_if_per_iteration",
        "loop_trip_count",
        "nested_scan_loop_if_then",
    ],
)
def test_matches_unroll(name: str) -> None:
    """jvp and vjp of a model against jvp and vjp of ``onnax.unroll`` of it (no loops left)."""
    case = _static(name)
    model = case.model("double", 16)
    unrolled = onnax.unroll(model)
    assert not [n for g in unrolled.graphs() for n in g if n.op_type in ("Scan", "Loop")]
    feeds = case.feeds(model)
    rng = np.random.default_rng(11)
    primal = run(model, feeds)
    for transform in (onnax.jvp, onnax.vjp):
        derived = transform(model)
        extra = {}
        for v in list(derived.graph.inputs)[len(model.graph.inputs) :]:
            base = str(v.name).split("_", 1)[1]
            like = feeds[base] if base in feeds else primal[base]
            extra[str(v.name)] = rng.standard_normal(like.shape)
        got = run(derived, {**feeds, **extra})
        want = run(transform(unrolled), {**feeds, **extra})
        assert got.keys() == want.keys()
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-10, atol=1e-12, err_msg=key)


def test_backward_scan_accumulates_captured_weight_in_its_state() -> None:
    model = Case("scan", SCAN_MATMUL_TEXT, dims={"K": 50}).model("float", 16)
    vm = onnax.vjp(model, inputs=["W"])
    (producer,) = [n for n in vm.graph if "adj_W" in [o.name for o in n.outputs]]
    assert producer.op_type == "Scan"
    states = len(producer.inputs) - producer.attributes.get_int("num_scan_inputs", 0)
    index = [o.name for o in producer.outputs].index("adj_W")
    assert index < states, "the weight's cotangent must be loop state, not a scan output"
    # Nothing of size T·|w| exists anywhere in the model.
    for graph in vm.graphs():
        for value in (o for n in graph for o in n.outputs):
            shape = value.shape
            if shape is not None and shape.rank() == 3 and list(shape.dims[1:]) == [3, 3]:
                raise AssertionError(f"{value.name} holds one weight-sized slice per step")
    # The forward-mode Scan carries tangents and records nothing.
    jm = onnax.jvp(model, inputs=["W"])
    (scan,) = [n for n in jm.graph if n.op_type == "Scan"]
    assert len(scan.outputs) == 4  # Hf, its tangent, Ys, its tangent


CONSTANT_IF_TEXT = """
g ({T}[N] X) => ({T}[N] Y) {
    c = Constant <value = bool {1}> ()
    Y = If (c) <
        then_branch = g1 () => ({T}[N] t) { t = Sin(X) },
        else_branch = g2 () => ({T}[N] e) {
            r = RandomNormalLike(X)
            e = Add(r, X)
        }
    >
}
"""

INITIALIZER_IF_TEXT = """
g ({T}[N] X) => ({T}[N] Y) <bool c = {0}> {
    Y = If (c) <
        then_branch = g1 () => ({T}[N] t) {
            r = RandomNormalLike(X)
            t = Add(r, X)
        },
        else_branch = g2 () => ({T}[N] e) { e = Identity(X) }
    >
}
"""


@pytest.mark.parametrize("text", [CONSTANT_IF_TEXT, INITIALIZER_IF_TEXT], ids=["constant", "init"])
def test_constant_condition_if_is_inlined(text: str) -> None:
    case = Case("const_if", text)
    model = case.model("double", 18)
    feeds = case.feeds(model)
    for derived in (check_jvp(model, feeds), check_vjp(model, feeds)):
        assert all(n.op_type not in ("If", "RandomNormalLike") for g in derived.graphs() for n in g)


SHAPE_IF_TEXT = """
g ({T}[2,3] X, int64[2] S) => ({T}[2,3] Y) {
    two = Constant <value_int = 2> ()
    n = Size(S)
    c = Equal(n, two)
    W, V = If (c) <
        then_branch = g1 () => (int64[1] w, {T}[2,3] v) {
            w0, w = Split <num_outputs = 2> (S)
            v = Sin(X)
        },
        else_branch = g2 () => (int64[2] w2, {T}[2,3] v2) {
            w2 = Identity(S)
            v2 = Softplus(X)
        }
    >
    zero = Constant <value_int = 0> ()
    one = Constant <value_int = 1> ()
    r = Range(zero, W, one)
    rf = CastLike(r, X)
    Y = Mul(V, rf)
}
"""


def test_if_on_a_static_shape_is_inlined() -> None:
    """An If on ``Size(S) == 2`` with ``S`` of static shape ``[2]`` (as AffineGrid's body writes
    it) is decided before any transform: the Range it feeds with a ``[1]`` piece gets a scalar
    (onnxruntime refuses the inlined model otherwise), and the untaken branch, which reads X,
    keeps no primal node alive in the vmap model (it read the replaced input: invalid model)."""
    case = Case("shape_if", SHAPE_IF_TEXT, fixed={"S": np.array([2, 3])})
    model = case.model("double", 18)
    feeds = case.feeds(model)
    derived = [check_jvp(model, feeds), check_vjp(model, feeds)]
    derived.append(check_vmap(model, feeds, in_axes={"X": 0, "S": None}))
    for d in derived:
        assert all(n.op_type not in ("If", "Softplus") for g in d.graphs() for n in g)


GROWING_TEXT = """
g ({T}[3] X) => ({T}[K] Y) {
    one = Constant <value = int64 {1}> ()
    cond = Constant <value = bool {1}> ()
    Y = Loop (one, cond, X) <
        body = lb (int64 i, bool c, {T}[3] s) => (bool c2, {T}[6] s2) {
            c2 = Identity(c)
            e = Sin(s)
            s2 = Concat <axis = 0> (s, e)
        }
    >
}
"""


def test_growing_loop_state_is_refused_by_reverse_mode() -> None:
    model = Case("grow", GROWING_TEXT).model("double", 16)
    feeds = {"X": np.array([0.1, 0.2, 0.3])}
    check_jvp(model, feeds)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vjp(model)
    message = str(err.value)
    parts = ("vjp", "ai.onnx::Loop", "loop-carried value 0 ('X')", "Remedy", "scan output")
    for part in parts:
        assert part in message, (part, message)


def test_models_stay_valid_after_two_transforms() -> None:
    """Names stay unique across body scopes when a derivative model is transformed again."""
    model = Case("scan", SCAN_MATMUL_TEXT, dims={"K": 3}).model("float", 21)
    twice = onnax.vjp(onnax.jvp(model))
    names: list[str] = []
    for graph in twice.graphs():
        names += [v.name for v in graph.inputs if v.name]
        names += [o.name for n in graph for o in n.outputs if o.name]
    assert len(names) == len(set(names))
    ir.to_proto(twice)


@pytest.mark.parametrize("name", ["scan_matmul_weight", "nested_scan_loop_if_then"])
def test_hessian(name: str) -> None:
    """hessian (jacfwd of jacrev: vmap over both modes) against differences of the gradient."""
    (case,) = [c for c in CASES if c.name == name]
    lossy = Case(name, with_loss(case.text), fill=case.fill, fixed=case.fixed, dims=case.dims)
    model = lossy.model("double", 16)
    feeds = lossy.feeds(model)
    hess = run(onnax.hessian(model, output="L"), feeds)
    gm = onnax.grad(model, output="L")
    names = [str(v.name) for v in model.graph.inputs]
    rng = np.random.default_rng(13)
    for x in names:
        direction = rng.standard_normal(feeds[x].shape)
        expected = fd_jvp(gm, feeds, {x: direction}, [f"grad_{x2}" for x2 in names])
        for x2 in names:
            block = hess[f"hess_L_{x2}_{x}"]
            got = np.tensordot(block, direction, axes=direction.ndim)
            np.testing.assert_allclose(got, expected[f"grad_{x2}"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "inputs", "outputs"),
    [
        ("scan_states_axes_directions", ["W"], ["Zs"]),
        ("scan_states_axes_directions", ["Xs", "S"], ["Hf"]),
        ("loop_trip_count", ["W"], ["Acc"]),
        ("loop_data_dependent_termination", ["X"], ["Fin"]),
        ("if_then", ["W"], ["Z"]),
        ("nested_scan_loop_if_then", ["Xs"], ["Y"]),
    ],
)
def test_partial_selection(name: str, inputs: list[str], outputs: list[str]) -> None:
    """Cotangents seeded on some outputs only, wanted for some inputs only (zeros elsewhere)."""
    (case,) = [c for c in CASES if c.name == name]
    model = case.model("double", 16 if 16 in case.opsets else 13)
    feeds = case.feeds(model)
    check_jvp(model, feeds, inputs, outputs)
    check_vjp(model, feeds, inputs, outputs)


@pytest.mark.parametrize(
    "name", ["scan_matmul_weight", "loop_trip_count", "nested_scan_loop_if_then", "if_then"]
)
def test_captured_initializer_weight(name: str) -> None:
    """A weight stored as an initializer and read inside the bodies, selected by name."""
    (case,) = [c for c in CASES if c.name == name]
    model = case.model("double", 16 if 16 in case.opsets else 13)
    feeds = case.feeds(model)
    (w,) = [v for v in model.graph.inputs if v.name == "W"]
    w.const_value = ir.tensor(feeds.pop("W"))
    model.graph.inputs.remove(w)
    model.graph.register_initializer(w)
    check_jvp(model, feeds, ["W"])
    check_vjp(model, feeds, ["W"])


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("text", [SCAN_ADD_TEXT, LOOP_ADD_TEXT], ids=["scan", "loop"])
def test_final_state_wrt_initial_state_is_the_identity(text: str, dtype: str) -> None:
    """``a = a0 + sum(x)``: the final state's derivative w.r.t. the initial one is I, in every
    mode (the backward body must read the state's cotangent although it only passes through)."""
    case = Case("add", text, dims={"K": 3}, fixed={"M": np.array(3)})
    model = case.model(dtype, 16)
    feeds = case.feeds(model)
    seed = np.array([1.5, -2.0], feeds["a0"].dtype)
    got = run(onnax.vjp(model, inputs=["a0"], outputs=["a"]), {**feeds, "adj_a": seed})
    np.testing.assert_array_equal(got["adj_a0"], seed)
    got = run(onnax.jvp(model, inputs=["a0"], outputs=["a"]), {**feeds, "fwd_a0": seed})
    np.testing.assert_array_equal(got["fwd_a"], seed)
    for jac in (onnax.jacfwd, onnax.jacrev):
        got = run(jac(model, inputs=["a0"], outputs=["a"]), feeds)
        np.testing.assert_array_equal(got["jac_a_a0"], np.eye(2, dtype=seed.dtype))


def _attribute_lists(model: ir.Model) -> list[tuple[str, str, object]]:
    found = []
    for graph in model.graphs():
        for node in graph:
            for name, attr in node.attributes.items():
                found.append((node.op_type, name, attr.value))
    return found


@pytest.mark.parametrize(
    "case", [c for c in [*CASES, *PASSTHROUGH_CASES] if "scan" in c.name], ids=lambda c: c.name
)
def test_no_empty_list_attributes(case: Case) -> None:
    """An empty ints attribute has no type of its own (onnx_ir warns of an ambiguous empty
    sequence): the control-flow rules omit it, which means the same for Scan."""
    model = case.model("double", 16)
    for transform in (onnax.jvp, onnax.vjp, onnax.jacfwd, onnax.jacrev):
        for op, name, value in _attribute_lists(transform(model)):
            empty = isinstance(value, (list, tuple)) and len(value) == 0
            assert not empty, (transform.__name__, op, name)


# vmap of reverse mode through a Loop whose termination depends on the data: each example runs
# its own number of iterations. The primal Loop's records (the state each iteration starts from)
# are padded per example by vmap, and the backward Loop runs as often as each example's count.
WHILE_LOSS_TEXT = """
g (int64 big, {T}[3] X, {T}[3] W) => ({T} L) {
    cond = Constant <value = bool {1}> ()
    two = Constant <value = {T} {2}> ()
    limit = Constant <value = {T} {50}> ()
    Fin = Loop (big, cond, X) <
        body = lb (int64 i, bool c, {T}[3] s) => (bool c2, {T}[3] s2) {
            d = Mul(s, two)
            w = Sin(W)
            e = Mul(w, s)
            s2 = Add(d, e)
            m = ReduceMax <keepdims = 0> (s2)
            c2 = Less(m, limit)
        }
    >
    sq = Mul(Fin, Fin)
    L = ReduceSum <keepdims = 0> (sq)
}
"""


def _while_trips(big: int, x: np.ndarray, w: np.ndarray) -> int:
    """How many iterations the Loop of WHILE_LOSS_TEXT runs (numpy, float64)."""
    s, trips = x.astype(np.float64), 0
    while trips < big:
        s = 2 * s + np.sin(w) * s
        trips += 1
        if s.max() >= 50:
            break
    return trips


WHILE_XS = np.array([[0.3, 0.7, 1.1], [0.01, 0.02, 0.03], [3.0, 1.0, 2.0], [-1.0, -2.0, -3.0]])
WHILE_WS = np.array([[0.1, -0.2, 0.3], [0.4, 0.2, -0.1], [-0.3, 0.5, 0.2], [0.2, 0.2, 0.2]])


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize(
    "axes",
    [
        {"big": None, "X": 0, "W": None},
        {"big": None, "X": 0, "W": 0},
        {"big": 0, "X": 0, "W": None},
    ],
    ids=["x", "x_w", "big_x"],
)
def test_vmap_of_grad_through_data_dependent_loop(
    axes: dict[str, int | None], dtype: str, opset: int
) -> None:
    model = Case("while", WHILE_LOSS_TEXT).model(dtype, opset)
    gm = onnax.grad(model, output="L")
    np_dtype = np.float32 if dtype == "float" else np.float64
    bigs = np.array([30, 3, 30, 1]) if axes["big"] == 0 else np.array([30] * 4)
    examples = [
        {
            "big": np.array(bigs[b]),
            "X": WHILE_XS[b].astype(np_dtype),
            "W": (WHILE_WS[b] if axes["W"] == 0 else WHILE_WS[0]).astype(np_dtype),
        }
        for b in range(len(WHILE_XS))
    ]
    trips = [_while_trips(int(e["big"]), e["X"], e["W"]) for e in examples]
    assert len(set(trips)) >= 3, trips  # the examples stop after different iteration counts
    feeds = {
        k: np.stack([e[k] for e in examples]) if axes[k] == 0 else examples[0][k] for k in axes
    }
    got = run(onnax.vmap(gm, in_axes=axes), feeds)
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == "double" else {"rtol": 1e-5, "atol": 1e-4}
    for b, example in enumerate(examples):
        one = run(gm, example)
        assert got.keys() == one.keys()
        for name, value in one.items():
            np.testing.assert_allclose(got[name][b], value, **tol, err_msg=f"{name}[{b}]")


def test_vmap_of_grad_with_batched_termination_refuses_user_scan_outputs() -> None:
    """A user's scan output would have a length per example: refused, naming the user's Loop."""
    (case,) = [c for c in CASES if c.name == "loop_data_dependent_termination"]
    text = case.text.replace("Fin, Acc = Loop", "[my_loop] Fin, Acc = Loop")
    model = Case("while", with_loss(text)).model("double", 16)
    gm = onnax.grad(model, output="L")
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(gm, in_axes={"big": None, "X": 0, "W": None})
    message = str(err.value)
    for part in ("vmap", "ai.onnx::Loop", "node 'my_loop'", "'Acc'", "batched condition"):
        assert part in message, (part, message)
    assert "cf_" not in message, message


@pytest.mark.parametrize("transform", [onnax.jvp, onnax.vjp], ids=["jvp", "vjp"])
def test_vmap_of_second_order_through_data_dependent_loop(transform: object) -> None:
    """Per-example Hessian-vector products: the records' marks follow the Loop through a second
    transform (forward mode's record tangents, reverse mode's records of records)."""
    model = Case("while", WHILE_LOSS_TEXT).model("double", 16)
    derived = transform(onnax.grad(model, output="L"), inputs=["X"])  # type: ignore[operator]
    base = {"big": np.array(30), "W": WHILE_WS[0]}
    rng = np.random.default_rng(0)
    extra = {
        str(v.name): rng.standard_normal(3)
        for v in derived.graph.inputs
        if v.name not in ("big", "X", "W")
    }
    axes = {"big": None, "X": 0, "W": None, **dict.fromkeys(extra)}
    got = run(onnax.vmap(derived, in_axes=axes), {**base, **extra, "X": WHILE_XS})
    trips = {_while_trips(30, x, WHILE_WS[0]) for x in WHILE_XS}
    assert len(trips) >= 3, trips
    for b, x in enumerate(WHILE_XS):
        one = run(derived, {**base, **extra, "X": x})
        for name, value in one.items():
            np.testing.assert_allclose(got[name][b], value, rtol=1e-10, atol=1e-10, err_msg=name)


def _scan8_model(batch: int, lengths: bool = False) -> onnx.ModelProto:
    """An opset-8 running sum: Scan-8 with a batch axis in front of state and sequence."""
    from onnx import TensorProto
    from onnx import helper as h

    body = h.make_graph(
        [h.make_node("Add", ["s", "x"], ["s2"]), h.make_node("Identity", ["s2"], ["o"])],
        "body",
        [h.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s", "x")],
        [h.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s2", "o")],
    )
    inputs = [
        h.make_tensor_value_info("init", TensorProto.FLOAT, [batch, 2]),
        h.make_tensor_value_info("xs", TensorProto.FLOAT, [batch, 3, 2]),
    ]
    if lengths:
        inputs.append(h.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    scan = h.make_node(
        "Scan", ["lens" if lengths else "", "init", "xs"], ["y", "z"], body=body, num_scan_inputs=1
    )
    graph = h.make_graph(
        [scan],
        "g",
        inputs,
        [
            h.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 2]),
            h.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 3, 2]),
        ],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=7)


def test_scan8_batch_axis_survives_the_version_converter() -> None:
    """onnx's Scan 8 -> 9 adapter strips the batch axis from the graph's declarations; the
    repair keeps them and squeezes the (single-example) batch around the Scan instead."""
    from onnx import version_converter

    from onnax.passes.scan8 import unbatch_scan8

    before = _scan8_model(1)
    after = version_converter.convert_version(before, 17)
    assert [d.dim_value for d in after.graph.input[1].type.tensor_type.shape.dim] == [3, 2]
    unbatch_scan8(before, after)
    onnx.checker.check_model(after, full_check=True)
    rng = np.random.default_rng(0)
    feeds = {
        "init": rng.standard_normal((1, 2)).astype(np.float32),
        "xs": rng.standard_normal((1, 3, 2)).astype(np.float32),
    }
    want = [ort_run(before, feeds)[k] for k in ("y", "z")]
    got = [ort_run(after, feeds)[k] for k in ("y", "z")]
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
    for bad, part in (
        (_scan8_model(2), "batch axis of 'init' is 2"),
        (_scan8_model(1, True), "sequence_lens"),
    ):
        converted = (
            version_converter.convert_version(bad, 17) if "lens" not in part else onnx.ModelProto()
        )
        with pytest.raises(ValueError, match="Remedy") as err:
            unbatch_scan8(bad, converted)
        assert part in str(err.value) and "Scan node" in str(err.value)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def test_scan8_model_is_differentiated_after_conversion() -> None:
    """prepare repairs the converted Scan-8 (batch of one), so jvp and vjp agree with finite
    differences of the original opset-8 model."""
    model = ir.from_proto(_scan8_model(1))
    rng = np.random.default_rng(1)
    feeds = {
        "init": rng.standard_normal((1, 2)).astype(np.float32),
        "xs": rng.standard_normal((1, 3, 2)).astype(np.float32),
    }
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    with pytest.raises(onnax.errors.InvalidModelError, match="batch axis of 'init' is 2"):
        onnax.jvp(ir.from_proto(_scan8_model(2)))


CAPTURED_OUTPUT_TEXT = """
g ({T}[3] X, bool c) => ({T}[3] Y) {
    S = Sin (X)
    Y = If (c) <
        then_branch = t () => ({T}[3] S) {},
        else_branch = e () => ({T}[3] Z) { Z = Cos (X) }
    >
}
"""


def test_branch_returning_a_captured_value_gets_the_checker_message() -> None:
    """A branch whose output *is* an outer value is invalid ONNX; onnx_ir's cloner raises a bare
    RuntimeError on it, so prepare copies such a model through its serialised form and the user
    gets the checker's diagnosis instead."""
    model = Case("captured_output", CAPTURED_OUTPUT_TEXT).model("double", 16)
    with pytest.raises(onnax.errors.InvalidModelError) as err:
        onnax.jvp(model, ["X"])
    assert "Graph output 'S' is not an output of any node" in str(err.value)
    assert "onnx.checker" in str(err.value)
