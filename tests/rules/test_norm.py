"""Normalization operators over axes of each example (rules in onnax.rules.norm).

Every case has a symbolic batch dimension N and is differentiated in all its floating-point
inputs. Opsets straddle the schema changes: InstanceNormalization 6/22, GroupNormalization 18/21
(per-group to per-channel scale), LpNormalization 1/22, MeanVarianceNormalization 9/13.

Double is tested wherever onnxruntime 1.32 runs it at double precision. Float only, because:

* InstanceNormalization and MeanVarianceNormalization have no double kernel (MVN-13's function
  body adds a float epsilon to a double, which fails to type-check);
* LayerNormalization's Mean/InvStdDev outputs are float32 (type U) even for a double X: double
  finite differences (eps 1e-6) of float32 values are noise, so the cases with those outputs are
  float (double LayerNorm with only Y is tested);
* GroupNormalization-21 with the default stash_type=1 computes in float32; its double case sets
  stash_type=11 (valid for float too).

vmap is checked on every case (all inputs batched at 0, 1, -1; only X batched, which folds the
batch or shifts the axis; X shared with batched parameters, which takes the elementwise affine
path), and on the jvp/vjp models of a selection. Second order (jvp of the vjp model) is checked
for every operator. The helpers of those checks serve test_batchnorm and test_lrn too, and the
graph-shape and float-only second-order checks here cover their operators alongside.

GroupNormalization-18 is deprecated in onnx 1.23, whose checker rejects it (so onnax refuses such
models before any rule runs); onnxruntime still runs it. To check the rule kept for it, this module
lets the checker pass that one deprecation (``_tolerate_deprecated_group_norm``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import onnx
import onnx.checker
import onnx_ir as ir
import pytest

import onnax
from cases import Case, away_from_zero, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vmap, run

FLOAT = ("float",)


@pytest.fixture(autouse=True)
def _tolerate_deprecated_group_norm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """onnx.checker without its refusal of the deprecated GroupNormalization-18 (only that)."""
    original = onnx.checker.check_model

    def check_model(model: object, *args: object, **kwargs: object) -> None:
        try:
            original(model, *args, **kwargs)  # type: ignore[arg-type]
        except onnx.checker.ValidationError as err:
            if "GroupNormalization is deprecated" not in str(err):
                raise

    monkeypatch.setattr(onnx.checker, "check_model", check_model)
    yield


def moderate(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Spread-out values (uniform in [-2, 2]): no slice has a tiny variance, which would make
    the normalisation's derivative huge and float32 differences inaccurate."""
    return rng.uniform(-2.0, 2.0, shape).astype(dtype)


