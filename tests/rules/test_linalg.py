"""MatMul and Gemm: jvp and vjp against finite differences and the adjoint identity.

onnxruntime has float and double kernels for both operators, so every case runs in both.
Scalar results are wrapped in a ``Mul`` by a vector, which still feeds a rank-0 cotangent to the
rule: for a rank-0 graph output, ``VjpPass`` currently gives the seed input no shape
(``y.shape.copy() if y.shape else None`` treats the empty ``ir.Shape`` as missing) and
onnx.checker rejects the vjp model.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap
from rules.test_gather import check_vmap_examples, check_vmap_variants, vmap_params, vmapped_feeds

MATMUL_OPSETS = (11, 13, 18, 21)


def _matmul(name: str, a: str, b: str, y: str, **kw: object) -> Case:
    text = f"g ({{T}}[{a}] A, {{T}}[{b}] B) => ({{T}}[{y}] Y) {{ Y = MatMul(A, B) }}"
    return Case(name, text, **{"opsets": MATMUL_OPSETS, **kw})  # type: ignore[arg-type]


MATMUL_CASES = [
    _matmul("mm_2d", "N, 4", "4, 5", "N, 5"),
    _matmul("mm_1d_2d", "4", "4, 5", "5"),
    _matmul("mm_2d_1d", "N, 4", "4", "N"),
    _matmul("mm_1d_3d", "4", "N, 4, 5", "N, 5", opsets=(11, 18)),
    _matmul("mm_3d_1d", "N, 3, 4", "4", "N, 3", opsets=(11, 18)),
    _matmul("mm_batch_broadcast", "N, 1, 3, 4", "2, 4, 5", "N, 2, 3, 5"),
    _matmul(
        "mm_batch_broadcast_b_only",
        "N, 1, 3, 4",
        "2, 4, 5",
        "N, 2, 3, 5",
        inputs=["B"],
        opsets=(13,),
    ),
    _matmul(
        "mm_batch_broadcast_a_only",
        "N, 1, 3, 4",
        "2, 4, 5",
        "N, 2, 3, 5",
        inputs=["A"],
        opsets=(13,),
    ),
    _matmul("mm_4d_2d", "2, N, 3, 4", "4, 5", "2, N, 3, 5", opsets=(11, 21)),
    # A Linear layer over [B, S, H] with run-time B and S: its weight gradient is one Gemm.
    _matmul("mm_linear_3d", "N, S, 4", "4, 5", "N, S, 5", opsets=(11, 18), dims={"S": 2}),
    _matmul("mm_2d_4d", "3, 4", "2, N, 4, 5", "2, N, 3, 5", opsets=(11, 21)),
    # The batch dimensions N and M broadcast only at run time (M = 1): summed with run-time axes.
    _matmul(
        "mm_symbolic_broadcast",
        "N, 3, 4",
        "M, 4, 5",
        "N, 3, 5",
        opsets=(13, 21),
        dims={"N": 3, "M": 1},
    ),
    Case(
        "mm_1d_1d",
        "g ({T}[4] A, {T}[4] B, {T}[2] V) => ({T}[2] Y) { S = MatMul(A, B)\n Y = Mul(S, V) }",
        opsets=MATMUL_OPSETS,
    ),
    Case("mm_self", "g ({T}[N, N] A) => ({T}[N, N] Y) { Y = MatMul(A, A) }", opsets=(13,)),
]


def _gemm(name: str, a: str, b: str, c: str | None, attrs: str, **kw: object) -> Case:
    # "{T} C" is a rank-0 input in ONNX text; "{T}[] C" would leave the shape unknown.
    c_in = "" if c is None else (f", {{T}}[{c}] C" if c else ", {T} C")
    c_arg = ", C" if c is not None else ""
    text = f"g ({{T}}[{a}] A, {{T}}[{b}] B{c_in}) => ({{T}}[N, 5] Y) {{ Y = Gemm <{attrs}> (A, B{c_arg}) }}"
    return Case(name, text, **{"opsets": MATMUL_OPSETS, **kw})  # type: ignore[arg-type]


GEMM_CASES = [
    _gemm(
        f"gemm_tA{ta}_tB{tb}",
        "4, N" if ta else "N, 4",
        "5, 4" if tb else "4, 5",
        "5",
        f"alpha: float = 0.5, beta: float = 2.0, transA: int = {ta}, transB: int = {tb}",
    )
    for ta, tb in itertools.product((0, 1), repeat=2)
]
GEMM_CASES += [
    _gemm(
        f"gemm_c_{name}",
        "N, 4",
        "4, 5",
        c,
        "alpha: float = 1.5, beta: float = -0.5",
        opsets=(11, 13, 21),
    )
    for name, c in (
        ("scalar", ""),
        ("one", "1"),
        ("row", "5"),
        ("column", "N, 1"),
        ("full", "N, 5"),
    )
]
GEMM_CASES += [
    _gemm("gemm_no_c", "N, 4", "5, 4", None, "transB: int = 1"),
    _gemm(
        "gemm_no_c_default",
        "4, N",
        "4, 5",
        None,
        "alpha: float = 2.0, transA: int = 1",
        opsets=(11, 21),
    ),
    _gemm(
        "gemm_only_c", "N, 4", "4, 5", "N, 1", "beta: float = 3.0", inputs=["C"], opsets=(11, 18)
    ),
    _gemm(
        "gemm_only_a",
        "4, N",
        "5, 4",
        "5",
        "transA: int = 1, transB: int = 1",
        inputs=["A"],
        opsets=(13,),
    ),
    _gemm(
        "gemm_a_and_c",
        "N, 4",
        "5, 4",
        "N, 5",
        "beta: float = 0.25, transB: int = 1",
        inputs=["A", "C"],
        opsets=(13,),
    ),
    _gemm(
        "gemm_b_and_c",
        "4, N",
        "4, 5",
        "1",
        "alpha: float = 3.0, transA: int = 1",
        inputs=["B", "C"],
        opsets=(18,),
    ),
]


CASES = MATMUL_CASES + GEMM_CASES
"""Every case; the closure test enumerates the operators their derivative models emit."""


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


SECOND_ORDER = {
    "mm_1d_2d",
    "mm_2d_1d",
    "mm_batch_broadcast",
    "mm_symbolic_broadcast",
    "gemm_tA1_tB1",
    "gemm_c_column",
}


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c.name in SECOND_ORDER],
    ids=case_id,
)
def test_second_order(case: Case) -> None:
    """The vjp model (whose cotangents use Gemm with the cotangent as an operand, and sums over
    broadcast batch axes) is itself differentiated, in both modes."""
    vm = onnax.vjp(case.model("double", case.opsets[-1]), case.inputs)
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


def test_matmul_symbolic_broadcast_before_opset_13() -> None:
    """Before opset 13, a batch dimension that may broadcast at run time cannot be summed."""
    model = _matmul("m", "N, 3, 4", "M, 4, 5", "N, 3, 5").model("float", 11)
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        onnax.vjp(model)
    message = str(info.value)
    for fact in (
        "ai.onnx::MatMul",
        "opset 11",
        "'Y'",
        "input 1 'B'",
        "dimension M",
        "opset 13",
        "onnx.version_converter",
    ):
        assert fact in message, (fact, message)


# ------------------------------------------------------------------------------------ vmap

# Their models multiply a scalar result by a vector, which needs Mul's batch rule.
VMAP_NEEDS_OTHERS = {"mm_1d_1d"}


def has_scalar_input(model: ir.Model) -> bool:
    return any(v.shape is not None and v.shape.rank() == 0 for v in model.graph.inputs)


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    model = case.model(dtype, opset)
    if case.name in VMAP_NEEDS_OTHERS:
        check_vmap_variants(model, case.feeds(model), 0)
    if has_scalar_input(model):
        # oracles.check_vmap perturbs a batched rank-0 input into a numpy scalar, which
        # onnxruntime refuses as a feed; explicit examples cover these cases instead.
        examples = [case.feeds(model, seed=s) for s in range(3)]
        names = [v.name for v in model.graph.inputs]
        for in_axes in ({n: 0 for n in names}, {names[0]: 0}, {names[-1]: -1}):
            check_vmap_examples(model, [dict(ex) for ex in examples], in_axes)
        return
    run_vmap_case(case, dtype, opset)


_A_SHAPES = {1: "4", 2: "3, 4", 3: "2, 3, 4", 4: "5, 1, 3, 4"}
_B_SHAPES = {1: "4", 2: "4, 6", 3: "2, 4, 6", 4: "1, 2, 4, 6"}
_RANK_PAIRS = list(itertools.product(range(1, 5), repeat=2))


@pytest.mark.parametrize(("ra", "rb"), _RANK_PAIRS, ids=[f"{a}x{b}" for a, b in _RANK_PAIRS])
def test_vmap_matmul_ranks(ra: int, rb: int) -> None:
    """Every rank combination with either or both operands batched (at various axes)."""
    shape_a, shape_b = (
        tuple(int(d) for d in s[r].split(",")) for s, r in ((_A_SHAPES, ra), (_B_SHAPES, rb))
    )
    y = np.matmul(np.zeros(shape_a), np.zeros(shape_b)).shape
    y_type = f"double[{', '.join(map(str, y))}]" if y else "double"
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        f"g (double[{_A_SHAPES[ra]}] A, double[{_B_SHAPES[rb]}] B) => ({y_type} Y) "
        "{ Y = MatMul(A, B) }"
    )
    feeds = Case("m", "").feeds(model)
    for in_axes in ((0, None), (None, -1), (1 if ra > 1 else 0, 0)):
        check_vmap(model, feeds, in_axes=in_axes)


@pytest.mark.parametrize("case", [c for c in GEMM_CASES if c.inputs is None], ids=case_id)
def test_vmap_gemm_operands(case: Case) -> None:
    """Gemm with B, C, or A and C batched (the case list batches A alone or all)."""
    model = case.model("float", case.opsets[0])
    names = [v.name for v in model.graph.inputs]
    examples = [case.feeds(model, seed=s) for s in range(3)]
    variants: list[dict[str, int | None]] = [{"B": 1}]
    if "C" in names:
        variants += [{"C": 0}, {"A": -1, "C": -1}, {"B": 0, "C": 0}]
    for in_axes in variants:
        check_vmap_examples(model, [dict(ex) for ex in examples], in_axes)


def test_vmap_matmul_unknown_rank_is_refused() -> None:
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        "g (float[12] X, int64[K] S, float[3, 4, 5] B) => (float[3, 2, 5] Y) {\n"
        " R = Reshape(X, S)\n Y = MatMul(R, B) }"
    )
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        onnax.vmap(model, in_axes={"B": 0})
    message = str(info.value)
    for fact in ("vmap", "ai.onnx::MatMul", "'Y'", "rank of its input 0 'R'", "Remedy"):
        assert fact in message, (fact, message)


# The derivative models of a few cases under vmap: all inputs batched, and only the tangents
# (jvp) or output seeds (vjp) batched with the primal shared, which is how jacfwd/jacrev batch
# them. Their transposes emit Transpose, ReduceSum, Unsqueeze, identities (Range/Equal/Cast)...
DERIVED = [
    ("mm_2d", 13),
    ("mm_1d_3d", 18),
    ("mm_batch_broadcast", 18),
    ("gemm_tA1_tB1", 13),
    ("gemm_c_column", 13),
]


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(("name", "opset"), DERIVED, ids=[f"{n}-{o}" for n, o in DERIVED])
def test_vmap_of_derivatives(name: str, opset: int, mode: str) -> None:
    case = next(c for c in CASES if c.name == name)
    model = case.model("double", opset)
    derived = onnax.jvp(model, case.inputs) if mode == "jvp" else onnax.vjp(model, case.inputs)
    feeds = case.feeds(derived)
    n_primal, n_inputs = len(model.graph.inputs), len(derived.graph.inputs)
    axes = [None] * n_primal + [0] * (n_inputs - n_primal)
    check_vmap_variants(derived, feeds, 0, axes)


# Derivatives of vmapped models: the operators the batch rules emit must have rules (closure).
OF_VMAP = [
    ("mm_1d_3d", 13, {"A": 0, "B": 0}),
    ("mm_2d_1d", 11, {"B": 0}),
    ("mm_dot", 18, {"A": 0, "B": 0}),
    ("gemm_tA1_tB1", 13, {"B": 1, "C": 0}),
    ("gemm_c_scalar", 11, {"A": 0, "C": 0}),
]


@pytest.mark.parametrize(
    ("name", "opset", "in_axes"), OF_VMAP, ids=[f"{n}-{o}" for n, o, _ in OF_VMAP]
)
def test_derivatives_of_vmap(name: str, opset: int, in_axes: dict[str, int | None]) -> None:
    # mm_dot has a rank-0 output, which the vjp of the unbatched model could not seed (see the
    # module docstring); batched, it is a vector.
    dot = Case("mm_dot", "g ({T}[4] A, {T}[4] B) => ({T} Y) { Y = MatMul(A, B) }")
    case = next(c for c in [*CASES, dot] if c.name == name)
    vm = onnax.vmap(case.model("double", opset), in_axes=in_axes)
    feeds = vmapped_feeds(case, vm, in_axes)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


@pytest.mark.parametrize(
    ("a", "y"), [("N, 4", "N, 5"), ("N, S, 4", "N, S, 5"), ("2, N, 3, 4", "2, N, 3, 5")]
)
def test_weight_gradient_is_one_product(a: str, y: str) -> None:
    """A shared 2-D weight's gradient sums over the batch axes inside one Gemm (transA): no
    batched MatMul with a ReduceSum after it, no Transpose; the data gradient of a 2-D product
    is a Gemm (transB) too. Numerically checked by the cases mm_2d, mm_4d_2d, mm_linear_3d."""
    model = _matmul("linear", a, "4, 5", y).model("float", 18)
    weight = [n.op_type for n in onnax.vjp(model, ["B"]).graph]
    assert weight.count("Gemm") == 1, weight
    assert "ReduceSum" not in weight and "Transpose" not in weight, weight
    data = [n.op_type for n in onnax.vjp(model, ["A"]).graph]
    assert ("Gemm" in data) == (a == "N, 4"), data
