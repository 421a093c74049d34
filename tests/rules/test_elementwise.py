from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, positive, run_case, run_vmap_case, unit
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_jvp, check_model_valid, check_vjp, check_vmap, run


def grid(offset: float):
    """Distinct values 0.37 apart, shifted by ``offset``: operands built with different offsets
    never tie (and stay >= 0.1 apart), so max/min/clip are differentiable at the fill."""

    def fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        n = int(np.prod(shape)) if shape else 1
        return (rng.permutation(n).reshape(shape) * 0.37 - 1.3 + offset).astype(dtype)

    return fill


def _mod_operands() -> tuple[np.ndarray, np.ndarray]:
    """A = B * (k + u) with integer k and u in [0.3, 0.7]: far from Mod's jumps at A/B integer."""
    rng = np.random.default_rng(7)
    b = rng.uniform(1.0, 2.0, (3,)) * rng.choice([-1.0, 1.0], (3,))
    k = rng.integers(-2, 3, (3, 3))
    u = rng.uniform(0.3, 0.7, (3, 3))
    return b * (k + u), b


MOD_A, MOD_B = _mod_operands()
WHERE_C = np.array([[True, False, True], [False, False, True], [True, True, False]])


def per_dtype(name: str, text: str, **kwargs: object) -> list[Case]:
    """Cases whose text needs the ONNX type code of {T} (Cast's ``to``) as ``{TO}``."""
    return [
        Case(f"{name}_{dt}", text.replace("{TO}", str(code)), dtypes=(dt,), **kwargs)  # type: ignore[arg-type]
        for dt, code in (("float", 1), ("double", 11))
    ]


