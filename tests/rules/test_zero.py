import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from cases import Case, away_from_zero, case_id, distinct, parametrize, run_case
from onnax.core.emit import Emitter
from onnax.core.registry import jvp_rules
from onnax.rules import collect
from onnax.rules.zero import ZERO_SINCE
from oracles import check_model_valid, run


def off_integers(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """k + u with u in [0.15, 0.35]: away from the jumps of Floor/Ceil (integers) and Round (halves)."""
    return (rng.integers(-3, 3, shape) + rng.uniform(0.15, 0.35, shape)).astype(dtype)


def offset_distinct(offset: float):
    def fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return (distinct(rng, shape, dtype) + offset).astype(dtype)

    return fill


def per_dtype(name: str, text: str, **kwargs: object) -> list[Case]:
    """Cases whose text needs the ONNX type code of {T} (Cast's ``to``) as ``{TO}``."""
    return [
        Case(f"{name}_{dt}", text.replace("{TO}", str(code)), dtypes=(dt,), **kwargs)  # type: ignore[arg-type]
        for dt, code in (("float", 1), ("double", 11))
    ]


OPSETS = (11, 13, 18, 21)

CASES = [
    # Derivatives flow past the rounding family (a zero tangent through the rounded factor).
    Case(
        "floor_product",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { f = Floor(X)\n Y = Mul(X, f) }",
        fill={"X": off_integers},
        opsets=OPSETS,
    ),
    Case(
        "ceil_round",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { c = Ceil(X)\n r = Round(X)\n p = Mul(X, c)\n Y = Add(p, r) }",
        fill={"X": off_integers},
        opsets=OPSETS,
    ),
    Case(
        "sign_abs",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { s = Sign(X)\n Y = Mul(X, s) }",
        fill={"X": away_from_zero},
        opsets=OPSETS,
    ),
    # A float output of a zero-derivative operator gets a materialised zero tangent.
    Case(
        "floor_output",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y, {T}[N, 3] Z) { Y = Floor(X)\n Z = Sign(X) }",
        fill={"X": off_integers},
        opsets=(11, 21),
    ),
    *per_dtype(
        "cast_floor",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { f = Floor(X)\n i = Cast <to = 7> (f)\n c = Cast <to = {TO}> (i)\n Y = Mul(X, c) }",
        fill={"X": off_integers},
        opsets=OPSETS,
    ),
    # Comparisons and logic steer a Where.
    Case(
        "compare_where",
        "g ({T}[N, 3] X, {T}[3] Z) => ({T}[N, 3] Y) { g = Greater(X, Z)\n l = Less(X, Z)\n e = Equal(X, Z)\n"
        " o = Or(g, e)\n x = Xor(o, l)\n n = Not(x)\n a = And(g, x)\n m = Mul(Z, Z)\n w = Where(a, X, m)\n Y = Where(n, Z, w) }",
        fill={"X": distinct, "Z": offset_distinct(0.1)},
        opsets=OPSETS,
    ),
    Case(
        "compare_or_equal",
        "g ({T}[N, 3] X, {T}[3] Z) => ({T}[N, 3] Y) { g = GreaterOrEqual(X, Z)\n l = LessOrEqual(X, Z)\n"
        " m = Mul(X, X)\n w = Where(g, X, m)\n Y = Where(l, Z, w) }",
        fill={"X": distinct, "Z": offset_distinct(0.1)},
        opsets=(13, 18, 21),
    ),
    Case(
        "isnan_isinf",
        "g ({T}[N, 3] X, {T}[3] Z) => ({T}[N, 3] Y) { a = IsNaN(X)\n b = IsInf(X)\n c = Or(a, b)\n Y = Where(c, Z, X) }",
        opsets=OPSETS,
    ),
    Case(
        "shape_size_expand",
        "g ({T}[N, 3] X, {T}[1, 3] Z) => ({T}[N, 3] Y) { s = Shape(X)\n e = Expand(Z, s)\n Y = Mul(X, e) }",
        opsets=OPSETS,
    ),
    Case(
        "size_castlike",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { s = Size(X)\n c = CastLike(s, X)\n Y = Mul(X, c) }",
        opsets=(15, 21),
    ),
    # Paths through index-valued operators only: a zero cotangent for X, W's is the index.
    *per_dtype(
        "argmax_only",
        "g ({T}[N, 4] X, {T}[N, 1] W) => ({T}[N, 1] Y) { i = ArgMax <axis = 1> (X)\n c = Cast <to = {TO}> (i)\n Y = Mul(W, c) }",
        fill={"X": distinct},
        opsets=OPSETS,
    ),
    *per_dtype(
        "argmin_only_x",
        "g ({T}[N, 4] X) => ({T}[N, 1] Y) { i = ArgMin <axis = 1, keepdims = 1> (X)\n Y = Cast <to = {TO}> (i) }",
        fill={"X": distinct},
        opsets=OPSETS,
    ),
    # onnxruntime has no double kernel for NonZero (nor for Hardmax below): float only.
    Case(
        "nonzero_only",
        "g ({T}[N, 3] X, {T}[2] W) => ({T}[2] Y) { z = NonZero(X)\n s = Shape(z)\n c = Cast <to = 1> (s)\n Y = Mul(W, c) }",
        fill={"X": away_from_zero},
        opsets=OPSETS,
        dtypes=("float",),
    ),
    Case(
        "eyelike",
        "g ({T}[3, 3] X) => ({T}[3, 3] Y) { e = EyeLike(X)\n Y = Mul(X, e) }",
        opsets=OPSETS,
    ),
    Case(
        "hardmax",
        "g ({T}[N, 4] X) => ({T}[N, 4] Y) { h = Hardmax(X)\n Y = Mul(X, h) }",
        fill={"X": distinct},
        opsets=(11, 13, 21),
        dtypes=("float",),
    ),
    # onnxruntime's QuantizeLinear takes float32 only.
    Case(
        "quantize_only",
        "g ({T}[N, 3] X, {T}[N, 3] W) => ({T}[N, 3] Y) { s = Constant <value = float {0.5}> ()\n"
        " z = Constant <value = uint8 {128}> ()\n q = QuantizeLinear(X, s, z)\n c = CastLike(q, W)\n Y = Mul(W, c) }",
        # Multiples of the scale: in the middle of a rounding step, far from its jumps.
        fill={"X": lambda rng, s, dt: (rng.integers(-20, 20, s) * 0.5).astype(dt)},
        opsets=(15, 21),
        dtypes=("float",),
    ),
    # OneHot is linear in its values (onnxruntime's OneHot has no double values kernel).
    Case(
        # A run-time depth: the one-hot axis is symbolic and unbroadcast needs opset 13.
        "onehot_values",
        "g (int64[N] I, int64 D, {T}[2] V, {T}[N, 4] X) => ({T}[N, 4] Y) { h = OneHot <axis = -1> (I, D, V)\n Y = Mul(h, X) }",
        fixed={"I": np.array([0, 3, -1]), "D": np.array(4)},
        opsets=(13, 21),
        dtypes=("float",),
    ),
    Case(
        "onehot_values_const_depth",
        "g (int64[N] I, {T}[2] V, {T}[N, 4] X) => ({T}[N, 4] Y) { D = Constant <value = int64 {4}> ()\n"
        " h = OneHot <axis = -1> (I, D, V)\n Y = Mul(h, X) }",
        fixed={"I": np.array([0, 3, -1])},
        opsets=(11, 13),
        dtypes=("float",),
    ),
    Case(
        "onehot_axis0_values_only",
        "g (int64[N] I, int64 D, {T}[2] V) => ({T}[4, N] Y) { Y = OneHot <axis = 0> (I, D, V) }",
        fixed={"I": np.array([2, 0, 1]), "D": np.array(4)},
        opsets=(11, 21),
        dtypes=("float",),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def test_zero_rules_registered_at_earliest_since_version() -> None:
    collect()
    history = onnx.defs.get_all_schemas_with_history()
    for op, version in ZERO_SINCE.items():
        versions = [s.since_version for s in history if s.name == op and s.domain == ""]
        assert version == min(versions), (op, version, sorted(versions))
        for opset in range(11, onnx.defs.onnx_opset_version() + 1):
            if opset >= version:
                assert jvp_rules.lookup("", op, opset) is not None, (op, opset)


@pytest.mark.parametrize(
    "op", ["BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "NonMaxSuppression"]
)
def test_integer_only_ops_give_zero(op: str) -> None:
    # These never take a float that carries a derivative; check the rule itself.
    collect()
    rule = jvp_rules.lookup("", op, 21)
    assert rule is not None
    node = ir.node(op, [ir.Value(name="a"), ir.Value(name="b")], num_outputs=1)
    assert list(rule(Emitter(21), node, [None, None])) == [None]


def test_zero_tangent_is_materialised_in_grad() -> None:
    # A loss that only depends on X through ArgMax: zeros of X's shape, valid model.
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[N, 4] X) => (float[1, 1] L) { i = ArgMax <axis = 1> (X)\n c = Cast <to = 1> (i)\n L = ReduceSum <keepdims = 1> (c) }"
    )
    vm = onnax.vjp(model)
    check_model_valid(vm)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    got = run(vm, {"X": x, "adj_L": np.ones((1, 1), np.float32)})
    np.testing.assert_array_equal(got["adj_X"], np.zeros_like(x))
