"""Conv weight gradients in each form of ``onnax.rules._conv_grad``: pointwise MatMul, depthwise
Mul + ReduceSum per kernel offset, one-hot im2col + MatMul, and the classic Conv with the
cotangent as kernel.

Every form is checked against central differences and the adjoint identity (``run_case``), on
the Conv kinds that select it by default and, with the selection forced, on every case of
``test_conv``; the derivative models are differentiated and batched again (closure), and the
half and double models agree with the float one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.rules import _conv_grad
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap, run
from rules.test_conv import CASES as CONV_CASES
from rules.test_conv import _conv
from test_half_precision import rel_err, run_half

CASES = [
    # Pointwise: a batched MatMul over the positions read (strided: a Slice first).
    _conv("pw_stride1", "N, 4, 5, 6", "3, 4, 1, 1", "N, 3, 5, 6", bias="3", opsets=(11, 18)),
    _conv("pw_stride2", "N, 4, 5, 6", "3, 4, 1, 1", "N, 3, 3, 3", "strides=[2, 2]"),
    _conv(
        "pw_groups_strided_tail",
        "N, 4, 8, 5",
        "6, 2, 1, 1",
        "N, 6, 3, 3",
        "group=2, strides=[3, 2]",
        opsets=(11, 18),
    ),
    _conv("pw_1d_symbolic", "N, 3, L", "2, 3, 1", "N, 2, ?", "strides=[2]", dims={"L": 7}),
    _conv("pw_3d", "N, 2, 3, 2, 4", "4, 2, 1, 1, 1", "N, 4, 3, 2, 4", opsets=(13, 22)),
    _conv(
        "pw_same_upper",
        "N, 2, 5, 4",
        "3, 2, 1, 1",
        "N, 3, 3, 2",
        'auto_pad="SAME_UPPER", strides=[2, 2]',
    ),
    # A padded 1x1 reads zeros at the border: not pointwise (begin pad), im2col or classic.
    _conv("pw_padded", "N, 2, 3, 4", "3, 2, 1, 1", "N, 3, 5, 5", "pads=[1, 0, 1, 1]"),
    _conv("pw_padded_1d", "N, 2, 23", "3, 2, 1", "N, 3, 25", "pads=[1, 1]"),
    # Depthwise: Mul + ReduceSum per kernel offset.
    _conv(
        "dw_strided_cropped",
        "N, 4, 9",
        "4, 1, 3",
        "N, 4, 4",
        "group=4, strides=[2], pads=[1, 0]",
        opsets=(11, 18),
    ),
    _conv(
        "dw_dilated",
        "N, 3, 7, 7",
        "3, 1, 3, 3",
        "N, 3, 7, 7",
        "group=3, dilations=[2, 2], pads=[2, 2, 2, 2]",
    ),
    _conv(
        "dw_3d",
        "N, 2, 4, 4, 3",
        "2, 1, 2, 2, 2",
        "N, 2, 4, 4, 3",
        "group=2, pads=[1, 0, 1, 0, 1, 0]",
    ),
    # Depthwise, more than 16 kernel elements: the banded GEMM.
    _conv(
        "dw_banded_7x7",
        "N, 3, 9, 8",
        "3, 1, 7, 7",
        "N, 3, 9, 8",
        "group=3, pads=[3, 3, 3, 3]",
        bias="3",
        opsets=(11, 18),
    ),
    _conv(
        "dw_banded_strided_dilated",
        "N, 2, 13, 12",
        "2, 1, 5, 4",
        "N, 2, 6, 9",
        "group=2, strides=[2, 1], dilations=[1, 2], pads=[2, 1, 1, 2]",
    ),
    # Rows cropped (the tail no window reads), uneven pads.
    _conv(
        "dw_banded_cropped",
        "N, 2, 11, 10",
        "2, 1, 5, 5",
        "N, 2, 3, 7",
        "group=2, strides=[3, 1], pads=[2, 1, 0, 0]",
    ),
    # A static batch of 2.
    _conv(
        "dw_banded_static_batch",
        "2, 2, 14, 9",
        "2, 1, 7, 5",
        "2, 2, 14, 9",
        "group=2, pads=[3, 2, 3, 2]",
    ),
    _conv(
        "dw_banded_static_batch_3d",
        "2, 2, 4, 9, 6",
        "2, 1, 3, 3, 3",
        "2, 2, 4, 4, 6",
        "group=2, strides=[1, 2, 1], pads=[1, 1, 1, 1, 0, 1]",
    ),
    # Strided along the last axis, or too few rows (a static batch of 1): the classic Conv.
    _conv(
        "dw_large_strided",
        "N, 2, 11, 10",
        "2, 1, 5, 5",
        "N, 2, 3, 2",
        "group=2, strides=[3, 3], pads=[2, 0, 0, 0]",
    ),
    _conv(
        "dw_large_few_rows",
        "1, 3, 9, 8",
        "3, 1, 7, 7",
        "1, 3, 9, 8",
        "group=3, pads=[3, 3, 3, 3]",
    ),
    _conv("dw_banded_1d", "N, 3, 30", "3, 1, 17", "N, 3, 15", "group=3, pads=[1, 0]"),
    _conv(
        "dw_banded_3d",
        "N, 2, 4, 5, 6",
        "2, 1, 3, 3, 3",
        "N, 2, 4, 5, 6",
        "group=2, pads=[1, 1, 1, 1, 1, 1]",
    ),
    # Windows that tile the input (stride == kernel): the im2col up to 16 kernel elements,
    # the classic Conv beyond (ViT's patch embedding).
    _conv("patch_small", "N, 2, 24, 25", "3, 2, 2, 2", "N, 3, 12, 12", "strides=[2, 2]"),
    _conv(
        "patch_large",
        "N, 1, 60, 62",
        "2, 1, 5, 5",
        "N, 2, 12, 12",
        "strides=[5, 5]",
        inputs=["W"],
        dims={"N": 2},
    ),
    # Depth multiplier 2: grouped, not depthwise.
    _conv("dw_multiplier", "N, 2, 6, 6", "4, 1, 3, 3", "N, 4, 6, 6", "group=2, pads=[1, 1, 1, 1]"),
    # Run-time spatial sizes: the im2col.
    _conv(
        "dw_symbolic_spatial",
        "N, 3, H, V",
        "3, 1, 3, 3",
        "N, 3, H, V",
        "group=3, pads=[1, 1, 1, 1]",
        dims={"H": 5, "V": 4},
    ),
    # 1-D and 3-D kernels with at least 128 output positions: the im2col per example.
    _conv("im2col_1d", "N, 2, 130", "3, 2, 3", "N, 3, 130", "pads=[1, 1]", opsets=(11, 18)),
    _conv(
        "im2col_3d", "N, 2, 6, 5, 7", "2, 2, 2, 2, 2", "N, 2, 5, 4, 7", "pads=[0, 0, 1, 0, 0, 0]"
    ),
    # 2-D kernels (any number of output positions): the channels-major im2col.
    _conv(
        "im2col_3x3", "N, 3, 12, 12", "4, 3, 3, 3", "N, 4, 12, 12", "pads=[1, 1, 1, 1]", bias="4"
    ),
    _conv(
        "im2col_grouped_strided_dilated",
        "N, 4, 25, 27",
        "6, 2, 3, 2",
        "N, 6, 11, 14",
        "group=2, strides=[2, 2], dilations=[2, 1], pads=[0, 1, 1, 0]",
    ),
    _conv(
        "im2col_symbolic_batch_spatial",
        "N, 2, H, V",
        "3, 2, 3, 3",
        "N, 3, P, Q",
        "strides=[2, 1], pads=[1, 1, 0, 1]",
        dims={"N": 2, "H": 7, "V": 5},
    ),
    # A 7x7 stem keeps the channels-major im2col (vmap of the classic Conv ran 14x slower).
    _conv(
        "stem_7x7",
        "N, 3, 16, 15",
        "4, 3, 7, 7",
        "N, 4, 8, 8",
        "strides=[2, 2], pads=[3, 3, 3, 3]",
        bias="4",
        opsets=(11, 18),
    ),
    _conv("im2col_6x6", "N, 2, 9, 8", "3, 2, 6, 6", "N, 3, 5, 3", "pads=[1, 0, 0, 0]"),
    # ConvTranspose: its weight gradient is the same correlation, input and cotangent exchanged.
    _conv(
        "convT_pw_strided",
        "N, 4, 3, 3",
        "4, 2, 1, 1",
        "N, 2, 6, 6",
        "strides=[2, 2], output_padding=[1, 1]",
        op="ConvTranspose",
    ),
    # Output pads that crop the full output: the windows reach past the cotangent's end.
    _conv(
        "convT_pw_cropped",
        "N, 3, 4",
        "3, 2, 1",
        "N, 2, 6",
        "strides=[2], pads=[0, 1]",
        op="ConvTranspose",
    ),
    _conv(
        "convT_pw_cropped_symbolic",
        "N, 3, L",
        "3, 2, 1",
        "N, 2, ?",
        "strides=[2], pads=[0, 1]",
        op="ConvTranspose",
        dims={"L": 4},
    ),
    _conv(
        "convT_dw",
        "N, 3, 4, 4",
        "3, 1, 3, 3",
        "N, 3, 9, 9",
        "group=3, strides=[2, 2]",
        op="ConvTranspose",
    ),
    _conv(
        "convT_im2col_groups",
        "N, 4, 12, 12",
        "4, 1, 3, 3",
        "N, 2, 25, 25",
        "group=2, strides=[2, 2]",
        op="ConvTranspose",
    ),
]
"""The closure test enumerates the operators their derivative models emit."""

BATCH_ONE = [
    Case(c.name + "_n1", c.text, c.opsets, dims={**c.dims, "N": 1}, dtypes=c.dtypes)
    for c in CASES
    if c.name in ("pw_stride1", "dw_dilated", "im2col_3x3", "dw_banded_7x7")
]

STATIC_ONE = [
    Case(
        c.name + "_static1", c.text.replace("[N, ", "[1, "), c.opsets, dims=c.dims, dtypes=c.dtypes
    )
    for c in CASES
    if c.name
    in (
        "im2col_3x3",
        "im2col_grouped_strided_dilated",
        "convT_im2col_groups",
        "pw_stride1",
        "pw_groups_strided_tail",
        "pw_1d_symbolic",
        "pw_3d",
        "im2col_1d",
        "im2col_3d",
        "stem_7x7",
    )
]
"""A batch of statically one example: the channels-major im2col moves no data (Reshapes), the
per-example products need no sum over the batch."""


@pytest.mark.parametrize(
    ("case", "dtype", "opset"), parametrize(CASES + BATCH_ONE + STATIC_ONE), ids=case_id
)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def _weight_gradient_ops(case: Case) -> Counter[str]:
    """The operators of the vjp w.r.t. the weight, the primal's own excluded."""
    model = case.model("float", case.opsets[-1])
    primal = Counter(n.op_type for n in model.graph)
    return Counter(n.op_type for n in onnax.vjp(model, ["W"]).graph) - primal


