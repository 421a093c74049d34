"""DFT and STFT (rules in onnax.rules.spectral).

DFT is checked at opsets 17 and 18 (axis attribute) and 20 and 28 (axis input): real and complex
input, forward and inverse, onesided (even and odd lengths), ``dft_length`` padding and
truncating (constant and run-time), axes before the signal's batch axis and after it. STFT
(17) with and without a window, real and complex signal, onesided or not, constant and
run-time frame_step. onnxruntime 1.32 has float and double kernels for both. vmap is checked
on the same cases with the length/step/axis inputs shared, and the refusal of a batched
``dft_length``.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnax
from cases import Case, case_id, parametrize, run_case, run_vmap_case
from onnax.errors import UnsupportedOperatorError
from oracles import check_vmap

OLD = (17, 18)
NEW = (20, 28)

CASES = [
    Case(
        "dft_real_axis1",
        "g ({T}[N, 6, 1] X) => ({T}[N, 6, 2] Y) { Y = DFT<axis=1>(X) }",
        opsets=OLD,
    ),
    Case(
        "dft_complex_inverse",
        "g ({T}[N, 5, 2] X) => ({T}[N, 5, 2] Y) { Y = DFT<axis=1, inverse=1>(X) }",
        opsets=OLD,
    ),
    Case(
        "dft_real_onesided_even",
        "g ({T}[N, 6, 1] X) => ({T}[N, 4, 2] Y) { Y = DFT<axis=1, onesided=1>(X) }",
        opsets=OLD,
    ),
    Case(
        "dft_real_onesided_odd_axis0",
        "g ({T}[5, N, 1] X) => ({T}[3, N, 2] Y) { Y = DFT<axis=0, onesided=1>(X) }",
        opsets=(17,),
    ),
    Case(
        "dft_pad_const_length",
        "g ({T}[N, 4, 1] X) => ({T}[N, 7, 2] Y) {\n"
        " L = Constant<value = int64 {7}>()\n Y = DFT<axis=1>(X, L) }",
        opsets=OLD,
    ),
    Case(
        "dft_truncate_runtime_length_complex",
        "g ({T}[N, 7, 2] X, int64 L) => ({T}[N, 5, 2] Y) { Y = DFT<axis=1>(X, L) }",
        opsets=(17,),
        fixed={"L": np.array(5)},
    ),
    Case(
        "dft_pad_runtime_length_onesided",
        "g ({T}[N, 4, 1] X, int32 L) => ({T}[N, 4, 2] Y) { Y = DFT<axis=1, onesided=1>(X, L) }",
        opsets=(17,),
        fixed={"L": np.array(6, dtype=np.int32)},
    ),
    Case(
        "dft20_default_axis",
        "g ({T}[N, 3, 6, 2] X) => ({T}[N, 3, 6, 2] Y) { Y = DFT(X) }",
        opsets=NEW,
    ),
    Case(
        "dft20_axis_input_inverse",
        "g ({T}[2, N, 4, 1] X) => ({T}[2, N, 4, 2] Y) {\n"
        " A = Constant<value = int64 {-2}>()\n Y = DFT<inverse=1>(X, , A) }",
        opsets=NEW,
    ),
    Case(
        "dft20_axis0_onesided_length",
        "g ({T}[5, N, 1] X) => ({T}[4, N, 2] Y) {\n"
        " A = Constant<value = int64 {0}>()\n L = Constant<value = int64 {6}>()\n"
        " Y = DFT<onesided=1>(X, L, A) }",
        opsets=(20,),
    ),
    # A run-time axis (opset 20): normalised in the graph, padded and sliced through it.
    Case(
        "dft20_runtime_axis_onesided",
        "g ({T}[N, 4, 3, 1] X, int64 A) => ({T}[N, 3, 3, 2] Y) { Y = DFT<onesided=1>(X, , A) }",
        opsets=(20,),
        fixed={"A": np.array(1)},
    ),
    Case(
        "dft20_runtime_negative_axis_length",
        "g ({T}[N, 4, 3, 2] X, int64 A, int64 L) => ({T}[N, 4, 5, 2] Y) { Y = DFT(X, L, A) }",
        opsets=(20,),
        fixed={"A": np.array(-2), "L": np.array(5)},
    ),
    # Inverse real FFTs (one-sided spectrum in, real signal out), n = 2 * (5 - 1) = 8.
    Case(
        "irfft_axis1",
        "g ({T}[N, 5, 2] X) => ({T}[N, 8, 1] Y) { Y = DFT<axis=1, inverse=1, onesided=1>(X) }",
        opsets=(19,),
    ),
    Case(
        "irfft_runtime_axis",
        "g ({T}[5, N, 2] X, int64 A) => ({T}[8, N, 1] Y) {\n"
        " Y = DFT<inverse=1, onesided=1>(X, , A) }",
        opsets=(20, 28),
        fixed={"A": np.array(0)},
    ),
    Case(
        "stft_window_real",
        "g ({T}[N, 16, 1] X, {T}[5] W) => ({T}[N, 4, 3, 2] Y) {\n"
        " S = Constant<value = int64 {3}>()\n Y = STFT<onesided=1>(X, S, W) }",
        opsets=(17, 20),
    ),
    Case(
        "stft_window_complex_twosided",
        "g ({T}[N, 12, 2] X, {T}[4] W, int64 S) => ({T}[N, 5, 4, 2] Y) {\n"
        " Y = STFT<onesided=0>(X, S, W) }",
        opsets=(17,),
        fixed={"S": np.array(2)},
    ),
    Case(
        "stft_symbolic_length_runtime_step",
        "g ({T}[N, T, 1] X, {T}[5] W, int32 S) => ({T}[N, F, 3, 2] Y) {\n"
        " Y = STFT<onesided=1>(X, S, W) }",
        opsets=(17,),
        fixed={"S": np.array(4, dtype=np.int32)},
        dims={"T": 14},
    ),
    Case(
        "stft_frame_length_no_window",
        "g ({T}[N, 10, 1] X) => ({T}[N, 3, 3, 2] Y) {\n"
        " S = Constant<value = int64 {3}>()\n F = Constant<value = int64 {4}>()\n"
        " Y = STFT<onesided=1>(X, S, , F) }",
        opsets=(17,),
    ),
]

# Inputs that decide shapes: shared in every vmap variant.
SHARED = ("L", "S", "A")


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_rule(case: Case, dtype: str, opset: int) -> None:
    run_case(case, dtype, opset)


@pytest.mark.parametrize(("case", "dtype", "opset"), parametrize(CASES), ids=case_id)
def test_vmap(case: Case, dtype: str, opset: int) -> None:
    run_vmap_case(case, dtype, opset, shared=SHARED)


@pytest.mark.parametrize("name", ["dft_real_onesided_even", "stft_window_real"])
def test_vmap_of_derivatives(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    model = case.model("double", case.opsets[0])
    for transform in (onnax.jvp, onnax.vjp):
        derived = transform(model)
        feeds = case.feeds(derived)
        check_vmap(derived, feeds, in_axes=0)


def test_vjp_refuses_irfft_with_other_length() -> None:
    model = Case(
        "irfft_length",
        "g ({T}[N, 5, 2] X) => ({T}[N, 7, 1] Y) {\n"
        " L = Constant<value = int64 {7}>()\n Y = DFT<axis=1, inverse=1, onesided=1>(X, L) }",
    ).model("float", 19)
    with pytest.raises(UnsupportedOperatorError, match=r"vjp: ai\.onnx::DFT.*dft_length.*Remedy"):
        onnax.vjp(model)


def test_vmap_refuses_batched_dft_length() -> None:
    case = next(c for c in CASES if c.name == "dft_truncate_runtime_length_complex")
    model = case.model("float", 17)
    with pytest.raises(UnsupportedOperatorError, match=r"ai\.onnx::DFT.*dft_length.*'L'.*Remedy"):
        onnax.vmap(model, in_axes=0)
