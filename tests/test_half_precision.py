"""FLOAT16 and BFLOAT16 models: every transform against float64 references.

The oracle knows nothing of the rules: each model is written once with ``{T}`` for its element
type, instantiated in a half type and in DOUBLE, and fed the *same* point (random values rounded
to the half type, widened exactly for the double model). The reference derivatives are float64
central differences of the double model through onnxruntime; the half results are compared with
them in relative norm.

Runners: onnxruntime's CPU provider runs FLOAT16 graphs (casting to FLOAT where it lacks a
kernel), but has almost no BFLOAT16 kernel (not even Add), so BFLOAT16 graphs run in onnx's
reference evaluator, whose numpy kernels round to BFLOAT16 after each operator (and accumulate in
it: ``test_float32_accumulation_rescues_long_bfloat16_sums`` shows what that costs).

Tolerances. The unit roundoff is eps/2 (FLOAT16 eps 2^-10 = 9.8e-4, BFLOAT16 eps 2^-7 = 7.8e-3).
The half model rounds its inputs, every primal intermediate and every derivative intermediate:
along a path of k rounded operators, a result carries a relative error of about k * eps/2, times
the condition factor of the derivative expression (how much it amplifies relative perturbations
of its operands; O(1) for these well-scaled random inputs, a few for softmax and norms, which
divide by computed statistics). These graphs have k <= 8 on their longest derivative path and a
condition factor <= 4, so the relative error in norm is bounded by 8 * 4 * eps/2 = 16 * eps:
1.6e-2 for FLOAT16, 1.25e-1 for BFLOAT16. vmap against a loop of single runs of the same half
model only reorders the same roundings: a few ulps (4 * eps).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

import onnax
from oracles import check_model_valid, run, session

HALF = ("float16", "bfloat16")
NP_TYPE: dict[str, type] = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float": np.float32,
    "double": np.float64,
}
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}
CONDITION = 16  # k (<= 8 rounded operators) x condition factor (<= 4) x unit roundoff (eps/2)


def tol(dtype: str) -> float:
    return CONDITION * EPS[dtype]


def build(text: str, dtype: str, opset: int = 18) -> ir.Model:
    header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
    return ir.from_onnx_text(header + text.replace("{T}", dtype))


def ort_runs(model: ir.Model) -> bool:
    """Whether onnxruntime's CPU provider has a kernel for every operator of ``model``."""
    try:
        session(ir.to_proto(model))
    except Exception as err:  # onnxruntime's own exception types: match on the message
        # No kernel for a type: NOT_IMPLEMENTED, or a Type Error when the op has none at all
        # for it (FLOAT16 Range).
        if "NOT_IMPLEMENTED" in str(err) or "Type Error" in str(err):
            return False
        raise
    return True


def engine(primal: ir.Model, dtype: str) -> str:
    """onnxruntime for FLOAT16 where it runs the *primal*; the reference evaluator otherwise.

    A derivative model that onnxruntime cannot run while it runs the primal is a bug of onnax
    and fails the test; a primal it cannot run (FLOAT16 Conv) is not, so it goes elsewhere.
    """
    return "ort" if dtype == "float16" and ort_runs(primal) else "reference"


def run_half(model: ir.Model, feeds: Mapping[str, np.ndarray], how: str) -> dict[str, np.ndarray]:
    """Runs a half model with onnxruntime (``"ort"``) or the reference evaluator."""
    proto = ir.to_proto(model)
    names = [o.name for o in proto.graph.output]
    wanted = {i.name for i in proto.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in wanted}
    if how == "ort":
        return run(model, feeds)
    outs = ReferenceEvaluator(proto).run(None, dict(feeds))
    return dict(zip(names, outs, strict=True))


def check_valid(model: ir.Model, how: str) -> None:
    """onnx.checker (full: types included), and an onnxruntime session where it runs."""
    if how == "ort":
        check_model_valid(model)
    else:
        onnx.checker.check_model(ir.to_proto(model), full_check=True)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got64.shape == want64.shape, (got64.shape, want64.shape)
    return float(np.linalg.norm(got64 - want64) / max(np.linalg.norm(want64), 1e-3))