@pytest.mark.parametrize(
    ("name", "form"),
    [
        ("pw_stride1", "matmul"),
        ("pw_groups_strided_tail", "matmul"),
        ("pw_1d_symbolic", "matmul"),
        ("convT_pw_strided", "matmul"),
        ("convT_pw_cropped", "matmul"),
        ("convT_pw_cropped_symbolic", "matmul"),
        ("dw_strided_cropped", "classic"),  # strided, a batch: the shifts measured slower
        ("dw_3d", "banded"),
        ("convT_dw", "classic"),  # strided, a batch
        ("dw_symbolic_spatial", "channels"),
        ("dw_banded_7x7", "banded"),
        ("dw_banded_strided_dilated", "banded"),
        ("dw_banded_cropped", "banded"),
        ("dw_banded_1d", "banded"),
        ("dw_banded_3d", "banded"),
        ("dw_banded_static_batch", "banded"),
        ("dw_banded_static_batch_3d", "banded"),
        ("dw_large_strided", "classic"),
        ("patch_small", "channels"),
        ("patch_large", "classic"),
        ("dw_large_few_rows", "toeplitz"),  # one example, stride 1, 49 taps
        ("dw_multiplier", "channels"),  # 36 output positions: still the GEMM over N * P
        ("im2col_3x3", "channels"),
        ("im2col_grouped_strided_dilated", "channels"),
        ("im2col_symbolic_batch_spatial", "channels"),
        ("convT_im2col_groups", "channels"),
        ("im2col_1d", "im2col"),
        ("im2col_3d", "im2col"),
        ("pw_padded", "channels"),
        ("pw_padded_1d", "classic"),  # 25 output positions
        ("stem_7x7", "channels"),
        ("im2col_6x6", "channels"),
    ],
)
def test_form_chosen(name: str, form: str) -> None:
    """The measured choice of the module doc: which operators compute the weight gradient."""
    case = next(c for c in CASES if c.name == name)
    ops = _weight_gradient_ops(case)
    w = case.model("float", case.opsets[-1]).graph.inputs[1]
    taps = int(np.prod(w.shape.numpy()[2:]))
    assert ops["Conv"] == (form in ("im2col", "channels", "classic")), ops
    products = ops["MatMul"] + ops["Gemm"]
    assert bool(products) == (form in ("matmul", "im2col", "channels", "banded", "toeplitz")), ops
    # The channels-major im2col sums over the batch inside its one GEMM; the per-example
    # forms sum their products after.
    assert (ops["ReduceSum"] == 0) == (form in ("channels", "classic", "toeplitz")), ops
    # The banded GEMM: the rows picked and the band read by Gathers; the Toeplitz GEMM: the rows.
    assert bool(ops["Gather"]) == (form in ("banded", "toeplitz")), ops
    assert bool(ops["Expand"]) == (form == "toeplitz"), ops  # the cotangent's shifted copies
    # The shifts form: one Mul and one ReduceSum per kernel element, no MatMul or Conv.
    shifts = ops["ReduceSum"] == taps == ops["Mul"] and not ops["MatMul"]
    assert shifts == (form == "shifts"), ops