CASES = [
    # ------------------------------------------------------------------------------- Pow
    Case(
        "pow_broadcast",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Pow(A, B) }",
        fill={"A": positive, "B": unit},
        opsets=(11, 13, 15, 18, 21),
    ),
    Case(
        "pow_base_broadcast",
        "g ({T}[3] A, {T}[N, 3] B) => ({T}[N, 3] Y) { Y = Pow(A, B) }",
        fill={"A": positive, "B": unit},
        opsets=(11, 15),
    ),
    Case(
        "pow_exponent_only",
        "g ({T}[N, 3] A, {T} B) => ({T}[N, 3] Y) { Y = Pow(A, B) }",
        fill={"A": positive, "B": unit},
        inputs=["B"],
        opsets=(13, 21),
    ),
    Case(
        # Negative bases with a constant integral exponent: only d/dA, no log of a negative.
        "pow_const_exponent",
        "g ({T}[N, 3] A) => ({T}[N, 3] Y) { c = Constant <value = {T} {3.0}> ()\n Y = Pow(A, c) }",
        opsets=(11, 18),
    ),
    Case(
        # The square's slope is spelled 2 * A (no Pow), the identity's is the tangent itself.
        "pow_const_square",
        "g ({T}[N, 3] A) => ({T}[N, 3] Y) { c = Constant <value = {T} {2.0}> ()\n Y = Pow(A, c) }",
        opsets=(13,),
    ),
    Case(
        "pow_const_one",
        "g ({T}[N, 3] A) => ({T}[N, 3] Y) { c = Constant <value = {T} {1.0}> ()\n Y = Pow(A, c) }",
        opsets=(13,),
    ),
    Case(
        # A one-element exponent of higher rank than the base broadcasts the result up.
        "pow_const_exponent_raises_rank",
        "g ({T}[3] A) => ({T}[1, 1, 3] Y) "
        "{ c = Constant <value = {T}[1, 1, 1] {3.0}> ()\n Y = Pow(A, c) }",
        opsets=(13,),
    ),
    Case(
        # Pow-12+: an integer exponent (no derivative) with a float base.
        "pow_int_exponent",
        "g ({T}[N, 3] A, int64[3] B) => ({T}[N, 3] Y) { Y = Pow(A, B) }",
        fixed={"B": np.array([1, 2, 3])},
        opsets=(13, 15, 21),
    ),
    Case(
        # Pow-15: a double exponent with a float base; the coefficient is computed in float.
        "pow_mixed_exponent_type",
        "g (float[N, 3] A, double[3] B) => (float[N, 3] Y) { Y = Pow(A, B) }",
        fill={"A": positive, "B": unit},
        inputs=["A"],
        dtypes=("float",),
        opsets=(15, 21),
    ),
    # --------------------------------------------------------------------------- Sum / Mean
    Case(
        "sum_variadic",
        "g ({T}[N, 3] A, {T}[3] B, {T}[N, 1] C) => ({T}[N, 3] Y) { Y = Sum(A, B, C) }",
        opsets=(11, 13, 18, 21),
    ),
    Case(
        "sum_partial_expand",
        "g ({T}[N, 3] A, {T}[3] B, {T}[N, 1] C) => ({T}[N, 3] Y) { Y = Sum(A, B, C) }",
        inputs=["B", "C"],
        opsets=(13, 21),
    ),
    Case("sum_single", "g ({T}[N, 3] A) => ({T}[N, 3] Y) { Y = Sum(A) }", opsets=(11, 13)),
    # onnxruntime has no double kernel for Mean: float only.
    Case(
        "mean_variadic",
        "g ({T}[N, 3] A, {T}[3] B, {T}[N, 1] C) => ({T}[N, 3] Y) { Y = Mean(A, B, C) }",
        opsets=(11, 13, 18, 21),
        dtypes=("float",),
    ),
    Case(
        "mean_one_active",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Mean(A, B) }",
        inputs=["B"],
        opsets=(13,),
        dtypes=("float",),
    ),
    # ----------------------------------------------------------------------------- Max / Min
    Case(
        "max_variadic",
        "g ({T}[N, 3] A, {T}[3] B, {T}[N, 1] C) => ({T}[N, 3] Y) { Y = Max(A, B, C) }",
        fill={"A": grid(0.0), "B": grid(0.12), "C": grid(0.25)},
        opsets=(11, 12, 13, 18, 21),
    ),
    Case(
        "min_variadic",
        "g ({T}[N, 3] A, {T}[3] B, {T}[N, 1] C) => ({T}[N, 3] Y) { Y = Min(A, B, C) }",
        fill={"A": grid(0.0), "B": grid(0.12), "C": grid(0.25)},
        opsets=(11, 13, 21),
    ),
    Case(
        "max_binary_second_only",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Max(A, B) }",
        fill={"A": grid(0.0), "B": grid(0.12)},
        inputs=["B"],
        opsets=(13,),
    ),
    Case(
        "min_first_only",
        "g ({T}[N, 3] A, {T}[3] B, {T}[N, 1] C) => ({T}[N, 3] Y) { Y = Min(A, B, C) }",
        fill={"A": grid(0.0), "B": grid(0.12), "C": grid(0.25)},
        inputs=["A"],
        opsets=(18,),
    ),
    Case("max_single", "g ({T}[N, 3] A) => ({T}[N, 3] Y) { Y = Max(A) }", opsets=(13,)),
    # ---------------------------------------------------------------------------------- Clip
    # onnxruntime has no double kernel for Clip-11: opset 11 is tested in float only.
    *(
        Case(
            f"clip_both_bounds{suffix}",
            "g ({T}[N, 3] X, {T} Lo, {T} Hi) => ({T}[N, 3] Y) { Y = Clip(X, Lo, Hi) }",
            fill={"X": grid(0.0)},
            fixed={"Lo": np.array(-0.4), "Hi": np.array(0.35)},
            opsets=opsets,
            dtypes=dtypes,
        )
        for suffix, opsets, dtypes in (
            ("", (12, 13, 18, 21), ("float", "double")),
            ("_11", (11,), ("float",)),
        )
    ),
    Case(
        "clip_max_only",
        "g ({T}[N, 3] X, {T} Hi) => ({T}[N, 3] Y) { Y = Clip(X, , Hi) }",
        fill={"X": grid(0.0)},
        fixed={"Hi": np.array(0.35)},
        opsets=(13,),
    ),
    Case(
        "clip_max_only_11",
        "g ({T}[N, 3] X, {T} Hi) => ({T}[N, 3] Y) { Y = Clip(X, , Hi) }",
        fill={"X": grid(0.0)},
        fixed={"Hi": np.array(0.35)},
        opsets=(11,),
        dtypes=("float",),
    ),
    Case(
        "clip_min_only",
        "g ({T}[N, 3] X, {T} Lo) => ({T}[N, 3] Y) { Y = Clip(X, Lo) }",
        fill={"X": grid(0.0)},
        fixed={"Lo": np.array(-0.4)},
        opsets=(13, 21),
    ),
    Case(
        # min > max: Clip returns max everywhere.
        "clip_crossed_bounds",
        "g ({T}[N, 3] X, {T} Lo, {T} Hi) => ({T}[N, 3] Y) { Y = Clip(X, Lo, Hi) }",
        fill={"X": grid(0.0)},
        fixed={"Lo": np.array(0.35), "Hi": np.array(-0.4)},
        opsets=(13,),
    ),
    Case(
        "clip_const_bounds",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { lo = Constant <value = {T} {-0.4}> ()\n"
        " hi = Constant <value = {T} {0.35}> ()\n Y = Clip(X, lo, hi) }",
        fill={"X": grid(0.0)},
        opsets=(12, 18),
    ),
    Case("clip_unbounded", "g ({T}[N, 3] X) => ({T}[N, 3] Y) { Y = Clip(X) }", opsets=(12, 13)),
    Case(
        "clip_unbounded_11",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { Y = Clip(X) }",
        opsets=(11,),
        dtypes=("float",),
    ),
    # --------------------------------------------------------------------------------- Where
    Case(
        "where_broadcast",
        "g (bool[N, 3] C, {T}[3] X, {T}[N, 1] Z) => ({T}[N, 3] Y) { Y = Where(C, X, Z) }",
        fixed={"C": WHERE_C},
        opsets=(11, 16, 18, 21),
    ),
    Case(
        # Only X active: Where(C[3], tX[3], 0) must be expanded to [N, 3].
        "where_x_only_expand",
        "g (bool[3] C, {T}[3] X, {T}[N, 3] Z) => ({T}[N, 3] Y) { Y = Where(C, X, Z) }",
        fixed={"C": np.array([True, False, True])},
        inputs=["X"],
        opsets=(13, 21),
    ),
    Case(
        "where_y_only",
        "g (bool[N, 3] C, {T}[N, 3] X, {T} Z) => ({T}[N, 3] Y) { Y = Where(C, X, Z) }",
        fixed={"C": WHERE_C},
        inputs=["Z"],
        opsets=(11, 16),
    ),
    # ---------------------------------------------------------------------- Cast / CastLike
    # A double input whose path goes through float32 cannot be checked against float64 finite
    # differences (eps = 1e-6 drowns in float32 rounding): double -> float casts are checked
    # analytically in test_cast_double_to_float below, the other cases start from float.
    Case(
        "cast_float_to_double",
        "g (float[N, 3] X) => (double[N, 3] Y) { Y = Cast <to = 11> (X) }",
        dtypes=("float",),
        opsets=(11, 13, 19, 21),
    ),
    Case(
        "cast_same_type",
        "g (double[N, 3] X) => (double[N, 3] Y) { Y = Cast <to = 11> (X) }",
        dtypes=("double",),
        opsets=(11, 21),
    ),
    Case(
        "cast_chain",
        "g (float[N, 3] X) => (float[N, 3] Y) { a = Cast <to = 11> (X)\n b = Mul(a, a)\n"
        " c = Cast <to = 1> (b)\n Y = CastLike(c, X) }",
        dtypes=("float",),
        opsets=(15, 19, 21),
    ),
    Case(
        "castlike_to_other",
        "g (float[N, 3] X, double[3] D, float[3] F) => (double[N, 3] Y, float[N, 3] Z) "
        "{ Y = CastLike(X, D)\n Z = CastLike(X, F) }",
        inputs=["X"],
        dtypes=("float",),
        opsets=(15, 21),
    ),
    Case(
        "castlike_double",
        "g (double[N, 3] X, double[3] D) => (double[N, 3] Y) { Y = CastLike(X, D) }",
        inputs=["X"],
        dtypes=("double",),
        opsets=(15, 21),
    ),
    *per_dtype(
        # Casting to an integer type is piecewise constant: the derivative only flows through X.
        "cast_to_int",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { i = Cast <to = 7> (X)\n f = Cast <to = {TO}> (i)\n"
        " Y = Mul(X, f) }",
        fill={
            "X": lambda rng, s, dt: (rng.integers(-3, 3, s) + rng.uniform(0.2, 0.8, s)).astype(dt)
        },
        opsets=(11, 13, 21),
    ),
    # ----------------------------------------------------------------------------------- Mod
    Case(
        "mod_fmod",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Mod <fmod = 1> (A, B) }",
        fixed={"A": MOD_A, "B": MOD_B},
        opsets=(11, 13, 18, 21),
    ),
    Case(
        "mod_dividend_only",
        "g ({T}[N, 3] A, {T}[3] B) => ({T}[N, 3] Y) { Y = Mod <fmod = 1> (A, B) }",
        fixed={"A": MOD_A, "B": MOD_B},
        inputs=["A"],
        opsets=(13,),
    ),
    Case(
        "mod_divisor_only",
        "g ({T}[3] A, {T}[N, 3] B) => ({T}[N, 3] Y) { Y = Mod <fmod = 1> (A, B) }",
        fixed={"A": MOD_B * 1.45, "B": np.tile(MOD_B, (3, 1)) * np.array([[1.0], [0.9], [0.55]])},
        inputs=["B"],
        opsets=(13, 21),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def test_mod_fills_avoid_jumps() -> None:
    for a, b in (
        (MOD_A, MOD_B),
        (MOD_B * 1.45, np.tile(MOD_B, (3, 1)) * np.array([[1.0], [0.9], [0.55]])),
    ):
        frac = np.abs(np.fmod(a / b, 1.0))
        assert np.all((frac > 0.2) & (frac < 0.8))


def test_pow_negative_base_exponent_derivative_is_finite() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[3] A, float B) => (float[3] Y) { Y = Pow(A, B) }"
    )
    vm = onnax.vjp(model)
    feeds = {
        "A": np.array([-2.0, 0.0, 3.0], np.float32),
        "B": np.array(2.0, np.float32),
        "adj_Y": np.ones(3, np.float32),
    }
    got = run(vm, feeds)
    # d/dB sum(A^B) = sum(A^B log|A|), with the A == 0 term 0.
    expected = 4 * np.log(2.0) + 9 * np.log(3.0)
    np.testing.assert_allclose(got["adj_B"], expected, rtol=1e-5)
    np.testing.assert_allclose(got["adj_A"], [-4.0, 0.0, 6.0], rtol=1e-5)


