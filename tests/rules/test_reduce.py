"""Reductions (rules in onnax.rules.reduce; Softmax and LogSoftmax are in test_softmax).

Every reduction is checked on a ``[N, 2, 3]`` input (N symbolic) with the axes given the ways the
schemas allow: as an attribute (opsets 11, 13, 17; ReduceSum only before 13), and from 13
(ReduceSum) or 18 (the rest) as a Constant node, an initializer, or a run-time graph input; with
keepdims 0 and 1; axes absent (reduce all), single, several, negative, including the symbolic
axis; and noop_with_empty_axes with absent and empty axes. onnxruntime 1.32 has float and double
kernels for all of them, so both dtypes are tested everywhere.

vmap is checked on the same cases (rank-0 results not lifted), each case at each of its opsets
in float or double alternately, plus rank-0 inputs, values of unknown rank and the refusal of
batched axes; vmap of the jvp and vjp models skips while another module's batch rule is missing.
Some cases chain a Softmax with reductions; the second-order and vmap-of-derivatives checks
serve test_softmax too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import (
    Case,
    away_from_zero,
    case_id,
    distinct,
    normal,
    parametrize,
    positive,
    run_case,
    run_vmap_case,
)
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_jvp, check_vmap, run

Fill = Callable[[np.random.Generator, tuple[int, ...], np.dtype], np.ndarray]

DIMS: list[int | str] = ["N", 2, 3]


def moderate(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """|x| in [0.6, 1.4] with random signs: products of many elements stay near 1, and away from 0."""
    return (rng.uniform(0.6, 1.4, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


# Fills keeping finite differences off kinks (|x| at 0, ties of max/min) and inside domains.
FILLS: dict[str, Fill] = {
    "ReduceSum": normal,
    "ReduceMean": normal,
    "ReduceMax": distinct,
    "ReduceMin": distinct,
    "ReduceProd": moderate,
    "ReduceSumSquare": normal,
    "ReduceL1": away_from_zero,
    "ReduceL2": normal,
    "ReduceLogSum": positive,
    "ReduceLogSumExp": normal,
}
REDUCTIONS = tuple(FILLS)


def _out_dims(axes: Sequence[int] | None, keepdims: int, noop: int) -> list[int | str]:
    if axes is None or not axes:
        if noop:
            return list(DIMS)
        axes = range(len(DIMS))
    reduced = {a % len(DIMS) for a in axes}
    if keepdims:
        return [1 if i in reduced else d for i, d in enumerate(DIMS)]
    return [d for i, d in enumerate(DIMS) if i not in reduced]


def _shape(dims: Sequence[int | str]) -> str:
    return "{T}[" + ", ".join(str(d) for d in dims) + "]" if dims else "{T}"


def reduction(
    op: str,
    form: str,
    axes: Sequence[int] | None,
    keepdims: int,
    opsets: Sequence[int],
    noop: int = 0,
    lift: bool = True,
) -> Case:
    """A one-node reduction case.

    Args:
        form: "attr" (axes attribute), "const" (Constant node), "init" (initializer) or "input"
            (a run-time graph input, fixed to ``axes``).
        lift: Lift a rank-0 result to [1] (for vjp, see below); vmap needs no lifting.
    """
    attrs = [f"keepdims={keepdims}"]
    if noop:
        attrs.append(f"noop_with_empty_axes={noop}")
    ins, body, inits, fixed = "{T}[N, 2, 3] X", "", "", {}
    axes_text = "" if axes is None else ", ".join(str(a) for a in axes)
    args = "X"
    if form == "attr":
        if axes is not None:
            attrs.append(f"axes=[{axes_text}]")
    elif axes is not None or form == "input":
        assert axes is not None
        args = "X, A"
        if form == "const":
            body = f"A = Constant<value = int64[{len(axes)}] {{{axes_text}}}>()\n "
        elif form == "init":
            inits = f" <int64[{len(axes)}] A = {{{axes_text}}}>"
        else:
            ins += f", int64[{len(axes)}] A"
            fixed = {"A": np.array(list(axes), np.int64)}
    out_dims = _out_dims(axes, keepdims, noop)
    node = f"Y = {op}<{', '.join(attrs)}>({args})"
    if not out_dims and lift:
        # VjpPass drops the shape of a rank-0 seed (`if y.shape` is False for Shape([])), which
        # onnx.checker rejects; until that is fixed in core, lift rank-0 results to [1].
        ins += ", {T}[1] Z"
        fixed = {**fixed, "Z": np.zeros(1)}
        node = f"R = {op}<{', '.join(attrs)}>({args})\n Y = Add(R, Z)"
        out_dims = [1]
    out = _shape(out_dims)
    text = f"g ({ins}) => ({out} Y){inits} {{ {body}{node} }}"
    name = f"{op}-{form}-{axes_text or 'none'}-k{keepdims}-n{noop}".replace(" ", "")
    return Case(name, text, opsets=opsets, fill={"X": FILLS[op]}, fixed=fixed, inputs=["X"])


def reduction_cases(op: str, lift: bool = True) -> list[Case]:
    moved = 13 if op == "ReduceSum" else 18
    attr_opsets = (11, 12) if op == "ReduceSum" else (11, 13, 17)
    late = (13, 18, 21) if op == "ReduceSum" else (18, 21)
    a, b = late[0], late[-1]
    return [
        # the attribute form
        reduction(op, "attr", [1], 0, attr_opsets, lift=lift),
        reduction(op, "attr", [-1, 0], 1, attr_opsets[:1] + attr_opsets[-1:], lift=lift),
        reduction(op, "attr", None, 0, attr_opsets[-1:], lift=lift),
        reduction(op, "attr", [0, 2], 0, attr_opsets[:1], lift=lift),
        # the input forms
        reduction(op, "const", [-1, 0], 0, late, lift=lift),
        reduction(op, "init", [1], 1, (a,), lift=lift),
        reduction(
            op, "attr", None, 1, (b,), noop=1, lift=lift
        ),  # absent axes with noop: the identity
        reduction(op, "attr", None, 1, (a,), lift=lift),  # absent axes: everything
        reduction(op, "const", [], 0, (b,), lift=lift),  # empty axes, no noop: everything
        reduction(op, "input", [-1], 0, (moved,), lift=lift),
        reduction(op, "input", [0, 2], 1, (b,), lift=lift),
        reduction(
            op, "input", [], 0, (b,), noop=1, lift=lift
        ),  # empty run-time axes with noop: identity
        reduction(op, "input", [], 1, (a,), lift=lift),  # empty run-time axes: everything
    ]


CASES = [c for op in REDUCTIONS for c in reduction_cases(op)]

# A slice with one zero and a slice with two: ReduceProd's derivative there is the product of the
# others (non-zero for the lone zero, zero otherwise). The product is smooth, so differences hold.
PROD_ZEROS = np.array(
    [
        [[0.0, 1.2, -0.7], [0.9, 1.1, 0.8]],
        [[0.0, 0.0, 1.3], [-1.2, 0.7, 1.0]],
        [[0.8, -0.9, 1.1], [1.3, 0.6, -0.8]],
    ]
)
CASES += [
    Case(
        "ReduceProd-zeros",
        "g ({T}[N, 2, 3] X) => ({T}[N, 2] Y) { Y = ReduceProd<axes=[2], keepdims=0>(X) }",
        opsets=(11, 13),
        fixed={"X": PROD_ZEROS},
    ),
    Case(
        "ReduceProd-zeros-input",
        "g ({T}[N, 2, 3] X, int64[1] A) => ({T}[N, 2, 1] Y) { Y = ReduceProd<keepdims=1>(X, A) }",
        opsets=(18,),
        fixed={"X": PROD_ZEROS, "A": np.array([-1], np.int64)},
        inputs=["X"],
    ),
]


# A chain where a reduction feeds another, so that transposes meet non-input tangents.
CASES += [
    Case(
        "chain-mean-logsumexp",
        "g ({T}[N, 2, 3] X) => ({T}[2] Y) { S = Softmax<axis=-1>(X)\n M = ReduceMean<axes=[0], keepdims=0>(S)\n"
        " Y = ReduceLogSumExp<axes=[1], keepdims=0>(M) }",
        opsets=(13, 17),
    ),
    Case(
        "chain-mean-input",
        "g ({T}[N, 2, 3] X, int64[1] A, int64[1] B) => ({T}[2] Y) { S = Softmax<axis=0>(X)\n"
        " M = ReduceMean<keepdims=0>(S, A)\n Y = ReduceSum<keepdims=0>(M, B) }",
        opsets=(18,),
        fixed={"A": np.array([0], np.int64), "B": np.array([-1], np.int64)},
        inputs=["X"],
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize(("dtype", "opset"), [("float", 18), ("double", 21)])
def test_runtime_empty_axes_to_scalar(op: str, dtype: str, opset: int) -> None:
    """Empty run-time axes without noop reduce everything to a rank-0 result.

    Checked with jvp against differences and the adjoint identity only: check_vjp's full
    onnx.checker rejects the vjp model while VjpPass drops the shape of rank-0 seeds, and lifting
    the result to [1] (as ``reduction`` does) needs the unknown shape of the reduction's output.
    """
    case = Case(
        "scalar",
        f"g ({{T}}[N, 2, 3] X, int64[0] A) => ({{T}} Y) {{ Y = {op}<keepdims=0>(X, A) }}",
        fill={"X": FILLS[op]},
        fixed={"A": np.zeros(0, np.int64)},
        inputs=["X"],
    )
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    check_jvp(model, feeds, ["X"])
    check_adjoint(model, feeds, ["X"])


# ------------------------------------------------------------------------------- second order
# jvp of the vjp model (a Hessian-vector product) against its differences: the transposes' own
# operators (Unsqueeze, Expand, Reshape, ScatterElements...) must differentiate too.
SECOND_ORDER = [
    ("ReduceSum-attr-1-k0-n0", 11),
    ("ReduceSum-input--1-k0-n0", 13),
    ("ReduceMean-attr--1,0-k1-n0", 17),
    ("ReduceMean-input-0,2-k1-n0", 21),
    ("ReduceMax-const--1,0-k0-n0", 18),
    ("ReduceMin-input--1-k0-n0", 18),
    ("ReduceProd-attr-0,2-k0-n0", 11),
    ("ReduceProd-zeros", 13),
    ("ReduceProd-zeros-input", 18),
    ("ReduceSumSquare-init-1-k1-n0", 18),
    ("ReduceL1-attr-1-k0-n0", 13),
    ("ReduceL2-const--1,0-k0-n0", 21),
    ("ReduceLogSum-attr--1,0-k1-n0", 11),
    ("ReduceLogSumExp-input--1-k0-n0", 18),
    ("chain-mean-input", 18),
]


def check_second_order(case: Case, opset: int) -> None:
    """jvp of the vjp model in X (a Hessian-vector product) against its differences."""
    model = case.model("double", opset)
    feeds = case.feeds(model)
    vm = onnax.vjp(model, ["X"])
    rng = np.random.default_rng(3)
    for seed in vm.graph.inputs[len(model.graph.inputs) :]:
        shape = [d if isinstance(d, int) else 3 for d in seed.shape.dims]
        feeds[seed.name] = rng.standard_normal(shape)
    check_jvp(vm, feeds, ["X"])


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER, ids=[f"{n}-{o}" for n, o in SECOND_ORDER])
def test_second_order(name: str, opset: int) -> None:
    check_second_order(next(c for c in CASES if c.name == name), opset)


# ------------------------------------------------------------------------------- ties and kinks
TIES = np.array([[[1.0, 3.0, 3.0], [-2.0, -2.0, -2.0]], [[0.5, 0.5, -1.0], [2.0, 1.0, 2.0]]])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize(("dtype", "opset"), [("float", 13), ("double", 18)])
def test_extreme_ties_split_equally(op: str, dtype: str, opset: int) -> None:
    """At ties finite differences are invalid; check the adjoint identity and the equal split."""
    axes = "<axes=[2], keepdims=0>" if opset < 18 else "<keepdims=0>"
    args = "X" if opset < 18 else "X, A"
    body = "" if opset < 18 else "A = Constant<value = int64[1] {2}>()\n "
    case = Case(
        "ties",
        f"g ({{T}}[N, 2, 3] X) => ({{T}}[N, 2] Y) {{ {body}Y = {op}{axes}({args}) }}",
        fixed={"X": TIES},
    )
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    check_adjoint(model, feeds)
    jm = onnax.jvp(model)
    t = np.arange(TIES.size, dtype=feeds["X"].dtype).reshape(TIES.shape)
    got = run(jm, {**feeds, jm.graph.inputs[1].name: t})[jm.graph.outputs[1].name]
    x = TIES
    extreme = x.max(axis=2, keepdims=True) if op == "ReduceMax" else x.min(axis=2, keepdims=True)
    mask = x == extreme
    np.testing.assert_allclose(got, (mask * t).sum(axis=2) / mask.sum(axis=2), rtol=1e-6)


@pytest.mark.parametrize("opset", [13, 18])
def test_l2_zero_slice_has_zero_tangent(opset: int) -> None:
    """ReduceL2 at a zero slice (a kink): the tangent is 0, not NaN."""
    axes = "<axes=[1], keepdims=0>" if opset < 18 else "<keepdims=0>"
    args = "X" if opset < 18 else "X, A"
    body = "" if opset < 18 else "A = Constant<value = int64[1] {1}>()\n "
    case = Case("l2", f"g ({{T}}[N, 3] X) => ({{T}}[N] Y) {{ {body}Y = ReduceL2{axes}({args}) }}")
    model = case.model("double", opset)
    x = np.array([[0.0, 0.0, 0.0], [3.0, 0.0, -4.0]])
    t = np.array([[1.0, -2.0, 0.5], [1.0, 1.0, 1.0]])
    jm = onnax.jvp(model)
    got = run(jm, {"X": x, jm.graph.inputs[1].name: t})[jm.graph.outputs[1].name]
    np.testing.assert_allclose(got, [0.0, (3.0 - 4.0) / 5.0])
    vm = onnax.vjp(model)
    ct = run(vm, {"X": x, vm.graph.inputs[1].name: np.array([1.0, 1.0])})[vm.graph.outputs[1].name]
    assert np.all(np.isfinite(ct))
    np.testing.assert_allclose(ct[1], [0.6, 0.0, -0.8])


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceSum", "ReduceSumSquare"])
def test_reduction_of_an_empty_set_has_a_zero_tangent(op: str) -> None:
    """The reduction of an empty slice is a constant: its tangent is 0, also through a Sqrt
    (whose coefficient is infinite at 0), as in onnx's test_reduce_l2_empty_set_expanded."""
    case = Case(
        "empty",
        "g ({T}[2, 0, 4] X, int64[1] A) => ({T}[2, 1, 4] Y) {\n"
        f" S = {op}<keepdims=1>(X, A)\n Y = Sqrt(S) }}",
        opsets=(18,),
    )
    for dtype, np_dtype in (("float", np.float32), ("double", np.float64)):
        model = case.model(dtype, 18)
        feeds = {"X": np.zeros((2, 0, 4), np_dtype), "A": np.array([1])}
        jm = onnax.jvp(model)
        got = run(jm, {**feeds, jm.graph.inputs[2].name: feeds["X"]})[jm.graph.outputs[1].name]
        assert got.shape == (2, 1, 4) and not np.any(got), got
        vm = onnax.vjp(model)
        seed = np.ones((2, 1, 4), np_dtype)
        ct = run(vm, {**feeds, vm.graph.inputs[2].name: seed})[vm.graph.outputs[1].name]
        assert ct.shape == (2, 0, 4)