@pytest.mark.parametrize(
    ("name", "product"),
    [
        ("pw_stride1_static1", "Gemm"),
        ("pw_3d_static1", "Gemm"),
        ("pw_groups_strided_tail_static1", "MatMul"),
        ("im2col_1d_static1", "Gemm"),
        ("im2col_3d_static1", "Gemm"),
    ],
)
def test_single_example_products_are_not_summed(name: str, product: str) -> None:
    """With a static batch of one the product over the positions is the whole weight gradient:
    one Gemm (one group; the transposed operand read in place) or one batched MatMul over the
    groups, and no ReduceSum over the unit batch axis after it."""
    case = next(c for c in STATIC_ONE if c.name == name)
    ops = _weight_gradient_ops(case)
    assert ops[product] == 1 and ops["MatMul"] + ops["Gemm"] == 1, ops
    assert ops["ReduceSum"] == 0, ops


@pytest.mark.parametrize("batch", ["N", "1"])
@pytest.mark.parametrize(("outputs", "left"), [(64, True), (65, False)])
def test_channels_major_operand_order(outputs: int, left: bool, batch: str) -> None:
    """Up to 64 output channels the im2col columns are the Gemm's left operand (``g`` as the
    transposed right one), above its transposed right operand; no 2-D Transpose follows the
    Gemm (onnxruntime would fold it in by swapping the operands). With a static batch of one,
    neither ``x`` nor ``g`` is transposed."""
    text = (
        f"g (float[{batch}, 3, 6, 6] X, float[{outputs}, 3, 3, 3] W)"
        f" => (float[{batch}, {outputs}, 6, 6] Y) {{ Y = Conv<pads=[1, 1, 1, 1]>(X, W) }}"
    )
    model = Case("order", text).model("float", 18)
    graph = onnax.vjp(model, ["W"]).graph
    one_hot = next(n for n in graph if n.op_type == "Conv" and len(n.outputs[0].shape or []) == 5)
    (columns,) = [u for u, _ in one_hot.outputs[0].uses()]  # the Reshape to [C*K, N*P]
    (product,) = [u for u, _ in columns.outputs[0].uses()]
    assert product.op_type == "Gemm", product
    assert (product.inputs[0] is columns.outputs[0]) == left
    assert product.attributes.get_int("transB") == 1
    (after,) = [u for u, _ in product.outputs[0].uses()]
    assert after.op_type == "Reshape", after
    transposes = [n.attributes.get_ints("perm") for n in graph if n.op_type == "Transpose"]
    if batch == "1":
        assert [1, 0, 2, 3] not in [list(p or []) for p in transposes], transposes