CASES = [
    # ---------------------------------------------------------------- LayerNormalization
    Case(
        "LayerNorm-last",
        "g ({T}[N, 2, 3] X, {T}[3] S, {T}[3] B) => ({T}[N, 2, 3] Y) "
        "{ Y = LayerNormalization(X, S, B) }",
        opsets=(17, 21),
        fill={"X": moderate},
    ),
    Case(
        "LayerNorm-axis1-noB",
        "g ({T}[N, 2, 3] X, {T}[2, 3] S) => ({T}[N, 2, 3] Y) "
        "{ Y = LayerNormalization<axis=1, epsilon=0.001>(X, S) }",
        opsets=(18,),
        fill={"X": moderate},
    ),
    Case(
        # Scale and B broadcast over the normalised [2, 3] block: reverse mode sums them back.
        "LayerNorm-broadcast",
        "g ({T}[N, 2, 3] X, {T}[3] S, {T}[1] B) => ({T}[N, 2, 3] Y) "
        "{ Y = LayerNormalization<axis=-2>(X, S, B) }",
        opsets=(17,),
        fill={"X": moderate},
    ),
    Case(
        "LayerNorm-stats",
        "g ({T}[N, 2, 3] X, {T}[2, 3] S, {T}[2, 3] B) => ({T}[N, 2, 3] Y, float[N, 1, 1] M, "
        "float[N, 1, 1] I) { Y, M, I = LayerNormalization<axis=1>(X, S, B) }",
        opsets=(17, 23),
        fill={"X": moderate},
        dtypes=FLOAT,
    ),
    Case(
        # An omitted Mean output in the middle.
        "LayerNorm-invstd-only",
        "g ({T}[N, 4] X, {T}[4] S) => ({T}[N, 4] Y, float[N, 1] I) "
        "{ Y, , I = LayerNormalization(X, S) }",
        opsets=(18,),
        fill={"X": moderate},
        dtypes=FLOAT,
    ),
    # ---------------------------------------------------------------- InstanceNormalization
    Case(
        "InstanceNorm-4d",
        "g ({T}[N, 3, 2, 3] X, {T}[3] S, {T}[3] B) => ({T}[N, 3, 2, 3] Y) "
        "{ Y = InstanceNormalization<epsilon=0.01>(X, S, B) }",
        opsets=(11, 21, 22),
        fill={"X": moderate},
        dtypes=FLOAT,
    ),
    Case(
        "InstanceNorm-3d",
        "g ({T}[N, 2, 4] X, {T}[2] S, {T}[2] B) => ({T}[N, 2, 4] Y) "
        "{ Y = InstanceNormalization(X, S, B) }",
        opsets=(13,),
        fill={"X": moderate},
        dtypes=FLOAT,
    ),
    # ---------------------------------------------------------------- GroupNormalization
    Case(
        "GroupNorm-18",
        "g ({T}[N, 4, 2, 2] X, {T}[2] S, {T}[2] B) => ({T}[N, 4, 2, 2] Y) "
        "{ Y = GroupNormalization<num_groups=2, epsilon=0.001>(X, S, B) }",
        opsets=(18, 20),
        fill={"X": moderate},
    ),
    Case(
        "GroupNorm-21",
        "g ({T}[N, 4, 2, 2] X, {T}[4] S, {T}[4] B) => ({T}[N, 4, 2, 2] Y) "
        "{ Y = GroupNormalization<num_groups=2, stash_type=11>(X, S, B) }",
        opsets=(21, 23),
        fill={"X": moderate},
    ),
    Case(
        "GroupNorm-21-rank3",
        "g ({T}[N, 6, 2] X, {T}[6] S, {T}[6] B) => ({T}[N, 6, 2] Y) "
        "{ Y = GroupNormalization<num_groups=3, stash_type=11>(X, S, B) }",
        opsets=(22,),
        fill={"X": moderate},
    ),
    # ---------------------------------------------------------------- RMSNormalization
    Case(
        "RMSNorm-last",
        "g ({T}[N, 2, 3] X, {T}[3] S) => ({T}[N, 2, 3] Y) { Y = RMSNormalization(X, S) }",
        opsets=(23, 24),
    ),
    Case(
        "RMSNorm-axis1",
        "g ({T}[N, 2, 3] X, {T}[2, 3] S) => ({T}[N, 2, 3] Y) "
        "{ Y = RMSNormalization<axis=1, epsilon=0.01>(X, S) }",
        opsets=(23,),
    ),
    # ---------------------------------------------------------------- LpNormalization
    Case(
        "LpNorm-p2-axis1",
        "g ({T}[N, 3, 2] X) => ({T}[N, 3, 2] Y) { Y = LpNormalization<axis=1, p=2>(X) }",
        opsets=(11, 21),
    ),
    Case(
        "LpNorm-p1-last",
        "g ({T}[N, 3, 4] X) => ({T}[N, 3, 4] Y) { Y = LpNormalization<p=1>(X) }",
        opsets=(13, 22),
        fill={"X": away_from_zero},
    ),
    Case(
        "LpNorm-default",
        "g ({T}[N, 4] X) => ({T}[N, 4] Y) { Y = LpNormalization(X) }",
        opsets=(22,),
    ),
    # ---------------------------------------------------------------- MeanVarianceNormalization
    Case(
        # The default axes [0, 2, 3], spelled out: onnx's full check (shape inference of the
        # function body) fails on an MVN node without the axes attribute.
        "MVN-default",
        "g ({T}[N, 2, 3, 2] X) => ({T}[N, 2, 3, 2] Y) "
        "{ Y = MeanVarianceNormalization<axes=[0, 2, 3]>(X) }",
        opsets=(11, 13),
        fill={"X": moderate},
        dtypes=FLOAT,
    ),
    Case(
        "MVN-axes",
        "g ({T}[N, 2, 3] X) => ({T}[N, 2, 3] Y) { Y = MeanVarianceNormalization<axes=[1, -1]>(X) }",
        opsets=(18,),
        fill={"X": moderate},
        dtypes=FLOAT,
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def vmap_params(cases: Sequence[Case]) -> list[tuple[Case, str, int]]:
    """Each case at each of its opsets, alternating dtypes where the case has both."""
    params, k = [], 0
    for c in cases:
        for o in c.opsets:
            params.append((c, c.dtypes[k % len(c.dtypes)], o))
            k += 1
    return params


def shared_data_params(cases: Sequence[Case]) -> list[tuple[Case, str, int]]:
    """:func:`vmap_params` of the cases with parameters besides the data."""
    return [p for p in vmap_params(cases) if len(p[0].model(p[1], p[2]).graph.inputs) > 1]


def check_vmap_shared_data(case: Case, dtype: str, opset: int) -> None:
    """The data shared, the parameters batched (a per-example scale/bias/mean/var)."""
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    axes = {v.name: (None if i == 0 else 0) for i, v in enumerate(model.graph.inputs)}
    check_vmap(model, feeds, in_axes=axes)
    # One parameter batched alone (the bias, or BatchNorm's var): the others stay shared.
    last = model.graph.inputs[-1].name
    check_vmap(model, feeds, in_axes={last: -1})


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), shared_data_params(CASES), ids=case_id)
def test_vmap_shared_data(case: Case, dtype: str, opset: int) -> None:
    """The data shared, the parameters batched (a per-example scale/bias)."""
    check_vmap_shared_data(case, dtype, opset)


