"""Checks shared by the tests of the shape-family rule modules (layout, slicing, padding,
sources, random): model helpers and the vmap and second-order checks every family runs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

import onnax
from cases import Case, run_vmap_case, vmap_axes
from onnax.errors import UnsupportedOperatorError
from oracles import check_jvp, check_vjp, check_vmap, run


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def lit(values: list[int]) -> str:
    return f"int64[{len(values)}] {{{', '.join(map(str, values))}}}"


def model(text: str, opset: int = 13) -> ir.Model:
    return ir.from_onnx_text(f'<ir_version: 10, opset_import: ["" : {opset}]>\n' + text)


def shape_like_inputs(m: ir.Model) -> list[str]:
    """Integer graph inputs: in these cases they are shapes, axes, pads, bounds or repeats."""
    ints = (ir.DataType.INT64, ir.DataType.INT32)
    return [v.name for v in m.graph.inputs if v.dtype in ints]


def shared(m: ir.Model, axes: tuple[int | None, ...], names: list[str]) -> tuple[int | None, ...]:
    inputs = [v.name for v in m.graph.inputs]
    return tuple(None if n in names else a for n, a in zip(inputs, axes, strict=True))


def check_vmap_case(case: Case, dtype: str, opset: int) -> None:
    """vmap of the case against a loop, with its shape-like inputs shared."""
    m = case.model(dtype, opset)
    names = shape_like_inputs(m)
    if not names:
        run_vmap_case(case, dtype, opset)
        return
    # Shape-like inputs batched (identical copies in the all-batched variants) are refused:
    # nothing proves the copies equal. Shared, every variant works.
    feeds = case.feeds(m)
    for axes in vmap_axes(m).values():
        if shared(m, axes, names) != axes:
            with pytest.raises(UnsupportedOperatorError, match="in_axes None"):
                onnax.vmap(m, in_axes=axes)
        check_vmap(m, feeds, in_axes=shared(m, axes, names))
    check_vmap(m, feeds, in_axes=shared(m, (0,) * len(m.graph.inputs), names), out_axes=-1)


def check_vmap_targeted(case: Case, dtype: str, opset: int) -> None:
    """:func:`check_vmap_case`, and only the second input batched against shared data."""
    check_vmap_case(case, dtype, opset)
    m = case.model(dtype, opset)
    feeds = case.feeds(m)
    names = shape_like_inputs(m)
    # Only the second input batched (a batched value against shared data, where there is one).
    if len(m.graph.inputs) > 1 and m.graph.inputs[1].name not in names:
        axes = tuple(0 if i == 1 else None for i in range(len(m.graph.inputs)))
        check_vmap(m, feeds, in_axes=axes)


def check_second_order(case: Case, opset: int) -> None:
    """jvp and vjp of the vjp model: the operators the transpose rules emit are differentiated
    (and transposed) in turn."""
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


def check_vmap_of_derivative_model(case: Case, opset: int, kind: str) -> None:
    """vmap of a derivative model: the primal inputs and per-example tangents/cotangents batched
    (shape-like inputs shared), and only the seeds batched (many directions in one pass)."""
    m = case.model("double", opset)
    d = onnax.jvp(m, case.inputs) if kind == "jvp" else onnax.vjp(m, case.inputs)
    feeds = case.feeds(m)
    primal = run(m, feeds)
    rng = np.random.default_rng(5)
    n_primal = len(m.graph.inputs)
    for v in list(d.graph.inputs)[n_primal:]:
        like = v.name.split("_", 1)[1]
        shape = feeds[like].shape if like in feeds else primal[like].shape
        feeds[v.name] = rng.standard_normal(shape)
    names = shape_like_inputs(d)
    check_vmap(d, feeds, in_axes=shared(d, (0,) * len(d.graph.inputs), names))
    seeds_only = tuple(None if i < n_primal else -1 for i in range(len(d.graph.inputs)))
    check_vmap(d, feeds, in_axes=seeds_only, out_axes=-1)


def check_derivatives_of_vmapped_model(case: Case, opset: int) -> None:
    """Derivatives of a vmapped model: the operators the batch rules emit (Where, NonZero,
    Range, ReduceProd on shapes, Cast...) must themselves be differentiable."""
    m = case.model("double", opset)
    feeds = case.feeds(m)
    names = shape_like_inputs(m)
    v = onnax.vmap(m, in_axes=shared(m, (0,) * len(m.graph.inputs), names))
    rng = np.random.default_rng(4)
    batched = {
        k: a if k in names else np.stack([a + 0.1 * rng.standard_normal(a.shape) for _ in range(2)])
        for k, a in feeds.items()
    }
    check_jvp(v, batched)
    check_vjp(v, batched)


def check_vmap_refusal(text: str, in_axes: object, fragments: list[str]) -> None:
    """vmap of the model refuses, with every fragment in its message."""
    with pytest.raises(UnsupportedOperatorError) as err:
        onnax.vmap(model(text, 13), in_axes=in_axes)
    message = str(err.value)
    for fragment in [*fragments, "vmap", "Remedy", "in_axes None"]:
        assert fragment in message, (fragment, message)
