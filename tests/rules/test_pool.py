"""Pooling: jvp and vjp against finite differences, the adjoint identity, and vmap.

onnxruntime has double kernels for MaxPool only; AveragePool, LpPool, the global pools and
MaxUnpool run in float, with the float tolerances of the oracles (AveragePool and MaxUnpool are
linear, LpPool is smooth away from zero). Max pools are filled with distinct, well-separated
values so that no finite-difference step changes a window's winner.

Opsets: 11 and 13 (GatherElements' transpose is a one-hot contraction before 16), 16/18 (a
scatter-add), 19 (AveragePool gains dilations), 22 (every pool's newest schema).
"""

from __future__ import annotations

import numpy as np
import pytest

import onnax
from cases import Case, away_from_zero, case_id, distinct, parametrize, run_case, run_vmap_case
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap, session
from rules.test_gather import vmap_params, vmapped_feeds

FLOAT = ("float",)


def _pool(name: str, op: str, x: str, y: str, attrs: str = "", **kw: object) -> Case:
    attrs = f"<{attrs}>" if attrs else ""
    text = f"g ({{T}}[{x}] X) => ({{T}}[{y}] Y) {{ Y = {op}{attrs}(X) }}"
    return Case(name, text, **{"opsets": (13,), **kw})  # type: ignore[arg-type]


def _max(name: str, x: str, y: str, attrs: str, **kw: object) -> Case:
    return _pool(name, "MaxPool", x, y, attrs, **{"fill": {"X": distinct}, **kw})  # type: ignore[arg-type]


def _avg(name: str, x: str, y: str, attrs: str, **kw: object) -> Case:
    return _pool(name, "AveragePool", x, y, attrs, **{"dtypes": FLOAT, **kw})  # type: ignore[arg-type]


MAX_POOL = [
    _max(
        "max2d",
        "N, 2, 4, 4",
        "N, 2, 2, 2",
        "kernel_shape=[2, 2], strides=[2, 2]",
        opsets=(11, 18, 22),
    ),
    # Overlapping windows: one element can win several windows (the transpose must add).
    _max(
        "max2d_overlap_pads",
        "N, 2, 4, 5",
        "N, 2, 4, 5",
        "kernel_shape=[3, 3], pads=[1, 1, 1, 1]",
        opsets=(11, 13, 16, 22),
    ),
    _max(
        "max1d_ceil",
        "N, 3, 7",
        "N, 3, 3",
        "kernel_shape=[3], strides=[3], ceil_mode=1",
        opsets=(11, 18),
    ),
    _max(
        "max2d_dilations",
        "N, 1, 6, 5",
        "N, 1, 2, 3",
        "kernel_shape=[2, 2], dilations=[3, 2], strides=[2, 1]",
        opsets=(12, 22),
    ),
    _max(
        "max2d_same_upper",
        "N, 2, 5, 5",
        "N, 2, 3, 3",
        'kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"',
    ),
    _max(
        "max2d_symbolic_spatial",
        "N, 2, H, V",
        "N, 2, P, Q",
        "kernel_shape=[2, 3], pads=[0, 1, 1, 0]",
        dims={"H": 4, "V": 5},
        opsets=(11, 18),
    ),
    _max(
        "max3d",
        "N, 1, 4, 3, 4",
        "N, 1, 2, 2, 2",
        "kernel_shape=[2, 2, 2], strides=[2, 1, 2]",
        opsets=(18,),
    ),
    Case(
        "max_indices_output",
        "g ({T}[N, 2, 4, 4] X) => ({T}[N, 2, 2, 2] Y, int64[N, 2, 2, 2] I) "
        "{ Y, I = MaxPool<kernel_shape=[2, 2], strides=[2, 2]>(X) }",
        fill={"X": distinct},
        opsets=(11, 18),
    ),
    # Column-major Indices cannot serve the rule: it emits a row-major MaxPool of its own.
    Case(
        "max_indices_column_major",
        "g ({T}[N, 1, 3, 4] X) => ({T}[N, 1, 2, 3] Y, int64[N, 1, 2, 3] I) "
        "{ Y, I = MaxPool<kernel_shape=[2, 2], storage_order=1>(X) }",
        fill={"X": distinct},
        opsets=(13,),
    ),
]