def _case(name: str) -> Case:
    # BatchNormalization's and LRN's cases live in their own test modules, which import this one.
    from rules.test_batchnorm import CASES as BATCH_NORM_CASES
    from rules.test_lrn import CASES as LRN_CASES

    return next(c for c in [*CASES, *BATCH_NORM_CASES, *LRN_CASES] if c.name == name)


def ops_of(model: ir.Model) -> list[str]:
    """The operator of each node of the main graph, in order."""
    return [n.op_type for n in model.graph]


# ------------------------------------------------------------------------- graph shape
def test_vmap_folds_or_shifts() -> None:
    """Only X batched: one node of the operator itself (folded batch or shifted axis)."""
    for name, opset, op in [
        ("BatchNorm-9", 13, "BatchNormalization"),
        ("InstanceNorm-4d", 22, "InstanceNormalization"),
        ("GroupNorm-18", 18, "GroupNormalization"),
        ("LRN-size3", 13, "LRN"),
        ("LayerNorm-axis1-noB", 18, "LayerNormalization"),
    ]:
        model = _case(name).model("float", opset)
        axes = {v.name: (0 if i == 0 else None) for i, v in enumerate(model.graph.inputs)}
        ops = ops_of(onnax.vmap(model, in_axes=axes))
        assert ops.count(op) == 1, (name, ops)
    vm = onnax.vmap(_case("LayerNorm-axis1-noB").model("float", 18), in_axes={"X": 0, "S": None})
    (node,) = [n for n in vm.graph if n.op_type == "LayerNormalization"]
    assert node.attributes.get_int("axis") == 2


def test_layer_norm_tangent_uses_ordinary_operators() -> None:
    """The tangent of LayerNorm is built of ordinary operators (reverse mode: their transposes);
    besides the primal, one unit-scale LayerNormalization gives the statistics."""
    model = _case("LayerNorm-stats").model("float", 17)
    jm = onnax.jvp(model)
    ops = set(ops_of(jm))
    ordinary = {"LayerNormalization", "ReduceMean", "ReduceSum", "Sub", "Mul", "Add", "Neg"}
    assert ops <= {*ordinary, "Constant"}, ops
    assert ops_of(jm).count("LayerNormalization") == 2


def test_layer_norm_statistics_are_not_recomputed() -> None:
    """grad reads xhat and the inverse deviation from one fused LayerNormalization: no means,
    square roots or reciprocals of the data in the forward sweep; the backward sums with
    ReduceSum and applies no Neg or Sub to the cotangent; and the graph is bounded."""
    model = _case("LayerNorm-last").model("float", 17)
    loss = ir.node("ReduceSum", [model.graph.outputs[0]], attributes={"keepdims": 0})
    loss.outputs[0].name = "L"
    model.graph.append(loss)
    model.graph.outputs[:] = [loss.outputs[0]]
    gm = onnax.grad(model, ["X", "S", "B"], output="L")
    ops = ops_of(gm)
    assert ops.count("LayerNormalization") == 2, ops
    assert not {"Sqrt", "Reciprocal", "Sub", "Neg", "ReduceMean"} & set(ops), ops
    # 33 derivative nodes (the loss's seed included) when the statistics were recomputed.
    assert len(ops) - 2 <= 24, ops


# ------------------------------------------------------------------------- second order
SECOND_ORDER = [
    ("LayerNorm-last", 17),
    ("GroupNorm-18", 18),
    ("GroupNorm-21", 21),
    ("RMSNorm-axis1", 23),
    ("LpNorm-p2-axis1", 21),
    ("LpNorm-p1-last", 22),
]


