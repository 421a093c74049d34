"""BatchNormalization (rules in onnax.rules.batchnorm).

Every case has a symbolic batch dimension N and is differentiated in all its floating-point
inputs, mean and var included. Opsets straddle the schema changes 9/14/15 (training_mode at 14,
other element types for the parameters at 15); training mode has cases of its own. Double is
tested throughout (onnxruntime 1.32 runs BatchNormalization at double precision).

vmap is checked on every case (all inputs batched at 0, 1, -1; only X batched, which folds the
batch; X shared with batched parameters, which takes the elementwise path), and on the jvp/vjp
models of one case; second order (jvp of the vjp model) for the inference and training forms.
The helpers of those checks are test_norm's.
"""

from __future__ import annotations

import onnx
import onnx.checker
import onnx_ir as ir
import pytest

import onnax
from cases import Case, case_id, parametrize, positive, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_vmap
from rules.test_norm import (
    check_second_order,
    check_vmap_shared_data,
    derived_model,
    moderate,
    ops_of,
    shared_data_params,
    vmap_params,
)

BN_FILL = {"X": moderate, "var": positive}
BN_IN = "{T}[N, 3, 2, 2] X, {T}[3] scale, {T}[3] B, {T}[3] mean, {T}[3] var"
CASES = [
    # ---------------------------------------------------------------- BatchNormalization
    Case(
        "BatchNorm-9",
        f"g ({BN_IN}) => ({{T}}[N, 3, 2, 2] Y) {{ Y = BatchNormalization<epsilon=0.01>(X, scale, B, mean, var) }}",
        opsets=(11, 13),
        fill=BN_FILL,
    ),
    Case(
        "BatchNorm-rank2",
        "g ({T}[N, 3] X, {T}[3] scale, {T}[3] B, {T}[3] mean, {T}[3] var) => ({T}[N, 3] Y) "
        "{ Y = BatchNormalization(X, scale, B, mean, var) }",
        opsets=(14,),
        fill=BN_FILL,
    ),
    Case(
        "BatchNorm-15",
        "g ({T}[N, 3, 4] X, {T}[3] scale, {T}[3] B, {T}[3] mean, {T}[3] var) => ({T}[N, 3, 4] Y) "
        "{ Y = BatchNormalization<training_mode=0, epsilon=0.001>(X, scale, B, mean, var) }",
        opsets=(15, 21),
        fill=BN_FILL,
    ),
    Case(
        "BatchNorm-params-only",
        f"g ({BN_IN}) => ({{T}}[N, 3, 2, 2] Y) {{ Y = BatchNormalization(X, scale, B, mean, var) }}",
        opsets=(15,),
        fill=BN_FILL,
        inputs=["B", "var"],
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), vmap_params(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), shared_data_params(CASES), ids=case_id)
def test_vmap_shared_data(case: Case, dtype: str, opset: int) -> None:
    """The data shared, the parameters batched (a per-example scale/bias/mean/var)."""
    check_vmap_shared_data(case, dtype, opset)


def _case(name: str) -> Case:
    return next(c for c in [*CASES, *TRAINING_CASES] if c.name == name)


# ------------------------------------------------------------------------- second order
SECOND_ORDER = [
    ("BatchNorm-9", 11),
    ("BatchNormTrain-stats", 15),
]


@pytest.mark.parametrize(("name", "opset"), SECOND_ORDER, ids=[f"{n}-{o}" for n, o in SECOND_ORDER])
def test_second_order(name: str, opset: int) -> None:
    """jvp of the vjp model (a Hessian-vector product) against its differences."""
    check_second_order(_case(name), opset)


# ------------------------------------------------------------------------- vmap of derivatives
DERIVATIVES = [
    ("BatchNorm-15", 15, "double"),
]


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(
    ("name", "opset", "dtype"), DERIVATIVES, ids=[f"{n}-{o}" for n, o, _ in DERIVATIVES]
)
def test_vmap_of_derivatives(name: str, opset: int, dtype: str, mode: str) -> None:
    """vmap of the jvp/vjp models with every input batched."""
    derived, feeds, _ = derived_model(_case(name), opset, dtype, mode)
    check_vmap(derived, feeds, in_axes=0)


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
@pytest.mark.parametrize(
    ("name", "opset", "dtype"), DERIVATIVES, ids=[f"{n}-{o}" for n, o, _ in DERIVATIVES]
)
def test_vmap_of_derivatives_seeds_only(name: str, opset: int, dtype: str, mode: str) -> None:
    """vmap of the jvp/vjp models over the tangents/seeds alone (rows of a Jacobian)."""
    derived, feeds, extra = derived_model(_case(name), opset, dtype, mode)
    check_vmap(derived, feeds, in_axes={v.name: -1 for v in extra})