AVERAGE_POOL = [
    _avg(
        "avg2d",
        "N, 2, 4, 4",
        "N, 2, 2, 2",
        "kernel_shape=[2, 2], strides=[2, 2]",
        opsets=(11, 18, 22),
    ),
    _avg(
        "avg2d_pads_exclude",
        "N, 2, 4, 5",
        "N, 2, 2, 3",
        "kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]",
        opsets=(11, 19),
    ),
    _avg(
        "avg2d_pads_include",
        "N, 2, 4, 5",
        "N, 2, 2, 3",
        "kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1",
        opsets=(11, 19),
    ),
    _avg(
        "avg1d_ceil_include",
        "N, 2, 7",
        "N, 2, 3",
        "kernel_shape=[3], strides=[3], pads=[0, 1], ceil_mode=1, count_include_pad=1",
    ),
    _avg(
        "avg1d_ceil",
        "N, 2, 5",
        "N, 2, 2",
        "kernel_shape=[3], strides=[3], ceil_mode=1",
        opsets=(11, 22),
    ),
    _avg(
        "avg2d_same_lower", "N, 1, 5, 4", "N, 1, 5, 4", 'kernel_shape=[2, 3], auto_pad="SAME_LOWER"'
    ),
    _avg(
        "avg2d_same_upper_include",
        "N, 1, 5, 4",
        "N, 1, 3, 2",
        'kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER", count_include_pad=1',
    ),
    _avg(
        "avg2d_dilations",
        "N, 2, 6, 5",
        "N, 2, 2, 4",
        "kernel_shape=[2, 2], dilations=[2, 2], strides=[2, 1], pads=[0, 1, 0, 0]",
        opsets=(19, 22),
    ),
    _avg("avg2d_uncovered_tail", "N, 1, 7, 5", "N, 1, 2, 2", "kernel_shape=[2, 2], strides=[3, 2]"),
    _avg(
        "avg2d_symbolic_spatial",
        "N, 2, H, V",
        "N, 2, P, Q",
        "kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 0, 1]",
        dims={"H": 5, "V": 6},
        opsets=(11, 18),
    ),
]

# A symbolic channel count: the window sums fold the channels into the batch instead of a
# depthwise Conv.
SYMBOLIC_CHANNELS = [
    _avg(
        "avg2d_symbolic_channels",
        "N, C, 4, 5",
        "N, C, 2, 2",
        "kernel_shape=[2, 3], strides=[2, 2]",
        dims={"C": 2},
    ),
    _pool(
        "lp2d_symbolic_channels",
        "LpPool",
        "N, C, 4, 4",
        "N, C, 3, 2",
        "kernel_shape=[2, 2], strides=[1, 2]",
        dtypes=FLOAT,
        dims={"C": 2},
    ),
]

LP_POOL = [
    _pool(
        "lp2d_p2",
        "LpPool",
        "N, 2, 4, 4",
        "N, 2, 3, 3",
        "kernel_shape=[2, 2]",
        dtypes=FLOAT,
        opsets=(11, 18, 22),
    ),
    _pool(
        "lp1d_p1",
        "LpPool",
        "N, 2, 6",
        "N, 2, 3",
        "kernel_shape=[2], strides=[2], p=1",
        dtypes=FLOAT,
        fill={"X": away_from_zero},
    ),
    _pool(
        "lp2d_p3_pads",
        "LpPool",
        "N, 1, 4, 5",
        "N, 1, 2, 3",
        "kernel_shape=[2, 3], strides=[2, 2], pads=[1, 1, 0, 1], p=3",
        dtypes=FLOAT,
        fill={"X": away_from_zero},
        opsets=(11, 18),
    ),
    _pool(
        "lp2d_ceil_dilations",
        "LpPool",
        "N, 1, 6, 5",
        "N, 1, 2, 2",
        "kernel_shape=[2, 2], strides=[3, 2], dilations=[2, 2], ceil_mode=1",
        dtypes=FLOAT,
        opsets=(18, 22),
    ),
]

