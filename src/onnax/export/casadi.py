"""Derivative families for CasADi's ONNX backend.

CasADi (``casadi.GraphBuilder``, 3.8.2 and later) evaluates an ONNX model with onnxruntime and
takes its derivatives from *sibling* files next to the model, found by name: for ``f.onnx`` the
reverse mode is ``adj_f.onnx``, the forward mode ``fwd_f.onnx``, forward over reverse
``fwd_adj_f.onnx`` and so on. :func:`family` writes such a set from one model:

* every sibling takes the inputs of the model it differentiates (all of them, by name) and one
  seed per differentiable input (``fwd_<x>``) or output (``adj_<y>``), and returns the primal
  outputs and one derivative per differentiable output (``fwd_<y>``) or input (``adj_<x>``);
* repeated differentiation names the next level as CasADi's ``diff_prefix`` does (``fwd2_``,
  ``adj2_``) with seed dimensions ``nfwd``/``nadj``/``nfwd2``...;
* in the ``"casadi"`` layout a tensor is the matrix CasADi sees (rank 0 and 1 a column, rank 2 as
  it is, higher ranks flattened row-major into a column), and the ``n`` seeds of an ``rxc`` value
  are one ``rx(n*c)`` matrix of seed-major column blocks; the seed count is a named symbolic
  dimension. The ``"onnx"`` layout keeps each value's own shape and appends the seed axis last.

The siblings are built from :func:`onnax.jvp`/:func:`onnax.vjp` and :func:`onnax.vmap` (the
seed axis), and :class:`SeedLayoutPass` moves the seed axis to the requested layout at the
boundary. :func:`check_family` verifies a family on disk against the contract, because a file
that breaks it usually makes CasADi compute wrong numbers rather than fail.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common

from onnax.core.emit import Emitter
from onnax.core.naming import diff_prefix, io_names
from onnax.core.selection import is_float, select_inputs, select_outputs
from onnax.export.contract import (
    casadi_diff_mask,
    check_embedded,
    check_family,
    check_member,
    seed_dimension,
    siblings_on_disk,
)
from onnax.export.layout import (
    CasadiContractError,
    Dim,
    Layout,
    SeedLayoutPass,
    casadi_matrix,
    dim_product,
    seeded_shape,
    shape_dims,
)
from onnax.passes.jvp import JvpPass
from onnax.passes.prepare import prepare
from onnax.passes.vjp import VjpPass
from onnax.passes.vmap import VmapPass

__all__ = [
    "DEFAULT_KINDS",
    "CasadiContractError",
    "Dim",
    "Family",
    "Layout",
    "SeedLayoutPass",
    "build_family",
    "casadi_diff_mask",
    "casadi_matrix",
    "check_family",
    "family",
    "onnxruntime_library",
    "seeded_shape",
    "use_onnxruntime",
]

DEFAULT_KINDS: tuple[str, ...] = ("adj", "fwd_adj")
"""The siblings written by default: gradients, Jacobians and exact Hessians (forward over adjoint)."""


_KIND = re.compile(r"^(?:(?:fwd|adj)_)*(?:fwd|adj)$")


_PROTOBUF_LIMIT = 2**31 - 1


def onnxruntime_library() -> str:
    """The full path of the shared library bundled in the installed onnxruntime wheel.

    CasADi's ONNX backend loads onnxruntime itself, from the path in the environment variable
    ``CASADI_ONNXRUNTIME_LIB``; the wheel ships it as ``onnxruntime/capi/libonnxruntime.so.<v>``
    (``.dylib`` on macOS, ``onnxruntime.dll`` on Windows).

    Raises:
        CasadiContractError: If onnxruntime is not installed or has no bundled library.
    """
    try:
        import onnxruntime
    except ImportError as err:  # pragma: no cover - onnxruntime is a dependency
        raise CasadiContractError("onnxruntime is not installed; CasADi needs its library") from err
    capi = Path(onnxruntime.__file__).parent / "capi"
    patterns = ("libonnxruntime.so*", "libonnxruntime*.dylib", "onnxruntime.dll")
    found = sorted(p for pat in patterns for p in glob.glob(str(capi / pat)))
    if not found:
        raise CasadiContractError(
            f"no onnxruntime shared library in {capi}. Point CASADI_ONNXRUNTIME_LIB at "
            "libonnxruntime.so of an onnxruntime installation by hand."
        )
    # The versioned name (libonnxruntime.so.1.32.0) is the real file; prefer the longest name.
    return max(found, key=len)


def use_onnxruntime() -> str:
    """Sets ``CASADI_ONNXRUNTIME_LIB`` (unless already set) and returns its value.

    Call it before the first ``casadi.GraphBuilder(...).create(...)`` of the process.
    """
    current = os.environ.get("CASADI_ONNXRUNTIME_LIB")
    if current:
        return current
    path = onnxruntime_library()
    os.environ["CASADI_ONNXRUNTIME_LIB"] = path
    return path


@dataclass
class _Level:
    """One file of the family and what CasADi differentiates in it."""

    model: ir.Model
    diff_inputs: list[str]
    diff_outputs: list[str]
    seed_dims: list[str] = field(default_factory=list)


def _derive(parent: _Level, mode: str, layout: Layout) -> _Level:
    """The sibling that differentiates ``parent`` once more in ``mode`` ("fwd" or "adj")."""
    model = parent.model
    graph = model.graph
    prefix = diff_prefix(io_names(graph), mode)
    dim = seed_dimension(prefix)
    n_in, n_out = len(graph.inputs), len(graph.outputs)
    if mode == "fwd":
        derived = JvpPass(parent.diff_inputs, parent.diff_outputs)(model).model
        expected_seeds = [prefix + x for x in parent.diff_inputs]
        expected_results = [prefix + y for y in parent.diff_outputs]
        witness = dict(zip(expected_seeds, parent.diff_inputs, strict=True))
    else:
        derived = VjpPass(parent.diff_inputs, parent.diff_outputs)(model).model
        expected_seeds = [prefix + y for y in parent.diff_outputs]
        expected_results = [prefix + x for x in parent.diff_inputs]
        witness = dict(zip(expected_seeds, parent.diff_outputs, strict=True))
    seeds = [str(v.name) for v in list(derived.graph.inputs)[n_in:]]
    results = [str(v.name) for v in list(derived.graph.outputs)[n_out:]]
    if seeds != expected_seeds or results != expected_results:  # pragma: no cover - a bug
        raise CasadiContractError(
            f"internal error: {mode} named its seeds {seeds} and results {results}, expected "
            f"{expected_seeds} and {expected_results}"
        )
    mapped = VmapPass(
        in_axes={str(v.name): (0 if v.name in seeds else None) for v in derived.graph.inputs},
        out_axes={str(v.name): (0 if v.name in results else None) for v in derived.graph.outputs},
    )(derived).model
    adapted = SeedLayoutPass(seeds, results, dim, layout, witness)(mapped).model
    return _Level(
        adapted,
        [*parent.diff_inputs, *seeds],
        results,
        [*parent.seed_dims, dim],
    )


def _jacobian_sibling(level: _Level) -> ir.Model:
    """``jac_<y>_<x>`` outputs of shape (numel y)x(numel x), in CasADi's column-major order."""
    from onnax.api import jacfwd, jacrev

    model = level.model
    graph = model.graph
    by_name = {v.name: v for v in (*graph.inputs, *graph.outputs)}
    xs = [by_name[n] for n in level.diff_inputs]
    ys = [by_name[n] for n in level.diff_outputs]
    n_x = sum(_numel_guess(x) for x in xs)
    n_y = sum(_numel_guess(y) for y in ys)
    transform = jacfwd if n_x <= n_y else jacrev
    jac = transform(model, level.diff_inputs, level.diff_outputs)
    out_graph = jac.graph
    n_out = len(graph.outputs)
    em = Emitter(jac.opset_imports[""])
    for i, value in enumerate(list(out_graph.outputs)[n_out:], start=n_out):
        name = str(value.name)
        y = next(y for y in ys if name.startswith(f"jac_{y.name}_"))
        x = by_name[name[len(f"jac_{y.name}_") :]]
        y_dims, x_dims = shape_dims(y), shape_dims(x)
        # CasADi numbers a matrix's entries column by column: swap the axes of rank-2 parts.
        perm = [*_col_major(0, len(y_dims)), *_col_major(len(y_dims), len(x_dims))]
        block = em.transpose(value, perm)
        rows = dim_product(*y_dims) if y_dims else 1
        cols = dim_product(*x_dims) if x_dims else 1
        flat = em.op("Flatten", [block], {"axis": len(y_dims)})
        out_graph.extend(em.take())
        value.name = None
        flat.name = name
        flat.type = value.type
        flat.shape = ir.Shape([rows, cols])
        out_graph.outputs[i] = flat
    common.NameFixPass()(jac)
    return jac


