"""DepthToSpace, SpaceToDepth, Det, Resize and Upsample: jvp/vjp against finite differences, vmap.

onnxruntime has double kernels for DepthToSpace and SpaceToDepth, so both dtypes are tested; it has
no double kernel for Det nor Resize (NOT_IMPLEMENTED), so those cases run in float only.

Resize in linear/cubic mode: the jvp in X runs onnxruntime's kernel while the vjp contracts with
interpolation matrices built in the graph, so the adjoint check compares the two. Scales and roi
are graph inputs in some cases (their derivative is checked against finite differences); those
cases are vmapped with the parameters shared (a batched scales input could change the shape).
"""

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vmap, run

# No double Det kernel in onnxruntime.
FLOAT = ("float",)

CASES = [
    Case(
        "d2s_dcr",
        "g ({T}[N, 8, 2, 3] X) => ({T}[N, 2, 4, 6] Y) { Y = DepthToSpace <blocksize = 2> (X) }",
        opsets=(11, 13, 21, 28),
        dims={"N": 2},
    ),
    Case(
        "d2s_crd",
        "g ({T}[N, 8, 2, 3] X) => ({T}[N, 2, 4, 6] Y)"
        ' { Y = DepthToSpace <blocksize = 2, mode = "CRD"> (X) }',
        opsets=(11, 13, 28),
        dims={"N": 2},
    ),
    Case(
        "d2s_crd_symbolic_spatial",
        "g ({T}[N, 9, H, W] X) => ({T}[N, 1, H3, W3] Y)"
        ' { Y = DepthToSpace <blocksize = 3, mode = "CRD"> (X) }',
        opsets=(13,),
        dims={"N": 2, "H": 2, "W": 1},
    ),
    Case(
        "s2d",
        "g ({T}[N, 2, 4, 6] X) => ({T}[N, 8, 2, 3] Y) { Y = SpaceToDepth <blocksize = 2> (X) }",
        opsets=(11, 13, 21, 28),
        dims={"N": 2},
    ),
    Case(
        "s2d_crd",
        "g ({T}[N, 2, 4, 6] X) => ({T}[N, 8, 2, 3] Y)"
        ' { Y = SpaceToDepth <blocksize = 2, mode = "CRD"> (X) }',
        opsets=(28,),
        dims={"N": 2},
    ),
    # Resize: onnxruntime has no double kernel, float only.
    Case(
        "resize_scales_11",
        "g ({T}[N, 2, 2, 3] X) => ({T}[N, 2, 4, 4] Y) { r = Constant <value = float[0] {}> ()\n"
        " s = Constant <value = float[4] {1, 1, 2, 1.5}> ()\n"
        ' Y = Resize <mode = "nearest"> (X, r, s) }',
        opsets=(11,),
        dtypes=FLOAT,
    ),
    Case(
        "resize_scales",
        "g ({T}[N, 2, 2, 3] X) => ({T}[N, 2, 4, 4] Y) { s = Constant <value = float[4] {1, 1, 2, 1.5}> ()\n"
        ' Y = Resize <mode = "nearest", nearest_mode = "floor"> (X, , s) }',
        opsets=(13, 18),
        dtypes=FLOAT,
    ),
    Case(
        "resize_sizes",
        "g ({T}[2, 1, 3, 4] X) => ({T}[2, 1, 5, 3] Y) { z = Constant <value = int64[4] {2, 1, 5, 3}> ()\n"
        ' Y = Resize <mode = "nearest", coordinate_transformation_mode = "asymmetric"> (X, , , z) }',
        opsets=(13, 19),
        dtypes=FLOAT,
    ),
    Case(
        "resize_axes",
        "g ({T}[N, 3, 4] X) => ({T}[N, 6, 2] Y) { s = Constant <value = float[2] {2, 0.5}> ()\n"
        ' Y = Resize <mode = "nearest", axes = [1, -1]> (X, , s) }',
        opsets=(18, 19),
        dtypes=FLOAT,
    ),
    *[
        Case(
            f"resize_{mode}_{ctm}",
            "g ({T}[N, 2, 3, 4] X) => ({T}[N, 2, 5, 6] Y)"
            " { s = Constant <value = float[4] {1, 1, 1.7, 1.6}> ()\n"
            " r = Constant <value = float[0] {}> ()\n"
            f' Y = Resize <mode = "{mode}", coordinate_transformation_mode = "{ctm}"{extra}>'
            " (X, r, s) }",
            opsets=opsets,
            dtypes=FLOAT,
            dims={"N": 2},
        )
        for mode, ctm, extra, opsets in [
            ("linear", "half_pixel", "", (11, 13, 19)),
            ("linear", "pytorch_half_pixel", "", (13,)),
            ("linear", "align_corners", "", (11, 18)),
            ("linear", "asymmetric", "", (13,)),
            ("linear", "half_pixel_symmetric", "", (19,)),
            ("cubic", "half_pixel", "", (11, 19)),
            ("cubic", "pytorch_half_pixel", ", cubic_coeff_a = -0.5", (13,)),
            ("cubic", "align_corners", ", exclude_outside = 1", (13,)),
            ("cubic", "asymmetric", ", exclude_outside = 1", (18,)),
            ("cubic", "half_pixel_symmetric", "", (19,)),
        ]
    ],
    *[
        Case(
            f"resize_{mode}_crop",
            "g ({T}[N, 2, 3, 4] X) => ({T}[N, 2, 5, 6] Y)"
            " { s = Constant <value = float[4] {1, 1, 1.7, 1.6}> ()\n"
            " r = Constant <value = float[8] {0, 0, -0.15, 0.1, 1, 1, 1.1, 0.85}> ()\n"
            f' Y = Resize <mode = "{mode}", coordinate_transformation_mode = "tf_crop_and_resize",'
            " extrapolation_value = 2.5> (X, r, s) }",
            opsets=(11, 19),
            dtypes=FLOAT,
            dims={"N": 2},
        )
        for mode in ("linear", "cubic", "nearest")
    ],
    Case(
        "resize_linear_2d_sizes",
        "g ({T}[3, 4] X) => ({T}[7, 3] Y) { z = Constant <value = int64[2] {7, 3}> ()\n"
        ' Y = Resize <mode = "linear"> (X, , , z) }',
        opsets=(13,),
        dtypes=FLOAT,
    ),
    Case(
        "resize_cubic_axes",
        "g ({T}[N, 2, 3, 4] X) => ({T}[N, 2, 5, 7] Y) { z = Constant <value = int64[2] {5, 7}> ()\n"
        ' Y = Resize <mode = "cubic", axes = [2, -1]> (X, , , z) }',
        opsets=(18,),
        dtypes=FLOAT,
        dims={"N": 2},
    ),
    Case(
        # not_larger: one scale min(6/3, 9/4) = 2 for both axes, so W becomes 8, not 9.
        "resize_linear_keep_aspect",
        "g ({T}[N, 2, 3, 4] X) => ({T}[N, 2, 6, 8] Y) { z = Constant <value = int64[2] {6, 9}> ()\n"
        ' Y = Resize <mode = "linear", axes = [2, 3], keep_aspect_ratio_policy = "not_larger">'
        " (X, , , z) }",
        opsets=(18,),
        dtypes=FLOAT,
        dims={"N": 2},
    ),
    Case(
        "resize_trilinear",
        "g ({T}[2, 1, 3, 4, 2] X) => ({T}[2, 1, 5, 3, 4] Y)"
        " { s = Constant <value = float[5] {1, 1, 1.7, 0.8, 2}> ()\n"
        ' Y = Resize <mode = "linear"> (X, , s) }',
        opsets=(13,),
        dtypes=FLOAT,
    ),
    Case(
        "resize_linear_nhwc",
        "g ({T}[N, 3, 4, 2] X) => ({T}[N, 5, 6, 2] Y)"
        " { s = Constant <value = float[4] {1, 1.7, 1.6, 1}> ()\n"
        ' Y = Resize <mode = "linear"> (X, , s) }',
        opsets=(13,),
        dtypes=FLOAT,
        dims={"N": 2},
    ),
    *[
        Case(
            f"resize_antialias_{mode}_{ctm}_{exclude}_{scales[0]}",
            f"g ({{T}}[N, 2, 7, 9] X) => ({{T}}[N, 2, {int(7 * scales[0])}, {int(9 * scales[1])}] Y)"
            f" {{ s = Constant <value = float[4] {{1, 1, {scales[0]}, {scales[1]}}}> ()\n"
            " r = Constant <value = float[8] {0, 0, -0.1, 0.15, 1, 1, 1.05, 0.8}> ()\n"
            f' Y = Resize <mode = "{mode}", coordinate_transformation_mode = "{ctm}",'
            f" antialias = 1, exclude_outside = {exclude}, extrapolation_value = 2.5> (X, r, s) }}",
            opsets=(18,),
            dtypes=FLOAT,
            dims={"N": 2},
        )
        for mode, ctm, exclude, scales in [
            ("linear", "half_pixel", 0, (0.6, 0.45)),
            ("linear", "align_corners", 1, (1.7, 0.8)),
            ("linear", "tf_crop_and_resize", 0, (1.7, 0.8)),
            ("cubic", "asymmetric", 0, (0.6, 0.45)),
            ("cubic", "half_pixel", 1, (1.7, 0.8)),
            ("cubic", "tf_crop_and_resize", 1, (0.6, 0.45)),
        ]
    ],
    Case(
        "upsample_9_nearest",
        "g ({T}[2, 2, 3, 4] X) => ({T}[2, 2, 6, 8] Y) { s = Constant <value = float[4] {1, 1, 2, 2}> ()\n"
        ' Y = Upsample <mode = "nearest"> (X, s) }',
        opsets=(9,),
        dtypes=FLOAT,
    ),
    Case("det_1", "g ({T}[N, 1, 1] A) => ({T}[N] Y) { Y = Det(A) }", opsets=(11,), dtypes=FLOAT),
    Case(
        "det_2",
        "g ({T}[N, 2, 2] A) => ({T}[N] Y) { Y = Det(A) }",
        opsets=(11, 13, 22),
        dtypes=FLOAT,
    ),
    Case("det_3", "g ({T}[3, 3] A) => ({T} Y) { Y = Det(A) }", opsets=(13, 21, 22), dtypes=FLOAT),
    Case(
        "det_4",
        "g ({T}[2, N, 4, 4] A) => ({T}[2, N] Y) { Y = Det(A) }",
        dims={"N": 2},
        dtypes=FLOAT,
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


def _model(text: str, opset: int) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n' + text)


@pytest.mark.parametrize(("dims", "found"), [("5, 5", "5"), ("M, M", "symbolic (M)")])
def test_det_size_limit_is_refused(dims: str, found: str) -> None:
    m = _model(f"g (float[{dims}] A) => (float Y) {{ Y = Det(A) }}", 13)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(m)
    message = str(err.value)
    assert "ai.onnx::Det" in message and "'Y'" in message
    assert "at most 4x4" in message and f"size here is {found}" in message
    assert "Remedy" in message


def test_det_second_order() -> None:
    # jvp of the gradient differentiates the Det of the minors (2x2 here) once more.
    case = next(c for c in CASES if c.name == "det_3")
    model = case.model("float", 13)
    grad_model = onnax.vjp(model)
    feeds = case.feeds(model)
    feeds["adj_Y"] = np.array(1.0, dtype=np.float32)
    check_jvp(grad_model, feeds, ["A"])


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_vmap_of_resize_in_4d_only_modes(mode: str) -> None:
    # onnxruntime runs linear and cubic Resize on 4-D inputs only: the batch must be folded into
    # axis 0, with scales given at run time.

    m = ir.from_onnx_text(
        f"""<ir_version: 10, opset_import: ["" : 18]>
        g (float[1, 2, 4, 4] X, float[4] scales) => (float[1, 2, 8, 8] Y) {{
          Y = Resize <mode = "{mode}"> (X, , scales)
        }}"""
    )
    feeds = {
        "X": np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32),
        "scales": np.array([1.0, 1.0, 2.0, 2.0], np.float32),
    }
    check_vmap(m, feeds, in_axes={"X": 0})


def _scales_fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    # Away from 1 (an axis with scale 1 is copied) and from integer output lengths 3*s, 4*s.
    return np.array([1.7, 1.6], dtype)


def _shrink_fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    # Scales 0.6725, 0.5 (the model multiplies by 0.1, so that float32 differences with step
    # 1e-2 step the scales by 1e-3: the coordinates move as 1 / scale, strongly curved). Output
    # lengths 7 * 0.6725 = 4.7 and 9 * 0.5 = 4.5 stay 4, and the source coordinates stay clear
    # of the pixel centres (the linear filter's peak, a kink).
    return np.array([6.725, 5.0], dtype)


def _roi_fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    # Some coordinates fall outside the input (extrapolated), none on its border.
    return np.array([-0.15, 0.1, 1.1, 0.85], dtype)


PARAMETER_CASES = [
    *[
        Case(
            f"resize_scales_{mode}_{ctm}",
            "g ({T}[N, 2, 3, 4] X, float[2] sc) => ({T}[N, 2, 5, 6] Y)"
            " { one = Constant <value = float[2] {1, 1}> ()\n s = Concat <axis = 0> (one, sc)\n"
            " r = Constant <value = float[0] {}> ()\n"
            f' Y = Resize <mode = "{mode}", coordinate_transformation_mode = "{ctm}"{extra}>'
            " (X, r, s) }",
            opsets=(opset,),
            dtypes=FLOAT,
            dims={"N": 2},
            fill={"sc": _scales_fill},
        )
        for mode, ctm, extra, opset in [
            ("linear", "half_pixel", "", 13),
            ("linear", "pytorch_half_pixel", "", 11),
            ("linear", "asymmetric", "", 18),
            ("linear", "half_pixel_symmetric", "", 19),
            ("linear", "align_corners", "", 13),
            ("cubic", "half_pixel", "", 13),
            ("cubic", "asymmetric", ", exclude_outside = 1", 19),
            ("cubic", "half_pixel_symmetric", ", cubic_coeff_a = -0.5", 19),
            ("linear", "half_pixel", ", antialias = 1", 18),
            ("cubic", "asymmetric", ", antialias = 1, exclude_outside = 1", 18),
        ]
    ],
    *[
        Case(
            # Shrinking widens the antialiasing filter with 1 / scale: a second path to scales.
            f"resize_scales_antialias_shrink_{mode}",
            "g ({T}[N, 2, 7, 9] X, float[2] sc) => ({T}[N, 2, 4, 4] Y)"
            " { one = Constant <value = float[2] {1, 1}> ()\n"
            " tenth = Constant <value = float {0.1}> ()\n"
            " small = Mul (sc, tenth)\n s = Concat <axis = 0> (one, small)\n"
            f' Y = Resize <mode = "{mode}", antialias = 1> (X, , s) }}',
            opsets=(18,),
            dtypes=FLOAT,
            dims={"N": 2},
            fill={"sc": _shrink_fill},
        )
        for mode in ("linear", "cubic")
    ],
    *[
        Case(
            f"resize_roi_{mode}",
            "g ({T}[3, 4] X, float[4] r) => ({T}[5, 6] Y)"
            " { s = Constant <value = float[2] {1.7, 1.6}> ()\n"
            f' Y = Resize <mode = "{mode}", coordinate_transformation_mode = "tf_crop_and_resize",'
            " extrapolation_value = 3.0> (X, r, s) }",
            opsets=(13,),
            dtypes=FLOAT,
            fill={"r": _roi_fill},
        )
        for mode in ("linear", "cubic")
    ],
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(PARAMETER_CASES), ids=case_id)
def test_resize_parameters(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)
    model = case.model(dtype, opset)
    check_vmap(model, case.feeds(model), in_axes={"X": 0})


def test_resize_nearest_scales_have_zero_derivative() -> None:
    # Nearest resizing is piecewise constant in the scales: their tangent contributes nothing.
    m = _model(
        "g (float[1, 1, 3, 4] X, float[4] s) => (float[1, 1, 5, 6] Y)"
        ' { Y = Resize <mode = "nearest"> (X, , s) }',
        13,
    )
    feeds = {
        "X": np.random.default_rng(0).standard_normal((1, 1, 3, 4)).astype(np.float32),
        "s": np.array([1, 1, 1.7, 1.6], np.float32),
    }
    jm = onnax.jvp(m, ["s"])

    got = run(jm, {**feeds, jm.graph.inputs[2].name: np.ones(4, np.float32)})
    np.testing.assert_array_equal(got[jm.graph.outputs[1].name], np.zeros((1, 1, 5, 6)))


def test_upsample_9_linear() -> None:
    case = Case(
        "upsample_9_linear",
        "g ({T}[2, 2, 3, 4] X) => ({T}[2, 2, 6, 8] Y)"
        " { s = Constant <value = float[4] {1, 1, 2, 2}> ()\n"
        ' Y = Upsample <mode = "linear"> (X, s) }',
        opsets=(9,),
        dtypes=FLOAT,
    )
    run_case(case, "float", 9)


def test_resize_second_order() -> None:
    # jvp of the vjp of a cubic Resize with run-time scales: the interpolation matrices and their
    # slopes are differentiated once more.
    case = next(c for c in PARAMETER_CASES if c.name == "resize_scales_cubic_half_pixel")
    model = case.model("float", 13)
    vjp_model = onnax.vjp(model)
    feeds = case.feeds(model)
    rng = np.random.default_rng(5)
    for seed in list(vjp_model.graph.inputs)[len(model.graph.inputs) :]:
        shape = [d if isinstance(d, int) else 2 for d in seed.shape.dims]
        feeds[seed.name] = rng.standard_normal(shape).astype(np.float32)
    check_jvp(vjp_model, feeds, ["X", "sc"])


@pytest.mark.parametrize(("name", "role"), [("sc", "scales"), ("r", "roi")])
def test_resize_batched_parameters_are_refused(name: str, role: str) -> None:
    m = _model(
        "g (float[1, 1, 3, 4] X, float[4] r, float[2] sc) => (float[1, 1, 5, 6] Y)"
        " { one = Constant <value = float[2] {1, 1}> ()\n s = Concat <axis = 0> (one, sc)\n"
        ' Y = Resize <mode = "linear", coordinate_transformation_mode = "tf_crop_and_resize">'
        " (X, r, s) }",
        13,
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(m, in_axes={"X": 0, name: 0})
    message = str(err.value)
    assert "ai.onnx::Resize" in message and "'Y'" in message and f"batched {role}" in message
    assert "Remedy" in message