GLOBAL = [
    _pool(
        "global_avg",
        "GlobalAveragePool",
        "N, 3, 4, 5",
        "N, 3, 1, 1",
        dtypes=FLOAT,
        opsets=(11, 18, 22),
    ),
    _pool("global_avg_1d", "GlobalAveragePool", "N, 2, 5", "N, 2, 1", dtypes=FLOAT, opsets=(11,)),
    _pool(
        "global_avg_symbolic",
        "GlobalAveragePool",
        "N, 2, H, V",
        "N, 2, 1, 1",
        dtypes=FLOAT,
        dims={"H": 3, "V": 4},
        opsets=(13,),
    ),
    _pool(
        "global_max",
        "GlobalMaxPool",
        "N, 3, 4, 5",
        "N, 3, 1, 1",
        dtypes=FLOAT,
        fill={"X": distinct},
        opsets=(11, 18, 22),
    ),
    # onnxruntime has no GlobalLpPool kernel for opset 22.
    _pool(
        "global_lp_p2", "GlobalLpPool", "N, 3, 4, 3", "N, 3, 1, 1", dtypes=FLOAT, opsets=(11, 18)
    ),
    _pool(
        "global_lp_p3",
        "GlobalLpPool",
        "N, 2, 5",
        "N, 2, 1",
        "p=3",
        dtypes=FLOAT,
        fill={"X": away_from_zero},
    ),
    _pool(
        "global_lp_p1",
        "GlobalLpPool",
        "N, 2, 3, 3",
        "N, 2, 1, 1",
        "p=1",
        dtypes=FLOAT,
        fill={"X": away_from_zero},
    ),
]

MAX_UNPOOL = [
    # The indices come from a MaxPool in the same model, so they are valid for any N.
    Case(
        "unpool_after_pool",
        "g ({T}[N, 2, 4, 4] X) => ({T}[N, 2, 4, 4] Z) {\n"
        " Y, I = MaxPool<kernel_shape=[2, 2], strides=[2, 2]>(X)\n"
        " Z = MaxUnpool<kernel_shape=[2, 2], strides=[2, 2]>(Y, I) }",
        fill={"X": distinct},
        dtypes=FLOAT,
        opsets=(11, 18, 22),
    ),
    Case(
        "unpool_fixed_indices_output_shape",
        "g ({T}[2, 1, 2, 2] X, int64[2, 1, 2, 2] I) => ({T}[2, 1, 5, 5] Z) {\n"
        " S = Constant<value = int64[4] {2, 1, 5, 5}>()\n"
        " Z = MaxUnpool<kernel_shape=[2, 2], strides=[2, 2]>(X, I, S) }",
        fixed={"I": np.array([[[[0, 3], [11, 18]]], [[[25 + 6, 25 + 8], [25 + 16, 25 + 24]]]])},
        dtypes=FLOAT,
        opsets=(11, 22),
    ),
    Case(
        "unpool_symbolic",
        "g ({T}[N, 2, H, V] X) => ({T}[N, 2, P, Q] Z) {\n"
        " Y, I = MaxPool<kernel_shape=[2, 2], strides=[2, 2]>(X)\n"
        " Z = MaxUnpool<kernel_shape=[2, 2], strides=[2, 2]>(Y, I) }",
        fill={"X": distinct},
        dims={"H": 4, "V": 6},
        dtypes=FLOAT,
        opsets=(13,),
    ),
]

CASES = MAX_POOL + AVERAGE_POOL + SYMBOLIC_CHANNELS + LP_POOL + GLOBAL + MAX_UNPOOL
"""Every case; the closure test enumerates the operators their derivative models emit."""


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(
    ("name", "opset"),
    [
        ("max2d_overlap_pads", 13),
        ("max2d_overlap_pads", 18),
        ("avg2d_pads_exclude", 19),
        ("lp2d_p3_pads", 18),
    ],
)
def test_second_order(name: str, opset: int) -> None:
    """The vjp model is itself differentiated in both modes (closure of the emitted operators)."""
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vjp(case.model("float", opset))
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


@pytest.mark.parametrize(
    ("name", "mode", "shared"),
    [
        ("avg2d_pads_include", "vjp", True),
        ("lp2d_p2", "jvp", True),
        # With the primal shared, vmap leaves MaxPool's output Y (a graph output) nameless but
        # used, and onnx_ir's RemoveUnusedNodesPass then drops it as an unused optional output
        # of MaxPool ("Cannot remove output ... because it has uses"): a VmapPass issue, so the
        # primal is batched too here.
        ("max2d_overlap_pads", "vjp", False),
        ("max2d_overlap_pads", "jvp", False),
    ],
)
def test_vmap_of_derivatives(name: str, mode: str, shared: bool) -> None:
    """Batched tangents/seeds, with shared primals (how jacfwd/jacrev batch the derivatives)."""
    case = next(c for c in CASES if c.name == name)
    model = case.model("float", 18)
    derived = onnax.jvp(model) if mode == "jvp" else onnax.vjp(model)
    feeds = case.feeds(derived)
    n_primal, n_inputs = len(model.graph.inputs), len(derived.graph.inputs)
    primal_axis = None if shared else 0
    check_vmap(derived, feeds, in_axes=[primal_axis] * n_primal + [0] * (n_inputs - n_primal))


