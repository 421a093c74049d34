"""CasADi's matrix view of tensors and the seed-axis adapter pass.

CasADi reads a tensor as a matrix (rank 0 and 1 a column, rank 2 as it is, higher ranks flattened
row-major into a column) and takes ``n`` seeds of an ``r x c`` value as one ``r x (n*c)`` matrix of
seed-major column blocks, the seed count being a named symbolic dimension. :class:`SeedLayoutPass`
converts a model whose seeds carry a leading axis (the output of ``vmap``) to that layout, or to a
trailing seed axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import onnx_ir as ir
import onnx_ir.passes.common as common

from onnax.core.emit import Emitter
from onnax.errors import OnnaxError

__all__ = [
    "CasadiContractError",
    "Dim",
    "Layout",
    "SeedLayoutPass",
    "casadi_matrix",
    "dim_product",
    "seeded_shape",
    "shape_dims",
]

Layout = Literal["casadi", "onnx"]


Dim = int | str


class CasadiContractError(OnnaxError, ValueError):
    """A model or a file that would break CasADi's sibling contract."""


def _factors(dim: Dim) -> tuple[int, list[str]]:
    """A dimension as an integer factor and symbolic factors (``"3*nadj"`` -> 3, [nadj])."""
    if isinstance(dim, int):
        return dim, []
    number, names = 1, []
    for part in str(dim).split("*"):
        part = part.strip()
        if part.isdigit():
            number *= int(part)
        elif part:
            names.append(part)
    return number, names


def dim_product(*dims: Dim) -> Dim:
    """The product of dimensions, as CasADi spells it: ``"3*nadj"``, ``"N*nfwd*nadj"``."""
    number, names = 1, []
    for d in dims:
        k, n = _factors(d)
        number *= k
        names.extend(n)
    if not names:
        return number
    return "*".join(([str(number)] if number != 1 else []) + names)


def _dim(d: int | ir.SymbolicDim) -> Dim:
    if isinstance(d, int):
        return d
    if d.value is None:
        raise CasadiContractError("a dimension without a name cannot be written for CasADi")
    return str(d.value)


def casadi_matrix(dims: Sequence[Dim]) -> tuple[Dim, Dim]:
    """The matrix CasADi sees for a tensor of shape ``dims``: (rows, columns)."""
    if len(dims) == 0:
        return 1, 1
    if len(dims) == 1:
        return dims[0], 1
    if len(dims) == 2:
        return dims[0], dims[1]
    return dim_product(*dims), 1


def seeded_shape(dims: Sequence[Dim], seed_dim: str, layout: Layout) -> list[Dim]:
    """The shape of the seeds (or derivatives) of a value of shape ``dims`` in ``layout``."""
    if layout == "onnx":
        return [*dims, seed_dim]
    rows, cols = casadi_matrix(dims)
    return [rows, dim_product(cols, seed_dim)]


def shape_dims(value: ir.Value) -> list[Dim]:
    """The dimensions of ``value`` as CasADi names them; raises if one has no name.

    Raises:
        CasadiContractError: If the shape, or the name of a symbolic dimension, is unknown.
    """
    if value.shape is None:
        raise CasadiContractError(
            f"the shape of {value.name!r} is unknown; CasADi needs every input and output of a "
            "model to have a declared rank and dimensions. Give the model typed inputs."
        )
    return [_dim(d) for d in value.shape.dims]


