"""Softmax and LogSoftmax (rules in onnax.rules.softmax).

Each is checked along one axis given the ways the schemas allow: before opset 13 normalised over
the flattened block axis..rank-1 (default axis 1, negative axes), from 13 along one axis
(default -1, negative, the symbolic axis). onnxruntime 1.32 has float and double kernels for
both, so both dtypes are tested everywhere. A fully masked row (all -inf) keeps its derivatives
finite; a flattening softmax of unknown rank is refused.

vmap is checked on the same cases, each at each of its opsets in float or double alternately,
and on the jvp and vjp models of a selection (with test_reduce's checks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_adjoint, check_jvp, check_vjp, run
from rules.test_reduce import check_second_order, check_vmap_of_derivatives

CASES: list[Case] = []


def softmax(op: str, axis: int | None, opsets: Sequence[int], dims: str = "N, 3, 4") -> Case:
    attr = "" if axis is None else f"<axis={axis}>"
    text = f"g ({{T}}[{dims}] X) => ({{T}}[{dims}] Y) {{ Y = {op}{attr}(X) }}"
    return Case(f"{op}-axis{axis}-{dims.replace(', ', 'x')}", text, opsets=opsets)


for _op in ("Softmax", "LogSoftmax"):
    CASES += [
        # Before 13: normalised over the flattened block axis..rank-1.
        softmax(_op, 1, (11, 12)),
        softmax(_op, None, (11,)),  # default axis 1
        softmax(_op, -2, (12,)),
        # From 13: along one axis (default -1).
        softmax(_op, 1, (13, 18, 21)),
        softmax(_op, -1, (13, 21)),
        softmax(_op, None, (18,)),
        softmax(_op, 0, (21,)),  # along the symbolic axis
    ]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


# ------------------------------------------------------------------------------- second order
SECOND_ORDER = [
    ("Softmax-axis1-Nx3x4", 11),
    ("LogSoftmax-axis-1-Nx3x4", 13),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER, ids=[f"{n}-{o}" for n, o in SECOND_ORDER])
def test_second_order(name: str, opset: int) -> None:
    check_second_order(next(c for c in CASES if c.name == name), opset)


# ------------------------------------------------------------------------------- masked rows
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype", ["float", "double"])
def test_fully_masked_softmax_row_gives_zero_not_nan(op: str, dtype: str) -> None:
    """A row that is entirely -inf (attention with every key masked) has a NaN softmax, which the
    model then discards with a Where; the derivatives must stay finite (0 there) and agree with
    finite differences elsewhere. The mask is an additive bias, as in Attention, so that the
    cotangent of X is the softmax's own (a Where on X would hide a NaN behind its mask)."""
    text = (
        "g ({T}[3, 4] X, bool[3, 4] M) => ({T}[3, 4] Y) {\n"
        " ninf = Constant<value = float {-inf}>()\n zero = Constant<value = float {0}>()\n"
        " n = CastLike(ninf, X)\n z = CastLike(zero, X)\n"
        f" bias = Where(M, z, n)\n B = Add(X, bias)\n S = {op}<axis = -1>(B)\n"
        " a = Constant<value = int64[1] {-1}>()\n D = ReduceMax<keepdims = 1>(B, a)\n"
        " E = Equal(D, n)\n K = Where(M, S, z)\n Y = Where(E, z, K) }"
    )
    model = Case("masked", text).model(dtype, 18)
    mask = np.array([[True, True, False, True], [False, False, False, False], [True] * 4])
    np_dtype = np.float32 if dtype == "float" else np.float64
    feeds = {"X": np.random.default_rng(0).standard_normal((3, 4)).astype(np_dtype), "M": mask}
    check_jvp(model, feeds)
    check_adjoint(model, feeds)
    vm = onnax.vjp(model)
    ct = run(vm, {**feeds, vm.graph.inputs[2].name: np.ones((3, 4), np_dtype)})
    adj = ct[vm.graph.outputs[1].name]
    assert np.all(np.isfinite(adj)), adj
    assert not np.any(adj[1]), adj


