"""The reference function of a check: the source model, lifted and preferably in float64.

*Lifted*: the initializers a derivative is taken with respect to become graph inputs, so
finite differences can move them (their stored values are the point's coordinates). *float64*:
the twin of :mod:`onnax.checking.runtime`, used when it runs and computes the same function as
the source (a graph may rely on float32 rounding; its twin is then refused).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx_ir as ir

from onnax.checking.finite import eps, norm
from onnax.checking.runtime import float64_twin, runner

__all__ = ["Reference", "lift"]

Feeds = Mapping[str, np.ndarray]

_TWIN_LIMIT = 1e3
"""The twin is refused when it differs from the source by more than this many units of the
source's roundoff (norm-wise): it would then be another function, not a more exact one."""


def lift(model: ir.Model, names: Iterable[str]) -> ir.Model:
    """A copy of ``model`` where the named initializers are graph inputs instead."""
    copy = model.clone()
    graph = copy.graph
    listed = {v.name for v in graph.inputs}
    for name in names:
        value = graph.initializers.pop(name)
        value.const_value = None
        if name not in listed:
            graph.inputs.append(value)
    return copy


def _native_dtypes(model: ir.Model) -> dict[str, np.dtype]:
    return {str(v.name): v.dtype.numpy() for v in model.graph.inputs if v.dtype is not None}


class Reference:
    """Runs the lifted source at a point given in float64, as exactly as the runtime allows.

    Attributes:
        amplification: How many units of roundoff the source's float computation loses at the
            point (its distance to the twin, at least 1): derivative rounding grows alike.
        description: How the reference runs, for the report.
    """

    def __init__(self, lifted: ir.Model, point: Feeds) -> None:
        from onnax.core.widen import holds_half, widen_half

        # A half model runs in FLOAT when the twin cannot: a FLOAT16 step drowns in rounding.
        native_model = widen_half(lifted) if holds_half(lifted) else lifted
        self._dtypes = _native_dtypes(native_model)
        self.amplification = 1.0
        self._float64 = False
        graph = lifted.graph
        types = [v.dtype for v in (*graph.inputs, *graph.outputs) if v.dtype is not None]
        narrow = [t.numpy() for t in types if t.is_floating_point() and t != ir.DataType.DOUBLE]
        self._run, backend = runner(native_model)
        self._backend = backend
        if not narrow:
            self._nominal = "float64"
            self.description = f"the source model (float64) in {backend}"
            return
        self._nominal = "float32"
        self.description = f"the source model in {backend} at its own precision"
        unit = max(eps(np.dtype(d)) for d in narrow)
        try:
            twin, twin_backend = runner(float64_twin(lifted))
            here = self(point)
            there = twin(_as_float64(point))
        except Exception as err:
            self.description += f" (its float64 twin does not run: {type(err).__name__})"
            return
        gaps = [
            norm(here[k] - there[k]) / max(norm(there[k]), 1e-300)
            for k in there
            if k in here and np.asarray(there[k]).dtype.kind == "f"
        ]
        gap = max(gaps, default=0.0)
        if not np.isfinite(gap) or gap > _TWIN_LIMIT * unit:
            self.description += (
                f" (its float64 twin differs from it by {gap:.1e}: another function)"
            )
            return
        self.amplification = max(1.0, gap / unit)
        self._run, self._float64, self._backend = twin, True, twin_backend
        self._nominal = "float64"
        self.description = f"the float64 twin of the source model in {twin_backend}"

    @property
    def precision(self) -> str:
        """The precision the reference computes in: ``"float64"`` or ``"float32"``.

        ``onnx.reference`` counts as float32 whatever the types: some of its kernels compute in
        float32 (``Erf`` goes through ``np.vectorize(math.erf, otypes=["f"])``).
        """
        return "float32" if "onnx.reference" in str(self._backend) else self._nominal

    def __call__(self, point: Feeds) -> dict[str, np.ndarray]:
        """The source's outputs at ``point`` (float values in float64)."""
        if self._float64:
            feeds = _as_float64(point)
        else:
            feeds = {
                k: np.asarray(v).astype(self._dtypes[k]) if k in self._dtypes else np.asarray(v)
                for k, v in point.items()
            }
        out = self._run(feeds)
        return {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in out.items()}


def _as_float64(point: Feeds) -> dict[str, np.ndarray]:
    return {
        k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
        for k, v in point.items()
    }