def check_second_order(case: Case, opset: int) -> None:
    """jvp of the vjp model (a Hessian-vector product) against its differences."""
    model = case.model("double", opset)
    feeds = case.feeds(model)
    inputs = [v.name for v in model.graph.inputs]
    vm = onnax.vjp(model, inputs)
    rng = np.random.default_rng(3)
    for seed in vm.graph.inputs[len(model.graph.inputs) :]:
        shape = [d if isinstance(d, int) else 3 for d in seed.shape.dims]
        feeds[seed.name] = rng.standard_normal(shape)
    check_jvp(vm, feeds, inputs)


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER, ids=[f"{n}-{o}" for n, o in SECOND_ORDER])
def test_second_order(name: str, opset: int) -> None:
    """jvp of the vjp model (a Hessian-vector product) against its differences."""
    check_second_order(_case(name), opset)


def test_second_order_float_only_ops() -> None:
    """The same for operators onnxruntime runs in float only (LRN, MVN, InstanceNorm)."""
    for name, opset in [("LRN-size3", 13), ("MVN-axes", 18), ("InstanceNorm-3d", 13)]:
        case = _case(name)
        model = case.model("float", opset)
        feeds = case.feeds(model)
        vm = onnax.vjp(model, ["X"])
        rng = np.random.default_rng(3)
        for seed in vm.graph.inputs[len(model.graph.inputs) :]:
            shape = [d if isinstance(d, int) else 3 for d in seed.shape.dims]
            feeds[seed.name] = rng.standard_normal(shape).astype(np.float32)
        check_jvp(vm, feeds, ["X"])


# ------------------------------------------------------------------------- vmap of derivatives
DERIVATIVES = [
    ("LayerNorm-last", 17, "double"),
    ("GroupNorm-18", 18, "double"),
    ("GroupNorm-21-rank3", 22, "double"),
    ("InstanceNorm-4d", 22, "float"),
    ("RMSNorm-last", 23, "double"),
    ("LpNorm-p1-last", 13, "double"),
    ("MVN-default", 13, "float"),
]


def derived_model(
    case: Case, opset: int, dtype: str, mode: str
) -> tuple[ir.Model, dict, list[ir.Value]]:
    """The jvp or vjp model of the case, its feeds (with random tangents/seeds) and those inputs."""
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    derived = onnax.jvp(model) if mode == "jvp" else onnax.vjp(model)
    rng = np.random.default_rng(5)
    extra = list(derived.graph.inputs[len(model.graph.inputs) :])
    np_dtype = np.float64 if dtype == "double" else np.float32
    for v in extra:
        shape = [d if isinstance(d, int) else 3 for d in v.shape.dims]
        feeds[v.name] = rng.standard_normal(shape).astype(np_dtype)
    return derived, feeds, extra


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(
    ("name", "opset", "dtype"), DERIVATIVES, ids=[f"{n}-{o}" for n, o, _ in DERIVATIVES]
)
def test_vmap_of_derivatives(name: str, opset: int, dtype: str, mode: str) -> None:
    """vmap of the jvp/vjp models with every input batched."""
    derived, feeds, _ = derived_model(_case(name), opset, dtype, mode)
    check_vmap(derived, feeds, in_axes=0)


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(
    ("name", "opset", "dtype"), DERIVATIVES, ids=[f"{n}-{o}" for n, o, _ in DERIVATIVES]
)
def test_vmap_of_derivatives_seeds_only(name: str, opset: int, dtype: str, mode: str) -> None:
    """vmap of the jvp/vjp models over the tangents/seeds alone (rows of a Jacobian)."""
    derived, feeds, extra = derived_model(_case(name), opset, dtype, mode)
    check_vmap(derived, feeds, in_axes={v.name: -1 for v in extra})


# ------------------------------------------------------------------------- refusals
def test_lp_norm_other_p_is_refused() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 22]>\n'
        "g (float[N, 3] X) => (float[N, 3] Y) { Y = LpNormalization<p=3>(X) }"
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model)
    message = str(err.value)
    assert "ai.onnx::LpNormalization" in message and "p=3" in message and "'Y'" in message
    assert "p=1 and p=2" in message and "Remedy" in message


def test_layer_norm_unknown_rank() -> None:
    """A negative axis needs no rank (checked against differences); a non-negative one does."""
    text = (
        "g (float[N, 4] X, float[4] S, int64[K] E) => (float[N, 4] Y) "
        "{{ Z = Expand(X, E)\n Y = LayerNormalization<axis={axis}>(Z, S) }}"
    )
    header = '<ir_version: 10, opset_import: ["" : 18]>\n'
    model = ir.from_onnx_text(header + text.format(axis=-1))
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.uniform(-2, 2, (3, 4)).astype(np.float32),
        "S": rng.standard_normal(4).astype(np.float32),
        "E": np.array([3, 4], np.int64),
    }
    check_jvp(model, feeds, ["X", "S"])
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(ir.from_onnx_text(header + text.format(axis=1)), ["X"])
    message = str(err.value)
    assert "ai.onnx::LayerNormalization" in message and "'Y'" in message
    assert "rank" in message and "Remedy" in message