@pytest.fixture(params=["im2col", "im2col_gemm", "classic", "banded"])
def forced(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every k x k gradient through one form: im2col (from one output position on; 2-D
    kernels with the columns on the left or, ``im2col_gemm``, as the Gemm's transposed right
    operand), the classic Conv (no im2col, no depthwise shifts), or every depthwise one with
    static pads through the banded GEMM (any stride, any batch)."""
    if request.param == "banded":
        monkeypatch.setattr(_conv_grad, "_DEPTHWISE_MAX_TAPS", 0)
        monkeypatch.setattr(_conv_grad, "banded_fits", lambda *args: True)
    else:
        monkeypatch.setattr(_conv_grad, "tiles_input", lambda *args: False)
        monkeypatch.setattr(_conv_grad, "banded_fits", lambda *args: False)
    if request.param.startswith("im2col"):
        monkeypatch.setattr(_conv_grad, "_IM2COL_MIN_POSITIONS", 0)
    if request.param == "im2col_gemm":
        monkeypatch.setattr(_conv_grad, "_COLUMNS_LEFT_MAX_ROWS", 0)
    if request.param == "classic":
        monkeypatch.setattr(_conv_grad, "_IM2COL_MIN_POSITIONS", 10**9)
        monkeypatch.setattr(_conv_grad, "_IM2COL_2D_MIN_POSITIONS", 10**9)
        monkeypatch.setattr(_conv_grad, "_DEPTHWISE_MAX_TAPS", 0)
    yield request.param


WEIGHT_CASES = [c for c in CONV_CASES + CASES + STATIC_ONE if c.inputs is None or "W" in c.inputs]


@pytest.mark.parametrize("case", WEIGHT_CASES, ids=case_id)
def test_forced_form(case: Case, forced: str) -> None:
    """Each form on every Conv geometry of the rule tests: differences and adjoint identity."""
    model = case.model("float", case.opsets[-1])
    feeds = case.feeds(model)
    check_vjp(model, feeds, ["W"])
    check_adjoint(model, feeds, ["W"])


@pytest.mark.parametrize(
    "name",
    [
        "pw_groups_strided_tail",
        "dw_strided_cropped",
        "im2col_grouped_strided_dilated",
        "dw_banded_strided_dilated",
    ],
)
def test_second_order_and_per_example(name: str) -> None:
    """The new forms close under the transforms: their vjp differentiated in both modes, and
    per-example weight gradients (vmap of the vjp) against a loop."""
    case = next(c for c in CASES if c.name == name)
    model = case.model("float", case.opsets[-1])
    vm = onnax.vjp(model, ["W"])
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_vmap(vm, feeds, in_axes=[0, None, 0])


@pytest.mark.parametrize("name", ["im2col_3x3", "im2col_3x3_static1"])
@pytest.mark.parametrize("left", [64, 0])
def test_channels_major_second_order_and_per_example(
    left: int, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both operand orders of the ungrouped channels-major im2col's Gemm (the columns on the
    left, or transposed on the right), with a run-time batch and with a static batch of one
    (Reshapes for the transposes), close under the transforms."""
    monkeypatch.setattr(_conv_grad, "_COLUMNS_LEFT_MAX_ROWS", left)
    case = next(c for c in CASES + STATIC_ONE if c.name == name)
    model = case.model("float", case.opsets[-1])
    vm = onnax.vjp(model, ["W"])
    (gemm,) = [n for n in vm.graph if n.op_type == "Gemm"]
    assert (gemm.inputs[0].shape or [])[0] == (27 if left else 4), gemm  # C*K, or M
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_vmap(vm, feeds, in_axes=[0, None, None, 0])


@pytest.mark.parametrize(
    "name", ["pw_groups_strided_tail", "dw_dilated", "im2col_3x3", "dw_banded_cropped"]
)
@pytest.mark.parametrize("dtype", ["float16", "double"])
def test_half_and_double(name: str, dtype: str) -> None:
    """The weight gradient of the float16 and double models (onnx's reference evaluator:
    onnxruntime has no float16 or double Conv kernel) agrees with the float model's."""
    case = next(c for c in CASES if c.name == name)
    base = case.model("float", case.opsets[-1])
    feeds32 = case.feeds(onnax.vjp(base, ["W"]))
    want = list(run(onnax.vjp(base, ["W"]), feeds32).values())[-1]
    vm = onnax.vjp(case.model(dtype, case.opsets[-1]), ["W"])
    np_type = np.float16 if dtype == "float16" else np.float64
    got = list(
        run_half(vm, {k: v.astype(np_type) for k, v in feeds32.items()}, "reference").values()
    )[-1]
    assert got.dtype == np_type
    assert rel_err(got, want) < (1e-2 if dtype == "float16" else 1e-5)