def _col_major(start: int, rank: int) -> list[int]:
    axes = list(range(start, start + rank))
    return axes[::-1] if rank == 2 else axes


def _numel_guess(value: ir.Value) -> int:
    if value.shape is None:
        return 1
    return int(np.prod([d if isinstance(d, int) else 8 for d in value.shape.dims]))


def _check_kinds(kinds: Iterable[str]) -> list[str]:
    chosen = []
    for kind in kinds:
        if not isinstance(kind, str) or not (_KIND.match(kind) or kind == "jac"):
            raise CasadiContractError(
                f"family: unknown kind {kind!r}. Kinds are 'jac' or fwd/adj words joined by '_', "
                "e.g. 'adj', 'fwd', 'fwd_adj', 'adj_adj', 'fwd_fwd'."
            )
        if kind not in chosen:
            chosen.append(kind)
    for kind in chosen:
        parent = kind.split("_", 1)[1] if "_" in kind and kind != "jac" else None
        if parent is not None and parent not in chosen:
            raise CasadiContractError(
                f"family: kind {kind!r} needs {parent!r} as well: CasADi opens "
                f"{kind}_f.onnx only while differentiating {parent}_f.onnx. "
                f"Add {parent!r} to kinds."
            )
    return chosen


def _symbolic_dims(graph: ir.Graph) -> list[str]:
    found: list[str] = []
    for v in graph.inputs:
        if v.name in graph.initializers or v.shape is None:
            continue
        for d in v.shape.dims:
            if isinstance(d, ir.SymbolicDim):
                if d.value is None:
                    raise CasadiContractError(
                        f"family: input {v.name!r} has an unnamed dimension "
                        f"(shape {v.shape}); CasADi sizes every dimension from its name. "
                        "Name it (e.g. 'N') in the model, or give it a fixed size."
                    )
                if str(d.value) not in found:
                    found.append(str(d.value))
    return found