def test_layer_norm_double_stats_are_cast() -> None:
    """For a double X, Mean and InvStdDev are float32 (the stash type): so are their tangents.

    (Finite differences of float32 outputs in double are noise, so the values are checked
    against the formulas: mean(t), and -inv**2 * mean(xhat * t).)
    """
    model = _case("LayerNorm-stats").model("double", 17)
    feeds = _case("LayerNorm-stats").feeds(model)
    jm = onnax.jvp(model, ["X"])
    t = np.random.default_rng(1).standard_normal(feeds["X"].shape)
    got = run(jm, {**feeds, jm.graph.inputs[3].name: t})
    dmean, dinv = (got[o.name] for o in jm.graph.outputs[4:6])
    assert dmean.dtype == np.float32 and dinv.dtype == np.float32
    x = feeds["X"]
    mean = x.mean(axis=(1, 2), keepdims=True)
    inv = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=(1, 2), keepdims=True) + np.float32(1e-5))
    xhat = (x - mean) * inv
    np.testing.assert_allclose(dmean, t.mean(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-6)
    expected = -(inv**2) * (xhat * t).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(dinv, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("LayerNorm-last", "float"),
        ("LayerNorm-last", "double"),
        ("LayerNorm-axis1-noB", "float"),
        ("LayerNorm-broadcast", "float"),
        ("LayerNorm-stats", "float"),
    ],
)
def test_layer_norm_second_order(name: str, dtype: str) -> None:
    """Forward over reverse: jvp of the vjp model (w.r.t. X, S, B and the cotangent) against
    central differences of the vjp model itself. In float the vjp reads xhat and the inverse
    deviation from a unit-scale LayerNormalization, whose tangent the forward sweep builds
    from the same pieces as the model's own LayerNorm's."""
    case = _case(name)
    vm = onnax.vjp(case.model(dtype, case.opsets[0]))
    check_jvp(vm, case.feeds(vm))


def test_layer_norm_hvp_shares_the_tangent_of_xhat() -> None:
    """In a Hessian-vector product the unit-scale LayerNormalization's tangent (xhat's) is the
    model's LayerNorm's before its scale: one spelling, merged by CSE, no ReduceMean or Neg
    of a second one, and no product with the unit scale."""
    model = _case("LayerNorm-last").model("float", 17)
    hvp = onnax.jvp(onnax.vjp(model), inputs=["X"])
    ops = ops_of(hvp)
    assert "ReduceMean" not in ops and "Neg" not in ops, ops
    (unit,) = [
        n for n in hvp.graph if n.op_type == "LayerNormalization" and n.inputs[1].name != "S"
    ]
    ones = unit.inputs[1]
    assert not [n for n in hvp.graph if n.op_type == "Mul" and ones in n.inputs], ops
    assert len([op for op in ops if op != "Constant"]) <= 37, ops  # 38 in two spellings


def test_layer_norm_weights_of_ones_stay_parameters() -> None:
    """A LayerNorm weight initializer of ones (a fresh model's) is still read by the tangent:
    set to other values in the jvp model, the tangent follows them."""
    model = _case("LayerNorm-last").model("float", 17)
    for name, value in (("S", np.ones(3, np.float32)), ("B", np.zeros(3, np.float32))):
        v = next(i for i in model.graph.inputs if i.name == name)
        model.graph.inputs.remove(v)
        v.const_value = ir.tensor(value)
        model.graph.register_initializer(v)
    jm = onnax.jvp(model, inputs=["X"])
    scale = np.array([2.0, -1.0, 0.5], np.float32)
    jm.graph.initializers["S"].const_value = ir.tensor(scale)
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (3, 2, 3)).astype(np.float32)
    t = rng.standard_normal((3, 2, 3)).astype(np.float32)
    got = run(jm, {"X": x, "fwd_X": t})[jm.graph.outputs[1].name]
    model.graph.initializers["S"].const_value = ir.tensor(scale)
    h = 1e-3
    hi = run(model, {"X": (x + h * t).astype(np.float32)})["Y"].astype(np.float64)
    lo = run(model, {"X": (x - h * t).astype(np.float32)})["Y"].astype(np.float64)
    np.testing.assert_allclose(got, (hi - lo) / (2 * h), rtol=1e-2, atol=1e-3)
