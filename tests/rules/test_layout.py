import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vjp, check_vmap, run
from rules.shape_checks import (
    check_derivatives_of_vmapped_model,
    check_second_order,
    check_vmap_case,
    check_vmap_of_derivative_model,
    check_vmap_refusal,
    check_vmap_targeted,
    i64,
    model,
)

RESHAPE_RUNTIME = Case(
    # The target shape is computed at run time from the input's shape: [2 N, 3].
    "reshape_runtime_shape",
    """g ({T}[N, 2, 3] X) => ({T}[M, 3] Y)
    <int64[1] c0 = {0}, int64[1] c1 = {1}, int64[1] two = {2}, int64[1] three = {3}> {
        sh = Shape(X)
        n = Slice(sh, c0, c1)
        n2 = Mul(n, two)
        s = Concat <axis = 0> (n2, three)
        Y = Reshape(X, s)
    }""",
    opsets=(11, 13, 21),
)

RESHAPE = [
    Case(
        "reshape_minus_one",
        "g ({T}[N, 4] X) => ({T}[M, 6] Y) { s = Constant <value = int64[2] {-1, 6}> ()\n Y = Reshape(X, s) }",
        opsets=(11, 13, 14, 19, 21),
    ),
    Case(
        "reshape_allowzero",
        "g ({T}[2, 3, 4] X) => ({T}[3, 8] Y) { s = Constant <value = int64[2] {3, 8}> ()\n"
        " Y = Reshape <allowzero = 1> (X, s) }",
        opsets=(14, 21),
    ),
    Case(
        "reshape_copy_zero",
        "g ({T}[N, 2, 3] X) => ({T}[N, 6] Y) { s = Constant <value = int64[2] {0, -1}> ()\n Y = Reshape(X, s) }",
        opsets=(13,),
    ),
    RESHAPE_RUNTIME,
    Case(
        "flatten",
        "g ({T}[N, 2, 3] X) => ({T}[N, 6] Y) { Y = Flatten <axis = 1> (X) }",
        opsets=(11, 13, 21),
    ),
    Case(
        "flatten_axis0",
        "g ({T}[N, 2, 3] X) => ({T}[1, M] Y) { Y = Flatten <axis = 0> (X) }",
        opsets=(13,),
    ),
    Case(
        "flatten_neg_axis",
        "g ({T}[N, 2, 3] X) => ({T}[M, 3] Y) { Y = Flatten <axis = -1> (X) }",
        opsets=(21,),
    ),
    Case(
        "transpose_perm",
        "g ({T}[N, 2, 3] X) => ({T}[3, N, 2] Y) { Y = Transpose <perm = [2, 0, 1]> (X) }",
        opsets=(11, 13, 21),
    ),
    Case(
        "transpose_default",
        "g ({T}[N, 2, 3] X) => ({T}[3, 2, N] Y) { Y = Transpose (X) }",
        opsets=(13,),
    ),
]

SQUEEZE = [
    Case(
        "squeeze_attr",
        "g ({T}[N, 1, 3] X) => ({T}[N, 3] Y) { Y = Squeeze <axes = [1]> (X) }",
        opsets=(11,),
    ),
    Case(
        "squeeze_attr_neg",
        "g ({T}[N, 3, 1] X) => ({T}[N, 3] Y) { Y = Squeeze <axes = [-1]> (X) }",
        opsets=(11,),
    ),
    Case(
        "squeeze_input",
        "g ({T}[N, 1, 3, 1] X) => ({T}[N, 3] Y) { a = Constant <value = int64[2] {1, -1}> ()\n Y = Squeeze(X, a) }",
        opsets=(13, 21),
    ),
    Case(
        "squeeze_all",
        "g ({T}[2, 1, 3, 1] X) => ({T}[2, 3] Y) { Y = Squeeze(X) }",
        opsets=(11, 13, 21),
    ),
    Case(
        # Axes known at run time only (a graph input).
        "squeeze_runtime_axes",
        "g ({T}[N, 1, 3] X, int64[1] a) => ({T}[N, 3] Y) { Y = Squeeze(X, a) }",
        fixed={"a": i64(1)},
        opsets=(13,),
    ),
    Case(
        "unsqueeze_attr",
        "g ({T}[N, 3] X) => ({T}[1, N, 3, 1] Y) { Y = Unsqueeze <axes = [0, -1]> (X) }",
        opsets=(11,),
    ),
    Case(
        "unsqueeze_input",
        "g ({T}[N, 3] X) => ({T}[1, N, 3, 1] Y) { a = Constant <value = int64[2] {0, -1}> ()\n Y = Unsqueeze(X, a) }",
        opsets=(13, 21),
    ),
]

