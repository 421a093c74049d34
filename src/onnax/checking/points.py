"""The random point a check runs at, and feeds cast to a model's input types."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx_ir as ir

__all__ = ["feeds_for", "is_float", "np_dtype", "random_point"]

Feeds = dict[str, np.ndarray]


def np_dtype(value: ir.Value) -> np.dtype:
    """The numpy element type of a graph value (float64 when unknown)."""
    return np.dtype(value.dtype.numpy()) if value.dtype is not None else np.dtype(np.float64)


def is_float(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is a floating-point type, bfloat16 (a numpy void type) included."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def random_point(model: ir.Model, rng: np.random.Generator, size: int = 2) -> Feeds:
    """Uniform(-1, 1) floats, rounded to their element type then held in float64; zero ints."""
    point: Feeds = {}
    for v in model.graph.inputs:
        if v.name in model.graph.initializers or v.dtype is None:
            continue
        shape = [d if isinstance(d, int) else size for d in (v.shape.dims if v.shape else [])]
        dtype = np_dtype(v)
        if is_float(dtype):
            point[str(v.name)] = rng.uniform(-1.0, 1.0, shape).astype(dtype).astype(np.float64)
        else:
            point[str(v.name)] = np.zeros(shape, dtype)
    return point


def feeds_for(model: ir.Model, values: Mapping[str, np.ndarray]) -> Feeds:
    """``values`` cast to the element types of ``model``'s inputs (those it has)."""
    out: Feeds = {}
    for v in model.graph.inputs:
        name = str(v.name)
        if name in values and v.dtype is not None:
            out[name] = np.asarray(values[name]).astype(v.dtype.numpy())
    return out
