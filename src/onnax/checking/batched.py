"""The vmap check: the batched result against the source run example by example."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from onnax.checking.finite import eps, norm
from onnax.checking.points import feeds_for, is_float, random_point
from onnax.checking.result import Row
from onnax.checking.runtime import runner

__all__ = ["check_vmap"]

Feeds = dict[str, np.ndarray]


def _per_value_axes(spec: Any, values: Sequence[ir.Value]) -> list[int | None]:
    """An ``in_axes``/``out_axes`` value resolved to one normalised axis per value."""
    names = [str(v.name) for v in values]
    if spec is None or isinstance(spec, int):
        axes: list[int | None] = [spec] * len(values)
    elif isinstance(spec, Mapping):
        axes = [spec.get(n) for n in names]
    else:
        axes = list(spec)
    out: list[int | None] = []
    for axis, v in zip(axes, values, strict=True):
        rank = v.shape.rank() if v.shape is not None else 0
        out.append(None if axis is None else axis % (rank + 1))
    return out


def check_vmap(
    source: ir.Model,
    derived: ir.Model,
    in_axes: Any,
    out_axes: Any,
    axis_size: int | None,
    seed: int,
) -> tuple[list[Row], str]:
    """The batched result against the source run example by example (nothing is differenced)."""
    rng = np.random.default_rng(seed)
    f, f_backend = runner(source)
    g, _ = runner(derived)
    size = axis_size or 3
    graph = source.graph
    inputs = list(graph.inputs)
    in_ax = _per_value_axes(in_axes, inputs)
    out_ax = _per_value_axes(out_axes, list(graph.outputs))
    examples = [feeds_for(source, random_point(source, rng)) for _ in range(size)]
    feeds: Feeds = {}
    for v, axis in zip(inputs, in_ax, strict=True):
        name = str(v.name)
        if name not in examples[0]:
            continue
        if axis is None:
            for ex in examples:
                ex[name] = examples[0][name]
            feeds[name] = examples[0][name]
        else:
            feeds[name] = np.stack([ex[name] for ex in examples], axis=axis)
    got = g(feeds)
    runs = [f(ex) for ex in examples]
    rows: list[Row] = []
    for y, axis in zip(graph.outputs, out_ax, strict=True):
        name = str(y.name)
        wants = [r[name] for r in runs]
        want = np.stack(wants, axis=axis) if axis is not None else wants[0]
        have = np.asarray(got[name])
        dtype = np.dtype(want.dtype)
        # Batched kernels may sum in another order: a few hundred roundoffs, norm-wise.
        # Half types get fewer roundoffs: 256 of them would be 25%, loose enough to pass a
        # result scaled by 1.01.
        units = 256 if dtype in (np.float32, np.float64) else 32
        rtol = units * eps(dtype) if is_float(dtype) else 0.0
        tolerance = rtol * norm(want)
        if have.shape != want.shape:
            rows.append(
                Row(
                    "vmap",
                    name,
                    norm(want),
                    np.inf,
                    tolerance,
                    "wrong",
                    f"shape {list(have.shape)}, expected {list(want.shape)}",
                )
            )
            continue
        error = norm(have.astype(np.float64) - want.astype(np.float64))
        rows.append(
            Row("vmap", name, norm(want), error, tolerance, "ok" if error <= tolerance else "wrong")
        )
    return rows, f"the source model run example by example in {f_backend}"