MISC = [
    Case(
        "tile",
        "g ({T}[N, 2] X) => ({T}[K, 6] Y) { r = Constant <value = int64[2] {2, 3}> ()\n Y = Tile(X, r) }",
        opsets=(11, 13),
    ),
    Case(
        "tile_static",
        "g ({T}[2, 3] X) => ({T}[6, 3] Y) { r = Constant <value = int64[2] {3, 1}> ()\n Y = Tile(X, r) }",
    ),
    Case(
        "tile_runtime",
        "g ({T}[N, 2, 1] X, int64[3] r) => ({T}[K, L, M] Y) { Y = Tile(X, r) }",
        fixed={"r": i64(1, 2, 3)},
        opsets=(13,),
    ),
    Case(
        "expand",
        "g ({T}[N, 1] X) => ({T}[N, 4] Y) { s = Constant <value = int64[2] {1, 4}> ()\n Y = Expand(X, s) }",
        opsets=(11, 13),
    ),
    Case(
        # Every transpose rule composed with the others, several outputs at once.
        "layout_chain",
        """g ({T}[N, 2, 3] X, {T}[N, 1] B) => ({T}[N, 3, 3] Y0, {T}[N, 3, 4] Y1) {
            t = Transpose <perm = [0, 2, 1]> (X)
            f = Flatten <axis = 1> (t)
            c = Concat <axis = 1> (f, B)
            u = Unsqueeze <axes = [1]> (c)
            q = Constant <value = int64[6] {0, 1, 0, 0, 1, 0}> ()
            p = Pad <mode = "edge"> (u, q)
            Y0, Y1 = Split <axis = 2, split = [3, 4]> (p)
        }""",
        opsets=(11,),
    ),
    Case(
        "layout_chain_dynamic",
        """g ({T}[N, 2, 3] X) => ({T}[K, 2] Y0, {T}[L] Y1) {
            b = Constant <value = int64[1] {-1}> ()
            e = Constant <value = int64[1] {-100}> ()
            a = Constant <value = int64[1] {0}> ()
            st = Constant <value = int64[1] {-2}> ()
            s = Slice(X, b, e, a, st)
            r = Constant <value = int64[2] {-1, 2}> ()
            f = Reshape(s, r)
            r2 = Constant <value = int64[2] {2, 1}> ()
            Y0 = Tile(f, r2)
            z = Constant <value = int64[1] {-1}> ()
            Y1 = Reshape(X, z)
        }""",
        dims={"N": 4},
        opsets=(13, 21),
    ),
]

CASES = RESHAPE + SQUEEZE + MISC


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("case", [RESHAPE_RUNTIME], ids=case_id)
def test_one_model_serves_several_batch_sizes(case: Case) -> None:
    m = case.model("double", 13)
    for n in (1, 2, 5, 7):
        shape = [n if not isinstance(d, int) else d for d in m.graph.inputs[0].shape.dims]
        feeds = {"X": np.random.default_rng(n).standard_normal(shape)}
        check_jvp(m, feeds)
        check_vjp(m, feeds)


BY_NAME = {c.name: c for c in CASES}
# One case per transpose path (run-time parameters included), each at one opset.
SECOND_ORDER = [
    ("reshape_runtime_shape", 13),
    ("squeeze_all", 13),
    ("tile_runtime", 13),
    ("layout_chain_dynamic", 13),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER)
