"""``onnax.check``: it must catch every corrupted result and not cry wolf on correct ones.

The self-test corrupts the derivative outputs of real derived models (negated, scaled by 1.01,
two examples swapped) and requires every corruption to be judged "wrong"; the uncorrupted
model must be judged "ok". The models are the ones where the old check passed wrong answers
(small gradient entries of the GRU, a negated Hessian) or failed right ones (kinks of ReLU and
GridSample crossed by a float32 step).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from onnax.checking import CheckResult
from onnax.checking.points import random_point
from onnax.demo import build_loss_model

DATA = Path(__file__).parent / "data"


def _load(name: str) -> ir.Model:
    return ir.load(DATA / f"{name}.onnx")


def corrupt(derived: ir.Model, output: str, how: str, axis: int = 0) -> ir.Model:
    """A copy of ``derived`` whose output ``output`` is negated, scaled by 1.01 or swapped.

    "swap" exchanges the first two entries along ``axis`` (two examples of a batch).
    """
    copy = derived.clone()
    graph = copy.graph
    index = [v.name for v in graph.outputs].index(output)
    value = graph.outputs[index]
    value.name = f"{output}__uncorrupted"
    dtype = value.dtype.numpy()
    if how == "negate":
        node = ir.node("Neg", [value])
    elif how == "scale":
        factor = ir.val("__factor", const_value=ir.tensor(np.array(1.01, dtype)))
        graph.register_initializer(factor)
        node = ir.node("Mul", [value, factor])
    else:
        size = value.shape[axis]
        assert isinstance(size, int) and size >= 2, "swap needs two static examples"
        order = np.arange(size)
        order[[0, 1]] = [1, 0]
        perm = ir.val("__perm", const_value=ir.tensor(order.astype(np.int64)))
        graph.register_initializer(perm)
        node = ir.node("Gather", [value, perm], attributes={"axis": axis})
    graph.append(node)
    node.outputs[0].name = output
    node.outputs[0].type = value.type
    node.outputs[0].shape = value.shape
    graph.outputs[index] = node.outputs[0]
    return copy


Derive = Callable[[ir.Model], ir.Model]

SELF_TEST: list[tuple[str, str, Derive, str, str]] = [
    # (id, model, transform, output corrupted, transform name)
    ("gru-grad", "torch_gru_2layer_bidir", lambda m: onnax.grad(m), "grad_x", "grad"),
    (
        "mlp-hessian",
        "demo",
        lambda m: onnax.hessian(m, ["w2"], "loss"),
        "hess_loss_w2_w2",
        "hessian",
    ),
    ("mlp-grad-w1", "demo", lambda m: onnax.grad(m, ["w1"], "loss"), "grad_w1", "grad"),
    ("torch-mlp-jvp", "torch_mlp", lambda m: onnax.jvp(m), "fwd_linear_2", "jvp"),
    (
        "torch-mlp-vjp-weight",
        "torch_mlp",
        lambda m: onnax.vjp(m, ["net.0.weight"]),
        "adj_net.0.weight",
        "vjp",
    ),
    ("torch-mlp-jacrev", "torch_mlp", lambda m: onnax.jacrev(m), "jac_linear_2_x", "jacrev"),
    ("spatial-jvp", "torch_spatial_transformer", lambda m: onnax.jvp(m), "fwd_grid_sampler", "jvp"),
    ("encoder-jvp", "torch_transformer_encoder", lambda m: onnax.jvp(m), "fwd_layer_norm_1", "jvp"),
    ("torch-mlp-vmap", "torch_mlp", lambda m: onnax.vmap(m, 0, 0, 3), "linear_2", "vmap"),
]


def _model(name: str) -> ir.Model:
    return build_loss_model() if name == "demo" else _load(name)


@pytest.mark.parametrize(
    ("model_name", "derive", "output", "transform"),
    [case[1:] for case in SELF_TEST],
    ids=[case[0] for case in SELF_TEST],
)
def test_every_corruption_is_caught(
    model_name: str, derive: Derive, output: str, transform: str
) -> None:
    model = _model(model_name)
    derived = derive(model)
    extra = {"axis_size": 3} if transform == "vmap" else {}
    honest = onnax.check(model, derived, transform, **extra)
    assert honest.outcome == "ok", honest.format()
    assert output in [r.output for r in honest.rows]
    for how in ("negate", "scale", "swap"):
        result = onnax.check(model, corrupt(derived, output, how), transform, **extra)
        row = next(r for r in result.rows if r.output == output)
        assert row.outcome == "wrong", f"{how} passed:\n{result.format()}"
        assert row.error > row.tolerance
        assert result.outcome == "wrong" and not result.ok


def test_result_is_structured_and_transform_inferred() -> None:
    model = build_loss_model()
    result = onnax.check(model, onnax.grad(model, ["w1", "w2"], "loss"))
    assert isinstance(result, CheckResult)
    assert result.transform == "grad" and result.ok
    assert [r.output for r in result.rows] == ["grad_w1", "grad_w2"]
    assert all(0 <= r.error <= r.tolerance and r.scale > 0 for r in result.rows)
    assert "float64" in result.reference and "onnxruntime" in result.reference
    table = result.format()
    assert "grad_w1" in table and "tolerance" in table and "point seed 0" in table


def test_float32_reference_is_the_float64_twin() -> None:
    model = _load("torch_transformer_encoder")
    result = onnax.check(model, onnax.jvp(model))
    assert "float64 twin" in result.reference, result.reference
    # The relative tolerance of a float32 result is well below the 1% a scaled result is off.
    row = result.rows[0]
    assert row.tolerance < 5e-3 * row.scale


def test_weights_as_differentiation_inputs() -> None:
    """jvp crashed with KeyError on a weight, vjp and jacrev compared nothing."""
    model = _load("torch_mlp")
    weight = "net.2.weight"
    for transform in ("jvp", "vjp", "jacrev", "jacfwd"):
        derived = getattr(onnax, transform)(model, [weight])
        result = onnax.check(model, derived, transform)
        assert result.ok, result.format()
        assert len(result.rows) == 1 and not result.skipped
    vjp = onnax.vjp(model, [weight])
    bad = onnax.check(model, corrupt(vjp, f"adj_{weight}", "scale"), "vjp")
    assert bad.outcome == "wrong"


def _erf_model(dtype: ir.DataType) -> ir.Model:
    return ir.from_onnx_text(
        f'<ir_version: 10, opset_import: ["" : 18]>\n'
        f"g ({dtype.name.lower() if dtype != ir.DataType.FLOAT else 'float'}[3, 2] x) => "
        f"({'double' if dtype == ir.DataType.DOUBLE else 'float'}[3, 2] y) {{ y = Erf(x) }}"
    )


@pytest.mark.parametrize("dtype", [ir.DataType.DOUBLE, ir.DataType.FLOAT])
def test_reference_evaluator_fallback_for_missing_kernels(dtype: ir.DataType) -> None:
    """onnxruntime has no float64 Erf: the check runs it in onnx.reference instead of refusing."""
    model = _erf_model(dtype)
    result = onnax.check(model, onnax.jvp(model))
    assert result.ok, result.format()
    assert "onnx.reference" in result.reference


def _oscillating(frequency: float) -> ir.Model:
    return ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (double[4] x) => (double[4] y) {\n"
        f" k = Constant <value = double {{{frequency}}}> ()\n"
        " s = Mul(x, k)\n y = Sin(s) }"
    )


def test_inconclusive_when_the_steps_disagree() -> None:
    """sin(1e5 x): no step of the ladder resolves it. The derivative is right: not a failure."""
    model = _oscillating(1e5)
    result = onnax.check(model, onnax.jvp(model))
    assert result.outcome == "inconclusive" and not result.ok
    row = result.rows[0]
    assert row.outcome == "inconclusive" and "disagree" in row.note and "steps" in row.note
    assert "inconclusive" in result.format()
    smooth = _oscillating(3.0)
    assert onnax.check(smooth, onnax.jvp(smooth)).ok


def test_kink_close_to_the_point_is_not_a_failure() -> None:
    """A ReLU kink 1e-4 from the point: the float32 step 3e-3 crossed it and cried FAIL."""
    model = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[6] x, float[6] c) => (float[6] y) { d = Sub(x, c)\n y = Relu(d) }"
    )
    point = random_point(model, np.random.default_rng(0))
    shifted = ir.from_onnx_text(
        '<ir_version: 10, opset_import: ["" : 18]>\n'
        "g (float[6] x) => (float[6] y) { d = Sub(x, c)\n y = Relu(d) }"
    )
    c = (point["x"] + 1e-4).astype(np.float32)
    shifted.graph.register_initializer(ir.val("c", const_value=ir.tensor(c)))
    shifted.graph.node(0).replace_input_with(1, shifted.graph.initializers["c"])
    result = onnax.check(shifted, onnax.jvp(shifted))
    assert result.outcome in ("ok", "inconclusive"), result.format()


def test_unknown_transform_names_the_choices() -> None:
    model = build_loss_model()
    with pytest.raises(onnax.CheckError) as info:
        onnax.check(model, model.clone(), "jacobian")
    message = str(info.value)
    assert "unknown transform 'jacobian'" in message and "'jacfwd'" in message
    renamed = build_loss_model()
    renamed.graph.outputs[0].name = "other"
    with pytest.raises(onnax.CheckError) as info:
        onnax.check(model, renamed)
    assert "cannot tell which transform" in str(info.value) and "transform=" in str(info.value)


def test_nothing_to_compare_is_empty_not_ok() -> None:
    model = build_loss_model()
    result = onnax.check(model, model.clone(), "jvp")
    assert result.outcome == "empty" and not result.ok and result.rows == ()
    assert "nothing compared" in result.format()
