"""GridSample and AffineGrid: jvp/vjp against finite differences, the adjoint identity, vmap.

The jvp in X runs onnxruntime's GridSample kernel while the vjp scatters through taps built in the
graph, so the adjoint check compares the two; the grid derivative is checked against finite
differences. Grids are filled with sampling points away from the kinks: pixel coordinates at
``k + [0.3, 0.7]`` for linear and cubic (the taps change at integers), ``k + [-0.2, 0.2]`` for
nearest (the rounding jumps at half integers), with ``k`` from -1 to the length (so that the
padding modes are exercised).

onnxruntime registers no double GridSample kernel at opset 16-19 (NOT_IMPLEMENTED), so those
cases are float only; its kernel takes 4-D and 5-D inputs, cubic only in 4-D.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest

import onnax
from cases import Case, Fill, case_id, parametrize, run_case, run_vmap_case
from oracles import check_jvp


def sampling_points(lengths: Sequence[int], align: int, nearest: bool) -> Fill:
    """Normalised grids (components x, y, z over axes W, H, D) with points away from kinks."""

    def fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        out = np.empty(shape, np.float64)
        for d, length in enumerate(lengths):
            k = rng.integers(-1, length + 1, shape[:-1])
            offset = rng.uniform(-0.2, 0.2, shape[:-1]) if nearest else rng.uniform(0.3, 0.7)
            c = k + offset
            out[..., d] = 2 * c / (length - 1) - 1 if align else (2 * c + 1) / length - 1
        return out.astype(dtype)

    return fill


def _case_2d(opset: int, mode: str, padding: str, align: int) -> Case:
    return Case(
        f"grid_sample_{mode}_{padding}_{align}",
        "g ({T}[N, 2, 3, 4] X, {T}[N, 2, 5, 2] G) => ({T}[N, 2, 2, 5] Y) {"
        f' Y = GridSample <mode = "{mode}", padding_mode = "{padding}",'
        f" align_corners = {align}> (X, G) }}",
        opsets=(opset,),
        dims={"N": 2},
        fill={"G": sampling_points([4, 3], align, mode == "nearest")},
        dtypes=("float",) if opset < 20 else ("float", "double"),
    )


CASES = [
    *[
        _case_2d(16, mode, padding, align)
        for mode, padding, align in itertools.product(
            ("bilinear", "nearest", "bicubic"), ("zeros", "border", "reflection"), (0, 1)
        )
    ],
    *[
        _case_2d(opset, mode, padding, align)
        for opset, mode, padding, align in [
            (20, "linear", "reflection", 0),
            (20, "cubic", "border", 1),
            (22, "cubic", "reflection", 0),
            (22, "nearest", "zeros", 1),
            (22, "linear", "zeros", 1),
        ]
    ],
    *[
        Case(
            f"grid_sample_3d_{mode}_{padding}_{align}",
            "g ({T}[N, 2, 2, 4, 3] X, {T}[N, 2, 2, 3, 3] G) => ({T}[N, 2, 2, 2, 3] Y) {"
            f' Y = GridSample <mode = "{mode}", padding_mode = "{padding}",'
            f" align_corners = {align}> (X, G) }}",
            opsets=(opset,),
            dims={"N": 2},
            fill={"G": sampling_points([3, 4, 2], align, mode == "nearest")},
            dtypes=("double",),
        )
        for opset, mode, padding, align in [
            (20, "linear", "zeros", 0),
            (22, "linear", "reflection", 1),
            (22, "linear", "border", 0),
            (20, "nearest", "reflection", 0),
        ]
    ],
    *[
        Case(
            f"affine_grid_2d_{align}",
            "g ({T}[N, 2, 3] t) => ({T}[N, 4, 5, 2] Y)"
            " { s = Constant <value = int64[4] {2, 1, 4, 5}> ()\n"
            f" Y = AffineGrid <align_corners = {align}> (t, s) }}",
            opsets=(20, 22),
            dims={"N": 2},
        )
        for align in (0, 1)
    ],
    *[
        Case(
            f"affine_grid_3d_{align}",
            "g ({T}[2, 3, 4] t) => ({T}[2, 2, 4, 3, 3] Y)"
            " { s = Constant <value = int64[5] {2, 1, 2, 4, 3}> ()\n"
            f" Y = AffineGrid <align_corners = {align}> (t, s) }}",
            opsets=(20,),
        )
        for align in (0, 1)
    ],
    Case(
        # A spatial transformer: the grid's derivative flows on to theta.
        "affine_grid_then_grid_sample",
        "g ({T}[2, 2, 3, 4] X, {T}[2, 2, 3] t) => ({T}[2, 2, 4, 5] Y)"
        " { s = Constant <value = int64[4] {2, 2, 4, 5}> ()\n"
        " g = AffineGrid <align_corners = 0> (t, s)\n"
        " Y = GridSample (X, g) }",
        opsets=(20,),
        fixed={
            "t": np.array([[[0.9, 0.2, 0.05], [-0.1, 0.8, 0.1]], [[1.1, 0, -0.1], [0.1, 0.7, 0]]])
        },
        dtypes=("double",),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def test_affine_grid_symbolic_theta() -> None:
    # theta's shape is symbolic; the spatial rank comes from size's length.
    case = Case(
        "affine_grid_symbolic",
        "g ({T}[N, K, L] t) => ({T}[N, 4, 5, 2] Y)"
        " { s = Constant <value = int64[4] {2, 1, 4, 5}> ()\n Y = AffineGrid (t, s) }",
        opsets=(20,),
        dims={"N": 2, "K": 2, "L": 3},
    )
    run_case(case, "double", 20)


@pytest.mark.parametrize(
    ("name", "opset"),
    [("grid_sample_bicubic_reflection_1", 16), ("affine_grid_then_grid_sample", 20)],
)
def test_second_order(name: str, opset: int) -> None:
    # jvp of the vjp: differentiates the taps, the scatter and the gathers once more.
    case = next(c for c in CASES if c.name == name)
    dtype = case.dtypes[-1]
    model = case.model(dtype, opset)
    vjp_model = onnax.vjp(model)
    feeds = case.feeds(model)
    rng = np.random.default_rng(5)
    for seed in list(vjp_model.graph.inputs)[len(model.graph.inputs) :]:
        shape = [d if isinstance(d, int) else 2 for d in seed.shape.dims]
        feeds[seed.name] = rng.standard_normal(shape).astype(seed.dtype.numpy())
    check_jvp(vjp_model, feeds)