def test_second_order(name: str, opset: int) -> None:
    check_second_order(BY_NAME[name], opset)


def test_emitted_operators_have_rules() -> None:
    # Closure: every operator in the derivative models of the shape family's cases has a jvp
    # rule (the cases of its other modules too, so that the family keeps one such test).
    from onnax.rules import collect, jvp_rules
    from rules.test_padding import CASES as PADDING_CASES
    from rules.test_random import CASES as RANDOM_CASES
    from rules.test_slicing import CASES as SLICING_CASES
    from rules.test_sources import CASES as SOURCES_CASES

    collect()
    missing = set()
    for case in CASES + SLICING_CASES + PADDING_CASES + SOURCES_CASES + RANDOM_CASES:
        for opset in case.opsets:
            m = case.model("double", opset)
            for d in (onnax.vjp(m, case.inputs), onnax.jvp(m, case.inputs)):
                for n in d.graph:
                    if jvp_rules.lookup(n.domain, n.op_type, opset) is None:
                        missing.add((n.op_type, opset))
    assert not missing, sorted(missing)


# ----------------------------------------------------------------------------------- vmap
@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    check_vmap_case(case, dtype, opset)


TARGETED = [
    Case(
        # A 0 in the middle copies the input's dimension at the same position.
        "reshape_zero_and_minus_one",
        "g ({T}[4, 3, 2] X) => ({T}[2, 3, 4] Y) { s = Constant <value = int64[3] {2, 0, -1}> ()\n"
        " Y = Reshape(X, s) }",
        opsets=(11, 14, 21),
    ),
    Case(
        "reshape_zero_symbolic",
        "g ({T}[N, 3, 2] X) => ({T}[N, 3, 2] Y) { s = Constant <value = int64[3] {0, -1, 2}> ()\n"
        " Y = Reshape(X, s) }",
        opsets=(13,),
    ),
    Case(
        # allowzero=1: a 0 is a zero-size dimension (the data is empty).
        "reshape_allowzero_empty",
        "g ({T}[2, 0, 3] X) => ({T}[0, 3, 5] Y) { s = Constant <value = int64[3] {0, 3, 5}> ()\n"
        " Y = Reshape <allowzero = 1> (X, s) }",
        opsets=(14, 21),
    ),
    Case(
        "reshape_to_scalar",
        "g ({T}[1, 1] X) => ({T} Y) { s = Constant <value = int64[0] {}> ()\n Y = Reshape(X, s) }",
        opsets=(13,),
    ),
    Case(
        "reshape_shared_shape_input",
        "g ({T}[N, 6] X, int64[3] s) => ({T}[A, B, C] Y) { Y = Reshape(X, s) }",
        fixed={"s": i64(-1, 2, 3)},
        opsets=(13,),
    ),
    Case(
        "expand_shape_longer",
        "g ({T}[2, 1] X) => ({T}[3, 2, 4] Y) { s = Constant <value = int64[3] {3, 1, 4}> ()\n"
        " Y = Expand(X, s) }",
        opsets=(11, 13),
    ),
    Case(
        "expand_shape_shorter",
        "g ({T}[2, 3, 1] X) => ({T}[2, 3, 4] Y) { s = Constant <value = int64[1] {4}> ()\n"
        " Y = Expand(X, s) }",
        opsets=(13,),
    ),
    Case(
        "expand_ones_in_shape",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { s = Constant <value = int64[2] {1, 1}> ()\n Y = Expand(X, s) }",
        opsets=(13,),
    ),
    Case(
        # The target comes from another batched input's Shape (unbatched under vmap).
        "expand_to_shape_of",
        "g ({T}[N, 1] X, {T}[2, N, 4] Z) => ({T}[2, N, 4] Y) { s = Shape(Z)\n Y = Expand(X, s) }",
        opsets=(13, 21),
    ),
    Case(
        # The length of the shape is unknown statically; the result's rank is known.
        "expand_runtime_length",
        "g ({T}[2, 1] X, int64[K] s) => ({T}[A, B, C] Y) { Y = Expand(X, s) }",
        fixed={"s": i64(3, 1, 4)},
        opsets=(13,),
    ),
    Case(
        "flatten_static",
        "g ({T}[2, 3, 4] X) => ({T}[6, 4] Y) { Y = Flatten <axis = 2> (X) }",
        opsets=(11, 21),
    ),
    Case(
        "flatten_static_axis0",
        "g ({T}[2, 3, 4] X) => ({T}[1, 24] Y) { Y = Flatten <axis = 0> (X) }",
        opsets=(13,),
    ),
    Case(
        "flatten_symbolic_back",
        "g ({T}[2, 3, N] X) => ({T}[2, M] Y) { Y = Flatten <axis = 1> (X) }",
        opsets=(13,),
    ),
    Case(
        # Without axes and with a symbolic dimension: the size-1 axes are found at run time.
        "squeeze_all_symbolic",
        "g ({T}[N, 1, 3, 1] X) => ({T}[N, 3] Y) { Y = Squeeze(X) }",
        opsets=(13, 21),
    ),
    Case(
        "unsqueeze_runtime_axes",
        "g ({T}[N, 3] X, int64[2] a) => ({T}[A, B, C, D] Y) { Y = Unsqueeze(X, a) }",
        fixed={"a": i64(0, -1)},
        opsets=(13,),
    ),
    Case(
        "unsqueeze_runtime_axes_unknown_length",
        "g ({T}[N, 3] X, int64[K] a) => ({T}[A, B, C, D] Y) { Y = Unsqueeze(X, a) }",
        fixed={"a": i64(-1, 1)},
        opsets=(13,),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TARGETED), ids=case_id)
