"""Col2Im and DeformConv (rules in onnax.rules.im2col).

Col2Im (18) with several channels, strides with pads, dilations, three spatial dimensions and
run-time image and block shapes, at opsets 18, 22 and 28. onnxruntime 1.32 has a float Col2Im kernel only
(no double), so Col2Im runs in float. DeformConv (19, 22) through its lowering: offsets and
masks, bias, strides and pads, groups with offset groups and dilations, in float and double
(onnxruntime has both kernels); ``run_case`` also checks that the lowered primal reproduces
onnxruntime's DeformConv kernel. Offsets are integers plus fractions in [0.2, 0.8], so no
sampling position is an integer (where bilinear sampling has kinks) and some fall outside the
image. vmap against a loop on every case, and the refusal of a batched image shape.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, vmap_axes
from onnax.errors import UnsupportedOperatorError
from oracles import check_vmap


def fractional(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Integers in [-2, 1] plus fractions in [0.2, 0.8]: sampling positions off the grid."""
    return (rng.integers(-2, 2, shape) + rng.uniform(0.2, 0.8, shape)).astype(dtype)


def _col2im(
    name: str, x: str, y: str, image: list[int], block: list[int], attrs: str = "", **kw: object
) -> Case:
    attrs = f"<{attrs}>" if attrs else ""
    text = (
        f"g ({{T}}[{x}] X) => ({{T}}[{y}] Y) {{\n"
        f" I = Constant<value = int64[{len(image)}] {{{', '.join(map(str, image))}}}>()\n"
        f" B = Constant<value = int64[{len(block)}] {{{', '.join(map(str, block))}}}>()\n"
        f" Y = Col2Im{attrs}(X, I, B) }}"
    )
    return Case(name, text, **{"opsets": (18,), "dtypes": ("float",), **kw})  # type: ignore[arg-type]


COL2IM = [
    _col2im("col2im_channels", "N, 8, 6", "N, 2, 3, 4", [3, 4], [2, 2], opsets=(18, 22, 28)),
    _col2im(
        "col2im_strides_pads",
        "N, 9, 9",
        "N, 1, 5, 5",
        [5, 5],
        [3, 3],
        "strides=[2, 2], pads=[1, 1, 1, 1]",
        opsets=(18, 28),
    ),
    _col2im("col2im_dilations", "N, 8, 15", "N, 2, 6, 6", [6, 6], [2, 2], "dilations=[1, 3]"),
    _col2im("col2im_3d", "N, 4, 36", "N, 1, 3, 4, 5", [3, 4, 5], [1, 2, 2]),
    Case(
        "col2im_runtime_block_shape",
        "g ({T}[N, 6, 4] X, int64[2] B) => ({T}[N, 1, 4, 4] Y) {\n"
        " I = Constant<value = int64[2] {4, 4}>()\n Y = Col2Im<strides=[2, 1]>(X, I, B) }",
        opsets=(18, 28),
        dtypes=("float",),
        fixed={"B": np.array([2, 3])},
    ),
    Case(
        "col2im_runtime_image_shape",
        "g ({T}[N, 4, 4] X, int64[2] I) => ({T}[N, 1, 3, 3] Y) {\n"
        " B = Constant<value = int64[2] {2, 2}>()\n Y = Col2Im(X, I, B) }",
        opsets=(18,),
        dtypes=("float",),
        fixed={"I": np.array([3, 3])},
    ),
]

DEFORM = [
    Case(
        "deform_basic",
        "g ({T}[N, 2, 5, 5] X, {T}[3, 2, 3, 3] W, {T}[N, 18, 3, 3] O) => ({T}[N, 3, 3, 3] Y) {\n"
        " Y = DeformConv(X, W, O) }",
        opsets=(19, 22),
        fill={"O": fractional},
    ),
    Case(
        "deform_bias_mask_strides_pads",
        "g ({T}[N, 2, 5, 6] X, {T}[3, 2, 2, 2] W, {T}[N, 8, 3, 4] O, {T}[3] B, "
        "{T}[N, 4, 3, 4] M) => ({T}[N, 3, 3, 4] Y) {\n"
        " Y = DeformConv<strides=[2, 2], pads=[1, 1, 1, 1]>(X, W, O, B, M) }",
        opsets=(19, 22),
        fill={"O": fractional},
    ),
    Case(
        "deform_groups_offset_groups_dilations",
        "g ({T}[N, 4, 4, 4] X, {T}[4, 2, 2, 2] W, {T}[N, 16, 2, 3] O, {T}[N, 8, 2, 3] M) "
        "=> ({T}[N, 4, 2, 3] Y) {\n"
        " Y = DeformConv<group=2, offset_group=2, dilations=[2, 1], kernel_shape=[2, 2]>"
        "(X, W, O, , M) }",
        opsets=(22,),
        fill={"O": fractional},
    ),
]

CASES = COL2IM + DEFORM


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    names = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    for axes in vmap_axes(model).values():
        in_axes = {n: None if n in ("I", "B") else a for n, a in zip(names, axes, strict=True)}
        check_vmap(model, feeds, in_axes=in_axes, out_axes=0)
    check_vmap(model, feeds, in_axes={n: 0 for n in names if n not in ("I", "B")}, out_axes=-1)


def test_vmap_of_deform_conv_vjp() -> None:
    case = DEFORM[1]
    model = case.model("double", 22)
    vm = onnax.vjp(model)
    check_vmap(vm, case.feeds(vm), in_axes=0)


def test_vmap_refuses_batched_image_shape() -> None:
    model = COL2IM[-1].model("float", 18)
    with pytest.raises(
        UnsupportedOperatorError, match=r"ai\.onnx::Col2Im.*image_shape.*'I'.*Remedy"
    ):
        onnax.vmap(model, in_axes=0)
