"""Conv and ConvTranspose: jvp and vjp against finite differences, the adjoint identity, vmap.

onnxruntime implements Conv and ConvTranspose for float only (no double kernel), so every case
runs in float, where ``run_case`` uses the float tolerances of the oracles; the operators are
bilinear, so central differences have no truncation error and only float rounding remains.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import onnax
import onnax.passes.linearize as linearize_module
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from oracles import check_adjoint, check_jvp, check_vjp, check_vmap
from rules.test_gather import vmap_params, vmapped_feeds

FLOAT = ("float",)
OPSETS = (11, 13, 18, 22)


def _conv(
    name: str,
    x: str,
    w: str,
    y: str,
    attrs: str = "",
    bias: str | None = None,
    op: str = "Conv",
    **kw: object,
) -> Case:
    b_in = f", {{T}}[{bias}] B" if bias is not None else ""
    b_arg = ", B" if bias is not None else ""
    attrs = f"<{attrs}>" if attrs else ""
    text = (
        f"g ({{T}}[{x}] X, {{T}}[{w}] W{b_in}) => ({{T}}[{y}] Y) {{ Y = {op}{attrs}(X, W{b_arg}) }}"
    )
    return Case(name, text, **{"opsets": (13,), "dtypes": FLOAT, **kw})  # type: ignore[arg-type]


CONV = [
    _conv("conv1d_bias", "N, 2, 7", "3, 2, 3", "N, 3, 5", bias="3", opsets=OPSETS),
    _conv(
        "conv2d_strides_pads",
        "N, 2, 5, 6",
        "4, 2, 3, 2",
        "N, 4, 3, 8",
        "strides=[2, 1], pads=[1, 1, 1, 2]",
        opsets=(11, 18),
    ),
    _conv("conv2d_groups", "N, 4, 5, 5", "6, 2, 3, 3", "N, 6, 3, 3", "group=2", bias="6"),
    _conv(
        "conv2d_depthwise",
        "N, 3, 6, 6",
        "3, 1, 3, 3",
        "N, 3, 3, 3",
        "group=3, strides=[2, 2], pads=[1, 1, 1, 1]",
        opsets=(11, 22),
    ),
    _conv(
        "conv2d_dilations",
        "N, 2, 7, 6",
        "2, 2, 2, 3",
        "N, 2, 5, 5",
        "dilations=[2, 1], pads=[0, 1, 0, 0]",
    ),
    # Trailing input that no window reads (8 = 2 * 3 + 2 left over): a zero cotangent there.
    _conv("conv1d_uncovered_tail", "N, 1, 8", "2, 1, 3", "N, 2, 2", "strides=[3]"),
    _conv(
        "conv2d_same_upper",
        "N, 2, 5, 6",
        "3, 2, 3, 2",
        "N, 3, 3, 3",
        'auto_pad="SAME_UPPER", strides=[2, 2]',
        opsets=(11, 18),
    ),
    _conv(
        "conv2d_same_lower",
        "N, 2, 5, 6",
        "3, 2, 2, 3",
        "N, 3, 5, 6",
        'auto_pad="SAME_LOWER"',
        bias="3",
    ),
    # onnxruntime refuses dilations with SAME padding, so this one has strides only.
    _conv(
        "conv1d_same_lower_strided",
        "N, 2, 7",
        "2, 2, 4",
        "N, 2, 4",
        'auto_pad="SAME_LOWER", strides=[2]',
    ),
    _conv(
        "conv2d_valid", "N, 2, 6, 5", "2, 2, 3, 3", "N, 2, 2, 2", 'auto_pad="VALID", strides=[2, 2]'
    ),
    _conv("conv3d", "N, 1, 4, 3, 4", "2, 1, 2, 2, 3", "N, 2, 3, 2, 2", bias="2", opsets=(18,)),
    # Symbolic spatial sizes: the pads and crops are computed at run time.
    _conv(
        "conv2d_symbolic_spatial",
        "N, 4, H, V",
        "4, 2, 3, 2",
        "N, 4, P, Q",
        "group=2, strides=[2, 3], pads=[1, 0, 0, 1]",
        bias="4",
        dims={"H": 6, "V": 7},
        opsets=(11, 18),
    ),
    _conv(
        "conv2d_symbolic_same_upper",
        "N, 2, H, V",
        "2, 2, 2, 3",
        "N, 2, H, V",
        # Stride 1: with a larger stride, onnx_shape_inference 0.4.0 infers the output size
        # "ceiling(H/2)" and then fails to parse it when the derivative model is re-inferred
        # ("Unknown function 'ceiling'"), before any rule runs.
        'auto_pad="SAME_UPPER"',
        dims={"H": 5, "V": 7},
        opsets=(13,),
    ),
    # The kernel's spatial size is only known at run time.
    _conv("conv1d_symbolic_kernel", "N, 2, 6", "3, 2, K", "N, 3, ?", "strides=[2]", dims={"K": 3}),
    # Unit strides: the data gradient is a Conv with the flipped weight (asymmetric pads,
    # dilation and groups all change the flipped pads or the weight's layout).
    _conv(
        "conv2d_stride1_groups_dilation_asym_pads",
        "N, 4, 7, 6",
        "6, 2, 3, 2",
        "N, 6, 6, 6",
        "group=2, dilations=[2, 1], pads=[1, 0, 2, 1]",
        bias="6",
        opsets=(11, 22),
    ),
    _conv(
        "conv3d_stride1_groups",
        "N, 2, 4, 3, 5",
        "4, 1, 2, 3, 3",
        "N, 4, 4, 3, 3",
        "group=2, dilations=[1, 1, 2], pads=[1, 1, 0, 0, 1, 2]",
        opsets=(18,),
    ),
    _conv("conv1d_stride1_same_upper", "N, 2, 6", "3, 2, 4", "N, 3, 6", 'auto_pad="SAME_UPPER"'),
    _conv("conv2d_stride1_valid", "N, 2, 5, 4", "2, 2, 2, 2", "N, 2, 4, 3", 'auto_pad="VALID"'),
    _conv("conv2d_1x1", "N, 4, 3, 3", "2, 4, 1, 1", "N, 2, 3, 3", bias="2"),
    _conv(
        "conv2d_1x3_groups", "N, 4, 3, 4", "6, 2, 1, 3", "N, 6, 3, 4", "group=2, pads=[0, 1, 0, 1]"
    ),
    # Pads beyond the kernel's reach (the flipped pads would be negative): ConvTranspose.
    _conv("conv1d_stride1_wide_pads", "N, 2, 5", "3, 2, 2", "N, 3, 7", "pads=[2, 1]"),
    _conv("conv_only_w", "N, 2, 5", "3, 2, 2", "N, 3, 4", bias="3", inputs=["W"]),
    _conv("conv_only_b", "N, 2, 5", "3, 2, 2", "N, 3, 4", bias="3", inputs=["B"]),
    _conv("conv_x_and_b", "N, 2, 5", "3, 2, 2", "N, 3, 4", bias="3", inputs=["X", "B"]),
]

CONV_TRANSPOSE = [
    _conv(
        "convT1d_bias", "N, 3, 4", "3, 2, 3", "N, 2, 6", bias="2", op="ConvTranspose", opsets=OPSETS
    ),
    _conv(
        "convT2d_output_padding",
        "N, 2, 3, 3",
        "2, 3, 3, 3",
        "N, 3, 6, 5",
        "strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 0]",
        op="ConvTranspose",
        opsets=(11, 18),
    ),
    _conv(
        "convT2d_groups",
        "N, 4, 3, 3",
        "4, 1, 2, 2",
        "N, 2, 6, 6",
        "group=2, strides=[2, 2]",
        bias="2",
        op="ConvTranspose",
    ),
    _conv(
        "convT1d_output_shape",
        "N, 2, 3",
        "2, 2, 4",
        "N, 2, 7",
        "strides=[2], output_shape=[7]",
        op="ConvTranspose",
    ),
    _conv(
        "convT1d_output_shape_same_upper",
        "N, 2, 3",
        "2, 2, 4",
        "N, 2, 7",
        'strides=[2], output_shape=[7], auto_pad="SAME_UPPER"',
        op="ConvTranspose",
    ),
    # A larger output than the full result: zeros at the end, the end "pad" is negative.
    _conv(
        "convT1d_output_shape_larger",
        "N, 1, 3",
        "1, 2, 2",
        "N, 2, 9",
        "strides=[3], output_shape=[9]",
        op="ConvTranspose",
    ),
    _conv(
        "convT2d_same_lower",
        "N, 2, 3, 2",
        "2, 2, 3, 4",
        "N, 2, 9, 4",
        'auto_pad="SAME_LOWER", strides=[3, 2]',
        op="ConvTranspose",
        opsets=(11, 18),
    ),
    _conv(
        "convT2d_dilations",
        "N, 2, 3, 3",
        "2, 1, 2, 3",
        "N, 1, 7, 8",
        "dilations=[2, 3], strides=[2, 1], pads=[0, 1, 0, 0]",
        op="ConvTranspose",
    ),
    _conv(
        "convT2d_symbolic_spatial",
        "N, 2, H, V",
        "2, 2, 3, 2",
        "N, 4, P, Q",
        "group=2, strides=[2, 3], pads=[1, 0, 0, 1], output_padding=[1, 2]",
        op="ConvTranspose",
        bias="4",
        dims={"H": 3, "V": 2},
        opsets=(11, 18),
    ),
    _conv(
        "convT_only_w", "N, 2, 3", "2, 3, 2", "N, 3, 4", bias="3", op="ConvTranspose", inputs=["W"]
    ),
    _conv(
        "convT_only_b", "N, 2, 3", "2, 3, 2", "N, 3, 4", bias="3", op="ConvTranspose", inputs=["B"]
    ),
]

CASES = CONV + CONV_TRANSPOSE
"""Every case; the closure test enumerates the operators their derivative models emit."""


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    if case.name == "conv1d_symbolic_kernel":
        # A batched weight needs a static kernel size (see the test below): X only.
        model = case.model(dtype, opset)
        check_vmap(model, case.feeds(model), in_axes={"X": 0})
        return
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(
    "name",
    [
        "conv2d_groups",
        "convT2d_groups",
        "conv1d_uncovered_tail",
        "conv2d_stride1_groups_dilation_asym_pads",
    ],
)
def test_second_order(name: str) -> None:
    """The vjp model (ConvTranspose, weight-gradient Convs with the cotangent as the kernel) is
    itself differentiated in both modes: the rules close over what they emit."""
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vjp(case.model("float", case.opsets[-1]), case.inputs)
    feeds = case.feeds(vm)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


@pytest.mark.parametrize(
    ("name", "mode"),
    [("conv2d_groups", "jvp"), ("convT2d_groups", "vjp"), ("conv2d_groups", "vjp")],
)
def test_vmap_of_derivatives(name: str, mode: str) -> None:
    """Batched tangents/seeds with shared primals (how jacfwd/jacrev batch the derivatives)."""
    case = next(c for c in CASES if c.name == name)
    model = case.model("float", 13)
    derived = onnax.jvp(model) if mode == "jvp" else onnax.vjp(model)
    feeds = case.feeds(derived)
    n_primal, n_inputs = len(model.graph.inputs), len(derived.graph.inputs)
    check_vmap(derived, feeds, in_axes=[None] * n_primal + [0] * (n_inputs - n_primal))


@pytest.mark.parametrize(
    ("name", "in_axes"),
    [("conv2d_groups", {"X": 0, "W": 0}), ("convT1d_bias", {"W": 1, "B": 0})],
)
def test_derivatives_of_vmap(name: str, in_axes: dict[str, int | None]) -> None:
    """The batched-weight formulation (one-hot im2col Conv, MatMul) is differentiable."""
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vmap(case.model("float", 13), in_axes=in_axes)
    feeds = vmapped_feeds(case, vm, in_axes)
    check_jvp(vm, feeds)
    check_vjp(vm, feeds)
    check_adjoint(vm, feeds)


OPERANDS = [
    {"W": 0},
    {"B": 0},
    {"X": 0, "B": 1},
    {"W": 1, "B": 0},
    {"X": 2, "W": 0},
]


@pytest.mark.parametrize("in_axes", OPERANDS, ids=str)
@pytest.mark.parametrize("name", ["conv2d_groups", "convT2d_groups", "conv1d_bias"])
def test_vmap_operands(name: str, in_axes: dict[str, int]) -> None:
    """Every combination of batched and shared data, weight and bias."""
    case = next(c for c in CASES if c.name == name)
    model = case.model("float", 13)
    check_vmap(model, case.feeds(model), in_axes=in_axes)


# Kernels with more offsets than the output has positions, as the weight-gradient Conv of a
# batch-1 gradient has (the cotangent is the kernel): vmap extracts windows by output offset.
LARGE_KERNELS = [
    _conv("large_kernel_2d", "N, 2, 9, 8", "3, 2, 7, 6", "N, 3, 6, 5", "pads=[1, 1, 2, 1]"),
    _conv("large_kernel_1d_groups", "N, 4, 12", "2, 2, 10", "N, 2, 3", "group=2"),
    _conv("large_kernel_valid", "N, 1, 6, 6", "2, 1, 5, 4", "N, 2, 2, 3", 'auto_pad="VALID"'),
]


@pytest.mark.parametrize("in_axes", [{"W": 0}, {"X": 0, "W": 0}, {"X": 1, "W": 0}], ids=str)
@pytest.mark.parametrize("case", LARGE_KERNELS, ids=lambda c: c.name)
def test_vmap_batched_weight_larger_than_its_output(case: Case, in_axes: dict[str, int]) -> None:
    model = case.model("float", 13)
    check_vmap(model, case.feeds(model), in_axes=in_axes)
    vm = onnax.vmap(model, in_axes=in_axes)
    w, y = (v.shape for v in (model.graph.inputs[1], model.graph.outputs[0]))
    assert w is not None and y is not None
    kernel, out = (int(np.prod(s.dims[2:])) for s in (w, y))
    taps = [  # the one-hot extraction kernel has the output's Of taps, not the kernel's K
        int(np.prod(n.inputs[1].shape.dims[2:]))  # type: ignore[union-attr]
        for n in vm.graph
        if n.op_type == "Conv" and n.inputs[1] is not None and n.inputs[1].const_value is not None
    ]
    assert taps == [out] and out < kernel, (taps, out, kernel)


def test_vmap_batched_weight_needs_a_static_kernel() -> None:
    case = next(c for c in CASES if c.name == "conv1d_symbolic_kernel")
    with pytest.raises(onnax.errors.UnsupportedOperatorError) as info:
        onnax.vmap(case.model("float", 13), in_axes={"W": 0})
    message = str(info.value)
    for fact in ("ai.onnx::Conv", "'Y'", "'W'", "kernel_shape", "in_axes None"):
        assert fact in message, (fact, message)


@pytest.mark.parametrize(
    ("name", "convolution_transpose"),
    [
        ("conv2d_stride1_groups_dilation_asym_pads", False),
        ("conv3d_stride1_groups", False),
        ("conv1d_stride1_same_upper", False),
        ("conv2d_1x1", False),
        ("conv2d_strides_pads", True),
        ("conv1d_stride1_wide_pads", True),
        ("conv2d_symbolic_same_upper", True),
    ],
)
def test_data_gradient_operator(name: str, convolution_transpose: bool) -> None:
    """Unit strides with static pads within the kernel's reach take the flipped-weight Conv
    (faster in onnxruntime); strides, run-time sizes and wide pads keep the ConvTranspose."""
    case = next(c for c in CASES if c.name == name)
    vm = onnax.vjp(case.model("float", case.opsets[-1]), ["X"])
    ops = [node.op_type for node in vm.graph]
    assert ("ConvTranspose" in ops) == convolution_transpose, ops
    assert ops.count("Conv") == 1 + (not convolution_transpose), ops


def test_symbolic_batch_dimension_survives() -> None:
    """The vjp of a Conv with a symbolic N runs for several batch sizes."""
    case = next(c for c in CASES if c.name == "conv2d_groups")
    vm = onnax.vjp(case.model("float", 18))
    for n in (1, 4):
        feeds = Case(case.name, case.text, dims={"N": n}).feeds(vm)
        outs = onnax_run(vm, feeds)
        assert outs[1].shape == (n, 4, 5, 5)


def onnax_run(model: object, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from oracles import session

    sess = session(model)  # type: ignore[arg-type]
    wanted = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in wanted})


def _conv_bn_conv(group: int) -> ir.Model:
    """Conv (``group``) -> BatchNormalization -> strided Conv, constant weights (no Relu
    between: its kinks would spoil float32 differences)."""
    rng = np.random.default_rng(7)
    weights = {
        "w1": rng.standard_normal((6, 4 // group, 3, 3)),
        "s": rng.standard_normal(6),
        "b": rng.standard_normal(6),
        "m": rng.standard_normal(6),
        "v": np.abs(rng.standard_normal(6)) + 0.5,
        "w2": rng.standard_normal((5, 6, 3, 3)),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], group=group),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"]),
        helper.make_node("Conv", ["n1", "w2"], ["y"], strides=[2, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4, 7, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 5, 3, 4])],
        [numpy_helper.from_array(a.astype(np.float32), n) for n, a in weights.items()],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("group", [1, 2])
def test_batch_norm_factor_moves_into_the_conv_weight_in_reverse_mode(
    group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cotangent is not scaled by BatchNormalization's factor before the Conv's transpose:
    the factor multiplies the (constant) weight instead. Checked against differences. (The
    rules' own path: the pair is not folded into one Conv first, see test_fold_batchnorm.)"""
    monkeypatch.setattr(linearize_module, "fold_batch_norms", lambda *args: 0)
    model = _conv_bn_conv(group)
    feeds = {"x": np.random.default_rng(8).standard_normal((2, 4, 7, 6)).astype(np.float32)}
    vm = check_vjp(model, feeds, ["x"])
    check_adjoint(model, feeds, ["x"])
    scaled_weights = [
        n for n in vm.graph if n.op_type == "Mul" and any(i.name == "w1" for i in n.inputs)
    ]
    assert len(scaled_weights) == 1
    gm = onnax.grad(_with_sum(model), ["x"])
    assert any(n.op_type == "Mul" and any(i.name == "w1" for i in n.inputs) for n in gm.graph)