@pytest.mark.parametrize(("exponent", "muls"), [(2.0, 2), (3.0, 3)])
def test_pow_small_integer_exponent_slope_is_spelled_with_mul(exponent: float, muls: int) -> None:
    """d(A**2) = 2A dA and d(A**3) = 3 A*A dA with Mul: the only Pow left is the primal one."""
    text = (
        "g (double[N, 3] A) => (double[N, 3] Y) "
        f"{{ c = Constant <value = double {{{exponent}}}> ()\n Y = Pow(A, c) }}"
    )
    model = Case("pow", text).model("double", 13)
    feeds = {"A": np.random.default_rng(0).standard_normal((2, 3))}
    vm = check_vjp(model, feeds)
    ops = [n.op_type for n in vm.graph]
    assert ops.count("Pow") == 1 and ops.count("Mul") == muls, ops
    jm = check_jvp(model, feeds)
    assert [n.op_type for n in jm.graph].count("Pow") == 1


@pytest.mark.parametrize("opset", [11, 13, 21])
def test_cast_double_to_float(opset: int) -> None:
    model = ir.from_onnx_text(
        f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
        "g (double[N, 3] X) => (float[N, 3] Y) { Y = Cast <to = 1> (X) }"
    )
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((2, 4, 3))
    u = rng.standard_normal((4, 3)).astype(np.float32)
    jm, vm = onnax.jvp(model), onnax.vjp(model)
    check_model_valid(jm)
    check_model_valid(vm)
    got_t = run(jm, {"X": x, "fwd_X": t})["fwd_Y"]
    got_u = run(vm, {"X": x, "adj_Y": u})["adj_X"]
    assert got_t.dtype == np.float32 and got_u.dtype == np.float64
    np.testing.assert_array_equal(got_t, t.astype(np.float32))
    np.testing.assert_array_equal(got_u, u.astype(np.float64))