def _bind(model: ir.Model, dims: Mapping[str, int | None] | None) -> tuple[ir.Model, dict]:
    """Fixes the sizes given in ``dims``; every symbolic input dimension must be named there."""
    graph = model.graph
    symbolic = _symbolic_dims(graph)
    dims = dict(dims or {})
    unknown = [k for k in dims if k not in symbolic]
    if unknown:
        raise CasadiContractError(
            f"family: dims names {unknown}, which are not symbolic dimensions of the model's "
            f"inputs {symbolic or '(there are none)'}."
        )
    missing = [d for d in symbolic if d not in dims]
    if missing:
        example = ", ".join(f"{d!r}: 4" for d in missing)
        keep = ", ".join(f"{d!r}: None" for d in missing)
        raise CasadiContractError(
            f"family: the model's inputs have symbolic dimensions {missing}. Choose for each: "
            f"bind it, dims={{{example}}}, which writes fixed sizes into every file, or keep it "
            f"symbolic, dims={{{keep}}}, and give the size in CasADi with "
            f"GraphBuilder(path).bind_dim({missing[0]!r}, 4) before create()."
        )
    for name, size in dims.items():
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise CasadiContractError(
                f"family: dims[{name!r}] must be a positive int or None, got {size!r}"
            )
        if re.match(r"^n(fwd|adj)\d*$", name):
            raise CasadiContractError(
                f"family: the model uses the dimension name {name!r}, which CasADi reserves for "
                "seed counts. Rename that dimension in the model."
            )
    bound = {k: v for k, v in dims.items() if v is not None}
    if not bound:
        return model, dims
    for v in (*graph.inputs, *graph.outputs):
        if v.shape is not None:
            v.shape = ir.Shape(
                [
                    bound.get(str(d.value), d) if isinstance(d, ir.SymbolicDim) else d
                    for d in v.shape.dims
                ]
            )
    # Inferred shapes inside the graph are recomputed from the bound inputs.
    for node in graph:
        for o in node.outputs:
            if not o.is_graph_output():
                o.shape = None
    return prepare(model, "family"), dims


