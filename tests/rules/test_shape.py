import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case, vmap_axes
from onnax.errors import UnsupportedOperatorError
from onnax.rules.shape import _clamp
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap, run, session


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def lit(values: list[int]) -> str:
    return f"int64[{len(values)}] {{{', '.join(map(str, values))}}}"


RESHAPE_RUNTIME = Case(
    # The target shape is computed at run time from the input's shape: [2 N, 3].
    "reshape_runtime_shape",
    """g ({T}[N, 2, 3] X) => ({T}[M, 3] Y)
    <int64[1] c0 = {0}, int64[1] c1 = {1}, int64[1] two = {2}, int64[1] three = {3}> {
        sh = Shape(X)
        n = Slice(sh, c0, c1)
        n2 = Mul(n, two)
        s = Concat <axis = 0> (n2, three)
        Y = Reshape(X, s)
    }""",
    opsets=(11, 13, 21),
)

RESHAPE = [
    Case(
        "reshape_minus_one",
        "g ({T}[N, 4] X) => ({T}[M, 6] Y) { s = Constant <value = int64[2] {-1, 6}> ()\n Y = Reshape(X, s) }",
        opsets=(11, 13, 14, 19, 21),
    ),
    Case(
        "reshape_allowzero",
        "g ({T}[2, 3, 4] X) => ({T}[3, 8] Y) { s = Constant <value = int64[2] {3, 8}> ()\n"
        " Y = Reshape <allowzero = 1> (X, s) }",
        opsets=(14, 21),
    ),
    Case(
        "reshape_copy_zero",
        "g ({T}[N, 2, 3] X) => ({T}[N, 6] Y) { s = Constant <value = int64[2] {0, -1}> ()\n Y = Reshape(X, s) }",
        opsets=(13,),
    ),
    RESHAPE_RUNTIME,
    Case(
        "flatten",
        "g ({T}[N, 2, 3] X) => ({T}[N, 6] Y) { Y = Flatten <axis = 1> (X) }",
        opsets=(11, 13, 21),
    ),
    Case(
        "flatten_axis0",
        "g ({T}[N, 2, 3] X) => ({T}[1, M] Y) { Y = Flatten <axis = 0> (X) }",
        opsets=(13,),
    ),
    Case(
        "flatten_neg_axis",
        "g ({T}[N, 2, 3] X) => ({T}[M, 3] Y) { Y = Flatten <axis = -1> (X) }",
        opsets=(21,),
    ),
    Case(
        "transpose_perm",
        "g ({T}[N, 2, 3] X) => ({T}[3, N, 2] Y) { Y = Transpose <perm = [2, 0, 1]> (X) }",
        opsets=(11, 13, 21),
    ),
    Case(
        "transpose_default",
        "g ({T}[N, 2, 3] X) => ({T}[3, 2, N] Y) { Y = Transpose (X) }",
        opsets=(13,),
    ),
]

SQUEEZE = [
    Case(
        "squeeze_attr",
        "g ({T}[N, 1, 3] X) => ({T}[N, 3] Y) { Y = Squeeze <axes = [1]> (X) }",
        opsets=(11,),
    ),
    Case(
        "squeeze_attr_neg",
        "g ({T}[N, 3, 1] X) => ({T}[N, 3] Y) { Y = Squeeze <axes = [-1]> (X) }",
        opsets=(11,),
    ),
    Case(
        "squeeze_input",
        "g ({T}[N, 1, 3, 1] X) => ({T}[N, 3] Y) { a = Constant <value = int64[2] {1, -1}> ()\n Y = Squeeze(X, a) }",
        opsets=(13, 21),
    ),
    Case(
        "squeeze_all",
        "g ({T}[2, 1, 3, 1] X) => ({T}[2, 3] Y) { Y = Squeeze(X) }",
        opsets=(11, 13, 21),
    ),
    Case(
        # Axes known at run time only (a graph input).
        "squeeze_runtime_axes",
        "g ({T}[N, 1, 3] X, int64[1] a) => ({T}[N, 3] Y) { Y = Squeeze(X, a) }",
        fixed={"a": i64(1)},
        opsets=(13,),
    ),
    Case(
        "unsqueeze_attr",
        "g ({T}[N, 3] X) => ({T}[1, N, 3, 1] Y) { Y = Unsqueeze <axes = [0, -1]> (X) }",
        opsets=(11,),
    ),
    Case(
        "unsqueeze_input",
        "g ({T}[N, 3] X) => ({T}[1, N, 3, 1] Y) { a = Constant <value = int64[2] {0, -1}> ()\n Y = Unsqueeze(X, a) }",
        opsets=(13, 21),
    ),
]

