"""Operator test cases shared by the rule tests, the closure test and the corpus driver.

A case is a one- or few-node model written in ONNX text with ``{T}`` for the element type
(``float`` or ``double``) and ``{opset}`` for the default-domain opset, plus how to fill its
inputs. ``run_case`` checks jvp and vjp against float64 central differences and the adjoint
identity between the two, in the requested dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from oracles import check_adjoint, check_jvp, check_vjp, check_vmap

Fill = Callable[[np.random.Generator, tuple[int, ...], np.dtype], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def positive(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape).astype(dtype)


def unit(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Values in (-0.9, 0.9): inside the domain of asin, acos, atanh."""
    return rng.uniform(-0.9, 0.9, shape).astype(dtype)


def away_from_zero(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """|x| in [0.2, 2] with random signs: keeps finite differences off kinks at 0."""
    return (rng.uniform(0.2, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dtype)


def distinct(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A random permutation of well-separated values: no ties for max/min/sort."""
    n = int(np.prod(shape)) if shape else 1
    return (rng.permutation(n).reshape(shape) * 0.37 - n * 0.15).astype(dtype)


@dataclasses.dataclass(frozen=True)
class Case:
    """One operator test case.

    Attributes:
        name: Test id.
        text: ONNX text with ``{T}`` and ``{opset}`` placeholders.
        opsets: Opsets to instantiate the case at.
        fill: Per-input fill functions (default ``normal``); non-float inputs must be given in
            ``fixed``.
        fixed: Inputs with fixed values (indices, shapes); ``{T}`` arrays are cast to the dtype.
        inputs: The selection to differentiate (default: all float inputs).
        dims: Sizes for symbolic dimensions (default 3).
        dtypes: Element types to test.
    """

    name: str
    text: str
    opsets: Sequence[int] = (18,)
    fill: Mapping[str, Fill] = dataclasses.field(default_factory=dict)
    fixed: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    inputs: Sequence[str] | None = None
    dims: Mapping[str, int] = dataclasses.field(default_factory=dict)
    dtypes: Sequence[str] = ("float", "double")

    def model(self, dtype: str, opset: int) -> ir.Model:
        text = self.text.replace("{T}", dtype).replace("{opset}", str(opset))
        header = f'<ir_version: 10, opset_import: ["" : {opset}]>\n'
        return ir.from_onnx_text(header + text)

    def feeds(self, model: ir.Model, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feeds: dict[str, np.ndarray] = {}
        for v in model.graph.inputs:
            if v.name in model.graph.initializers:
                continue
            np_dtype = v.dtype.numpy()
            if v.name in self.fixed:
                feeds[v.name] = np.asarray(self.fixed[v.name]).astype(np_dtype)
                continue
            shape = tuple(
                d if isinstance(d, int) else self.dims.get(str(d), 3) for d in v.shape.dims
            )
            fill = self.fill.get(v.name, normal)
            feeds[v.name] = np.asarray(fill(rng, shape, np.dtype(np_dtype)))
        return feeds

    def params(self) -> list[tuple[str, int]]:
        return [(d, o) for o in self.opsets for d in self.dtypes]


def run_case(case: Case, dtype: str, opset: int) -> None:
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    check_jvp(model, feeds, case.inputs)
    check_vjp(model, feeds, case.inputs)
    check_adjoint(model, feeds, case.inputs)


def parametrize(cases: Sequence[Case]) -> list[tuple[Case, str, int]]:
    return [(c, d, o) for c in cases for d, o in c.params()]


def case_id(param: object) -> str:
    if isinstance(param, Case):
        return param.name
    return str(param)


def vmap_axes(model: ir.Model) -> dict[str, tuple[int | None, ...]]:
    """in_axes variants: all at 0, all at 1 (or the last axis for low ranks), all at -1, and
    only the first input batched (the others shared)."""
    inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
    ranks = [v.shape.rank() for v in inputs]
    return {
        "axis0": tuple(0 for _ in inputs),
        "axis1": tuple(min(1, r) for r in ranks),
        "axis-1": tuple(-1 for _ in inputs),
        "mixed": tuple(0 if i == 0 else None for i in range(len(inputs))),
    }


def run_vmap_case(case: Case, dtype: str, opset: int, shared: Sequence[str] = ()) -> None:
    """vmap of the case's model against a loop of single runs, for each in_axes variant.

    The inputs named in ``shared`` stay unbatched in every variant (those an operator cannot
    take batched, such as OneHot's depth or DFT's length).
    """
    model = case.model(dtype, opset)
    feeds = case.feeds(model)
    if not shared:
        for axes in vmap_axes(model).values():
            check_vmap(model, feeds, in_axes=axes, out_axes=0)
        check_vmap(model, feeds, in_axes=0, out_axes=-1)
        return
    names = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    for axes in vmap_axes(model).values():
        in_axes = {n: None if n in shared else a for n, a in zip(names, axes, strict=True)}
        check_vmap(model, feeds, in_axes=in_axes, out_axes=0)
    check_vmap(model, feeds, in_axes={n: 0 for n in names if n not in shared}, out_axes=-1)
