import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.errors import UnsupportedOperatorError
from onnax.rules.shape import _clamp
from oracles import check_adjoint, check_jvp, check_vjp, run, session


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
        "g (double[2, 3] X, double v) => (double[3, 5] Y) { p = Constant <value = int64[4] {1, -1, 1, 3}> ()\n"
        " Y = Pad(X, p, v) }"
    )
    g = onnax.vjp(m, inputs=["v"])
    got = run(g, {"X": np.zeros((2, 3)), "v": np.array(1.0), "adj_Y": np.ones((3, 5))})
    # 15 outputs, of which X fills rows 1..1 (one row kept of two) and columns 1..2.
    assert float(got["adj_v"]) == pytest.approx(15 - 1 * 2)


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
    assert "Remedy" in message


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