def _materialized(model: ir.Model) -> ir.Model:
    """``model``, or a copy of it whose external-data tensors are read into memory."""
    if not any(
        v.const_value is not None and not isinstance(v.const_value, ir.Tensor)
        for g in model.graphs()
        for v in g.initializers.values()
    ):
        return model
    copy = model.clone()
    for g in copy.graphs():
        for v in g.initializers.values():
            tensor = v.const_value
            if tensor is not None and not isinstance(tensor, ir.Tensor):
                v.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
    return copy


def _primal(
    model: ir.Model,
    inputs: str | Sequence[str] | None,
    outputs: str | Sequence[str] | None,
    dims: Mapping[str, int | None] | None,
) -> tuple[_Level, dict[str, np.ndarray], dict]:
    """f.onnx: prepared, selected initializers promoted to inputs, dimensions bound."""
    prepared = prepare(_materialized(model), "family")
    graph = prepared.graph
    mask = casadi_diff_mask(graph)
    if inputs is None and mask is not None:
        inputs = [name for name, diff in mask.items() if diff]
    xs = select_inputs(graph, inputs, "family")
    if mask is not None:
        chosen = {str(x.name) for x in xs}
        differ = [n for n, diff in mask.items() if diff != (n in chosen)]
        if differ:
            raise CasadiContractError(
                "family: CasADi reads the model's own names as derivative tensors "
                f"(inputs {[v.name for v in graph.inputs]}, outputs "
                f"{[v.name for v in graph.outputs]}) and infers that exactly "
                f"{[n for n, d in mask.items() if d]} are differentiable; inputs={sorted(chosen)} "
                f"disagrees on {differ}, and CasADi refuses such a family ('signatures disagree "
                "on differentiable inputs'). Keep the default inputs, or rename the fwd_/adj_ "
                "inputs and outputs of the model."
            )
    ys = select_outputs(graph, outputs, "family")
    floats = [y.name for y in graph.outputs if is_float(y)]
    left_out = [n for n in floats if n not in {y.name for y in ys}]
    if left_out:
        raise CasadiContractError(
            f"family: outputs leaves out the FLOAT/DOUBLE outputs {left_out}. CasADi asks "
            "adj_f.onnx for a seed adj_<y> of every floating-point output and refuses an "
            "incomplete one ('incomplete adj signature'). Keep the default (all float outputs), "
            "or remove those outputs from the model first."
        )
    if not xs:
        raise CasadiContractError(
            "family: nothing to differentiate: the model has no FLOAT/DOUBLE inputs that are not "
            "initializers. Select initializers by name with inputs=[...]."
        )
    if not ys:
        raise CasadiContractError("family: the model has no FLOAT/DOUBLE output to differentiate")
    names_out = {str(y.name) for y in graph.outputs}
    for v in graph.inputs:
        if v.name and v.name.startswith("out_") and v.name[4:] in names_out:
            raise CasadiContractError(
                f"family: input {v.name!r} has the name CasADi uses to feed the primal output "
                f"{v.name[4:]!r} to derivative files. Rename the input."
            )
    # CasADi never sees initializers as inputs: a selected one becomes a real input.
    values: dict[str, np.ndarray] = {}
    for x in xs:
        if x.name in graph.initializers:
            tensor = x.const_value
            assert tensor is not None
            values[str(x.name)] = tensor.numpy().copy()
            graph.initializers.pop(str(x.name))
            x.const_value = None
            if x not in graph.inputs:
                graph.inputs.append(x)
    prepared, bound = _bind(prepared, dims)
    graph = prepared.graph
    for v in (*graph.inputs, *graph.outputs):
        shape_dims(v)
    level = _Level(prepared, [str(x.name) for x in xs], [str(y.name) for y in ys])
    return level, values, bound