# ------------------------------------------------------------------------- training mode
# vmap takes each example's statistics over its own batch: checked against a loop of runs.
TRAINING_CASES = [
    Case(
        "BatchNormTrain-Y",
        f"g ({BN_IN}) => ({{T}}[N, 3, 2, 2] Y) "
        "{ Y, RM, RV = BatchNormalization<training_mode=1, epsilon=0.01>(X, scale, B, mean, var) }",
        opsets=(14, 15, 21),
        fill=BN_FILL,
    ),
    Case(
        # The running statistics depend on X (through the batch's mean and variance) and on
        # input_mean / input_var; Y does not depend on the latter in training mode.
        "BatchNormTrain-stats",
        f"g ({BN_IN}) => ({{T}}[N, 3, 2, 2] Y, {{T}}[3] RM, {{T}}[3] RV) "
        "{ Y, RM, RV = BatchNormalization<training_mode=1, momentum=0.7>(X, scale, B, mean, var) }",
        opsets=(14, 15),
        fill=BN_FILL,
    ),
    Case(
        "BatchNormTrain-rank2-var-only",
        "g ({T}[N, 3] X, {T}[3] scale, {T}[3] B, {T}[3] mean, {T}[3] var) => ({T}[3] RV) "
        "{ Y, RM, RV = BatchNormalization<training_mode=1>(X, scale, B, mean, var) }",
        opsets=(15,),
        fill=BN_FILL,
        dims={"N": 4},
    ),
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TRAINING_CASES), ids=case_id)
def test_batch_norm_training(case: Case, dtype: str, opset: int) -> None:
    """Training mode: batch statistics, differentiated through, and the running statistics."""
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(TRAINING_CASES), ids=case_id)
def test_batch_norm_training_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset)
    # Shared data with per-example parameters and running statistics.
    model = case.model(dtype, opset)
    check_vmap(model, case.feeds(model), in_axes={"X": None, "scale": 0, "mean": 0, "var": 0})


# ------------------------------------------------------------------------- refusals
BN_TRAINING = [
    (
        "outputs",
        11,
        "g (float[N, 3] X, float[3] s, float[3] b, float[3] m, float[3] v) => (float[N, 3] Y, "
        "float[3] M, float[3] V, float[3] SM, float[3] SV) "
        "{ Y, M, V, SM, SV = BatchNormalization(X, s, b, m, v) }",
        "'M', 'V', 'SM', 'SV'",
        ("jvp", "vjp", "vmap"),
    ),
]


@pytest.mark.parametrize(
    ("kind", "opset", "text", "what", "refused"), BN_TRAINING, ids=[k[0] for k in BN_TRAINING]
)
def test_batch_norm_training_is_refused(
    kind: str, opset: int, text: str, what: str, refused: tuple[str, ...]
) -> None:
    model = ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')
    calls = {
        "jvp": lambda: onnax.jvp(model, ["X"]),
        "vjp": lambda: onnax.vjp(model, ["X"]),
        "vmap": lambda: onnax.vmap(model, in_axes={"X": 0}),
    }
    for transform in refused:
        with pytest.raises(UnsupportedOperatorError) as err:
            calls[transform]()
        message = str(err.value)
        assert message.startswith(f"{transform}:"), message
        assert "ai.onnx::BatchNormalization" in message and f"at opset {opset}" in message
        assert "'Y'" in message and what in message
        assert "inference" in message and "model.eval()" in message
        assert "opset 14" in message, message


@pytest.mark.parametrize("mode", ["jvp", "vjp"])
def test_batch_norm_mixed_element_types_build(mode: str) -> None:
    """BatchNormalization-15 allows scale/bias and mean/var of other element types than X.
    onnxruntime has no such float/double kernel, so only the derivative models are checked
    (onnx.checker with full shape inference): the parameters and their tangents are cast."""
    text = (
        '<ir_version: 10, opset_import: ["" : 15]>\n'
        "g (float[N, 3, 2] X, double[3] s, double[3] b, double[3] m, double[3] v) "
        "=> (float[N, 3, 2] Y) { Y = BatchNormalization(X, s, b, m, v) }"
    )
    model = ir.from_onnx_text(text)
    derived = onnax.jvp(model) if mode == "jvp" else onnax.vjp(model)
    onnx.checker.check_model(ir.to_proto(derived), full_check=True)
    assert "Cast" in ops_of(derived)


def test_batch_norm_grad_is_lean() -> None:
    """grad of the inference form w.r.t. X, scale and B: xhat from one unit-scale
    BatchNormalization (no Sub over the data), the factor scale/sqrt(var + eps) from one on a row
    of ones (no Sqrt or Reciprocal), each parameter's gradient one ReduceSum without kept
    dimensions (no second ReduceSum, no Squeeze), and a bounded graph."""
    model = _case("BatchNorm-9").model("float", 13)
    loss = ir.node("ReduceSum", [model.graph.outputs[0]], attributes={"keepdims": 0})
    loss.outputs[0].name = "L"
    model.graph.append(loss)
    model.graph.outputs[:] = [loss.outputs[0]]
    gm = onnax.grad(model, ["X", "scale", "B"], output="L")
    ops = ops_of(gm)
    assert ops.count("BatchNormalization") == 3, ops
    assert not {"Sub", "Squeeze", "Sqrt", "Reciprocal"} & set(ops), ops
    # The seed's Expand, grad_B's and grad_scale's sums, and the loss itself.
    assert ops.count("ReduceSum") == 3, ops
    # 24 nodes (the loss's seed included) with xhat and the factor recomputed, sums squeezed.
    assert len(ops) - 2 <= 15, ops
