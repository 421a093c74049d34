"""DepthToSpace, SpaceToDepth and Det: jvp/vjp against finite differences, and vmap.

onnxruntime has double kernels for DepthToSpace and SpaceToDepth, so both dtypes are tested; it has
no double kernel for Det (NOT_IMPLEMENTED), so the Det cases run in float only.
"""

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp

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


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ('mode = "linear"', "mode 'linear'"),
        ('coordinate_transformation_mode = "tf_crop_and_resize"', "extrapolation_value"),
    ],
)
def test_resize_refusals(attrs: str, expected: str) -> None:
    m = _model(
        "g (float[1, 1, 2, 2] X, float[8] r) => (float[1, 1, 4, 4] Y)"
        " { s = Constant <value = float[4] {1, 1, 2, 2}> ()\n"
        f" Y = Resize <{attrs}> (X, r, s) }}",
        13,
    )
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(m, ["X"])
    message = str(err.value)
    assert "ai.onnx::Resize" in message and "'Y'" in message and expected in message
    assert "Remedy" in message


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_vmap_of_resize_in_4d_only_modes(mode: str) -> None:
    # onnxruntime runs linear and cubic Resize on 4-D inputs only: the batch must be folded into
    # axis 0, with scales given at run time.
    from oracles import check_vmap

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
