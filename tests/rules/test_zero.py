"""Shape queries, index-valued and quantized operators, OneHot (rules in onnax.rules.zero)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import onnax
from cases import Case, away_from_zero, case_id, distinct, parametrize, run_case, run_vmap_case
from onnax.core.emit import Emitter
from onnax.core.registry import batch_rules, jvp_rules
from onnax.errors import UnsupportedOperatorError
from onnax.rules import collect
from oracles import check_adjoint, check_jvp, check_model_valid, check_vjp, check_vmap, run
from rules.test_elementwise import (
    check_vmap_examples,
    vmap_derivatives,
)
from rules.test_logic import per_dtype

OPSETS = (11, 13, 18, 21)

CASES = [
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


# The operators with a zero derivative (rules in onnax.rules.zero, .logic and .quant); the first
# two groups broadcast under vmap, or apply as they are.
BROADCASTING_BATCH = (
    "Equal",
    "Less",
    "Greater",
    "LessOrEqual",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
)
VECTORIZED_BATCH = ("Not", "BitwiseNot", "Sign", "Floor", "Ceil", "Round", "IsNaN", "IsInf")
ZERO = (
    *BROADCASTING_BATCH,
    *VECTORIZED_BATCH,
    "Shape",
    "Size",
    "ArgMax",
    "ArgMin",
    "NonZero",
    "NonMaxSuppression",
    "QuantizeLinear",
    "Hardmax",
    "EyeLike",
)


def _schema_versions(op: str) -> list[int]:
    history = onnx.defs.get_all_schemas_with_history()
    return sorted(s.since_version for s in history if s.name == op and s.domain == "")


def test_zero_rules_registered_at_earliest_since_version() -> None:
    collect()
    for op in ZERO:
        versions = _schema_versions(op)
        assert jvp_rules.oldest_version("", op) == versions[0], (op, versions)
        for opset in range(11, onnx.defs.onnx_opset_version() + 1):
            if opset >= versions[0]:
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


# ------------------------------------------------------------------------------------ vmap
def model_at(opset: int, text: str) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')


# Inputs that must stay shared: a batched OneHot depth is refused (see the refusal tests).
VMAP_SHARED = {"onehot_values": ("D",), "onehot_axis0_values_only": ("D",)}
# Refused on batched inputs (a ragged result): see test_vmap_refuses_ragged_outputs.
VMAP_REFUSED = {"nonzero_only"}


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    if case.name in VMAP_REFUSED:
        model = case.model(dtype, opset)
        with pytest.raises(UnsupportedOperatorError, match="ragged"):
            onnax.vmap(model)
        return
    run_vmap_case(case, dtype, opset, shared=VMAP_SHARED.get(case.name, ()))


@pytest.mark.parametrize(
    ("name", "dtype", "opset"),
    [
        ("onehot_values_const_depth", "float", 13),
        ("argmax_only_double", "double", 11),
    ],
)
def test_vmap_of_derivatives(name: str, dtype: str, opset: int) -> None:
    vmap_derivatives(next(c for c in CASES if c.name == name), dtype, opset)


def test_batch_rules_registered_at_every_since_version() -> None:
    collect()
    for op in (*ZERO, "OneHot"):
        versions = _schema_versions(op)
        assert batch_rules.oldest_version("", op) == versions[0], (op, versions)
        for v in versions:
            assert batch_rules.lookup("", op, v) is not None, (op, v)


SHAPE_ATTRS = ["", "<start = 1>", "<start = -2>", "<start = -9>", "<end = -1>", "<end = 9>"]
SHAPE_ATTRS += ["<start = 1, end = 2>", "<start = 2, end = 1>", "<start = -1, end = 3>"]


@pytest.mark.parametrize("dims", ["N, 3, M", "2, 3, 4"])
@pytest.mark.parametrize(
    ("opset", "attrs"),
    [(11, ""), (13, "")] + [(o, a) for o in (15, 21) for a in SHAPE_ATTRS],
)
def test_shape_is_unbatched(dims: str, opset: int, attrs: str) -> None:
    # One example's shape, not batched (vmap broadcasts it to the outputs); start/end never reach
    # back into the batch axis (start = -9 clamps to the example's first axis).
    # A declared symbolic length is kept (never replaced by the inferred one); a static input
    # declares it unknown, which inference then fills in.
    length = "K" if "N" in dims else "?"
    model = model_at(
        opset, f"g (float[{dims}] X) => (int64[{length}] S) {{ S = Shape {attrs} (X) }}"
    )
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    for in_axes in (0, 1, -1):
        vm = check_vmap(model, {"X": x}, in_axes=in_axes)
    if dims == "2, 3, 4":
        # A constant: the only Shape left computes the batch size.
        assert [n.op_type for n in vm.graph].count("Shape") == 1


@pytest.mark.parametrize("dims", ["[N, 3]", "[2, 3]", ""])
@pytest.mark.parametrize("opset", [11, 13, 18, 21])
def test_size_is_unbatched(dims: str, opset: int) -> None:
    model = model_at(opset, f"g (double{dims} X) => (int64 S) {{ S = Size(X) }}")
    x = np.random.default_rng(0).standard_normal((2, 3) if dims else ())
    check_vmap(model, {"X": np.asarray(x)}, in_axes=0)
    check_vmap(model, {"X": np.asarray(x)}, in_axes=-1)


@pytest.mark.parametrize("opset", [11, 13, 18, 21])
def test_reshape_driven_by_shape_and_size_arithmetic(opset: int) -> None:
    # Shape and Size give one example's sizes, Reshape (another family's rule) puts the batch
    # back: [N, 6] -> [2N, 3] from Shape, and -> [6N/3, 3] from Size.
    model = model_at(
        opset,
        """g (float[N, 6] X) => (float[M, 3] Y, float[K, 3] Z) {
            s = Shape(X)
            c = Constant <value = int64[2] {1, 2}> ()
            d = Constant <value = int64[2] {2, 1}> ()
            h = Div(s, c)
            t = Mul(h, d)
            Y = Reshape(X, t)
            n = Size(X)
            three = Constant <value = int64[1] {3}> ()
            rows = Div(n, three)
            u = Concat <axis = 0> (rows, three)
            Z = Reshape(X, u)
        }""",
    )
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    for in_axes in (0, 1):
        check_vmap(model, {"X": x}, in_axes=in_axes)


@pytest.mark.parametrize(
    ("op", "attrs", "opset"),
    [
        ("ArgMax", "<axis = -1, keepdims = 0>", 11),
        ("ArgMin", "<axis = 1, keepdims = 1>", 11),
        ("ArgMax", "<axis = 0, keepdims = 0, select_last_index = 1>", 12),
        ("ArgMin", "<axis = -3, select_last_index = 1>", 13),
        ("ArgMax", "", 21),
    ],
)
def test_argmax_argmin_axes_and_attributes(op: str, attrs: str, opset: int) -> None:
    model = model_at(opset, f"g (double[2, N, 4] X) => (Y) {{ Y = {op} {attrs} (X) }}")
    rng = np.random.default_rng(1)
    # Ties in every example (small integers): select_last_index decides, and must be kept.
    examples = [{"X": rng.integers(0, 3, (2, 3, 4)).astype(np.float64)} for _ in range(3)]
    check_vmap_examples(model, examples, {"X": 0})
    check_vmap_examples(model, examples, {"X": 2})


@pytest.mark.parametrize(("opset", "axis"), [(11, 1), (11, -1), (11, 0), (13, 1), (13, -2)])
def test_hardmax_axis(opset: int, axis: int) -> None:
    # Before 13 Hardmax flattens at its axis (a row is everything after it); from 13 it works
    # along one axis. onnxruntime's Hardmax is float only.
    model = model_at(
        opset, f"g (float[2, 3, 4] X) => (float[2, 3, 4] Y) {{ Y = Hardmax <axis = {axis}> (X) }}"
    )
    rng = np.random.default_rng(2)
    examples = [{"X": distinct(rng, (2, 3, 4), np.dtype(np.float32))} for _ in range(3)]
    check_vmap_examples(model, examples, {"X": 0})
    check_vmap_examples(model, examples, {"X": 1})


@pytest.mark.parametrize(
    ("opset", "axis", "in_axes"),
    [
        (11, -1, {"I": 0}),
        (11, 0, {"I": 1}),
        (13, 1, {"I": 0, "V": 0}),
        (21, -2, {"V": 0}),
        (21, -3, {"I": 2, "V": 0}),
        (13, 2, {"V": 1}),
    ],
)
def test_onehot_batched_indices_and_values(opset: int, axis: int, in_axes: dict[str, int]) -> None:
    # Every example has its own indices (some out of range: all off) and its own off/on pair.
    # onnxruntime's OneHot has no double values kernel: float only.
    model = model_at(
        opset,
        f"g (int64[2, N] I, float[2] V) => (Y) {{ D = Constant <value = int64 {{4}}> ()\n"
        f" Y = OneHot <axis = {axis}> (I, D, V) }}",
    )
    examples = [
        {"I": np.array([[0, 3, -1], [2, 5, -5]]), "V": np.array([0.0, 1.0], np.float32)},
        {"I": np.array([[1, 1, 2], [-4, 0, 3]]), "V": np.array([-2.0, 3.5], np.float32)},
        {"I": np.array([[3, 2, 1], [0, 0, 4]]), "V": np.array([0.25, -1.0], np.float32)},
    ]
    vm = check_vmap_examples(model, examples, in_axes)
    if "V" in in_axes:
        assert "Where" in {n.op_type for n in vm.graph}


def test_onehot_batched_string_values() -> None:
    # Where picks the values exactly, whatever their type (the mask is int64 then).
    model = model_at(
        13,
        "g (int64[3] I, string[2] V) => (Y) { D = Constant <value = int64 {3}> ()\n"
        " Y = OneHot <axis = 0> (I, D, V) }",
    )
    vm = onnax.vmap(model, in_axes={"I": 0, "V": 0})
    check_model_valid(vm)
    indices = np.array([[0, 2, 1], [1, 1, 0]])
    values = np.array([["off", "on"], ["no", "yes"]], dtype=object)
    got = run(vm, {"I": indices, "V": values})["Y"]
    want = [
        np.where(np.eye(3, dtype=bool)[:, i], v[1], v[0])
        for i, v in zip(indices, values, strict=True)
    ]
    np.testing.assert_array_equal(got, np.stack(want))


@pytest.mark.parametrize(
    ("opset", "shape", "attrs"),
    [
        (11, "N, 4", "<k = 1>"),
        (13, "3, 4", "<k = -1, dtype = 7>"),
        (22, "N, 4", ""),
        (21, "M, N", "<dtype = 6>"),
    ],
)
def test_eyelike_is_shared(opset: int, shape: str, attrs: str) -> None:
    # EyeLike reads only its input's shape: one result for the whole batch (broadcast by vmap at
    # the output), and the batched input itself is not read.
    model = model_at(opset, f"g (float[{shape}] X) => (Y) {{ Y = EyeLike {attrs} (X) }}")
    x = np.random.default_rng(4).standard_normal((3, 4)).astype(np.float32)
    for in_axes in (0, 1, -1):
        vm = check_vmap(model, {"X": x}, in_axes=in_axes)
    eye = next(n for n in vm.graph if n.op_type == "EyeLike")
    assert eye.inputs[0] is not None and not eye.inputs[0].is_graph_input()


# --------------------------------------------------------------------------- vmap refusals
@pytest.mark.parametrize("in_axes", [0, 1])
def test_vmap_refuses_ragged_outputs(in_axes: int) -> None:
    model = model_at(13, "g (float[N, 3] X) => (int64[2, K] Y) { Y = NonZero(X) }")
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes=in_axes)
    msg = str(err.value)
    assert msg.startswith("vmap: ai.onnx::NonZero at opset 13 (the node producing 'Y')")
    assert "input 0 'X'" in msg and "number of nonzero elements" in msg and "ragged" in msg
    assert "Remedy" in msg and "in_axes None" in msg


@pytest.mark.parametrize("batched", ["scores", "max_out"])
def test_vmap_refuses_non_max_suppression(batched: str) -> None:
    model = model_at(
        11,
        "g (float[1, 4, 4] boxes, float[1, 1, 4] scores, int64[1] max_out) => (int64[K, 3] Y) {"
        " Y = NonMaxSuppression(boxes, scores, max_out) }",
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes={batched: 0})
    msg = str(err.value)
    index = 1 if batched == "scores" else 2
    assert "ai.onnx::NonMaxSuppression at opset 11" in msg and f"input {index} '{batched}'" in msg
    assert "number of selected boxes" in msg and "Remedy" in msg


@pytest.mark.parametrize("in_axes", [{"D": 0}, {"I": 0, "D": 0}])
def test_vmap_refuses_batched_onehot_depth(in_axes: dict[str, int]) -> None:
    case = next(c for c in CASES if c.name == "onehot_values")
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(case.model("float", 13), in_axes=in_axes)
    msg = str(err.value)
    assert msg.startswith("vmap: ai.onnx::OneHot at opset 13 (the node producing 'h')")
    assert "depth from input 1 'D'" in msg and "different shapes" in msg
    assert "Remedy" in msg and "constant" in msg and "in_axes None" in msg


@pytest.mark.parametrize(
    ("opset", "attrs"), [(13, ""), (15, "<start = -2>"), (21, "<start = 1, end = -9>")]
)
def test_shape_of_unknown_rank(opset: int, attrs: str) -> None:
    # A reshape to a run-time shape of run-time length: the rank of r is unknown to the rule.
    model = model_at(
        opset,
        f"g (float[6] X, int64[K] T) => (int64[M] S) {{ r = Reshape(X, T)\n S = Shape {attrs} (r) }}",
    )
    x = np.arange(6, dtype=np.float32)
    check_vmap(model, {"X": x, "T": np.array([2, 3])}, in_axes={"X": 0})
    check_vmap(model, {"X": x, "T": np.array([3, 1, 2])}, in_axes={"X": 0})


def test_derivatives_of_vmapped_onehot_with_batched_values() -> None:
    # The Where/Gather formulation is linear in the values: jvp and vjp of the vmapped model.
    model = next(c for c in CASES if c.name == "onehot_values_const_depth").model("float", 13)
    vm = onnax.vmap(model, in_axes={"I": 0, "V": 0, "X": None})
    rng = np.random.default_rng(10)
    feeds = {
        "I": np.array([[0, 3, -1], [1, 2, 7], [3, 3, 0]]),
        "V": rng.standard_normal((3, 2)).astype(np.float32),
        "X": rng.standard_normal((3, 4)).astype(np.float32),
    }
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


# Operators whose results are integers or piecewise constant in their float inputs: a zero
# derivative, checked against finite differences (which see zero away from the jumps), and
# their batch rules against a loop. BitCast-26 and MelWeightMatrix-17 have no double kernel in
# onnxruntime for these inputs: float only.
def _ml_model(text: str, opset: int = 26, ml: int = 5) -> ir.Model:
    return ir.from_onnx_text(
        f'<ir_version: 10, opset_import: ["" : {opset}, "ai.onnx.ml" : {ml}]>\n' + text
    )


PIECEWISE_CONSTANT = {
    "bitcast_to_int32": (
        "g (float[N, 3] X) => (int32[N, 3] Y, float[N, 3] Z) {\n"
        " Y = BitCast<to = 6>(X)\n Z = Mul(X, X) }",
        {"X": lambda rng: rng.standard_normal((2, 3)).astype(np.float32)},
    ),
    "binarizer": (
        "g (float[N, 4] X) => (float[N, 4] Y) {\n Y = ai.onnx.ml.Binarizer<threshold = 0.5>(X) }",
        {"X": lambda rng: (rng.uniform(-2, 2, (3, 4)) + 0.0).astype(np.float32)},
    ),
    "tree_ensemble": (
        "g (double[N, 2] X) => (double[N, 1] Y) {\n"
        " Y = ai.onnx.ml.TreeEnsemble<aggregate_function = 1, post_transform = 0, n_targets = 1,\n"
        "   tree_roots = [0], nodes_modes = uint8[1] {0}, nodes_featureids = [0],\n"
        "   nodes_splits = double[1] {0.25}, nodes_truenodeids = [0],\n"
        "   nodes_trueleafs = [1], nodes_falsenodeids = [1], nodes_falseleafs = [1],\n"
        "   leaf_targetids = [0, 0], leaf_weights = double[2] {1.5, -2.0}>(X) }",
        {"X": lambda rng: rng.uniform(-2, 2, (3, 2))},
    ),
    "mel_weight_matrix": (
        "g (float lo, float hi) => (float[9, 8] W) {\n"
        " n = Constant<value = int64 {8}>()\n d = Constant<value = int64 {16}>()\n"
        " r = Constant<value = int64 {8192}>()\n W = MelWeightMatrix(n, d, r, lo, hi) }",
        {
            "lo": lambda rng: np.array(30.0, np.float32),
            "hi": lambda rng: np.array(3500.0, np.float32),
        },
    ),
}


def _feeds(fills: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: np.asarray(f(rng)) for k, f in fills.items()}


@pytest.mark.parametrize("name", sorted(PIECEWISE_CONSTANT))
def test_piecewise_constant_ops_have_a_zero_derivative(name: str) -> None:
    text, fills = PIECEWISE_CONSTANT[name]
    model = _ml_model(text)
    feeds = _feeds(fills)
    jm = check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_adjoint(model, feeds)
    # The tangents of the piecewise-constant outputs are exactly zero (not just small).
    n_in, n_out = len(model.graph.inputs), len(model.graph.outputs)
    float_outs = [
        i
        for i, v in enumerate(model.graph.outputs)
        if v.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE)
    ]
    rng = np.random.default_rng(5)
    tangents = {
        v.name: rng.standard_normal(feeds[x.name].shape).astype(feeds[x.name].dtype)
        for x, v in zip(model.graph.inputs, jm.graph.inputs[n_in:], strict=False)
    }
    out = run(jm, {**feeds, **tangents})
    tangent_names = [v.name for v in jm.graph.outputs[n_out:]]
    if name != "bitcast_to_int32":  # there Z = X * X has a real tangent
        for t in tangent_names[: len(float_outs)]:
            assert not np.any(out[t]), (name, t)


@pytest.mark.parametrize("name", ["bitcast_to_int32", "binarizer", "tree_ensemble"])
def test_vmap_of_piecewise_constant_ops(name: str) -> None:
    text, fills = PIECEWISE_CONSTANT[name]
    model = _ml_model(text)
    check_vmap(model, _feeds(fills), in_axes=0, out_axes=0)
    check_vmap(model, _feeds(fills), in_axes=1, out_axes=-1)


@pytest.mark.parametrize("op", ["QLinearMatMul"])
def test_quantized_matmul_has_a_zero_derivative(op: str) -> None:
    # The scales are float inputs, the result is an integer: nothing to differentiate, but the
    # derivative reaches the node and must flow past it (the float output Z = a_scale * 2 shows
    # the selection is honoured).
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 21]>\n'
        "g (uint8[2, 3] a, float a_scale, uint8[3, 2] b) => (uint8[2, 2] y, float z) {\n"
        " zp = Constant<value = uint8 {0}>()\n s = Constant<value = float {0.5}>()\n"
        " y = QLinearMatMul(a, a_scale, zp, b, s, zp, s, zp)\n z = Add(a_scale, a_scale) }"
    )
    feeds = {
        "a": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "a_scale": np.array(0.1, np.float32),
        "b": np.arange(6, dtype=np.uint8).reshape(3, 2),
    }
    check_jvp(model, feeds)
    check_vjp(model, feeds)
    check_adjoint(model, feeds)


QLINEAR_MATMUL = (
    "g (uint8[N, 2, 3] a, float a_scale, uint8[3, 2] b) => (uint8[N, 2, 2] y) {\n"
    " zp = Constant<value = uint8 {0}>()\n s = Constant<value = float {0.5}>()\n"
    " y = QLinearMatMul(a, a_scale, zp, b, s, zp, s, zp) }"
)


def test_vmap_qlinear_matmul() -> None:
    model = ir.from_onnx_text('<ir_version: 10, opset_import: ["" : 21]>\n' + QLINEAR_MATMUL)
    rng = np.random.default_rng(0)
    feeds = {
        "a": rng.integers(0, 20, (2, 2, 3)).astype(np.uint8),
        "a_scale": np.array(0.1, np.float32),
        "b": rng.integers(0, 20, (3, 2)).astype(np.uint8),
    }
    check_vmap(model, feeds, in_axes=(0, None, 0), out_axes=0)
    check_vmap(model, feeds, in_axes=(None, None, 1), out_axes=-1)
    with pytest.raises(
        UnsupportedOperatorError, match=r"(?s)ai\.onnx::QLinearMatMul.*'a_scale'.*Remedy"
    ):
        onnax.vmap(model, in_axes=(None, 0, None))


def test_vmap_qlinear_conv() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 10]>\n'
        "g (uint8[1, 1, 4, 4] x, uint8[1, 1, 2, 2] w) => (uint8[1, 1, 3, 3] y) {\n"
        " s = Constant<value = float {0.25}>()\n zp = Constant<value = uint8 {3}>()\n"
        " y = QLinearConv(x, s, zp, w, s, zp, s, zp) }"
    )
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.integers(0, 30, (1, 1, 4, 4)).astype(np.uint8),
        "w": rng.integers(0, 9, (1, 1, 2, 2)).astype(np.uint8),
    }
    check_vmap(model, feeds, in_axes=(0, None), out_axes=0)
    with pytest.raises(UnsupportedOperatorError, match=r"(?s)ai\.onnx::QLinearConv.*'w'.*Remedy"):
        onnax.vmap(model, in_axes=(None, 0))


@pytest.mark.parametrize(
    ("n_mel", "dft", "rates", "out_type"),
    [(8, 16, (8192,), 1), (13, 256, (16000, 22050), 11), (5, 64, (8000, 16000), 7)],
)
def test_vmap_mel_weight_matrix(
    n_mel: int, dft: int, rates: tuple[int, ...], out_type: int
) -> None:
    # Batched band edges and sample rates move the filters between integer bins: one matrix per
    # example, equal to the kernel's (exactly, integer output included). Float edges only:
    # onnxruntime has no kernel for double ones.
    model = _ml_model(
        "g (int64 n, int64 d, int64 r, float lo, float hi) => (W) {\n"
        f" W = MelWeightMatrix<output_datatype = {out_type}>(n, d, r, lo, hi) }}",
        opset=17,
    )
    rng = np.random.default_rng(n_mel)
    batch = 6
    rate = rng.choice(rates, batch).astype(np.int64)
    lo = (rng.uniform(0.0, 0.2, batch) * rate).astype(np.float32)
    hi = (rng.uniform(0.25, 0.49, batch) * rate).astype(np.float32)
    shared = {"n": np.array(n_mel, np.int64), "d": np.array(dft, np.int64)}
    want = np.stack(
        [
            run(model, {**shared, "r": rate[b, ...], "lo": lo[b, ...], "hi": hi[b, ...]})["W"]
            for b in range(batch)
        ]
    )
    vm = onnax.vmap(model, in_axes={"r": 0, "lo": 0, "hi": 0})
    check_model_valid(vm)
    got = run(vm, {**shared, "r": rate, "lo": lo, "hi": hi})["W"]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # The matrix is not constant over the batch: the test sees filters move.
    assert any(not np.array_equal(want[0], w) for w in want[1:])
    # num_mel_bins and dft_length set the matrix's shape: refused.
    for name in ("n", "d"):
        with pytest.raises(
            UnsupportedOperatorError,
            match=rf"(?s)ai\.onnx::MelWeightMatrix.*'{name}'.*shape of the weight matrix.*Remedy",
        ):
            onnax.vmap(model, in_axes={name: 0, "lo": 0})