def test_vmap_targeted(case: Case, dtype: str, opset: int) -> None:
    check_vmap_targeted(case, dtype, opset)


@pytest.mark.parametrize("name", ["squeeze_all", "squeeze_all_symbolic", "flatten_static"])
def test_vmap_batch_of_one_keeps_batch_axis(name: str) -> None:
    # Squeeze without axes must never squeeze the batch axis, even of size 1.
    case = {c.name: c for c in CASES + TARGETED}[name]
    m = case.model("double", 13)
    check_vmap(m, case.feeds(m), batch=1)
    check_vmap(m, case.feeds(m), batch=1, axis_size=1)


def test_vmap_reshape_keeps_shape_constant() -> None:
    # A hard-coded reshape gets the batch size prepended; the constant shape is not batched.
    m = TARGETED[0].model("double", 13)
    v = onnax.vmap(m)
    assert [n.op_type for n in v.graph if n.op_type == "Reshape"] == ["Reshape"]
    got = run(v, {"X": np.arange(48.0).reshape(2, 4, 3, 2)})["Y"]
    np.testing.assert_array_equal(got, np.arange(48.0).reshape(2, 2, 3, 4))


REFUSALS = [
    # (model text, in_axes, fragments of the message)
    (
        "g (double[6] X, int64[2] s) => (double[A, B] Y) { Y = Reshape(X, s) }",
        (0, 0),
        ["ai.onnx::Reshape", "'Y'", "target shape", "'s'"],
    ),
    (
        # The shape is computed from batched data: different per example.
        "g (double[6] X, double[2] V) => (double[A, B] Y) { s = Cast <to = 7> (V)\n Y = Reshape(X, s) }",
        (None, 0),
        ["ai.onnx::Reshape", "target shape", "input 1 's'"],
    ),
    (
        "g (double[2, 1] X, int64[2] s) => (double[A, B] Y) { Y = Expand(X, s) }",
        (None, 0),
        ["ai.onnx::Expand", "target shape", "'s'"],
    ),
    (
        "g (double[4, 1] X, int64[1] a) => (double[4] Y) { Y = Squeeze(X, a) }",
        (0, 0),
        ["ai.onnx::Squeeze", "axes", "'a'"],
    ),
    (
        "g (double[4] X, int64[1] a) => (double[4, 1] Y) { Y = Unsqueeze(X, a) }",
        (0, 0),
        ["ai.onnx::Unsqueeze", "axes", "'a'"],
    ),
    (
        "g (double[6] X, int64[1] r) => (double[A] Y) { Y = Tile(X, r) }",
        (0, 0),
        ["ai.onnx::Tile", "repeats", "'r'"],
    ),
]