class SeedLayoutPass(ir.passes.FunctionalPass):
    """Moves the seed axis of seed inputs and derivative outputs from axis 0 to ``layout``.

    The argument model (typically ``vmap`` of a ``jvp``/``vjp`` model) carries ``n`` seeds as a
    leading axis: a seed input of a value of shape ``V`` has shape ``[n, *V]``. The result takes
    and returns them in ``layout``: ``"onnx"`` puts the seed axis last (``[*V, n]``), ``"casadi"``
    gives CasADi's ``rx(n*c)`` matrix of seed-major column blocks, where ``rxc`` is the matrix
    CasADi sees for ``V``. The conversions are Reshape and Transpose nodes at the boundary; the
    seed axis is renamed ``dim`` everywhere.

    Args:
        seeds: Names of graph inputs with a leading seed axis.
        results: Names of graph outputs with a leading seed axis.
        dim: The name of the seed dimension (CasADi's ``nfwd``, ``nadj``, ``nfwd2``...).
        layout: ``"casadi"`` or ``"onnx"``.
        witnesses: For a seed input, the name of an input or output of the same per-seed shape,
            read at run time when a dimension of that shape is symbolic.
    """

    def __init__(
        self,
        seeds: Sequence[str],
        results: Sequence[str],
        dim: str,
        layout: Layout = "casadi",
        witnesses: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if layout not in ("casadi", "onnx"):
            raise ValueError(f"layout must be 'casadi' or 'onnx', got {layout!r}")
        self.seeds = list(seeds)
        self.results = list(results)
        self.dim = dim
        self.layout: Layout = layout
        self.witnesses = dict(witnesses or {})

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        """Builds the model with the seed axes moved; the argument is left untouched."""
        model = ir.from_proto(ir.to_proto(model))
        graph = model.graph
        em = Emitter(model.opset_imports[""])
        by_name = {v.name: v for v in (*graph.inputs, *graph.outputs)}
        old_dims = {
            str(v.shape[0])
            for name in (*self.seeds, *self.results)
            if (v := by_name.get(name)) is not None
            and v.shape is not None
            and v.shape.rank() > 0
            and isinstance(v.shape[0], ir.SymbolicDim)
        }
        for i, x in enumerate(list(graph.inputs)):
            if x.name not in self.seeds:
                continue
            per_seed = shape_dims(x)[1:]
            new = ir.Value(
                name=x.name,
                type=x.type,
                shape=ir.Shape(seeded_shape(per_seed, self.dim, self.layout)),
            )
            x.name = None
            witness = by_name.get(self.witnesses.get(str(new.name), ""))
            internal = self._seed_in(em, new, per_seed, witness)
            graph.inputs[i] = new
            x.replace_all_uses_with(internal)
        entry = em.take()
        if entry:
            graph.insert_before(graph[0], entry) if len(graph) else graph.extend(entry)
        for i, y in enumerate(list(graph.outputs)):
            if y.name not in self.results:
                continue
            per_seed = shape_dims(y)[1:]
            out = self._result_out(em, y, len(per_seed))
            graph.extend(em.take())
            name = y.name
            y.name = None
            out.name = name
            out.type = y.type
            out.shape = ir.Shape(seeded_shape(per_seed, self.dim, self.layout))
            graph.outputs[i] = out
        _rename_dims(model, old_dims, self.dim)
        # A seed read through a witness output must come after the node computing it.
        graph.sort()
        common.NameFixPass()(model)
        return ir.passes.PassResult(model, modified=True)

    def _seed_in(
        self, em: Emitter, new: ir.Value, per_seed: list[Dim], witness: ir.Value | None
    ) -> ir.Value:
        """The ``[n, *V]`` tensor for a seed input given in the layout."""
        rank = len(per_seed)
        if self.layout == "onnx":
            return em.transpose(new, [rank, *range(rank)])
        if rank == 0:
            return em.op("Reshape", [new, em.ints([-1])])
        if rank == 1:
            return em.transpose(new, [1, 0])
        if rank == 2:
            cols: ir.Value
            if isinstance(per_seed[1], int):
                cols = em.ints([per_seed[1]])
            else:
                if witness is None:
                    raise CasadiContractError(
                        f"the seed {new.name!r} has a symbolic column count and nothing to read "
                        "it from at run time"
                    )
                cols = em.slice(em.op("Shape", [witness]), [1], [2], [0])
            blocks = em.op("Reshape", [new, em.op("Concat", [em.ints([0, -1]), cols], {"axis": 0})])
            return em.transpose(blocks, [1, 0, 2])
        seeds_first = em.transpose(new, [1, 0])
        if all(isinstance(d, int) for d in per_seed):
            target = em.ints([-1, *(int(d) for d in per_seed)])
        else:
            if witness is None:
                raise CasadiContractError(
                    f"the seed {new.name!r} has symbolic dimensions and nothing to read them from"
                )
            target = em.op("Concat", [em.ints([-1]), em.op("Shape", [witness])], {"axis": 0})
        return em.op("Reshape", [seeds_first, target])

    def _result_out(self, em: Emitter, y: ir.Value, rank: int) -> ir.Value:
        """A derivative output ``[n, *V]`` converted to the layout."""
        if self.layout == "onnx":
            out = em.transpose(y, [*range(1, rank + 1), 0])
        elif rank == 0:
            out = em.op("Reshape", [y, em.ints([1, -1])])
        elif rank == 1:
            out = em.transpose(y, [1, 0])
        elif rank == 2:
            out = em.op("Reshape", [em.transpose(y, [1, 0, 2]), em.ints([0, -1])])
        else:
            out = em.transpose(em.op("Flatten", [y], {"axis": 1}), [1, 0])
        if out is y:
            out = em.op("Identity", [y])
        return out


def _rename_dims(model: ir.Model, old: set[str], new: str) -> None:
    """Renames symbolic dimensions ``old`` to ``new`` in every typed value."""
    if not old:
        return
    for graph in model.graphs():
        values = [*graph.inputs, *graph.outputs, *(o for n in graph for o in n.outputs)]
        for v in values:
            if v.shape is None:
                continue
            dims = list(v.shape.dims)
            if any(isinstance(d, ir.SymbolicDim) and str(d) in old for d in dims):
                v.shape = ir.Shape(
                    [new if isinstance(d, ir.SymbolicDim) and str(d) in old else d for d in dims]
                )