CONCAT_SPLIT = [
    Case(
        "concat_axis1",
        "g ({T}[N, 2] A, {T}[N, 3] B) => ({T}[N, 5] Y) { Y = Concat <axis = 1> (A, B) }",
        opsets=(11, 13),
    ),
    Case(
        # Along the symbolic axis, with inputs of different symbolic sizes.
        "concat_symbolic_axis",
        "g ({T}[N, 2] A, {T}[M, 2] B, {T}[1, 2] C) => ({T}[K, 2] Y) { Y = Concat <axis = 0> (A, B, C) }",
        dims={"N": 3, "M": 2},
        opsets=(11, 13),
    ),
    Case(
        # Only B carries a derivative: A and C get zeros in forward mode and no cotangent.
        "concat_partial",
        "g ({T}[N, 2] A, {T}[N, 3] B, {T}[N, 1] C) => ({T}[N, 6] Y) { Y = Concat <axis = -1> (A, B, C) }",
        inputs=["B"],
        opsets=(13,),
    ),
    Case(
        "split_attr_uneven",
        "g ({T}[N, 7] X) => ({T}[N, 2] Y0, {T}[N, 5] Y1) { Y0, Y1 = Split <axis = 1, split = [2, 5]> (X) }",
        opsets=(11,),
    ),
    Case(
        "split_input_uneven",
        "g ({T}[N, 7] X) => ({T}[N, 2] Y0, {T}[N, 4] Y1, {T}[N, 1] Y2) "
        "{ s = Constant <value = int64[3] {2, 4, 1}> ()\n Y0, Y1, Y2 = Split <axis = 1> (X, s) }",
        opsets=(13, 18),
    ),
    Case(
        "split_num_outputs_uneven",
        "g ({T}[N, 7] X) => ({T}[N, 3] Y0, {T}[N, 3] Y1, {T}[N, 1] Y2) "
        "{ Y0, Y1, Y2 = Split <axis = -1, num_outputs = 3> (X) }",
        opsets=(18, 21),
    ),
    Case(
        "split_symbolic_axis",
        "g ({T}[N, 2] X) => ({T}[1, 2] Y0, {T}[K, 2] Y1) "
        "{ s = Constant <value = int64[2] {1, 2}> ()\n Y0, Y1 = Split <axis = 0> (X, s) }",
        opsets=(13,),
    ),
    Case(
        # The middle output is not a graph output: its cotangent is a zero.
        "split_unused_output",
        "g ({T}[N, 6] X) => ({T}[N, 2] Y0, {T}[N, 2] Y2) { Y0, Y1, Y2 = Split <axis = 1> (X) }",
        opsets=(11, 13),
    ),
    Case(
        # Two outputs of a Concat-Split chain differentiated together.
        "concat_then_split",
        "g ({T}[N, 2] A, {T}[N, 3] B) => ({T}[N, 1] Y0, {T}[N, 4] Y1) "
        "{ c = Concat <axis = 1> (A, B)\n Y0, Y1 = Split <axis = 1, split = [1, 4]> (c) }",
        opsets=(11,),
    ),
]


def slice_case(
    name: str,
    shape: str,
    out: str,
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int] | None,
    opsets: tuple[int, ...],
    dims: dict[str, int] | None = None,
) -> Case:
    args = ["X", "b", "e"]
    consts = [f"b = Constant <value = {lit(starts)}> ()", f"e = Constant <value = {lit(ends)}> ()"]
    if axes is not None:
        consts.append(f"a = Constant <value = {lit(axes)}> ()")
        args.append("a")
    elif steps is not None:
        args.append("")
    if steps is not None:
        consts.append(f"p = Constant <value = {lit(steps)}> ()")
        args.append("p")
    body = "\n ".join([*consts, f"Y = Slice({', '.join(args)})"])
    return Case(
        name,
        f"g ({{T}}[{shape}] X) => ({{T}}[{out}] Y) {{ {body} }}",
        opsets=opsets,
        dims=dims or {},
    )


SLICE = [
    slice_case("slice_static", "N, 6", "N, 4", [1], [5], [1], None, (11, 13, 18)),
    slice_case("slice_no_axes_clamped_end", "4, 6", "2, 4", [1, 2], [3, 100], None, None, (13,)),
    slice_case("slice_reverse", "N, 6", "N, 5", [-2], [-100], [1], [-1], (13,)),
    slice_case(
        "slice_reverse_two_axes", "N, 5", "2, 5", [4, 0], [-(2**63), 2], [1, -2], [-1, 1], (13, 21)
    ),
    slice_case("slice_step2", "N, 7", "N, 3", [1], [100], [1], [2], (11, 13)),
    slice_case("slice_step_neg2", "N, 7", "N, 4", [6], [-100], [-1], [-2], (13, 18)),
    slice_case("slice_symbolic_neg", "N, 3", "K, 3", [-4], [-1], [0], None, (11, 13, 21), {"N": 6}),
    slice_case(
        "slice_symbolic_neg_step",
        "N, 3",
        "K, 2",
        [-1, 0],
        [-5, 2],
        [0, 1],
        [-2, 1],
        (13,),
        {"N": 6},
    ),
    slice_case("slice_empty", "N, 6", "N, 0", [4], [2], [1], [1], (13,)),
    slice_case("slice_omitted_axes", "5, N", "2, K", [1, -1], [4, -100], None, [2, -1], (13,)),
    Case(
        # Every slice parameter is a graph input: known at run time only.
        "slice_runtime",
        "g ({T}[N, 7] X, int64[2] b, int64[2] e, int64[2] a, int64[2] p) => ({T}[K, L] Y) { Y = Slice(X, b, e, a, p) }",
        fixed={"b": i64(-1, 1), "e": i64(-100, 6), "a": i64(0, -1), "p": i64(-2, 1)},
        dims={"N": 5},
        opsets=(11, 13, 21),
    ),
    Case(
        "slice_runtime_no_axes",
        "g ({T}[N, 7] X, int64[2] b, int64[2] e) => ({T}[K, L] Y) { Y = Slice(X, b, e) }",
        fixed={"b": i64(1, -3), "e": i64(100, 7)},
        opsets=(13,),
    ),
    Case(
        "slice_runtime_int32",
        "g ({T}[N, 7] X, int32[1] b, int32[1] e, int32[1] a) => ({T}[N, L] Y) { Y = Slice(X, b, e, a) }",
        fixed={
            "b": np.array([2], np.int32),
            "e": np.array([-1], np.int32),
            "a": np.array([1], np.int32),
        },
        opsets=(13,),
    ),
]