# ------------------------------------------------------------------------------- graph shape
@pytest.mark.parametrize("dims", ["2, 3, 4", "N, 3, 4"])
def test_softmax_backward_broadcasts_its_row_sums(dims: str) -> None:
    """vjp of Softmax multiplies the row sums into y by broadcasting: no full-size Expand (the
    transpose of the ReduceSum), three full-size products and sums, and still the derivative."""
    model = Case("sm", f"g ({{T}}[{dims}] X) => ({{T}}[{dims}] Y) {{ Y = Softmax<axis = -1>(X) }}")
    m = model.model("double", 18)
    vm = check_vjp(m, {"X": np.random.default_rng(0).standard_normal((2, 3, 4))})
    ops = [n.op_type for n in vm.graph]
    assert "Expand" not in ops, ops
    assert ops.count("Mul") == 2 and ops.count("ReduceSum") == 1, ops


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_no_nan_guard_where_no_row_can_be_masked(op: str) -> None:
    """The IsNaN/Where guard of masked rows is emitted only where a -inf can reach the input:
    not for scores out of a MatMul scaled by a finite constant; yes for a -inf mask constant or
    a graph input (which may be fed -inf); the derivatives agree with finite differences."""
    head = "g ({T}[2, 3, 4] Q, {T}[2, 4, 3] K, {T}[2, 3, 3] M) => ({T}[2, 3, 3] Y) {\n"
    scores = " s = Constant<value = {T} {0.5}>()\n P = MatMul(Q, K)\n S = Mul(P, s)\n"
    masked = (
        " ninf = Constant<value = {T} {-inf}>()\n z = Constant<value = {T} {0}>()\n"
        " c = Constant<value = bool[3, 3] {1, 0, 0, 1, 1, 0, 1, 1, 1}>()\n"
        " bias = Where(c, z, ninf)\n S = Add(P, bias)\n"
    )
    rng = np.random.default_rng(0)
    feeds = {
        "Q": rng.standard_normal((2, 3, 4)),
        "K": rng.standard_normal((2, 4, 3)),
        "M": rng.standard_normal((2, 3, 3)),
    }
    for body, guarded in [
        (scores + f" Y = {op}<axis = -1>(S) }}", False),
        (" P = MatMul(Q, K)\n" + masked + f" Y = {op}<axis = -1>(S) }}", True),
        (" P = MatMul(Q, K)\n S = Add(P, M)\n" + f" Y = {op}<axis = -1>(S) }}", True),
    ]:
        model = Case("sm", head + body).model("double", 18)
        # LogSoftmax of a masked entry is -inf, where differences are NaN: structure only.
        finite = op == "Softmax" or "ninf" not in body
        vm = check_vjp(model, feeds) if finite else onnax.vjp(model)
        ops = [n.op_type for n in vm.graph]
        assert ("IsNaN" in ops) == guarded and ("Where" in ops) == guarded, (body, ops)
        if finite:
            check_jvp(model, feeds)


CAUSAL = """
g ({T}[2, 4, 3] Q, {T}[2, 3, 4] K) => ({T}[2, 4, 4] Y) {
    P = MatMul(Q, K)
    one = Constant<value = {T} {1}>()
    shape = Constant<value = int64[2] @fill@>()
    D = Expand(one, shape)
    k = Constant<value = int64 {@k@}>()
    T = Trilu<upper = @upper@>(D, k)
    z = Constant<value = {T} {0}>()
    c = Equal(T, z)
    ninf = Constant<value = {T} {-inf}>()
    bias = Where(c, ninf, z)
    S = Add(P, bias)
    Y = Softmax<axis = @axis@>(S)
}
"""