def point(
    model: ir.Model, dtype: str, seed: int = 0, fill: Mapping[str, Callable[..., np.ndarray]] = {}
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Random inputs rounded to ``dtype``, and the same values in float64."""
    rng = np.random.default_rng(seed)
    half, wide = {}, {}
    for v in model.graph.inputs:
        shape = tuple(d if isinstance(d, int) else 3 for d in v.shape.dims)
        values = fill[v.name](rng, shape) if v.name in fill else rng.standard_normal(shape)
        half[v.name] = np.asarray(values).astype(NP_TYPE[dtype])
        wide[v.name] = half[v.name].astype(np.float64)
    return half, wide


def jacobian(model64: ir.Model, feeds64: Mapping[str, np.ndarray], x: str, y: str) -> np.ndarray:
    """d y / d x of the double model by float64 central differences, one column per element.

    onnxruntime runs the double model where it can (it has no DOUBLE Conv: the reference
    evaluator runs that one, in float64 all the same).
    """
    how = "ort" if ort_runs(model64) else "reference"
    step = 1e-6
    base = feeds64[x]
    cols = []
    for k in range(base.size):
        moved = []
        for sign in (1.0, -1.0):
            shifted = base.astype(np.float64).ravel().copy()
            shifted[k] += sign * step
            moved.append(run_half(model64, {**feeds64, x: shifted.reshape(base.shape)}, how)[y])
        cols.append(((moved[0] - moved[1]) / (2 * step)).ravel())
    return np.stack(cols, axis=1)


# ------------------------------------------------------------------------------- the models
POSITIVE = {"v": lambda rng, s: rng.uniform(0.5, 2.0, s)}
DISTINCT = {"x": lambda rng, s: rng.permutation(int(np.prod(s))).reshape(s) * 0.37 - 1.0}

CASES: dict[str, tuple[str, dict[str, Callable[..., np.ndarray]]]] = {
    "elementwise_broadcast": (
        "g ({T}[3, 4] x, {T}[4] b, {T}[3, 1] v) => ({T}[3, 4] y) {"
        " s = Add(x, b)\n t = Tanh(s)\n e = Exp(b)\n d = Div(t, v)\n y = Mul(d, e) }",
        POSITIVE,
    ),
    "sigmoid_pow_sqrt": (
        "g ({T}[2, 3] x, {T}[2, 3] v) => ({T}[2, 3] y) {"
        " s = Sigmoid(x)\n r = Sqrt(v)\n two = Constant <value = float {2.0}> ()\n"
        " c = CastLike(two, x)\n p = Pow(s, c)\n y = Mul(p, r) }",
        POSITIVE,
    ),
    "matmul": (
        "g ({T}[3, 4] x, {T}[4, 2] w) => ({T}[3, 2] y) { y = MatMul(x, w) }",
        {},
    ),
    "gemm": (
        "g ({T}[3, 4] x, {T}[2, 4] w, {T}[2] c) => ({T}[3, 2] y) {"
        " y = Gemm <transB = 1, alpha = 0.5> (x, w, c) }",
        {},
    ),
    "conv": (
        "g ({T}[1, 2, 5, 5] x, {T}[3, 2, 3, 3] w, {T}[3] b) => ({T}[1, 3, 5, 5] y) {"
        " y = Conv <pads = [1, 1, 1, 1]> (x, w, b) }",
        {},
    ),
    "layer_norm": (
        "g ({T}[3, 4] x, {T}[4] s, {T}[4] b) => ({T}[3, 4] y) {"
        " y = LayerNormalization <axis = -1> (x, s, b) }",
        {},
    ),
    "batch_norm_inference": (
        "g ({T}[2, 3, 2] x, {T}[3] s, {T}[3] b, {T}[3] m, {T}[3] v) => ({T}[2, 3, 2] y) {"
        " y = BatchNormalization (x, s, b, m, v) }",
        POSITIVE,
    ),
    "reductions": (
        "g ({T}[3, 4] x) => ({T}[3] y) {"
        " s = ReduceSum <keepdims = 0> (x, axes)\n q = ReduceL2 <keepdims = 0> (x, axes)\n"
        " m = ReduceMax <keepdims = 0> (x, axes)\n a = Add(s, q)\n y = Add(a, m) }".replace(
            "(x, axes)", "(x, ax)"
        ).replace(
            "g ({T}[3, 4] x) => ({T}[3] y) {",
            "g ({T}[3, 4] x) => ({T}[3] y) { ax = Constant <value = int64[1] {1}> ()\n",
        ),
        DISTINCT,
    ),
    "softmax": (
        "g ({T}[3, 4] x) => ({T}[3, 4] y) {"
        " s = Softmax <axis = -1> (x)\n l = LogSoftmax <axis = 0> (x)\n y = Add(s, l) }",
        {},
    ),
}


# The ONNX spec types Conv (and the pools) for FLOAT16, FLOAT and DOUBLE only: no BFLOAT16
# model can hold one, so those run in FLOAT16 alone.
NO_BFLOAT16 = {"conv", "cnn"}


def half_params(names: Sequence[str]) -> list[tuple[str, str]]:
    return [(n, d) for n in names for d in HALF if not (d == "bfloat16" and n in NO_BFLOAT16)]


def _inputs(model: ir.Model) -> list[str]:
    return [str(v.name) for v in model.graph.inputs]


@pytest.mark.parametrize(("name", "dtype"), half_params(list(CASES)))
def test_jvp_and_vjp_against_float64_differences(name: str, dtype: str) -> None:
    text, fill = CASES[name]
    half_model, wide_model = build(text, dtype), build(text, "double")
    how = engine(half_model, dtype)
    xh, x64 = point(half_model, dtype, fill=fill)
    (y,) = [str(v.name) for v in half_model.graph.outputs]
    jac = {x: jacobian(wide_model, x64, x, y) for x in _inputs(half_model)}
    rng = np.random.default_rng(1)

    jm = onnax.jvp(half_model)
    check_valid(jm, how)
    tangents = {x: rng.standard_normal(xh[x].shape).astype(NP_TYPE[dtype]) for x in xh}
    got = run_half(jm, {**xh, **{f"fwd_{x}": t for x, t in tangents.items()}}, how)
    want = sum(jac[x] @ tangents[x].astype(np.float64).ravel() for x in xh)
    assert got[f"fwd_{y}"].dtype == NP_TYPE[dtype] or dtype == "bfloat16"
    assert rel_err(got[f"fwd_{y}"].ravel(), want) <= tol(dtype), name

    vm = onnax.vjp(half_model)
    check_valid(vm, how)
    out_shape = run_half(half_model, xh, how)[y].shape
    u = rng.standard_normal(out_shape).astype(NP_TYPE[dtype])
    got = run_half(vm, {**xh, f"adj_{y}": u}, how)
    for x in xh:
        want_x = jac[x].T @ u.astype(np.float64).ravel()
        assert rel_err(got[f"adj_{x}"].ravel(), want_x) <= tol(dtype), (name, x)


@pytest.mark.parametrize(
    ("name", "dtype"), half_params(["elementwise_broadcast", "gemm", "conv", "layer_norm"])
)
def test_vmap_against_a_loop(name: str, dtype: str) -> None:
    text, fill = CASES[name]
    model = build(text, dtype)
    how = engine(model, dtype)
    vm = onnax.vmap(model)
    check_valid(vm, how)
    examples = [point(model, dtype, seed=s, fill=fill)[0] for s in range(3)]
    batched = {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}
    got = run_half(vm, batched, how)
    for y in got:
        want = np.stack([run_half(model, ex, how)[y] for ex in examples])
        assert rel_err(got[y], want) <= 4 * EPS[dtype], (name, y)


# ----------------------------------------------------------------------- MLP and CNN models
MLP = """
g ({T}[4, 3] x, {T}[4, 2] target, {T}[3, 5] w1, {T}[5] b1, {T}[5, 2] w2, {T}[2] b2)
    => ({T} loss) {
    h = MatMul(x, w1)
    hb = Add(h, b1)
    a = Tanh(hb)
    o = Gemm(a, w2, b2)
    d = Sub(o, target)
    sq = Mul(d, d)
    loss = ReduceMean <keepdims = 0> (sq)
}
"""
CNN = """
g ({T}[2, 1, 6, 6] x, {T}[2, 3] target, {T}[2, 1, 3, 3] k, {T}[2] kb, {T}[8, 3] w)
    => ({T} loss) {
    c = Conv <pads = [1, 1, 1, 1]> (x, k, kb)
    r = Sigmoid(c)
    p = AveragePool <kernel_shape = [3, 3], strides = [3, 3]> (r)
    f = Flatten(p)
    o = MatMul(f, w)
    d = Sub(o, target)
    sq = Mul(d, d)
    loss = ReduceSum <keepdims = 0> (sq)
}
"""
NETS = {"mlp": (MLP, ["w1", "b1", "w2", "b2"]), "cnn": (CNN, ["k", "kb", "w"])}


def net(name: str, dtype: str) -> ir.Model:
    """The network in ``dtype``, with seeded weights rounded to FLOAT16 (exact in DOUBLE)."""
    text, params = NETS[name]
    model = build(text, dtype)
    rng = np.random.default_rng(5)
    graph = model.graph
    for p in params:
        (v,) = [i for i in graph.inputs if i.name == p]
        graph.inputs.remove(v)
        weights = (rng.standard_normal(tuple(v.shape.numpy())) * 0.7).astype(np.float16)
        v.const_value = ir.tensor(weights.astype(np.float64).astype(NP_TYPE[dtype]), name=p)
        graph.register_initializer(v)
    return model


def _weights(model: ir.Model) -> dict[str, np.ndarray]:
    return {
        n: v.const_value.numpy().astype(np.float64)
        for n, v in model.graph.initializers.items()
        if v.const_value is not None
    }


def _as_inputs(model: ir.Model) -> ir.Model:
    """The double model with its weights as graph inputs, so that differences can move them."""
    copy = ir.from_proto(ir.to_proto(model))
    for name in list(copy.graph.initializers):
        value = copy.graph.initializers.pop(name)
        value.const_value = None
        copy.graph.inputs.append(value)
    return copy


def grad_reference(
    model64: ir.Model, feeds64: Mapping[str, np.ndarray], params: Sequence[str]
) -> dict[str, np.ndarray]:
    """The gradient of the double model's loss, by central differences per element."""
    return {p: jacobian(model64, feeds64, p, "loss").reshape(feeds64[p].shape) for p in params}


@pytest.mark.parametrize("accumulate", ["model", "float32"])
@pytest.mark.parametrize(("name", "dtype"), half_params(list(NETS)))
def test_network_gradient(name: str, dtype: str, accumulate: str) -> None:
    _, params = NETS[name]
    model = net(name, dtype)
    how = engine(model, dtype)
    wide = _as_inputs(net(name, "double"))
    xh, x64 = point(model, dtype, seed=2)
    feeds64 = {**x64, **_weights(net(name, "double"))}
    want = grad_reference(wide, feeds64, ["x", *params])
    g = onnax.grad(model, inputs=["x", *params], accumulate=accumulate)  # type: ignore[arg-type]
    check_valid(g, how)
    got = run_half(g, xh, how)
    for p in ["x", *params]:
        assert rel_err(got[f"grad_{p}"], want[p]) <= tol(dtype), (name, p)
    # The primal part is the source's own nodes: its loss is bit for bit the source's.
    np.testing.assert_array_equal(got["loss"], run_half(model, xh, how)["loss"])


@pytest.mark.parametrize(("name", "dtype"), half_params(list(NETS)))
def test_network_hvp(name: str, dtype: str) -> None:
    """jvp(grad): Hessian-vector products against differences of differences in float64."""
    _, params = NETS[name]
    model = net(name, dtype)
    how = engine(model, dtype)
    wide = _as_inputs(net(name, "double"))
    xh, x64 = point(model, dtype, seed=3)
    feeds64 = {**x64, **_weights(net(name, "double"))}
    rng = np.random.default_rng(4)
    direction = {p: rng.standard_normal(feeds64[p].shape).astype(NP_TYPE[dtype]) for p in params}
    hvp = onnax.jvp(
        onnax.grad(model, inputs=params), inputs=params, outputs=[f"grad_{p}" for p in params]
    )
    check_valid(hvp, how)
    got = run_half(hvp, {**xh, **{f"fwd_{p}": d for p, d in direction.items()}}, how)
    step = 1e-4

    def shifted(sign: float) -> dict[str, np.ndarray]:
        moved = {
            **feeds64,
            **{p: feeds64[p] + sign * step * direction[p].astype(np.float64) for p in params},
        }
        return grad_reference(wide, moved, params)

    plus, minus = shifted(1.0), shifted(-1.0)
    for p in params:
        want = (plus[p] - minus[p]) / (2 * step)
        assert rel_err(got[f"fwd_grad_{p}"], want) <= tol(dtype), (name, p)


@pytest.mark.parametrize(("name", "dtype"), half_params(list(NETS)))
def test_network_per_example_gradients(name: str, dtype: str) -> None:
    """vmap(grad): per-example weight gradients against a loop of single grad runs."""
    _, params = NETS[name]
    model = net(name, dtype)
    how = engine(model, dtype)
    g = onnax.grad(model, inputs=params)
    vg = onnax.vmap(g, in_axes=0)
    check_valid(vg, how)
    examples = [point(model, dtype, seed=s)[0] for s in range(3)]
    got = run_half(vg, {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}, how)
    for p in params:
        want = np.stack([run_half(g, ex, how)[f"grad_{p}"] for ex in examples])
        assert rel_err(got[f"grad_{p}"], want) <= 4 * EPS[dtype], (name, p)


# ----------------------------------------------------------------------- float32 accumulation
LONG_SUM = (
    "g ({T}[4096] x, {T}[1] b) => ({T} y) { s = Add(x, b)\n y = ReduceSum <keepdims = 0> (s) }"
)


def test_float32_accumulation_rescues_long_bfloat16_sums() -> None:
    """d y / d b sums 4096 ones: 256 when summed in BFLOAT16 (256 + 1 rounds to 256)."""
    model = build(LONG_SUM, "bfloat16")
    feeds = {"x": np.ones(4096, ml_dtypes.bfloat16), "b": np.ones(1, ml_dtypes.bfloat16)}
    own = run_half(onnax.grad(model, ["b"]), feeds, "reference")["grad_b"]
    wide = run_half(onnax.grad(model, ["b"], accumulate="float32"), feeds, "reference")["grad_b"]
    assert float(wide[0]) == 4096.0
    assert float(own[0]) < 4096.0 * (1 - 8 * EPS["bfloat16"])  # why the option exists


@pytest.mark.parametrize("dtype", HALF)
def test_float32_accumulation_runs_emitted_sums_in_float(dtype: str) -> None:
    """Every sum the gradient emits runs on FLOAT; the primal nodes keep the model's type."""
    model = net("mlp", dtype)
    how = engine(model, dtype)
    g = onnax.grad(model, inputs=["x", "w1", "b1", "w2", "b2"], accumulate="float32")
    check_valid(g, how)
    proto = onnx.shape_inference.infer_shapes(ir.to_proto(g), strict_mode=True)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*proto.graph.value_info, *proto.graph.input, *proto.graph.output]
    }
    half = int(ir.DataType.FLOAT16 if dtype == "float16" else ir.DataType.BFLOAT16)
    primal_ops = [n.op_type for n in model.graph]
    sums = [
        n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm", "ReduceSum", "ReduceMean")
    ]
    in_half = [n for n in sums if types.get(n.input[0]) == half]
    assert [n.op_type for n in in_half] == [
        op for op in primal_ops if op in ("MatMul", "Gemm", "ReduceMean")
    ]
    assert len(sums) > len(in_half)  # the gradient's own sums exist, and run in FLOAT
    assert all(types.get(n.input[0]) == int(ir.DataType.FLOAT) for n in sums if n not in in_half)
    for out in proto.graph.output:
        assert out.type.tensor_type.elem_type == half