def pad_case(
    name: str,
    shape: str,
    pads: list[int],
    mode: str,
    opsets: tuple[int, ...],
    dims: dict[str, int] | None = None,
) -> Case:
    body = f'p = Constant <value = {lit(pads)}> ()\n Y = Pad <mode = "{mode}"> (X, p)'
    return Case(
        name,
        f"g ({{T}}[{shape}] X) => ({{T}}[K, L] Y) {{ {body} }}",
        opsets=opsets,
        dims=dims or {},
    )


PAD = [
    pad_case("pad_constant", "N, 3", [0, 1, 0, 2], "constant", (11, 13, 18, 21)),
    pad_case("pad_constant_negative", "N, 4", [1, -1, -1, 2], "constant", (11, 13, 19)),
    pad_case("pad_reflect", "N, 4", [0, 2, 1, 3], "reflect", (11, 13, 18, 21), {"N": 4}),
    pad_case("pad_reflect_negative", "N, 5", [1, -1, 0, 2], "reflect", (13,), {"N": 4}),
    pad_case("pad_edge", "N, 3", [2, 1, 1, 3], "edge", (11, 13, 19)),
    pad_case("pad_edge_negative", "N, 4", [-1, 3, 2, -2], "edge", (18,)),
    pad_case("pad_wrap", "N, 4", [1, 2, 3, 1], "wrap", (19, 21)),
    pad_case("pad_wrap_negative", "N, 4", [-1, 2, 2, -1], "wrap", (19,)),
    Case(
        # The padding value carries a derivative: d/dv = number of padded positions.
        "pad_constant_value",
        "g ({T}[N, 3] X, {T} v) => ({T}[K, 4] Y) { p = Constant <value = int64[4] {1, 0, 2, 1}> ()\n Y = Pad(X, p, v) }",
        opsets=(11, 13, 21),
    ),
    Case(
        "pad_constant_value_only",
        "g ({T}[N, 3] X, {T}[1] v) => ({T}[K, 3] Y) { p = Constant <value = int64[4] {1, -1, 2, 1}> ()\n"
        " Y = Pad(X, p, v) }",
        inputs=["v"],
        opsets=(13,),
    ),
    Case(
        "pad_axes",
        "g ({T}[N, 3, 2] X, {T} v) => ({T}[K, 3, L] Y) { p = Constant <value = int64[4] {1, 2, -1, 1}> ()\n"
        " a = Constant <value = int64[2] {-1, 0}> ()\n Y = Pad(X, p, v, a) }",
        opsets=(18, 21),
    ),
    Case(
        "pad_axes_reflect",
        "g ({T}[N, 3, 4] X) => ({T}[N, 3, 7] Y) { p = Constant <value = int64[2] {1, 2}> ()\n"
        ' a = Constant <value = int64[1] {-1}> ()\n Y = Pad <mode = "reflect"> (X, p, , a) }',
        opsets=(18, 21),
    ),
    Case(
        # Pads and axes known at run time only.
        "pad_runtime_edge",
        'g ({T}[N, 3, 4] X, int64[4] p, int64[2] a) => ({T}[K, 3, L] Y) { Y = Pad <mode = "edge"> (X, p, , a) }',
        fixed={"p": i64(2, -1, 1, 2), "a": i64(0, -1)},
        opsets=(18,),
    ),
    Case(
        "pad_runtime_constant",
        "g ({T}[N, 3] X, int64[4] p, {T} v) => ({T}[K, L] Y) { Y = Pad(X, p, v) }",
        fixed={"p": i64(1, -1, 0, 2)},
        opsets=(11, 13),
    ),
    Case(
        "pad_runtime_constant_axes",
        "g ({T}[N, 3] X, int64[2] p, int64[1] a, {T} v) => ({T}[K, L] Y) { Y = Pad(X, p, v, a) }",
        fixed={"p": i64(2, -1), "a": i64(-1)},
        opsets=(18,),
    ),
    Case(
        "pad_runtime_reflect",
        'g ({T}[N, 4] X, int64[4] p) => ({T}[K, L] Y) { Y = Pad <mode = "reflect"> (X, p) }',
        fixed={"p": i64(1, 2, 2, 1)},
        opsets=(11,),
    ),
]