@pytest.mark.parametrize(
    ("upper", "k", "axis", "fill", "guarded"),
    [
        (0, 0, -1, "{4, 4}", False),  # the causal mask: every row keeps column 0
        (0, 1, 2, "{4, 4}", False),
        (1, 0, -1, "{4, 4}", True),  # upper: not recognised
        (0, -1, -1, "{4, 4}", True),  # row 0 masked entirely
        (0, 0, 1, "{4, 4}", True),  # along columns: not a row of the mask
    ],
)
def test_causal_mask_needs_no_nan_guard(
    upper: int, k: int, axis: int, fill: str, guarded: bool
) -> None:
    """A lower-triangular -inf mask keeps a finite element in every row along the last axis:
    no IsNaN/Where guard (two full-size passes and a residual); other masks keep it. The
    derivatives agree with finite differences wherever the primal is finite."""
    text = CAUSAL.replace("@fill@", fill).replace("@k@", str(k)).replace("@upper@", str(upper))
    model = Case("causal", text.replace("@axis@", str(axis))).model("double", 18)
    rng = np.random.default_rng(0)
    feeds = {"Q": rng.standard_normal((2, 4, 3)), "K": rng.standard_normal((2, 3, 4))}
    finite = bool(np.all(np.isfinite(run(model, feeds)["Y"])))
    vm = check_vjp(model, feeds) if finite else onnax.vjp(model)
    ops = [n.op_type for n in vm.graph]
    assert ("IsNaN" in ops) == guarded, ops
    if finite:
        check_jvp(model, feeds)


# ------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_flattening_softmax_needs_a_rank(op: str) -> None:
    """Before opset 13 the normalised block runs to the last axis: an unknown rank is refused."""
    # Expand to a run-time shape of unknown length hides the rank from shape inference.
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 12]>\n'
        f"g (float[N, 3] X, int64[K] S) => (float[N, 3] Y) {{ E = Expand(X, S)\n Y = {op}(E) }}"
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model, inputs=["X"])
    message = str(err.value)
    assert f"ai.onnx::{op}" in message
    assert "'Y'" in message
    assert "at opset 12" in message and "rank" in message
    assert "value_info" in message and "convert_version(model, 13)" in message


# ------------------------------------------------------------------------------- vmap
VMAP_CASES = [
    *CASES,
    # Flattening softmax over the whole example (the batch becomes the rows) and the last axis.
    softmax("Softmax", 0, (11,)),
    softmax("LogSoftmax", -1, (12,), dims="N, 2, 3, 2"),
]


def _vmap_params() -> list[tuple[Case, str, int]]:
    """Each case at each of its opsets, in double and float alternately (both over the family).

    Double first: the dtypes the cases had when they followed the reductions in one list.
    """
    params, k = [], 1
    for c in VMAP_CASES:
        for o in c.opsets:
            params.append((c, c.dtypes[k % len(c.dtypes)], o))
            k += 1
    return params


@pytest.mark.parametrize(("case", "dtype", "opset"), _vmap_params(), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_vmap_softmax_shifts_axis(op: str, opset: int) -> None:
    """The batched node normalises along axis + 1 (the flattened block is unchanged before 13)."""
    model = softmax(op, -2, (opset,)).model("float", opset)
    vm = onnax.vmap(model, in_axes=0)
    (node,) = [n for n in vm.graph if n.op_type == op]
    assert node.attributes.get_int("axis") == 2


# vmap of the jvp and vjp models (tangents and seeds batched alongside the primal inputs, or
# alone: a Jacobian's rows).
DERIVATIVES = [
    ("Softmax-axis1-Nx3x4", 11),
    ("LogSoftmax-axis-1-Nx3x4", 13),
]


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(("name", "opset"), DERIVATIVES, ids=[f"{n}-{o}" for n, o in DERIVATIVES])
def test_vmap_of_derivatives(name: str, opset: int, mode: str) -> None:
    check_vmap_of_derivatives(next(c for c in VMAP_CASES if c.name == name), opset, mode)