def test_float32_accumulation_leaves_float_models_alone() -> None:
    model = build(MLP.replace("{T}", "float"), "float")
    default = onnax.grad(model, inputs=["w1", "b2"])
    wide = onnax.grad(model, inputs=["w1", "b2"], accumulate="float32")
    assert ir.to_proto(default).SerializeToString() == ir.to_proto(wide).SerializeToString()


def test_float32_accumulation_composes() -> None:
    """jvp and vjp take the option too; jvp(grad(accumulate)) differentiates through the Casts."""
    model = build(LONG_SUM.replace("4096", "64"), "float16")
    xh, _ = point(model, "float16")
    for transform in (onnax.jvp, onnax.vjp):
        out = transform(model, accumulate="float32")
        check_model_valid(out)
        assert "Cast" in {n.op_type for n in out.graph}
    g = onnax.grad(model, ["x", "b"], accumulate="float32")
    h = onnax.jvp(g, inputs=["x"], outputs=["grad_b"])
    check_model_valid(h)
    t = np.ones(64, np.float16)
    got = run(h, {**xh, "fwd_x": t})
    np.testing.assert_array_equal(got["fwd_grad_b"], np.zeros(1, np.float16))  # d²y/dx db = 0


def test_accumulate_rejects_unknown_policies() -> None:
    model = build(LONG_SUM, "float16")
    with pytest.raises(onnax.SelectionError) as info:
        onnax.grad(model, ["b"], accumulate="float64")  # type: ignore[arg-type]
    message = str(info.value)
    assert (
        "grad" in message
        and "'float64'" in message
        and "'model'" in message
        and "'float32'" in message
    )