@pytest.mark.parametrize(("text", "in_axes", "fragments"), REFUSALS, ids=lambda p: str(p)[:30])
def test_vmap_refuses_batched_shape_inputs(
    text: str, in_axes: object, fragments: list[str]
) -> None:
    check_vmap_refusal(text, in_axes, fragments)


def test_vmap_squeeze_symbolic_without_axes_refused_before_13() -> None:
    m = model("g (double[N, 1, 3] X) => (double[K] Y) { Y = Squeeze(X) }", 11)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(m)
    message = str(err.value)
    assert "ai.onnx::Squeeze" in message and "'N'" in message and "'X'" in message
    assert "explicit axes" in message and "opset 13" in message


# vmap of derivative models: the primal inputs and per-example tangents/cotangents batched
# (shape-like inputs shared), and only the seeds batched (many directions in one pass).
DERIVATIVES = [
    ("reshape_runtime_shape", 13),
    ("squeeze_all", 21),
    ("tile_runtime", 13),
    ("layout_chain", 11),
    ("layout_chain_dynamic", 21),
]


@pytest.mark.parametrize(("name", "opset"), DERIVATIVES)
@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_vmap_of_derivative_models(name: str, opset: int, kind: str) -> None:
    check_vmap_of_derivative_model(BY_NAME[name], opset, kind)


# Variants run_vmap_case does not cover: only a later input batched, the data shared.
ONE_BATCHED = [
    ("layout_chain", 11, (None, 0)),
]


@pytest.mark.parametrize(("name", "opset", "in_axes"), ONE_BATCHED)
def test_vmap_shared_data(name: str, opset: int, in_axes: tuple[int | None, ...]) -> None:
    case = BY_NAME[name]
    m = case.model("double", opset)
    check_vmap(m, case.feeds(m), in_axes=in_axes)


# Derivatives of vmapped models: the operators the batch rules emit (Where, NonZero, Range,
# ReduceProd on shapes, Cast...) must themselves be differentiable.
VMAPPED = [
    ("squeeze_all_symbolic", 13),
    ("flatten_symbolic_back", 13),
    ("expand_runtime_length", 13),
    ("unsqueeze_runtime_axes_unknown_length", 13),
    ("layout_chain_dynamic", 13),
]


@pytest.mark.parametrize(("name", "opset"), VMAPPED)
def test_derivatives_of_vmapped_models(name: str, opset: int) -> None:
    check_derivatives_of_vmapped_model({c.name: c for c in CASES + TARGETED}[name], opset)


@pytest.mark.parametrize("spatial", [3, 1])
def test_unsqueezed_parameter_gradient_is_one_sum(spatial: int) -> None:
    """A [C] parameter unsqueezed to [1, C, 1, 1] and broadcast over the data: its gradient is
    one ReduceSum dropping the axes (no Squeeze after a kept-dims sum), also where the spatial
    axes are 1 and the sum runs over the batch axis only; checked against differences."""
    text = (
        '<ir_version: 10, opset_import: ["" : 17]>\n'
        f"g (float[2, 3, {spatial}, {spatial}] X, float[3] b) => (float L) "
        "<int64[3] axes = {0, 2, 3}> { u = Unsqueeze(b, axes)\n y = Mul(X, u)\n"
        " L = ReduceSum<keepdims=0>(y) }"
    )
    model = ir.from_onnx_text(text)
    gm = onnax.grad(model, ["b"], output="L")
    ops = [n.op_type for n in gm.graph]
    assert "Squeeze" not in ops, ops
    rng = np.random.default_rng(0)
    feeds = {
        "X": rng.standard_normal((2, 3, spatial, spatial)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }
    check_vjp(model, feeds, ["b"], ["L"])