MISC = [
    Case(
        "tile",
        "g ({T}[N, 2] X) => ({T}[K, 6] Y) { r = Constant <value = int64[2] {2, 3}> ()\n Y = Tile(X, r) }",
        opsets=(11, 13),
    ),
    Case(
        "tile_static",
        "g ({T}[2, 3] X) => ({T}[6, 3] Y) { r = Constant <value = int64[2] {3, 1}> ()\n Y = Tile(X, r) }",
    ),
    Case(
        "tile_runtime",
        "g ({T}[N, 2, 1] X, int64[3] r) => ({T}[K, L, M] Y) { Y = Tile(X, r) }",
        fixed={"r": i64(1, 2, 3)},
        opsets=(13,),
    ),
    Case(
        "expand",
        "g ({T}[N, 1] X) => ({T}[N, 4] Y) { s = Constant <value = int64[2] {1, 4}> ()\n Y = Expand(X, s) }",
        opsets=(11, 13),
    ),
    Case(
        # Constants and ConstantOfShape on the path: no tangent flows through them.
        "constant_sources",
        "g ({T}[N, 3] X) => ({T}[N, 6] Y) { s = Constant <value = int64[2] {1, 3}> ()\n"
        " z = ConstantOfShape <value = {T}[1] {1.5}> (s)\n"
        " m = Mul(X, z)\n c = Constant <value = int64[4] {0, 1, 0, -1}> ()\n p = Pad(X, c)\n"
        " Y = Concat <axis = 1> (m, p) }",
        opsets=(11, 21),
    ),
    Case(
        # Keep (limit - start) / delta far from an integer: the length must not change under FD.
        "range",
        "g ({T} s, {T} l, {T} d) => ({T}[K] Y) { Y = Range(s, l, d) }",
        fixed={"s": np.array(0.3), "l": np.array(5.1), "d": np.array(0.7)},
        opsets=(11, 21),
    ),
    Case(
        "range_negative_delta",
        "g ({T} s, {T} l, {T} d) => ({T}[K] Y) { Y = Range(s, l, d) }",
        fixed={"s": np.array(2.0), "l": np.array(-1.3), "d": np.array(-0.6)},
        inputs=["s", "d"],
        opsets=(13,),
    ),
    Case("dropout_inference", "g ({T}[N, 3] X) => ({T}[N, 3] Y) { Y = Dropout(X) }", opsets=(11,)),
    Case(
        "dropout_mask",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y, bool[N, 3] M) { Y, M = Dropout <ratio = 0.5> (X) }",
        opsets=(11,),
    ),
    Case(
        "dropout_training_false",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { r = Constant <value = {T} {0.3}> ()\n"
        " f = Constant <value = bool {0}> ()\n Y = Dropout(X, r, f) }",
        opsets=(13, 22),
    ),
    Case(
        # Every transpose rule composed with the others, several outputs at once.
        "layout_chain",
        """g ({T}[N, 2, 3] X, {T}[N, 1] B) => ({T}[N, 3, 3] Y0, {T}[N, 3, 4] Y1) {
            t = Transpose <perm = [0, 2, 1]> (X)
            f = Flatten <axis = 1> (t)
            c = Concat <axis = 1> (f, B)
            u = Unsqueeze <axes = [1]> (c)
            q = Constant <value = int64[6] {0, 1, 0, 0, 1, 0}> ()
            p = Pad <mode = "edge"> (u, q)
            Y0, Y1 = Split <axis = 2, split = [3, 4]> (p)
        }""",
        opsets=(11,),
    ),
    Case(
        "layout_chain_dynamic",
        """g ({T}[N, 2, 3] X) => ({T}[K, 2] Y0, {T}[L] Y1) {
            b = Constant <value = int64[1] {-1}> ()
            e = Constant <value = int64[1] {-100}> ()
            a = Constant <value = int64[1] {0}> ()
            st = Constant <value = int64[1] {-2}> ()
            s = Slice(X, b, e, a, st)
            r = Constant <value = int64[2] {-1, 2}> ()
            f = Reshape(s, r)
            r2 = Constant <value = int64[2] {2, 1}> ()
            Y0 = Tile(f, r2)
            z = Constant <value = int64[1] {-1}> ()
            Y1 = Reshape(X, z)
        }""",
        dims={"N": 4},
        opsets=(13, 21),
    ),
]

CASES = RESHAPE + SQUEEZE + CONCAT_SPLIT + SLICE + PAD + MISC


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


def model(text: str, opset: int = 13) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n' + text)


def test_split_one_output_selected() -> None:
    m = model(
        "g (double[N, 7] X) => (double[N, 3] Y0, double[N, 4] Y1) { Y0, Y1 = Split <axis = 1, split = [3, 4]> (X) }",
        11,
    )
    feeds = {"X": np.random.default_rng(0).standard_normal((3, 7))}
    check_vjp(m, feeds, outputs=["Y1"])
    check_adjoint(m, feeds, outputs=["Y1"])


def test_static_slice_transposes_to_pad() -> None:
    m = SLICE[2].model("double", 13)
    ops = {n.op_type for n in onnax.vjp(m).graph}
    assert "Pad" in ops and "ScatterND" not in ops


def test_dynamic_slice_transposes_to_scatter() -> None:
    m = SLICE[6].model("double", 13)
    ops = {n.op_type for n in onnax.vjp(m).graph}
    assert "ScatterND" in ops


@pytest.mark.parametrize("case", [RESHAPE_RUNTIME, SLICE[6], SLICE[7], PAD[4]], ids=case_id)
def test_one_model_serves_several_batch_sizes(case: Case) -> None:
    m = case.model("double", 13)
    for n in (1, 2, 5, 7):
        shape = [n if not isinstance(d, int) else d for d in m.graph.inputs[0].shape.dims]
        feeds = {"X": np.random.default_rng(n).standard_normal(shape)}
        check_jvp(m, feeds)
        check_vjp(m, feeds)


def test_range_derivative_values() -> None:
    m = model("g (double s, double l, double d) => (double[K] Y) { Y = Range(s, l, d) }")
    j = onnax.jvp(m)
    feeds = {"s": 0.5, "l": 3.0, "d": 0.75, "fwd_s": 1.0, "fwd_l": 5.0, "fwd_d": 2.0}
    got = run(j, {k: np.array(v) for k, v in feeds.items()})
    np.testing.assert_allclose(got["fwd_Y"], 1.0 + 2.0 * np.arange(4))