@dataclass(frozen=True)
class Family:
    """What :func:`family` wrote.

    Attributes:
        path: The model file, ``.../f.onnx``.
        files: Kind (``"f"`` for the model itself, ``"adj"``, ``"fwd_adj"``...) to file path.
        inputs: The differentiable inputs, in order.
        parameters: The other inputs of ``f.onnx`` (not differentiated by CasADi).
        outputs: The differentiated outputs.
        layout: ``"casadi"`` or ``"onnx"``.
        dims: The symbolic input dimensions and their bound size (None: still symbolic).
        values: Stored values of initializers that became differentiable inputs: CasADi takes
            them as arguments now.
    """

    path: Path
    files: dict[str, Path]
    inputs: tuple[str, ...]
    parameters: tuple[str, ...]
    outputs: tuple[str, ...]
    layout: Layout
    dims: dict[str, int | None]
    values: dict[str, np.ndarray]


@dataclass
class _Built:
    models: dict[str, ir.Model]
    diff_inputs: list[str]
    values: dict[str, np.ndarray]
    dims: dict[str, int | None]


def _build(
    model: ir.Model,
    inputs: str | Sequence[str] | None,
    outputs: str | Sequence[str] | None,
    layout: Layout,
    kinds: Sequence[str],
    dims: Mapping[str, int | None] | None,
) -> _Built:
    if layout not in ("casadi", "onnx"):
        raise CasadiContractError(f"family: layout must be 'casadi' or 'onnx', got {layout!r}")
    chosen = _check_kinds(kinds)
    root, values, bound = _primal(model, inputs, outputs, dims)
    levels: dict[str, _Level] = {"f": root}
    models: dict[str, ir.Model] = {"f": root.model}
    for kind in sorted(chosen, key=lambda k: k.count("_")):
        if kind == "jac":
            models["jac"] = _jacobian_sibling(root)
            continue
        mode, _, rest = kind.partition("_")
        parent = levels[rest or "f"]
        levels[kind] = _derive(parent, mode, layout)
        models[kind] = levels[kind].model
    ordered = {k: models[k] for k in ["f", *chosen]}
    for kind, m in ordered.items():
        check_member(kind, m, ordered, layout, root.diff_inputs)
    return _Built(ordered, root.diff_inputs, values, bound)


def build_family(
    model: ir.Model,
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    layout: Layout = "casadi",
    kinds: Sequence[str] = DEFAULT_KINDS,
    dims: Mapping[str, int | None] | None = None,
) -> dict[str, ir.Model]:
    """The family in memory, checked against the contract: kind (``"f"`` for the model) to model.

    Same arguments as :func:`family`, which writes these models to disk.
    """
    return _build(model, inputs, outputs, layout, kinds, dims).models


def _embed(model: ir.Model) -> onnx.ModelProto:
    """The model as one protobuf with every tensor inside it (never external data)."""
    for graph in model.graphs():
        for v in graph.initializers.values():
            tensor = v.const_value
            if tensor is not None and not isinstance(tensor, ir.Tensor):
                v.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
    proto = ir.to_proto(model)
    if proto.ByteSize() > _PROTOBUF_LIMIT:
        raise CasadiContractError(
            f"family: the model graph {model.graph.name!r} needs {proto.ByteSize()} bytes, more "
            "than one protobuf holds (2 GiB); CasADi cannot read external data (.onnx.data), so "
            "it cannot load this model."
        )
    return proto