def test_cli_accumulate_flag(tmp_path: object) -> None:
    import pathlib

    from onnax.cli import main

    root = pathlib.Path(str(tmp_path))
    ir.save(build(LONG_SUM, "float16"), root / "m.onnx")
    assert (
        main(
            [
                "grad",
                str(root / "m.onnx"),
                str(root / "g.onnx"),
                "--inputs",
                "b",
                "--accumulate",
                "float32",
            ]
        )
        == 0
    )
    casts = [n for n in ir.load(root / "g.onnx").graph if n.op_type == "Cast"]
    assert len(casts) == 2
    feeds = {"x": np.ones(4096, np.float16), "b": np.ones(1, np.float16)}
    assert float(run(ir.load(root / "g.onnx"), feeds)["grad_b"][0]) == 4096.0


# ------------------------------------------------------------------------------ selection
def test_half_inputs_are_selected_by_default() -> None:
    model = build(
        "g ({T}[3] x, float[3] z, bfloat16[3] w) => ({T}[3] y) { y = Mul(x, x) }", "float16"
    )
    jm = onnax.jvp(model)
    assert [v.name for v in jm.graph.inputs][3:] == ["fwd_x", "fwd_z", "fwd_w"]
    assert session(ir.to_proto(jm)).get_inputs()[3].type == "tensor(float16)"