def test_pad_value_derivative_counts_padded_positions() -> None:
    m = model(
        "g (double[2, 3] X, double v) => (double[4, 5] Y) { p = Constant <value = int64[4] {1, -1, 1, 3}> ()\n"
        " Y = Pad(X, p, v) }"
    )
    g = onnax.vjp(m, inputs=["v"])
    got = run(g, {"X": np.zeros((2, 3)), "v": np.array(1.0), "adj_Y": np.ones((4, 5))})
    # 20 outputs, of which X fills rows 1..2 and, its first column cropped, columns 0..1.
    assert float(got["adj_v"]) == pytest.approx(20 - 2 * 2)


@pytest.mark.parametrize("flag", ["true", "runtime"])
def test_dropout_training_mode_is_refused(flag: str) -> None:
    if flag == "true":
        text = "g (float[N, 3] X) => (float[N, 3] Y) { f = Constant <value = bool {1}> ()\n Y = Dropout(X, , f) }"
    else:
        text = "g (float[N, 3] X, bool f) => (float[N, 3] Y) { Y = Dropout(X, , f) }"
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.jvp(model(text, 13))
    message = str(err.value)
    assert "ai.onnx::Dropout" in message and "training_mode" in message and "'Y'" in message
    assert ("constant true" if flag == "true" else "run time") in message
    assert "Remedy" in message and message.startswith("jvp:") and "opset 13" in message


def test_slice_clamp_matches_onnxruntime() -> None:
    # ONNX clamps differently from Python slicing (a negative step clamps start to dim - 1).
    m = model(
        "g (int64[N] X, int64[1] b, int64[1] e, int64[1] p) => (int64[K] Y) "
        "{ a = Constant <value = int64[1] {0}> ()\n Y = Slice(X, b, e, a, p) }"
    )
    sess = session(m)
    rng = np.random.default_rng(0)
    for _ in range(1000):
        dim = int(rng.integers(0, 6))
        start, end = (int(v) for v in rng.integers(-9, 9, 2))
        step = int(rng.choice([-3, -2, -1, 1, 2, 3]))
        feeds = {"X": np.arange(dim), "b": i64(start), "e": i64(end), "p": i64(step)}
        s, e = _clamp(start, end, step, dim)
        assert list(range(s, e, step)) == sess.run(None, feeds)[0].tolist(), (dim, start, end, step)


BY_NAME = {c.name: c for c in CASES}
# One case per transpose path (Pad path and scatter path of Slice, one-hot and scatter-add of
# Pad, run-time parameters), each at one opset.
SECOND_ORDER = [
    ("reshape_runtime_shape", 13),
    ("squeeze_all", 13),
    ("concat_partial", 13),
    ("split_unused_output", 11),
    ("slice_reverse", 13),
    ("slice_symbolic_neg", 11),
    ("slice_runtime", 13),
    ("pad_reflect", 13),
    ("pad_reflect", 18),
    ("pad_constant_value", 21),
    ("pad_runtime_edge", 18),
    ("tile_runtime", 13),
    ("range", 21),
    ("layout_chain_dynamic", 13),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER)
def test_second_order(name: str, opset: int) -> None:
    # jvp and vjp of the vjp model: the operators the transpose rules emit are differentiated
    # (and transposed) in turn.
    case = BY_NAME[name]
    m = case.model("double", opset)
    feeds = case.feeds(m)
    v = onnax.vjp(m, case.inputs)
    primal = run(m, feeds)
    rng = np.random.default_rng(7)
    seeds = list(v.graph.inputs)[len(m.graph.inputs) :]
    for s, y in zip(
        seeds, [o for o in m.graph.outputs if o.dtype == ir.DataType.DOUBLE], strict=True
    ):
        feeds[s.name] = rng.standard_normal(primal[y.name].shape)
    floats = [x.name for x in m.graph.inputs if x.dtype == ir.DataType.DOUBLE]
    wrt = [*(case.inputs or floats), *(s.name for s in seeds)]
    check_jvp(v, feeds, wrt)
    check_vjp(v, feeds, wrt)


def test_emitted_operators_have_rules() -> None:
    # Closure: every operator in the derivative models of these cases has a jvp rule.
    from onnax.rules import collect, jvp_rules

    collect()
    missing = set()
    for case in CASES:
        for opset in case.opsets:
            m = case.model("double", opset)
            for d in (onnax.vjp(m, case.inputs), onnax.jvp(m, case.inputs)):
                for n in d.graph:
                    if jvp_rules.lookup(n.domain, n.op_type, opset) is None:
                        missing.add((n.op_type, opset))
    assert not missing, sorted(missing)


# ----------------------------------------------------------------------------------- vmap
def shape_like_inputs(m: ir.Model) -> list[str]:
    """Integer graph inputs: in these cases they are shapes, axes, pads, bounds or repeats."""
    ints = (ir.DataType.INT64, ir.DataType.INT32)
    return [v.name for v in m.graph.inputs if v.dtype in ints]


def shared(m: ir.Model, axes: tuple[int | None, ...], names: list[str]) -> tuple[int | None, ...]:
    inputs = [v.name for v in m.graph.inputs]
    return tuple(None if n in names else a for n, a in zip(inputs, axes, strict=True))


