"""Reading a training model's layout: carried values, initial state, trained weights.

A training model records what it carries from one run to the next in its metadata
(``onnax.training``, JSON): the pairs (input name, output name) to feed back, the parameters and
their original types, the step and learning-rate inputs. The helpers here read that record, so a
caller never has to rebuild names by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from onnax.errors import SelectionError
from onnax.passes.clone import clone_model

__all__ = [
    "EXTERNAL_DATA_THRESHOLD",
    "METADATA_KEY",
    "carry",
    "initial_state",
    "layout",
    "save",
    "trained_model",
]

METADATA_KEY = "onnax.training"
EXTERNAL_DATA_THRESHOLD = 1 << 30
"""Weights above this many bytes in total are saved to a side file (protobuf stops at 2 GiB)."""


def layout(model: ir.Model) -> dict[str, Any]:
    """The training record of a model made by :mod:`onnax.training`.

    Raises:
        SelectionError: The model carries no record (it was not made by ``step`` or
            ``accumulation``).
    """
    text = model.metadata_props.get(METADATA_KEY)
    if text is None:
        raise SelectionError(
            f"the model has no {METADATA_KEY!r} metadata, expected a model made by "
            "onnax.training.step or onnax.training.accumulation. Remedy: pass the training "
            "model, not the inference model."
        )
    record: dict[str, Any] = json.loads(text)
    return record


def carry(model: ir.Model) -> list[tuple[str, str]]:
    """The (input, output) pairs whose output feeds the input of the next run, in order."""
    return [(i, o) for i, o in layout(model)["carry"]]


def initial_state(model: ir.Model) -> dict[str, np.ndarray]:
    """The arrays to feed a training model's carried inputs at step 0.

    Parameters start from their stored values (FLOAT master weights of half parameters start
    from the widened half values), optimizer state and gradient sums from zeros, the step count
    from 0.

    Args:
        model: A model made by :func:`onnax.training.step` or :func:`onnax.training.accumulation`.

    Returns:
        Input name -> array, for every carried input.
    """
    inputs = {v.name: v for v in model.graph.inputs}
    state: dict[str, np.ndarray] = {}
    for name, _ in carry(model):
        value = inputs[name]
        init = model.graph.initializers.get(name)
        if init is not None and init.const_value is not None:
            state[name] = np.array(init.const_value.numpy())
            continue
        if value.dtype is None or value.shape is None or not value.shape.is_static():
            raise SelectionError(
                f"initial_state: carried input {name!r} has shape {value.shape} and dtype "
                f"{value.dtype}, expected a static shape and a known dtype. Remedy: give the "
                "parameters static shapes in the inference model."
            )
        dims = [int(d) for d in value.shape.numpy()]
        state[name] = np.zeros(dims, dtype=value.dtype.numpy())
    return state


def save(
    model: ir.Model,
    path: str | os.PathLike[str],
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> None:
    """Saves ``model``, its weights in a side file ``<path name>.data`` when they are large.

    The side file is also used when the model still reads weights from a source's side file:
    those references are relative to the source, so a copy saved elsewhere needs its own.
    """
    tensors = [
        v.const_value
        for g in model.graphs()
        for v in g.initializers.values()
        if v.const_value is not None
    ]
    total = sum(t.nbytes for t in tensors)
    outside = any(isinstance(t, ir.ExternalTensor) for t in tensors)
    if total > external_data_threshold or outside:
        ir.save(model, path, external_data=f"{os.path.basename(os.fspath(path))}.data")
    else:
        ir.save(model, path)


def trained_model(
    model: ir.Model,
    params: Mapping[str, np.ndarray],
    path: str | os.PathLike[str] | None = None,
    external_data_threshold: int = EXTERNAL_DATA_THRESHOLD,
) -> ir.Model:
    """The inference model with trained weights written back into its initializers.

    Args:
        model: The original inference model; it is not modified.
        params: Parameter name -> trained array (a FLOAT master weight is cast back to the
            initializer's own type, FLOAT16 or BFLOAT16).
        path: Where to save the result, if anywhere.
        external_data_threshold: When the initializers hold more bytes than this, or when the
            source model keeps weights in a side file of its own, ``path`` is saved with its
            weights in a side file ``<path name>.data`` next to it.

    Returns:
        The updated copy.

    Raises:
        SelectionError: A name that is not an initializer, or an array of the wrong shape.
    """
    out = clone_model(model)
    inits = out.graph.initializers
    for name, array in params.items():
        value = inits.get(name)
        if value is None or value.const_value is None:
            raise SelectionError(
                f"trained_model: {name!r} is not an initializer of the model. Initializers: "
                f"{[n for n in inits if n][:20]}. Remedy: pass the inference model the training "
                "model was made from, keyed by parameter name."
            )
        old = value.const_value
        array = np.asarray(array)
        if tuple(array.shape) != tuple(old.shape.numpy()):
            raise SelectionError(
                f"trained_model: {name!r} has shape {list(old.shape.numpy())} in the model, got "
                f"an array of shape {list(array.shape)}. Remedy: pass the parameter's output of "
                "the training step."
            )
        dtype = old.dtype
        value.const_value = ir.tensor(array.astype(dtype.numpy()), dtype=dtype, name=name)
    if path is not None:
        save(out, path, external_data_threshold)
    return out
