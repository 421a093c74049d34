"""Finite differences on a ladder of steps, and the tolerance a derivative is judged with.

One step cannot serve every point: near a kink (ReLU, GridSample's cell borders, Abs) a step
that crosses it measures the average of two slopes. The ladder takes central differences at
decreasing steps and accepts the first pair of neighbouring steps that agree: their difference
bounds the reference's own error. When no pair agrees the point is *inconclusive*, which is
not a failure of the derivative model: the difference quotient, not the derivative, is
unreliable there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Settled", "eps", "ladder", "norm", "relative_tolerance", "settle"]

FIRST_STEPS = {"float64": (1e-3, 1e-4, 1e-5, 1e-6), "float32": (3e-2, 1e-2, 3e-3, 1e-3)}
"""Steps of first differences, by the precision the reference model computes in."""

SECOND_STEPS = {"float64": (1e-2, 3e-3, 1e-3, 3e-4, 1e-4), "float32": (1e-1, 5e-2, 3e-2)}
"""Steps of second differences (Hessians): rounding grows as 1/step², so they stay larger."""

AGREEMENT = 0.25
"""Neighbouring steps agree when they differ by at most this share of the tolerance."""


def eps(dtype: np.dtype) -> float:
    """The unit roundoff of a floating-point element type (bfloat16 included)."""
    if dtype.name == "bfloat16":
        return 2.0**-8
    return float(np.finfo(dtype).eps)


def relative_tolerance(dtype: np.dtype, second_order: bool = False) -> float:
    """The norm-wise relative error a derivative computed in ``dtype`` may have.

    Small enough that a result scaled by 1.01 fails in float32 and float64; float64 Hessians
    get 1e-5 because their reference, a second difference, is good to about that.
    """
    if dtype == np.float64:
        return 1e-5 if second_order else 1e-6
    if dtype == np.float32:
        return 2e-3
    if dtype == np.float16:
        return 3e-2
    return 1e-1  # bfloat16: 8 bits of mantissa


def norm(a: np.ndarray | float) -> float:
    """The Frobenius norm in float64 (0 for an empty array)."""
    arr = np.asarray(a, np.float64)
    return float(np.sqrt(np.sum(arr * arr))) if arr.size else 0.0


@dataclass(frozen=True)
class Settled:
    """The outcome of a ladder: a reference value, or none when no two steps agree.

    Attributes:
        value: The difference quotient at the smaller of the agreeing steps (None: inconclusive).
        uncertainty: The norm of the difference between the two agreeing steps, or the
            smallest such difference found when none agree.
        step: The step of ``value`` (the last tried when inconclusive).
    """

    value: np.ndarray | None
    uncertainty: float
    step: float


def ladder(
    estimate: Callable[[float], np.ndarray], steps: Sequence[float]
) -> Callable[[int], np.ndarray]:
    """Memoises ``estimate`` per rung, so several outputs can share one set of model runs."""
    cache: dict[int, np.ndarray] = {}

    def at(rung: int) -> np.ndarray:
        if rung not in cache:
            cache[rung] = np.asarray(estimate(steps[rung]), np.float64)
        return cache[rung]

    return at


def settle(
    at: Callable[[int], np.ndarray], steps: Sequence[float], rtol: float, floor: float
) -> Settled:
    """Walks down the ladder until two neighbouring steps agree within a share of the tolerance."""
    best = np.inf
    for rung in range(len(steps) - 1):
        coarse, fine = at(rung), at(rung + 1)
        spread = norm(coarse - fine)
        if not np.isfinite(spread):
            continue
        best = min(best, spread)
        if spread <= AGREEMENT * (rtol * norm(fine) + floor):
            return Settled(fine, spread, steps[rung + 1])
    return Settled(None, float(best), steps[-1])