@pytest.mark.parametrize("target", [("float16", 10), ("bfloat16", 16)])
def test_cast_through_half_precision_carries_the_tangent(target: tuple[str, int]) -> None:
    # A FLOAT -> half -> FLOAT round trip is the identity up to rounding: its tangent is the
    # tangent rounded the same way, and its cotangent likewise.
    name, code = target
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]>\n'
        f"g (float[N, 3] X) => (float[N, 3] Y) {{ h = Cast <to = {code}> (X)\n Y = Cast <to = 1> (h) }}"
    )
    jm, vm = onnax.jvp(model), onnax.vjp(model)
    check_model_valid(jm)
    check_model_valid(vm)
    half = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3))
    t = t.astype(np.float32)
    rounded = t.astype(half).astype(np.float32)
    if name == "float16":  # onnxruntime's CPU provider has no BFLOAT16 Cast from FLOAT to run
        np.testing.assert_array_equal(run(jm, {"X": x, "fwd_X": t})["fwd_Y"], rounded)
        np.testing.assert_array_equal(run(vm, {"X": x, "adj_Y": t})["adj_X"], rounded)
    kinds = {n.op_type for n in jm.graph} | {n.op_type for n in vm.graph}
    assert kinds == {"Cast"}, kinds


def test_cast_to_float8_is_refused() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]>\n'
        "g (float[N, 3] X) => (float[N, 3] Y) { h = Cast <to = 17> (X)\n Y = Cast <to = 1> (h) }"
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        onnax.jvp(model)
    message = str(info.value)
    assert "ai.onnx::Cast at opset 21" in message
    assert "'h'" in message
    assert "to = FLOAT8E4M3FN" in message
    assert "Remedy" in message and "FLOAT" in message and "`inputs`" in message