def family(
    model: ir.Model,
    path: str | os.PathLike[str],
    inputs: str | Sequence[str] | None = None,
    outputs: str | Sequence[str] | None = None,
    layout: Layout = "casadi",
    kinds: Sequence[str] = DEFAULT_KINDS,
    dims: Mapping[str, int | None] | None = None,
) -> Family:
    """Writes ``path`` (``.../f.onnx``) and the derivative siblings CasADi looks for beside it.

    ``adj`` gives ``f.reverse(n)``, gradients and reverse-mode Jacobians; ``fwd_adj`` adds exact
    Hessians (``casadi.hessian``); ``fwd`` gives ``f.forward(n)``; ``fwd_fwd``, ``adj_adj`` and
    ``jac`` (dense ``jac_<y>_<x>`` outputs) are also available. Each file is checked against
    CasADi's contract (:func:`check_family`) before anything is written, every tensor is embedded
    and each file keeps the model's element types. The files appear together or not at all;
    siblings of an earlier family at ``path`` that are not rewritten are removed, since CasADi
    would pick them up.

    Args:
        model: The model; it is not modified.
        path: Where to write the model, e.g. ``"generated/f.onnx"``.
        inputs: The inputs CasADi differentiates (graph inputs or initializers, by name).
            Default: every FLOAT/DOUBLE graph input that is not an initializer. An initializer
            selected here becomes an input of every file (CasADi never sees initializers);
            its stored value is returned in :attr:`Family.values`. Other inputs are parameters.
        outputs: Must be every FLOAT/DOUBLE output (the default): CasADi needs them all.
        layout: ``"casadi"`` (default) or ``"onnx"`` (seed count as a trailing axis).
        kinds: The siblings to write, e.g. ``("adj", "fwd_adj")``.
        dims: For each symbolic dimension of the inputs, a size to bind it to, or None to keep
            it symbolic (then bind it in CasADi with ``GraphBuilder(path).bind_dim``).

    Returns:
        A :class:`Family` describing the files.

    Raises:
        CasadiContractError: The model or the choices would give a family CasADi misreads.
        SelectionError: A name is unknown or not floating point.
        UnsupportedOperatorError: A derivative reaches an operator without a rule.
    """
    target = Path(path)
    if target.suffix != ".onnx":
        raise CasadiContractError(
            f"family: {str(target)!r} must end in .onnx: CasADi picks the backend from the suffix"
        )
    built = _build(model, inputs, outputs, layout, kinds, dims)
    models = built.models
    target.parent.mkdir(parents=True, exist_ok=True)
    names = {kind: (target.name if kind == "f" else f"{kind}_{target.name}") for kind in models}
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    backup = staging / "previous"
    moved: list[Path] = []
    saved: list[tuple[Path, Path]] = []
    try:
        for kind, m in models.items():
            proto = _embed(m)
            check_embedded(names[kind], proto)
            onnx.save_model(proto, str(staging / names[kind]))
        stale = [p for p in siblings_on_disk(target) if p.name not in names.values()]
        backup.mkdir()
        for old in [target.parent / n for n in names.values()] + stale:
            if old.exists():
                kept = backup / old.name
                os.replace(old, kept)
                saved.append((kept, old))
        for kind in models:
            final = target.parent / names[kind]
            os.replace(staging / names[kind], final)
            moved.append(final)
    except BaseException:
        for p in moved:
            with contextlib.suppress(OSError):
                p.unlink()
        for kept, old in saved:
            with contextlib.suppress(OSError):
                os.replace(kept, old)
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    root = models["f"].graph
    diff = built.diff_inputs
    return Family(
        path=target,
        files={kind: target.parent / n for kind, n in names.items()},
        inputs=tuple(diff),
        parameters=tuple(str(v.name) for v in root.inputs if v.name not in diff),
        outputs=tuple(str(y.name) for y in root.outputs if is_float(y)),
        layout=layout,
        dims=dict(built.dims),
        values=built.values,
    )
