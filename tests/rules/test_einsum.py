"""Einsum: jvp and vjp against finite differences and the adjoint identity, and vmap.

onnxruntime has float and double kernels for Einsum, so every case runs in both. Scalar results
are wrapped in a ``Mul`` by a vector, which still feeds a rank-0 cotangent to the rule: for a
rank-0 graph output, ``VjpPass`` currently gives the seed input no shape (``y.shape.copy() if
y.shape else None`` treats the empty ``ir.Shape`` as missing) and onnx.checker rejects the vjp
model.
"""

from __future__ import annotations

import string

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap
from rules.test_gather import check_vmap_examples, check_vmap_variants, vmap_params, vmapped_feeds
from rules.test_linalg import has_scalar_input

EINSUM_OPSETS = (13, 18, 21)


def _einsum(name: str, equation: str, shapes: list[str], y: str, **kw: object) -> Case:
    names = [chr(ord("A") + i) for i in range(len(shapes))]
    params = ", ".join(
        f"{{T}}[{s}] {n}" if s else f"{{T}} {n}" for s, n in zip(shapes, names, strict=True)
    )
    call = f'Einsum <equation: string = "{equation}"> ({", ".join(names)})'
    if y == "":
        # A scalar result is multiplied by a vector (see the module docstring).
        text = f"g ({params}, {{T}}[2] V) => ({{T}}[2] Y) {{ S = {call}\n Y = Mul(S, V) }}"
    else:
        text = f"g ({params}) => ({{T}}[{y}] Y) {{ Y = {call} }}"
    return Case(name, text, **{"opsets": EINSUM_OPSETS, **kw})  # type: ignore[arg-type]


EINSUM_CASES = [
    _einsum("ein_matmul", "ij,jk->ik", ["N, 3", "3, 4"], "N, 4", opsets=(12, 13, 18, 21)),
    _einsum("ein_matmul_spaces", "ij, jk -> ik", ["N, 3", "3, 4"], "N, 4", opsets=(13,)),
    _einsum("ein_batched_ellipsis", "...ij,...jk->...ik", ["N, 2, 3", "N, 3, 4"], "N, 2, 4"),
    _einsum("ein_outer", "i,j->ij", ["3", "N"], "3, N"),
    _einsum("ein_trace", "ii", ["3, 3"], ""),
    _einsum("ein_trace_explicit", "ii->", ["N, N"], "", opsets=(18,)),
    _einsum("ein_diagonal", "ii->i", ["N, N"], "N"),
    _einsum("ein_triple_diagonal", "iii->i", ["3, 3, 3"], "3", opsets=(13,)),
    _einsum("ein_diagonal_ellipsis", "...ii->...i", ["N, 3, 3"], "N, 3", opsets=(13, 21)),
    _einsum("ein_diagonal_contracted", "iij,j->i", ["3, 3, 4", "4"], "3", opsets=(13,)),
    _einsum("ein_sum", "ij->", ["N, 3"], ""),
    _einsum("ein_transpose", "ij->ji", ["N, 3"], "3, N"),
    _einsum("ein_three", "ij,jk,kl->il", ["N, 3", "3, 4", "4, 2"], "N, 2"),
    _einsum(
        "ein_three_middle_only",
        "ij,jk,kl->il",
        ["N, 3", "3, 4", "4, 2"],
        "N, 2",
        inputs=["B"],
        opsets=(13,),
    ),
    _einsum("ein_implicit", "ij,jk", ["N, 3", "3, 4"], "N, 4"),
    _einsum("ein_implicit_order", "kj,ji", ["2, 3", "3, N"], "N, 2", opsets=(13,)),
    _einsum("ein_implicit_ellipsis", "...ij,jk", ["N, 2, 3", "3, 4"], "N, 2, 4", opsets=(13, 21)),
    # Ellipsis broadcasting of size-1 dimensions (every ellipsis has the same rank, as the
    # specification and onnx-shape-inference require).
    _einsum(
        "ein_ellipsis_broadcast", "...ij,...jk->...ik", ["N, 1, 2, 3", "1, 4, 3, 5"], "N, 4, 2, 5"
    ),
    _einsum(
        "ein_ellipsis_middle",
        "i...j,j...->...i",
        ["2, N, 1, 3", "3, 1, 4"],
        "N, 4, 2",
        opsets=(13,),
    ),
    # Symbolic ellipsis dimensions that broadcast at run time (M = 1).
    _einsum(
        "ein_ellipsis_symbolic",
        "...i,...i->...i",
        ["N, 3", "M, 3"],
        "N, 3",
        dims={"N": 4, "M": 1},
        opsets=(13, 21),
    ),
    # A label summed out of one operand only: its cotangent is constant along that axis.
    _einsum("ein_summed_label", "ij,jk->i", ["N, 3", "3, 4"], "N"),
    _einsum("ein_summed_label_first", "ij,j->j", ["N, 3", "3"], "3", opsets=(13,)),
    # onnxruntime (like numpy) broadcasts a labelled dimension of size 1; onnx-shape-inference
    # takes the output size from the first operand, so the broadcast one comes second.
    _einsum("ein_label_broadcast", "ij,ij->ij", ["N, 3", "1, 3"], "N, 3", opsets=(13,)),
    _einsum("ein_self", "ij,jk->ik", ["3, 3", "3, 3"], "3, 3", opsets=(13,)),
    _einsum("ein_mixed_case", "aB,Bc->ca", ["N, 3", "3, 4"], "4, N", opsets=(13,)),
    _einsum("ein_scalar_operand", ",ij->ij", ["", "N, 3"], "N, 3", opsets=(13,)),
]

