import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case
from onnax.errors import UnsupportedOperatorError
from oracles import run
from rules.shape_checks import check_vmap_case, check_vmap_targeted, model

CASES = [
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
]


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


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


# ----------------------------------------------------------------------------------- vmap
@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    check_vmap_case(case, dtype, opset)


TARGETED = [
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
    check_vmap_targeted(case, dtype, opset)


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