def test_castlike_to_float8_is_refused() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 19]>\n'
        "g (float[N, 3] X, float8e4m3fn[1] H) => (float[N, 3] Y) "
        "{ h = CastLike(X, H)\n Y = Cast <to = 1> (h) }"
    )
    with pytest.raises(UnsupportedOperatorError) as info:
        onnax.vjp(model, inputs=["X"])
    message = str(info.value)
    assert "ai.onnx::CastLike at opset 19" in message
    assert "'target_type' = FLOAT8E4M3FN" in message and "'h'" in message


def test_cast_to_low_precision_off_the_selected_path_is_fine() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]>\n'
        "g (float[N, 3] X, float[N, 3] W) => (float[N, 3] Y) "
        "{ h = Cast <to = 10> (X)\n g = Cast <to = 1> (h)\n Y = Mul(g, W) }"
    )
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.standard_normal((3, 3)).astype(np.float32),
        "W": rng.standard_normal((3, 3)).astype(np.float32),
    }
    check_jvp(model, feeds, ["W"])
    check_vjp(model, feeds, ["W"])
    check_adjoint(model, feeds, ["W"])


# ------------------------------------------------------------------------------------ vmap
# Helpers shared with test_zero.py and test_elementwise_core.py (the same two rule modules).

# Operators whose batch rules live in rules/elementwise.py and rules/zero.py: a missing batch rule
# for one of them fails; one for another family's operator (met in a case or a derivative model)
# skips until that family has its rules.
ELEMENTWISE_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Mean", "Max", "Min", "Mod")
ELEMENTWISE_OPS += ("Where", "Neg", "Identity", "Cast", "CastLike", "Clip")