# Every input of Range decides the length of its result: refused whatever is batched.
VMAP_REFUSED = {"range", "range_negative_delta"}


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    m = case.model(dtype, opset)
    if case.name in VMAP_REFUSED:
        for axes in vmap_axes(m).values():
            with pytest.raises(UnsupportedOperatorError, match="Range"):
                onnax.vmap(m, in_axes=axes)
        return
    names = shape_like_inputs(m)
    if not names:
        run_vmap_case(case, dtype, opset)
        return
    # Shape-like inputs batched (identical copies in the all-batched variants) are refused:
    # nothing proves the copies equal. Shared, every variant works.
    feeds = case.feeds(m)
    for axes in vmap_axes(m).values():
        if shared(m, axes, names) != axes:
            with pytest.raises(UnsupportedOperatorError, match="in_axes None"):
                onnax.vmap(m, in_axes=axes)
        check_vmap(m, feeds, in_axes=shared(m, axes, names))
    check_vmap(m, feeds, in_axes=shared(m, (0,) * len(m.graph.inputs), names), out_axes=-1)


TARGETED = [
    Case(
        # A 0 in the middle copies the input's dimension at the same position.
        "reshape_zero_and_minus_one",
        "g ({T}[4, 3, 2] X) => ({T}[2, 3, 4] Y) { s = Constant <value = int64[3] {2, 0, -1}> ()\n"
        " Y = Reshape(X, s) }",
        opsets=(11, 14, 21),
    ),
    Case(
        "reshape_zero_symbolic",
        "g ({T}[N, 3, 2] X) => ({T}[N, 3, 2] Y) { s = Constant <value = int64[3] {0, -1, 2}> ()\n"
        " Y = Reshape(X, s) }",
        opsets=(13,),
    ),
    Case(
        # allowzero=1: a 0 is a zero-size dimension (the data is empty).
        "reshape_allowzero_empty",
        "g ({T}[2, 0, 3] X) => ({T}[0, 3, 5] Y) { s = Constant <value = int64[3] {0, 3, 5}> ()\n"
        " Y = Reshape <allowzero = 1> (X, s) }",
        opsets=(14, 21),
    ),
    Case(
        "reshape_to_scalar",
        "g ({T}[1, 1] X) => ({T} Y) { s = Constant <value = int64[0] {}> ()\n Y = Reshape(X, s) }",
        opsets=(13,),
    ),
    Case(
        "reshape_shared_shape_input",
        "g ({T}[N, 6] X, int64[3] s) => ({T}[A, B, C] Y) { Y = Reshape(X, s) }",
        fixed={"s": i64(-1, 2, 3)},
        opsets=(13,),
    ),
    Case(
        "expand_shape_longer",
        "g ({T}[2, 1] X) => ({T}[3, 2, 4] Y) { s = Constant <value = int64[3] {3, 1, 4}> ()\n"
        " Y = Expand(X, s) }",
        opsets=(11, 13),
    ),
    Case(
        "expand_shape_shorter",
        "g ({T}[2, 3, 1] X) => ({T}[2, 3, 4] Y) { s = Constant <value = int64[1] {4}> ()\n"
        " Y = Expand(X, s) }",
        opsets=(13,),
    ),
    Case(
        "expand_ones_in_shape",
        "g ({T}[N, 3] X) => ({T}[N, 3] Y) { s = Constant <value = int64[2] {1, 1}> ()\n Y = Expand(X, s) }",
        opsets=(13,),
    ),
    Case(
        # The target comes from another batched input's Shape (unbatched under vmap).
        "expand_to_shape_of",
        "g ({T}[N, 1] X, {T}[2, N, 4] Z) => ({T}[2, N, 4] Y) { s = Shape(Z)\n Y = Expand(X, s) }",
        opsets=(13, 21),
    ),
    Case(
        # The length of the shape is unknown statically; the result's rank is known.
        "expand_runtime_length",
        "g ({T}[2, 1] X, int64[K] s) => ({T}[A, B, C] Y) { Y = Expand(X, s) }",
        fixed={"s": i64(3, 1, 4)},
        opsets=(13,),
    ),
    Case(
        "flatten_static",
        "g ({T}[2, 3, 4] X) => ({T}[6, 4] Y) { Y = Flatten <axis = 2> (X) }",
        opsets=(11, 21),
    ),
    Case(
        "flatten_static_axis0",
        "g ({T}[2, 3, 4] X) => ({T}[1, 24] Y) { Y = Flatten <axis = 0> (X) }",
        opsets=(13,),
    ),
    Case(
        "flatten_symbolic_back",
        "g ({T}[2, 3, N] X) => ({T}[2, M] Y) { Y = Flatten <axis = 1> (X) }",
        opsets=(13,),
    ),
    Case(
        # Without axes and with a symbolic dimension: the size-1 axes are found at run time.
        "squeeze_all_symbolic",
        "g ({T}[N, 1, 3, 1] X) => ({T}[N, 3] Y) { Y = Squeeze(X) }",
        opsets=(13, 21),
    ),
    Case(
        "unsqueeze_runtime_axes",
        "g ({T}[N, 3] X, int64[2] a) => ({T}[A, B, C, D] Y) { Y = Unsqueeze(X, a) }",
        fixed={"a": i64(0, -1)},
        opsets=(13,),
    ),
    Case(
        "unsqueeze_runtime_axes_unknown_length",
        "g ({T}[N, 3] X, int64[K] a) => ({T}[A, B, C, D] Y) { Y = Unsqueeze(X, a) }",
        fixed={"a": i64(-1, 1)},
        opsets=(13,),
    ),
    Case(
        "slice_runtime_unknown_length_int32",
        "g ({T}[N, 7] X, int32[K] b, int32[K] e) => ({T}[A, B] Y) { Y = Slice(X, b, e) }",
        fixed={"b": np.array([1, -3], np.int32), "e": np.array([100, 7], np.int32)},
        opsets=(13,),
    ),
    Case(
        "pad_edge_with_value",
        "g ({T}[N, 3] X, {T} v) => ({T}[K, L] Y) { p = Constant <value = int64[4] {1, 0, 0, 2}> ()\n"
        ' Y = Pad <mode = "edge"> (X, p, v) }',
        opsets=(13,),
    ),
    Case(
        "dropout_ratio_input",
        "g ({T}[N, 3] X, {T} r) => ({T}[N, 3] Y, bool[N, 3] M) { Y, M = Dropout(X, r) }",
        # The ratio must stay in [0, 1) under vmap's perturbation of the examples.
        fixed={"r": np.array(0.5)},
        opsets=(13,),
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TARGETED), ids=case_id)
def test_vmap_targeted(case: Case, dtype: str, opset: int) -> None:
    test_vmap(case, dtype, opset)
    m = case.model(dtype, opset)
    feeds = case.feeds(m)
    names = shape_like_inputs(m)
    # Only the second input batched (a batched value against shared data, where there is one).
    if len(m.graph.inputs) > 1 and m.graph.inputs[1].name not in names:
        axes = tuple(0 if i == 1 else None for i in range(len(m.graph.inputs)))
        check_vmap(m, feeds, in_axes=axes)


