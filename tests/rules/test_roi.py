"""RoiAlign (avg) and MaxRoiPool: jvp/vjp in X against finite differences, adjoint, vmap.

Most cases fix the rois (``inputs=["X"]``); the ``roi_align_rois`` cases also differentiate
RoiAlign with respect to them (double only: float32 finite differences of the roi coordinates
would cross the kinks where a sampling point passes a pixel). MaxRoiPool's derivative with
respect to the rois is zero almost everywhere. vmap batches the rois too (integer indices as
identical copies, rois perturbed), which exercises the roi-folding batch rule.

onnxruntime has no RoiAlign kernel at opset 22 and no MaxRoiPool kernel at 22 nor for double
(NOT_IMPLEMENTED): RoiAlign is tested at 10 (converted to 11), 13, 16 and 21 (the transpose in X
scatters from 16 on, and contracts with the kernel's weights on a basis before), MaxRoiPool in
float at 11 and 21. MaxRoiPool's X is filled with distinct values (no ties for the maximum).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, distinct, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp

# The last roi reaches outside the image (samples beyond it contribute nothing).
ROIS = np.array(
    [[0.3, 0.6, 3.4, 2.7], [1.2, 0.4, 4.6, 3.9], [0.1, 1.1, 2.2, 3.3], [-1.55, 3.1, 2.15, 6.65]]
)
BATCH_INDICES = np.array([0, 1, 1, 0], np.int64)
ROIS_5 = np.concatenate([BATCH_INDICES[:, None].astype(np.float64), ROIS], axis=1)


def _rois(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    # Sampling points off the pixel grid, adaptive grid sizes off integers (no kinks nearby).
    return ROIS.astype(dtype)


def _roi_align(name: str, attrs: str, opsets: tuple[int, ...]) -> Case:
    return Case(
        name,
        "g ({T}[N, 3, 5, 6] X, {T}[4, 4] R, int64[4] I) => ({T}[4, 3, 2, 3] Y) {"
        f" Y = RoiAlign <output_height = 2, output_width = 3{attrs}> (X, R, I) }}",
        opsets=opsets,
        dims={"N": 2},
        fixed={"R": ROIS, "I": BATCH_INDICES},
        inputs=["X"],
    )


CASES = [
    _roi_align("roi_align_10", ", sampling_ratio = 2, spatial_scale = 0.9", (10,)),
    _roi_align("roi_align_adaptive", ", spatial_scale = 0.9", (16,)),
    _roi_align(
        "roi_align_output_half_pixel",
        ', sampling_ratio = 2, coordinate_transformation_mode = "output_half_pixel"',
        (16, 21),
    ),
    _roi_align(
        "roi_align_half_pixel",
        ', sampling_ratio = 3, spatial_scale = 1.1, coordinate_transformation_mode = "half_pixel"',
        (16,),
    ),
    *[
        Case(
            f"roi_align_rois_{opset}_{ratio}_{mode}",
            "g ({T}[2, 3, 5, 6] X, {T}[4, 4] R, int64[4] I) => ({T}[4, 3, 2, 3] Y) {"
            f" Y = RoiAlign <output_height = 2, output_width = 3, sampling_ratio = {ratio},"
            f" spatial_scale = 0.9{mode}> (X, R, I) }}",
            opsets=(opset,),
            fixed={"I": BATCH_INDICES},
            fill={"R": _rois},
            dtypes=("double",),
        )
        for opset, ratio, mode in [
            (16, 0, ""),
            (16, 2, ', coordinate_transformation_mode = "output_half_pixel"'),
            (21, 3, ', coordinate_transformation_mode = "half_pixel"'),
            (13, 2, ""),
        ]
    ],
    *[
        Case(
            f"max_roi_pool_{opset}",
            "g ({T}[2, 3, 5, 6] X, {T}[4, 5] R) => ({T}[4, 3, 2, 2] Y)"
            " { Y = MaxRoiPool <pooled_shape = [2, 2], spatial_scale = 0.9> (X, R) }",
            opsets=(opset,),
            fixed={"R": ROIS_5},
            inputs=["X"],
            fill={"X": distinct},
            dtypes=("float",),
        )
        for opset in (11, 21)
    ],
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def _model(text: str, opset: int) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n' + text)


def test_roi_align_max_mode_is_refused() -> None:
    m = _model(
        "g (float[1, 1, 4, 4] X, float[1, 4] R, int64[1] I) => (float[1, 1, 2, 2] Y)"
        ' { Y = RoiAlign <output_height = 2, output_width = 2, mode = "max"> (X, R, I) }',
        16,
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(m, ["X"])
    message = str(err.value)
    assert "ai.onnx::RoiAlign" in message and "'Y'" in message and "'max'" in message
    assert "Remedy" in message


def test_roi_align_second_order() -> None:
    # jvp of the vjp in X and the rois: the samples' taps and slopes are differentiated again.
    case = next(c for c in CASES if c.name == "roi_align_rois_16_0_")
    model = case.model("double", 16)
    vjp_model = onnax.vjp(model)
    feeds = case.feeds(model)
    rng = np.random.default_rng(5)
    for seed in list(vjp_model.graph.inputs)[len(model.graph.inputs) :]:
        feeds[seed.name] = rng.standard_normal([int(d) for d in seed.shape.dims])
    check_jvp(vjp_model, feeds, ["X", "R", *[v.name for v in vjp_model.graph.inputs][3:]])