# Both operands the same graph input.
EINSUM_CASES.append(
    Case(
        "ein_same_input",
        'g ({T}[3, 3] A) => ({T}[3, 3] Y) { Y = Einsum <equation: string = "ij,jk->ik"> (A, A) }',
        opsets=(13,),
    )
)


CASES = EINSUM_CASES
"""Every case; the closure test enumerates the operators their derivative models emit."""


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


SECOND_ORDER = {
    "ein_trace",
    "ein_diagonal_ellipsis",
    "ein_summed_label",
    "ein_ellipsis_broadcast",
    "ein_three",
}


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c.name in SECOND_ORDER],
    ids=case_id,
)
def test_second_order(case: Case) -> None:
    """The vjp model (whose cotangents use the helpers: ones and identities) is itself
    differentiated, in both modes."""
    vm = onnax.vjp(case.model("double", case.opsets[-1]), case.inputs)
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


def test_einsum_symbolic_ellipsis_at_opset_12() -> None:
    """At opset 12 an ellipsis dimension that may broadcast at run time cannot be summed."""
    case = _einsum("e", "...i,...i->...i", ["N, 3", "M, 3"], "N, 3")
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        onnax.vjp(case.model("float", 12))
    message = str(info.value)
    for fact in ("ai.onnx::Einsum", "opset 12", "ellipsis", "input 1 'B'", "opset 13"):
        assert fact in message, (fact, message)


def test_einsum_identity_is_computed_from_shapes() -> None:
    """The diagonal embedding builds its identity in-graph: no float constant of shape [n, n]."""
    vm = onnax.vjp(_einsum("d", "ii->i", ["N, N"], "N").model("float", 18))
    for node in vm.graph:
        if node.op_type == "Constant":
            value = node.attributes["value"].as_tensor()
            assert value.dtype == ir.DataType.INT64 or np.asarray(value.numpy()).size <= 1


# ------------------------------------------------------------------------------------ vmap

# Their models multiply a scalar result by a vector, which needs Mul's batch rule.
VMAP_NEEDS_OTHERS = {"ein_trace", "ein_trace_explicit", "ein_sum"}


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


@pytest.mark.parametrize(
    "case", [c for c in EINSUM_CASES if c.text.count(",") > 1 and "V)" not in c.text], ids=case_id
)
def test_vmap_einsum_operands(case: Case) -> None:
    """Einsum with only a later operand batched, or the first and last."""
    model = case.model("double", case.opsets[0])
    names = [v.name for v in model.graph.inputs]
    examples = [case.feeds(model, seed=s) for s in range(3)]
    for in_axes in ({names[-1]: 0}, {names[0]: -1, names[-1]: 1}):
        check_vmap_examples(model, [dict(ex) for ex in examples], in_axes)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [("ii", ["N, N"]), ("ii->", ["3, 3"]), ("ij->", ["N, 3"]), ("i,i", ["3", "3"])],
)
def test_vmap_einsum_scalar_results(equation: str, shapes: list[str]) -> None:
    """Rank-0 results (the case list wraps them in a Mul, which needs Mul's batch rule)."""
    names = [chr(ord("A") + i) for i in range(len(shapes))]
    params = ", ".join(f"double[{s}] {n}" for s, n in zip(shapes, names, strict=True))
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        f'g ({params}) => (double Y) {{ Y = Einsum <equation: string = "{equation}"> '
        f"({', '.join(names)}) }}"
    )
    feeds = Case("e", "").feeds(model)
    check_vmap(model, feeds, in_axes=0)
    check_vmap(model, feeds, in_axes=[1] + [None] * (len(names) - 1))
    check_vmap(model, feeds, in_axes=[None] * (len(names) - 1) + [-1], out_axes=0)


def test_vmap_einsum_without_a_free_letter() -> None:
    letters = string.ascii_lowercase + string.ascii_uppercase
    dims = ", ".join(["1"] * len(letters))
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 13]>\n'
        f"g (float[{dims}] A) => (float[{dims}] Y) "
        f'{{ Y = Einsum <equation: string = "{letters}->{letters}"> (A) }}'
    )
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        onnax.vmap(model)
    message = str(info.value)
    for fact in ("ai.onnx::Einsum", "'Y'", "52 letters", "Remedy", "in_axes None"):
        assert fact in message, (fact, message)


# The derivative models of a few cases under vmap: all inputs batched, and only the tangents
# (jvp) or output seeds (vjp) batched with the primal shared, which is how jacfwd/jacrev batch
# them. Their transposes emit Transpose, ReduceSum, Unsqueeze, identities (Range/Equal/Cast)...
DERIVED = [
    ("ein_diagonal_ellipsis", 13),
    ("ein_summed_label", 18),
    ("ein_ellipsis_broadcast", 18),
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
    ("ein_diagonal_ellipsis", 13, {"A": 1}),
    ("ein_three", 18, {"B": 0, "C": -1}),
    ("ein_implicit_ellipsis", 13, {"A": 0, "B": 0}),
]


@pytest.mark.parametrize(
    ("name", "opset", "in_axes"), OF_VMAP, ids=[f"{n}-{o}" for n, o, _ in OF_VMAP]
)
def test_derivatives_of_vmap(name: str, opset: int, in_axes: dict[str, int | None]) -> None:
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vmap(case.model("double", opset), in_axes=in_axes)
    feeds = vmapped_feeds(case, vm, in_axes)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)