@pytest.mark.parametrize("name", ["squeeze_all", "squeeze_all_symbolic", "flatten_static"])
def test_vmap_batch_of_one_keeps_batch_axis(name: str) -> None:
    # Squeeze without axes must never squeeze the batch axis, even of size 1.
    case = {c.name: c for c in CASES + TARGETED}[name]
    m = case.model("double", 13)
    check_vmap(m, case.feeds(m), batch=1)
    check_vmap(m, case.feeds(m), batch=1, axis_size=1)


def test_vmap_reshape_keeps_shape_constant() -> None:
    # A hard-coded reshape gets the batch size prepended; the constant shape is not batched.
    m = TARGETED[0].model("double", 13)
    v = onnax.vmap(m)
    assert [n.op_type for n in v.graph if n.op_type == "Reshape"] == ["Reshape"]
    got = run(v, {"X": np.arange(48.0).reshape(2, 4, 3, 2)})["Y"]
    np.testing.assert_array_equal(got, np.arange(48.0).reshape(2, 2, 3, 4))


REFUSALS = [
    # (model text, in_axes, fragments of the message)
    (
        "g (double[6] X, int64[2] s) => (double[A, B] Y) { Y = Reshape(X, s) }",
        (0, 0),
        ["ai.onnx::Reshape", "'Y'", "target shape", "'s'"],
    ),
    (
        # The shape is computed from batched data: different per example.
        "g (double[6] X, double[2] V) => (double[A, B] Y) { s = Cast <to = 7> (V)\n Y = Reshape(X, s) }",
        (None, 0),
        ["ai.onnx::Reshape", "target shape", "input 1 's'"],
    ),
    (
        "g (double[2, 1] X, int64[2] s) => (double[A, B] Y) { Y = Expand(X, s) }",
        (None, 0),
        ["ai.onnx::Expand", "target shape", "'s'"],
    ),
    (
        "g (double[4, 1] X, int64[1] a) => (double[4] Y) { Y = Squeeze(X, a) }",
        (0, 0),
        ["ai.onnx::Squeeze", "axes", "'a'"],
    ),
    (
        "g (double[4] X, int64[1] a) => (double[4, 1] Y) { Y = Unsqueeze(X, a) }",
        (0, 0),
        ["ai.onnx::Unsqueeze", "axes", "'a'"],
    ),
    (
        "g (double[6] X, int64[2] s) => (double[A] Y0, double[B] Y1) { Y0, Y1 = Split(X, s) }",
        (0, 0),
        ["ai.onnx::Split", "split sizes", "'s'"],
    ),
    (
        "g (double[6] X, int64[1] b, int64[1] e) => (double[A] Y) { Y = Slice(X, b, e) }",
        (0, None, 0),
        ["ai.onnx::Slice", "ends", "'e'"],
    ),
    (
        "g (double[6] X, int64[2] p) => (double[A] Y) { Y = Pad(X, p) }",
        (None, 0),
        ["ai.onnx::Pad", "pads", "'p'"],
    ),
    (
        "g (double[6] X, int64[1] r) => (double[A] Y) { Y = Tile(X, r) }",
        (0, 0),
        ["ai.onnx::Tile", "repeats", "'r'"],
    ),
    (
        "g (int64[2] s) => (double[A, B] Y) { Y = ConstantOfShape <value = double[1] {1.0}> (s) }",
        0,
        ["ai.onnx::ConstantOfShape", "shape", "'s'"],
    ),
    (
        "g (double s, double l, double d) => (double[K] Y) { Y = Range(s, l, d) }",
        (None, 0, None),
        ["ai.onnx::Range", "limit", "'l'", "length"],
    ),
]