@pytest.mark.parametrize(
    ("decl", "kind"), [("seq(float[3])", "sequence"), ("optional(float[3])", "optional")]
)
def test_selecting_a_sequence_or_optional_says_what_it_is(decl: str, kind: str) -> None:
    op = "SequenceAt (s, zero)" if kind == "sequence" else "OptionalGetElement (s)"
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        f"g (float[3] x, {decl} s) => (float[3] y) {{ zero = Constant <value = int64 {{0}}> ()\n"
        f" e = {op}\n y = Add(x, e) }}"
    )
    with pytest.raises(onnax.SelectionError) as info:
        onnax.jvp(model, inputs=["s"])
    message = str(info.value)
    assert f"input 's' is a{'n' if kind == 'optional' else ''} {kind}" in message
    assert "expected a tensor of FLOAT16, BFLOAT16, FLOAT or DOUBLE" in message
    assert "found FLOAT," not in message
    assert "Leave it out of `inputs`" in message and "as tensor inputs" in message


@pytest.mark.parametrize("dtype", HALF)
def test_range_of_half_values_carries_its_tangent(dtype: str) -> None:
    """Range's rule gave no tangent to FLOAT16/BFLOAT16 results (it checked FLOAT/DOUBLE)."""
    text = (
        "g ({T} start, {T} delta) => ({T}[4] y) {"
        " limit = Constant <value = float {3.9}> ()\n l = CastLike(limit, start)\n"
        " r = Range(start, l, delta)\n y = Identity(r) }"
    )
    model = build(text, dtype, opset=27)  # Range takes half types from opset 27 on
    how = engine(model, dtype)
    jm = onnax.jvp(model)
    check_valid(jm, how)
    feeds = {"start": np.array(0.0), "delta": np.array(1.0)}
    half = {k: v.astype(NP_TYPE[dtype]) for k, v in feeds.items()}
    tangents = {"fwd_start": np.array(0.5), "fwd_delta": np.array(-0.25)}
    got = run_half(jm, {**half, **{k: v.astype(NP_TYPE[dtype]) for k, v in tangents.items()}}, how)
    want = 0.5 + np.arange(4) * -0.25  # d(start + i * delta) along the tangents
    np.testing.assert_array_equal(np.asarray(got["fwd_y"], np.float64), want)


@pytest.mark.parametrize("command", ["jvp", "vjp", "grad"])
def test_cli_check_of_a_float16_model(
    tmp_path: object, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check takes its differences on the FLOAT version of a FLOAT16 model: in FLOAT16 a step
    of 3e-3 is three ulps near 1, and the check reported a correct derivative as wrong."""
    import pathlib

    from onnax.cli import main

    root = pathlib.Path(str(tmp_path))
    text = "g ({T}[3, 4] x, {T}[4] b) => ({T} y) { s = Add(x, b)\n t = Tanh(s)\n y = ReduceSum <keepdims = 0> (t) }"
    ir.save(build(text, "float16"), root / "m.onnx")
    assert main([command, str(root / "m.onnx"), str(root / "out.onnx"), "--check"]) == 0
    table = capsys.readouterr().out
    assert "FAIL" not in table and table.count(" ok") == (1 if command == "jvp" else 2), table