def _with_sum(model: ir.Model) -> ir.Model:
    y = model.graph.outputs[0]
    total = ir.node("ReduceSum", [y], {"keepdims": 0})
    model.graph.append(total)
    total.outputs[0].name = "loss"
    total.outputs[0].dtype = ir.DataType.FLOAT
    total.outputs[0].shape = ir.Shape([])
    model.graph.outputs.append(total.outputs[0])
    return model


@pytest.mark.parametrize("group", [1, 2])
def test_batch_norm_factor_stays_on_the_cotangent_when_the_weight_gradient_reads_it(
    group: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the Conv's weight differentiated too, its gradient reads the scaled cotangent, so
    the factor is not also folded into the weight (that only added a Reshape and a Mul per
    Conv). Both gradients checked against differences. (The rules' own path, as above.)"""
    monkeypatch.setattr(linearize_module, "fold_batch_norms", lambda *args: 0)
    model = _conv_bn_conv(group)
    feeds = {"x": np.random.default_rng(8).standard_normal((2, 4, 7, 6)).astype(np.float32)}
    vm = check_vjp(model, feeds, ["x", "w1"])
    check_adjoint(model, feeds, ["x", "w1"])
    assert not [n for n in vm.graph if n.op_type == "Mul" and any(i.name == "w1" for i in n.inputs)]