@pytest.mark.parametrize(("text", "in_axes", "fragments"), REFUSALS, ids=lambda p: str(p)[:30])
def test_vmap_refuses_batched_shape_inputs(
    text: str, in_axes: object, fragments: list[str]
) -> None:
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model(text, 13), in_axes=in_axes)
    message = str(err.value)
    for fragment in [*fragments, "vmap", "Remedy", "in_axes None"]:
        assert fragment in message, (fragment, message)


def test_vmap_squeeze_symbolic_without_axes_refused_before_13() -> None:
    m = model("g (double[N, 1, 3] X) => (double[K] Y) { Y = Squeeze(X) }", 11)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(m)
    message = str(err.value)
    assert "ai.onnx::Squeeze" in message and "'N'" in message and "'X'" in message
    assert "explicit axes" in message and "opset 13" in message


DROPOUT_TRAINING = (
    "g (double[N, 50] X) => (double[N, 50] Y, bool[N, 50] M) { r = Constant <value = double {0.5}> ()\n"
    " t = Constant <value = bool {1}> ()\n Y, M = Dropout(X, r, t) }"
)


def test_vmap_dropout_training_follows_randomness() -> None:
    m = model(DROPOUT_TRAINING, 13)
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(m)
    message = str(err.value)
    assert "ai.onnx::Dropout" in message and "training_mode" in message
    assert "randomness='different'" in message and "randomness='same'" in message
    assert "Remedy" in message
    x = np.ones((4, 2, 50))
    for policy in ("different", "same"):
        got = run(onnax.vmap(m, randomness=policy), {"X": x})
        y, mask = got["Y"], got["M"]
        assert y.shape == x.shape and mask.shape == x.shape
        np.testing.assert_allclose(y, np.where(mask, 2.0, 0.0))
        same = all(np.array_equal(mask[0], mask[b]) for b in range(4))
        assert same == (policy == "same")


# vmap of derivative models: the primal inputs and per-example tangents/cotangents batched
# (shape-like inputs shared), and only the seeds batched (many directions in one pass).
DERIVATIVES = [
    ("reshape_runtime_shape", 13),
    ("squeeze_all", 21),
    ("concat_partial", 13),
    ("slice_runtime", 13),
    ("pad_constant_value", 11),
    ("pad_reflect", 18),
    ("tile_runtime", 13),
    ("layout_chain", 11),
    ("layout_chain_dynamic", 21),
]


@pytest.mark.parametrize(("name", "opset"), DERIVATIVES)
@pytest.mark.parametrize("kind", ["jvp", "vjp"])
def test_vmap_of_derivative_models(name: str, opset: int, kind: str) -> None:
    case = BY_NAME[name]
    m = case.model("double", opset)
    d = onnax.jvp(m, case.inputs) if kind == "jvp" else onnax.vjp(m, case.inputs)
    feeds = case.feeds(m)
    primal = run(m, feeds)
    rng = np.random.default_rng(5)
    n_primal = len(m.graph.inputs)
    for v in list(d.graph.inputs)[n_primal:]:
        like = v.name.split("_", 1)[1]
        shape = feeds[like].shape if like in feeds else primal[like].shape
        feeds[v.name] = rng.standard_normal(shape)
    names = shape_like_inputs(d)
    check_vmap(d, feeds, in_axes=shared(d, (0,) * len(d.graph.inputs), names))
    seeds_only = tuple(None if i < n_primal else -1 for i in range(len(d.graph.inputs)))
    check_vmap(d, feeds, in_axes=seeds_only, out_axes=-1)


# Variants run_vmap_case does not cover: only a later input batched, the data shared.
ONE_BATCHED = [
    ("pad_constant_value", 11, (None, 0)),
    ("pad_constant_value", 21, (None, -1)),
    ("pad_axes", 18, (None, 0)),
    ("pad_runtime_constant", 13, (None, None, 0)),
    ("concat_symbolic_axis", 13, (None, 0, None)),
    ("concat_then_split", 11, (None, 1)),
    ("layout_chain", 11, (None, 0)),
]


@pytest.mark.parametrize(("name", "opset", "in_axes"), ONE_BATCHED)
def test_vmap_shared_data(name: str, opset: int, in_axes: tuple[int | None, ...]) -> None:
    case = BY_NAME[name]
    m = case.model("double", opset)
    check_vmap(m, case.feeds(m), in_axes=in_axes)


# Derivatives of vmapped models: the operators the batch rules emit (Where, NonZero, Range,
# ReduceProd on shapes, Cast...) must themselves be differentiable.
VMAPPED = [
    ("pad_constant_value", 11),
    ("pad_axes", 21),
    ("squeeze_all_symbolic", 13),
    ("flatten_symbolic_back", 13),
    ("expand_runtime_length", 13),
    ("slice_runtime_unknown_length_int32", 13),
    ("unsqueeze_runtime_axes_unknown_length", 13),
    ("layout_chain_dynamic", 13),
]


@pytest.mark.parametrize(("name", "opset"), VMAPPED)
def test_derivatives_of_vmapped_models(name: str, opset: int) -> None:
    case = {c.name: c for c in CASES + TARGETED}[name]
    m = case.model("double", opset)
    feeds = case.feeds(m)
    names = shape_like_inputs(m)
    v = onnax.vmap(m, in_axes=shared(m, (0,) * len(m.graph.inputs), names))
    rng = np.random.default_rng(4)
    batched = {
        k: a if k in names else np.stack([a + 0.1 * rng.standard_normal(a.shape) for _ in range(2)])
        for k, a in feeds.items()
    }
    check_jvp(v, batched)
    check_vjp(v, batched)