def check_vmap_examples(
    model: ir.Model, examples: Sequence[Mapping[str, np.ndarray]], in_axes: Mapping[str, int]
) -> ir.Model:
    """vmap(model) on explicit per-example feeds against a loop of single runs, stacked at 0.

    Unlike ``check_vmap`` (which batches integer and boolean inputs as identical copies), each
    example brings its own values of every batched input; inputs absent from ``in_axes`` are
    shared and taken from the first example.
    """
    vm = onnax.vmap(model, in_axes=dict(in_axes), out_axes=0)
    check_model_valid(vm)
    singles, feeds = [], {}
    for v in model.graph.inputs:
        axis = in_axes.get(v.name)
        values = [np.asarray(ex[v.name]) for ex in examples]
        feeds[v.name] = values[0] if axis is None else np.stack(values, axis=axis)
    for ex in examples:
        singles.append(
            run(model, {n: np.asarray(ex[n] if n in in_axes else examples[0][n]) for n in ex})
        )
    got = run(vm, feeds)
    for y in model.graph.outputs:
        want = np.stack([s[y.name] for s in singles])
        assert got[y.name].shape == want.shape, (y.name, got[y.name].shape, want.shape)
        tol = 1e-10 if want.dtype == np.float64 else 1e-5
        np.testing.assert_allclose(got[y.name], want, rtol=tol, atol=tol, err_msg=y.name)
    return vm


def derivative_feeds(
    model: ir.Model, derived: ir.Model, feeds: Mapping[str, np.ndarray], seed: int = 1
) -> dict[str, np.ndarray]:
    """Feeds of a jvp/vjp model: ``feeds`` plus random ``fwd_<x>`` (x's shape) and ``adj_<y>``
    (y's shape) inputs."""
    rng = np.random.default_rng(seed)
    outputs = run(model, feeds)
    result = dict(feeds)
    for v in derived.graph.inputs:
        if v.name in result:
            continue
        base = v.name.split("_", 1)[1]
        shape = np.shape(feeds[base] if base in feeds else outputs[base])
        result[v.name] = np.asarray(rng.standard_normal(shape).astype(v.dtype.numpy()))
    return result


def vmap_derivatives(case: Case, dtype: str, opset: int) -> None:
    """vmap of the case's jvp and vjp models: everything batched, and only the tangents (the
    columns of the Jacobian) or only the cotangents (its rows) batched."""
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    for transform, prefix in ((onnax.jvp, "fwd_"), (onnax.vjp, "adj_")):
        derived = transform(model, case.inputs)
        dfeeds = derivative_feeds(model, derived, feeds)
        check_vmap(derived, dfeeds, in_axes=0)
        seeds = {v.name: 0 for v in derived.graph.inputs if v.name.startswith(prefix)}
        check_vmap(derived, dfeeds, in_axes=seeds)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def _case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


@pytest.mark.parametrize(
    ("name", "opset"),
    [
        ("pow_broadcast", 15),
        ("max_variadic", 12),
        ("clip_both_bounds", 13),
        ("where_broadcast", 16),
        ("mod_fmod", 13),
        ("sum_variadic", 11),
    ],
)
def test_vmap_of_derivatives(name: str, opset: int) -> None:
    vmap_derivatives(_case(name), "double" if opset % 2 else "float", opset)