def test_vmap_after_a_reduction_over_run_time_axes() -> None:
    """Run-time axes (computed from the input's rank, as expanded RMSNormalization does) leave
    shape inference without the rank of the reduced value; kept dimensions keep it, and the
    batch rules write it down so that the broadcasting nodes that follow can align operands."""
    model = Case(
        "rms",
        "g ({T}[N, 4] X) => ({T}[N, 4] Y) {\n"
        " s = Shape(X)\n r = Size(s)\n one = Constant<value = int64 {1}>()\n"
        " axes = Range(one, r, one)\n sq = Mul(X, X)\n m = ReduceMean<keepdims = 1>(sq, axes)\n"
        " e = Constant<value = float {0.5}>()\n ec = CastLike(e, X)\n a = Add(m, ec)\n"
        " rms = Sqrt(a)\n Y = Div(X, rms) }",
    ).model("float", 18)
    feeds = {"X": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    check_vmap(model, feeds, in_axes=0, out_axes=0)
    check_vmap(model, feeds, in_axes=1, out_axes=1)


# ------------------------------------------------------------------------------- errors
# ------------------------------------------------------------------------------- vmap
# vmap needs no lifting of rank-0 results: the reduction cases as they are, then the others.
_REDUCTION_NAMES = {c.name for op in REDUCTIONS for c in reduction_cases(op)}
VMAP_CASES = [c for op in REDUCTIONS for c in reduction_cases(op, lift=False)]
VMAP_CASES += [c for c in CASES if c.name not in _REDUCTION_NAMES]
VMAP_CASES += [
    # One element per example: reduced along an inserted size-1 axis.
    Case("rank0-attr", "g ({T} X) => ({T} Y) { Y = ReduceLogSumExp<keepdims=1>(X) }", opsets=(11,)),
    Case("rank0-none", "g ({T} X) => ({T} Y) { Y = ReduceSumSquare<keepdims=0>(X) }", opsets=(18,)),
    Case(
        "rank0-input",
        "g ({T} X, int64[0] A) => ({T} Y) { Y = ReduceL1<keepdims=0>(X, A) }",
        opsets=(18,),
        fixed={"A": np.zeros(0, np.int64)},
    ),
    # Reductions of a value of unknown rank (the output of run-time axes without keepdims): static
    # negative axes, everything (static and empty run-time axes), softmax along a negative axis.
    Case(
        "unknown-rank",
        "g ({T}[N, 2, 3] X, int64[1] A, int64[0] E) => ({T}[N] Y, {T} S, {T} T, {T}[N, 2] P) {"
        " M = ReduceSum<keepdims=0>(X, A)\n L = Constant<value = int64[1] {-1}>()\n"
        " Y = ReduceMax<keepdims=0>(M, L)\n"
        " S = ReduceProd<keepdims=0>(M)\n T = ReduceL2<keepdims=0>(M, E)\n"
        " P = LogSoftmax<axis=-1>(M) }",
        opsets=(18,),
        fixed={"A": np.array([1], np.int64), "E": np.zeros(0, np.int64)},
    ),
    # The same at opset 13, where the other reductions still take static axes (attributes).
    Case(
        "unknown-rank-attr",
        "g ({T}[N, 2, 3] X, int64[1] A) => ({T}[N] Y, {T} S, {T}[1, 1] K, {T}[N, 3] P) {"
        " M = ReduceSum<keepdims=0>(X, A)\n Y = ReduceMin<axes=[-1], keepdims=0>(M)\n"
        " S = ReduceLogSumExp<keepdims=0>(M)\n K = ReduceMean<keepdims=1>(M)\n"
        " P = Softmax<axis=1>(M) }",
        opsets=(13,),
        fixed={"A": np.array([1], np.int64)},
    ),
]


def _runtime_int_inputs(model: ir.Model) -> list[str]:
    """Graph inputs holding run-time axes (ints that are neither initializers nor constants)."""
    g = model.graph
    return [
        v.name
        for v in g.inputs
        if v.name not in g.initializers and v.dtype == ir.DataType.INT64 and v.name is not None
    ]


def _vmap_params() -> list[tuple[Case, str, int]]:
    """Each case at each of its opsets, in float and double alternately (both over the family)."""
    params, k = [], 0
    for c in VMAP_CASES:
        for o in c.opsets:
            params.append((c, c.dtypes[k % len(c.dtypes)], o))
            k += 1
    return params


def _check_vmap_rank0(model: ir.Model, feeds: dict[str, np.ndarray]) -> None:
    """check_vmap for a rank-0 X (check_vmap's perturbed examples are numpy scalars, which
    onnxruntime refuses): vmap over X against a loop of single runs, stacked."""
    xs = np.asarray(feeds["X"]) + np.array([0.0, 0.3, -0.2], feeds["X"].dtype)
    vm = onnax.vmap(model, in_axes={"X": 0})
    got = run(vm, {**feeds, "X": xs})
    for out in model.graph.outputs:
        want = np.stack([run(model, {**feeds, "X": np.asarray(x)})[out.name] for x in xs])
        np.testing.assert_allclose(got[out.name], want, rtol=1e-5)


@pytest.mark.parametrize(("case", "dtype", "opset"), _vmap_params(), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    model = case.model(dtype, opset)
    if model.graph.inputs[0].shape.rank() == 0:
        _check_vmap_rank0(model, case.feeds(model))
        return
    axes_inputs = _runtime_int_inputs(model)
    if not axes_inputs:
        run_vmap_case(case, dtype, opset)
        return
    # Run-time axes shared by the examples: only the data is batched (at 0, 1 and -1).
    feeds = case.feeds(model)
    for axis in (0, 1, -1):
        check_vmap(model, feeds, in_axes={"X": axis})
    check_vmap(model, feeds, in_axes={"X": 0}, out_axes=-1)


@pytest.mark.parametrize("in_axis", [0, -1])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL2"])
def test_vmap_refuses_batched_axes(op: str, in_axis: int) -> None:
    """Axes that depend on batched data could differ per example: refused, naming the input."""
    case = reduction(op, "input", [1], 0, (18,))
    model = case.model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model, in_axes={"X": 0, "A": in_axis})
    message = str(err.value)
    assert f"ai.onnx::{op}" in message and "at opset 18" in message
    assert "'Y'" in message and "input 1 'A'" in message and "axes" in message
    assert "in_axes None" in message


# vmap of the jvp and vjp models (tangents and seeds batched alongside the primal inputs, or
# alone: a Jacobian's rows). The tangent and transpose rules emit Unsqueeze, Expand, Reshape,
# ScatterElements, ...: operators whose batch rules live in other modules.
DERIVATIVES = [
    ("ReduceSum-attr-1-k0-n0", 11),
    ("ReduceMean-input-0,2-k1-n0", 21),
    ("ReduceMax-const--1,0-k0-n0", 18),
    ("ReduceProd-zeros-input", 18),
    ("ReduceL2-init-1-k1-n0", 18),
    ("ReduceLogSumExp-attr--1,0-k1-n0", 13),
    ("chain-mean-logsumexp", 17),
]


def check_vmap_of_derivatives(case: Case, opset: int, mode: str) -> None:
    """vmap of the jvp/vjp model in X, everything batched but run-time axes, then the
    tangents/seeds alone."""
    model = case.model("double", opset)
    feeds = case.feeds(model)
    derived = onnax.jvp(model, ["X"]) if mode == "jvp" else onnax.vjp(model, ["X"])
    rng = np.random.default_rng(5)
    extra = derived.graph.inputs[len(model.graph.inputs) :]
    for v in extra:
        shape = [d if isinstance(d, int) else 3 for d in v.shape.dims]
        feeds[v.name] = rng.standard_normal(shape)
    shared_axes = {v.name: None for v in derived.graph.inputs if v.dtype == ir.DataType.INT64}
    # Everything batched but run-time axes; then only the tangents/seeds.
    check_vmap(derived, feeds, in_axes={**{v.name: 0 for v in derived.graph.inputs}, **shared_axes})
    check_vmap(derived, feeds, in_axes={v.name: -1 for v in extra})


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(("name", "opset"), DERIVATIVES, ids=[f"{n}-{o}" for n, o in DERIVATIVES])
def test_vmap_of_derivatives(name: str, opset: int, mode: str) -> None:
    check_vmap_of_derivatives(next(c for c in VMAP_CASES if c.name == name), opset, mode)
