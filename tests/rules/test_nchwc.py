"""onnxruntime's NCHWc layout operators (lowerings in onnax.rules.nchwc).

Each case converts plain NCHW inputs into the blocked layout with ReorderInput, applies the
operator, and converts back with ReorderOutput, as the models ORT_ENABLE_ALL saves do; filters and
biases are given in the reordered form onnxruntime stores. The oracles run onnxruntime's own NCHWc
kernels (float only). Channel counts use this machine's block size.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, Fill, case_id, distinct, parametrize, run_case, run_vmap_case, unit
from onnax.errors import UnsupportedOperatorError
from onnax.rules.nchwc import block_size
from oracles import check_jvp, check_vjp

B = block_size()
pytestmark = pytest.mark.skipif(B == 0, reason="onnxruntime has no NCHWc kernels on this CPU")


@dataclasses.dataclass(frozen=True)
class NchwcCase(Case):
    """A case whose model imports the com.microsoft.nchwc domain; ``{B}`` is the block size."""

    opsets: tuple[int, ...] = (18,)
    dtypes: tuple[str, ...] = ("float",)

    def model(self, dtype: str, opset: int) -> ir.Model:
        text = self.text.replace("{T}", dtype).replace("{opset}", str(opset))
        text = text.replace("{B}", str(B)).replace("{B2}", str(2 * B))
        # Between one and two blocks, whatever the block size (AVX-512: 16, AVX2: 8).
        text = text.replace("{B4}", str(B + 4))
        header = f'<ir_version: 10, opset_import: ["" : {opset}, "com.microsoft.nchwc" : 1]>\n'
        return ir.from_onnx_text(header + text)


def pooled(name: str, op: str, attrs: str, out: str, fill: Fill = unit) -> NchwcCase:
    return NchwcCase(
        name,
        f"g (float[N, 8, 5, 5] x) => (float[N, 8, {out}] y) {{"
        " b = com.microsoft.nchwc.ReorderInput(x)"
        f" p = com.microsoft.nchwc.{op}{attrs}(b)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = 8>(p) }",
        fill={"x": fill},
    )


CASES = [
    NchwcCase(
        "reorder",
        "g (float[N, 12, 3, 2] x) => (float[N, 12, 3, 2] y) {"
        " b = com.microsoft.nchwc.ReorderInput(x)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = 12>(b) }",
    ),
    NchwcCase(
        "reorder_channels_last",
        "g (float[N, 3, 2, 8] x) => (float[N, 3, 2, 8] y, float[N, 8, 3, 2] z) {"
        " b = com.microsoft.nchwc.ReorderInput<channels_last = 1>(x)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = 8, channels_last = 1>(b)"
        " z = com.microsoft.nchwc.ReorderOutput<channels = 8>(b) }",
    ),
    NchwcCase(
        "conv_plain_input_relu",  # fewer than B input channels: NCHW input, OIHWBo filter
        "g (float[N, 3, 5, 5] x, float[{B}, 3, 3, 3] w, float[{B}] c) => (float[N, 5, 3, 3] y) {"
        ' o = com.microsoft.nchwc.Conv<activation = "Relu", kernel_shape = [3, 3],'
        " strides = [2, 2], pads = [1, 1, 1, 1]>(x, w, c)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = 5>(o) }",
    ),
    NchwcCase(
        "conv_blocked_sum",  # OIHWBiBo filter, a fused residual Add
        "g (float[N, {B}, 4, 4] x, float[{B2}, {B}, 1, 1] w, float[{B2}] c,"
        " float[N, {B4}, 4, 4] z) => (float[N, {B4}, 4, 4] y) {"
        " b = com.microsoft.nchwc.ReorderInput(x) s = com.microsoft.nchwc.ReorderInput(z)"
        " o = com.microsoft.nchwc.Conv<kernel_shape = [1, 1]>(b, w, c, s)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = {B4}>(o) }",
        fill={"x": unit, "w": unit},
    ),
    NchwcCase(
        "conv_depthwise",  # OIHWBo filter, group = the padded channel count
        "g (float[N, {B}, 5, 5] x, float[{B}, 1, 3, 3] w, float[{B}] c) => (float[N, {B}, 5, 5] y) {"
        " b = com.microsoft.nchwc.ReorderInput(x)"
        " o = com.microsoft.nchwc.Conv<group = {B}, kernel_shape = [3, 3], pads = [1, 1, 1, 1],"
        ' activation = "Sigmoid">(b, w, c)'
        " y = com.microsoft.nchwc.ReorderOutput<channels = {B}>(o) }",
    ),
    pooled(
        "max_pool",
        "MaxPool",
        "<kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1]>",
        "3, 3",
        distinct,  # no near-ties for the differences to swap
    ),
    pooled("average_pool", "AveragePool", "<kernel_shape = [2, 2], strides = [2, 2]>", "2, 2"),
    pooled(
        "average_pool_pads",
        "AveragePool",
        "<kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 1>",
        "5, 5",
    ),
    pooled("global_average_pool", "GlobalAveragePool", "", "1, 1"),
    pooled("global_max_pool", "GlobalMaxPool", "", "1, 1", distinct),
    pooled("upsample_nearest", "Upsample", '<scales = [1, 1, 2, 3], mode = "nearest">', "10, 15"),
    pooled("upsample_linear", "Upsample", '<scales = [1, 1, 2, 2], mode = "linear">', "10, 10"),
    pooled(
        "upsample_linear_align_corners",
        "Upsample",
        '<scales = [1, 1, 2, 2], mode = "linear", coordinate_transformation_mode = "align_corners">',
        "10, 10",
    ),
    pooled(
        "upsample_linear_half_pixel",
        "Upsample",
        '<scales = [1, 1, 2, 2], mode = "linear", coordinate_transformation_mode = "half_pixel">',
        "10, 10",
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: NchwcCase, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: NchwcCase, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_derivative_is_default_domain(case: NchwcCase) -> None:
    model = case.model("float", 18)
    feeds = case.feeds(model)
    for derived in (check_jvp(model, feeds), check_vjp(model, feeds)):
        assert {n.domain for n in derived.graph.all_nodes()} <= {""}


def test_grouped_filter_not_a_block_multiple_is_refused() -> None:
    model = NchwcCase(
        "bad",
        "g (float[1, {B}, 4, 4] x, float[{B}, 4, 1, 1] w) => (float[1, {B}, 4, 4] y) {"
        " b = com.microsoft.nchwc.ReorderInput(x)"
        " o = com.microsoft.nchwc.Conv<group = 2, kernel_shape = [1, 1]>(b, w)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = {B}>(o) }",
    ).model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model, ["w"])
    message = str(err.value)
    assert "com.microsoft.nchwc::Conv" in message
    assert f"4 input channels per group, not a multiple of the block size {B}" in message
    assert "ORT_ENABLE_EXTENDED" in message


def test_reorder_output_channels_out_of_range_is_refused() -> None:
    model = NchwcCase(
        "bad",
        "g (float[1, 8, 2, 2] x) => (float[1, 40, 2, 2] y) {"
        " b = com.microsoft.nchwc.ReorderInput(x)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = 40>(b) }",
    ).model("float", 18)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model, ["x"])
    message = str(err.value)
    assert "com.microsoft.nchwc::ReorderOutput" in message
    assert f"channels=40 is not in 1..{B}" in message


def test_block_size_matches_reorder_padding() -> None:
    """The probe agrees with the padding onnxruntime gives a tensor of 4 channels."""
    assert B in (8, 16)
    model = NchwcCase(
        "pad",
        "g (float[1, 4, 1, 1] x) => (float[1, 4, 1, 1] y) {"
        " b = com.microsoft.nchwc.ReorderInput(x)"
        " y = com.microsoft.nchwc.ReorderOutput<channels = 4>(b) }",
    ).model("float", 18)
    j = onnax.jvp(model, ["x"])
    x = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
    feeds = {"x": x, "fwd_x": np.ones_like(x)}
    from oracles import run

    y, fwd = run(j, feeds).values()
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(fwd, np.ones_like(x))