@pytest.mark.parametrize("opset", [11, 12, 13, 21])
@pytest.mark.parametrize(
    "in_axes", [{"Lo": 0}, {"Hi": 0}, {"Lo": 0, "Hi": 0}, {"X": 1, "Lo": 0, "Hi": 0}, {"X": 1}]
)
def test_clip_batched_bounds(opset: int, in_axes: dict[str, int]) -> None:
    # Bounds per example: Max/Min against the aligned bounds (ONNX wants scalar Clip bounds);
    # only x batched: Clip as is. onnxruntime's Clip-11 is float only.
    dtype = "float" if opset == 11 else "double"
    case = _case("clip_both_bounds_11" if opset == 11 else "clip_both_bounds")
    model = case.model(dtype, opset)
    rng = np.random.default_rng(5)
    base = case.feeds(model)
    examples = [
        {
            "X": base["X"] + rng.uniform(-0.1, 0.1, base["X"].shape).astype(base["X"].dtype),
            "Lo": np.asarray(lo, dtype=base["Lo"].dtype),
            "Hi": np.asarray(hi, dtype=base["Hi"].dtype),
        }
        for lo, hi in ((-0.4, 0.35), (-1.0, 1.0), (0.2, -0.3))  # the last one crossed
    ]
    vm = check_vmap_examples(model, examples, in_axes)
    ops = {n.op_type for n in vm.graph}
    if "Lo" in in_axes or "Hi" in in_axes:
        assert "Clip" not in ops
    else:
        assert "Clip" in ops and "Max" not in ops


def test_clip_one_batched_bound_of_two_inputs() -> None:
    model = _case("clip_max_only").model("float", 13)
    rng = np.random.default_rng(6)
    examples = [
        {"X": grid(0.0)(rng, (3, 3), np.dtype(np.float32)), "Hi": np.asarray(h, np.float32)}
        for h in (0.35, -0.2, 1.0)
    ]
    vm = check_vmap_examples(model, examples, {"X": 0, "Hi": 0})
    assert {n.op_type for n in vm.graph} >= {"Min"}


@pytest.mark.parametrize("opset", [11, 16, 21])
def test_where_batched_condition_only(opset: int) -> None:
    model = _case("where_broadcast").model("double", opset)
    base = _case("where_broadcast").feeds(model)
    examples = [dict(base, C=c) for c in (WHERE_C, ~WHERE_C, np.roll(WHERE_C, 1, axis=1))]
    check_vmap_examples(model, examples, {"C": 0})
    check_vmap_examples(model, examples, {"C": 1, "X": 0})


@pytest.mark.parametrize("in_axes", [{"D": 0}, {"D": 0, "F": 1}, {"X": 1, "F": 0}])
def test_castlike_batched_target_only_lends_its_type(in_axes: dict[str, int]) -> None:
    # The targets only give the element type: an output is batched exactly when X is.
    model = _case("castlike_to_other").model("float", 21)
    check_vmap(model, _case("castlike_to_other").feeds(model), in_axes=in_axes)


def test_derivatives_of_vmapped_clip_with_batched_bounds() -> None:
    # The Max/Min rewrite must itself be differentiable (grad of a vmapped model): each
    # example's bounds at least 0.05 away from its grid of x values (no kinks).
    model = _case("clip_both_bounds").model("double", 13)
    vm = onnax.vmap(model, in_axes={"X": 0, "Lo": 0, "Hi": 0})
    rng = np.random.default_rng(9)
    feeds = {
        "X": np.stack([grid(0.0)(rng, (3, 3), np.dtype(np.float64)) for _ in range(3)]),
        "Lo": np.array([-0.4, -1.0, 0.0]),
        "Hi": np.array([0.35, 1.0, 0.5]),
    }
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)
