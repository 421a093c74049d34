"""Full Jacobians and Hessians as vmap over an identity basis.

``jacfwd`` maps ``jvp(model)`` over the rows of an identity matrix fed to its tangent inputs;
``jacrev`` maps ``vjp(model)`` over the rows fed to its cotangent inputs. The basis is built
inside the graph from the run-time sizes (``EyeLike`` of a ``[K, K]`` tensor), so nothing of size
K² is stored and symbolic dimensions stay symbolic. The primal part of the mapped model is shared
by all rows, so it is computed once.

Layout (as in JAX): the Jacobian of output ``y`` (shape ``Y``) with respect to input ``x`` (shape
``X``) is an output named ``jac_<y>_<x>`` of shape ``Y + X``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.naming import NameClaims, diff_prefix, io_names
from onnax.core.selection import select_inputs, select_outputs
from onnax.errors import SelectionError
from onnax.passes.cleanup import cleanup
from onnax.passes.jvp import JvpPass
from onnax.passes.prepare import prepare
from onnax.passes.stop_gradient import StopGradient, resolve_stops, without_stopped
from onnax.passes.vjp import VjpPass
from onnax.passes.vmap import VmapPass

__all__ = ["jacobian_model"]


def _identity_rows(
    em: Emitter, sizes: list[ir.Value], dtype: ir.DataType
) -> tuple[ir.Value, list[ir.Value]]:
    """A ``[K, K]`` identity with ``K = sum(sizes)`` and the start offset of each block."""
    total = sizes[0]
    offsets = [em.ints([0])]
    for s in sizes[1:]:
        offsets.append(total)
        total = em.op("Add", [total, s])
    square = em.op("Concat", [total, total], {"axis": 0})
    zeros = em.op(
        "ConstantOfShape", [square], {"value": ir.tensor(np.zeros(1, dtype=dtype.numpy()))}
    )
    return em.op("EyeLike", [zeros]), offsets


def _numel(em: Emitter, value: ir.Value) -> ir.Value:
    if value.shape is not None and value.shape.is_static():
        return em.ints([int(np.prod(value.shape.numpy(), dtype=np.int64))])
    return em.op("Reshape", [em.op("Size", [value]), em.ints([1])])


def jacobian_model(
    model: ir.Model,
    inputs: str | Sequence[str] | None,
    outputs: str | Sequence[str] | None,
    mode: str,
    stop_gradient: StopGradient = None,
) -> ir.Model:
    """The model with ``jac_<y>_<x>`` outputs appended; ``mode`` is "fwd" or "rev".

    ``stop_gradient`` names values whose derivative is zero (see :func:`onnax.api.jvp`).
    """
    transform = "jacfwd" if mode == "fwd" else "jacrev"
    prepared = prepare(model, transform)
    stopped = resolve_stops(prepared, stop_gradient, transform)
    xs = select_inputs(prepared.graph, inputs, transform)
    xs = without_stopped(xs, stopped, inputs is not None, transform)
    ys = select_outputs(prepared.graph, outputs, transform)
    if not xs or not ys:
        raise SelectionError(
            f"{transform}: nothing to differentiate (inputs {[x.name for x in xs]}, outputs {[y.name for y in ys]})"
        )
    dtypes = {v.dtype for v in (*xs, *ys)}
    if len(dtypes) != 1:
        raise SelectionError(
            f"{transform}: the selected inputs and outputs mix element types {sorted(d.name for d in dtypes if d)}; "
            "select values of one type (FLOAT or DOUBLE) so that one identity basis serves them all."
        )
    dtype = next(iter(dtypes))
    if dtype is None:
        raise SelectionError(f"{transform}: the selected values have no element type")
    x_names = [str(x.name) for x in xs]
    y_names = [str(y.name) for y in ys]
    n_in, n_out = len(prepared.graph.inputs), len(prepared.graph.outputs)
    if mode == "fwd":
        derived = JvpPass(x_names, y_names, stop_gradient=stop_gradient)(prepared).model
        basis_of = xs
    else:
        derived = VjpPass(x_names, y_names, stop_gradient=stop_gradient)(prepared).model
        basis_of = ys
    seeded = [str(v.name) for v in list(derived.graph.inputs)[n_in:]]
    results = list(derived.graph.outputs)[n_out:]
    result_names = [str(v.name) for v in results]
    mapped = VmapPass(
        in_axes={name: 0 for name in seeded},
        out_axes={
            str(v.name): (0 if v.name in result_names else None) for v in derived.graph.outputs
        },
    )(derived).model
    graph = mapped.graph
    em = Emitter(mapped.opset_imports[""])
    inputs_by_name = {v.name: v for v in graph.inputs}
    outputs_by_name = {v.name: v for v in graph.outputs}

    def here(v: ir.Value) -> ir.Value:
        """The value of the mapped model standing for primal input or output ``v``."""
        found = inputs_by_name.get(v.name) or graph.initializers.get(str(v.name))
        return found if found is not None else outputs_by_name[v.name]

    sizes = [_numel(em, here(v)) for v in basis_of]
    eye, offsets = _identity_rows(em, sizes, dtype)
    # Each seed input becomes its column block of the identity, reshaped to [K, *shape].
    at = {str(v.name): i for i, v in enumerate(graph.outputs) if v.name in result_names}
    for name, value, size, offset in zip(seeded, basis_of, sizes, offsets, strict=True):
        block = em.slice(eye, offset, em.op("Add", [offset, size]), [1])
        shape = em.op("Concat", [em.ints([-1]), em.shape(here(value))], {"axis": 0})
        # A seed can be a result itself (the tangent of an output that is an input, x => x).
        inputs_by_name[name].replace_all_uses_with(
            em.op("Reshape", [block, shape]), replace_graph_outputs=True
        )
    outputs_by_name.update({name: graph.outputs[i] for name, i in at.items()})
    for name in seeded:
        graph.inputs.remove(inputs_by_name[name])
    # A mapped result is [K, *R]: cut the rows of each basis block and move them last.
    kept = [v for i, v in enumerate(graph.outputs) if i not in at.values()]
    graph.outputs.clear()
    graph.outputs.extend(kept)
    claims = NameClaims(mapped)
    prefix = diff_prefix(io_names(graph), "jac")
    columns = ys if mode == "fwd" else xs
    new_outputs = []
    for result_name, col in zip(result_names, columns, strict=True):
        mapped_value = outputs_by_name[result_name]
        col_rank = col.shape.rank() if col.shape is not None else 0
        for row, size, offset in zip(basis_of, sizes, offsets, strict=True):
            block = em.slice(mapped_value, offset, em.op("Add", [offset, size]), [0])
            y, x = (col, row) if mode == "fwd" else (row, col)
            if mode == "fwd":
                # [n_x, *Y] -> [*Y, n_x]; reverse mode already has the y rows first.
                block = em.transpose(block, [*range(1, col_rank + 1), 0])
            shape = em.op("Concat", [em.shape(here(y)), em.shape(here(x))], {"axis": 0})
            new_outputs.append((em.op("Reshape", [block, shape]), y, x))
    graph.extend(em.take())
    # Outputs-major order whichever mode built them.
    new_outputs.sort(key=lambda e: (ys.index(e[1]), xs.index(e[2])))
    for jac, y, x in new_outputs:
        claims.claim(jac, f"{prefix}{y.name}_{x.name}")
        jac.dtype = dtype
        jac.shape = ir.Shape(
            [*(y.shape.dims if y.shape else []), *(x.shape.dims if x.shape else [])]
        )
        graph.outputs.append(jac)
    return cleanup(mapped)