@pytest.mark.parametrize(
    ("name", "in_axes"), [("max_indices_output", {"X": 1}), ("unpool_after_pool", {"X": 0})]
)
def test_derivatives_of_vmap(name: str, in_axes: dict[str, int | None]) -> None:
    """The offset arithmetic of the folded indices is differentiable (and has zero tangent)."""
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vmap(case.model("float", 18), in_axes=in_axes)
    feeds = vmapped_feeds(case, vm, in_axes)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


def test_max_pool_uses_its_own_indices() -> None:
    """A MaxPool whose Indices are computed anyway is not run a second time."""
    case = next(c for c in CASES if c.name == "max_indices_output")
    jm = onnax.jvp(case.model("float", 18))
    assert sum(n.op_type == "MaxPool" for n in jm.graph) == 1
    # Otherwise (column-major Indices here) the windows' taps are read by a one-hot Conv.
    case = next(c for c in CASES if c.name == "max_indices_column_major")
    jm = onnax.jvp(case.model("float", 18))
    assert sum(n.op_type == "MaxPool" for n in jm.graph) == 1
    assert sum(n.op_type == "Conv" for n in jm.graph) == 1
    # A double MaxPool (onnxruntime has no double Conv) runs a second MaxPool for its Indices.
    jm = onnax.jvp(case.model("double", 18))
    assert sum(n.op_type == "MaxPool" for n in jm.graph) == 2


def test_vmap_unpool_batched_output_shape_is_refused() -> None:
    text = (
        "g (float[1, 1, 2, 2] X, int64[1, 1, 2, 2] I, int64[4] S) => (float[1, 1, ?, ?] Z) {\n"
        " Z = MaxUnpool<kernel_shape=[2, 2], strides=[2, 2]>(X, I, S) }"
    )
    model = Case("u", text).model("float", 18)
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        onnax.vmap(model, in_axes={"X": 0, "S": 0})
    message = str(info.value)
    for fact in ("ai.onnx::MaxUnpool", "'Z'", "output_shape", "'S'", "in_axes None"):
        assert fact in message, (fact, message)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(
    "attrs",
    [
        "kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]",
        "kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1",
        "kernel_shape=[2, 3], dilations=[2, 1], pads=[0, 1, 1, 0]",
        # 20 taps, padded on every side
        "kernel_shape=[5, 4], pads=[2, 1, 2, 2]",
    ],
)
def test_max_pool_tangent_follows_the_runtimes_choice_among_ties(attrs: str, opset: int) -> None:
    """Integer-valued, mostly negative inputs: windows tie, and next to the padding every
    element is negative. The tangent must be the tangent of the element onnxruntime's own
    MaxPool picks (its Indices: an oracle independent of the rule), never of a padding tap,
    and the vjp its adjoint."""
    text = f"g (float[2, 3, 9, 8] X) => (float[2, 3, ?, ?] Y) {{ Y = MaxPool<{attrs}>(X) }}"
    model = Case("ties", text).model("float", opset)
    indices = text.replace("(float[2, 3, ?, ?] Y)", "(float[2, 3, ?, ?] Y, int64[2, 3, ?, ?] I)")
    reference = Case("indices", indices.replace("Y = MaxPool", "Y, I = MaxPool")).model(
        "float", opset
    )
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((2, 3, 9, 8)) * 1.5 - 2.0).astype(np.float32)
    t = rng.standard_normal(x.shape).astype(np.float32)
    jm = onnax.jvp(model)
    out = session(jm).run(None, {"X": x, jm.graph.inputs[1].name: t})
    ref_y, ref_i = session(reference).run(None, {"X": x})
    np.testing.assert_array_equal(out[0], ref_y)
    np.testing.assert_array_equal(out[1], t.reshape(-1)[ref_i])
    check_adjoint(model, {"X": x})
