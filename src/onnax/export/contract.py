"""CasADi's sibling contract, checked file by file.

A family that breaks the contract usually makes CasADi compute wrong numbers instead of failing
(an input without ``adj_<x>`` becomes a constant, an unknown input is fed NaN), so every rule is
checked here and broken ones raise :class:`~onnax.export.layout.CasadiContractError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import onnx_ir as ir

from onnax.core.naming import diff_prefix, io_names
from onnax.core.selection import is_float
from onnax.export.layout import CasadiContractError, Layout, dim_product, seeded_shape, shape_dims

__all__ = [
    "casadi_diff_mask",
    "check_embedded",
    "check_family",
    "check_member",
    "seed_dimension",
    "siblings_on_disk",
]

_SIBLING = re.compile(r"^((?:(?:fwd|adj)_)+|jac_)(.+)$")


def casadi_diff_mask(graph: ir.Graph) -> dict[str, bool] | None:
    """Which inputs CasADi takes as differentiable from the model's own names, if it decides.

    A model whose names already look like a derivative signature, an output ``fwd_<y>`` next
    to an output ``y`` or an input ``adj_<y>`` for an output ``y``, is read by CasADi as carrying
    its own derivative tensors: an input ``x`` is differentiable exactly when ``fwd_<x>`` is an
    input (forward signature) or ``adj_<x>`` an output (adjoint signature). Returns None when the
    names say nothing (then every floating-point input is differentiable).
    """
    ins = [str(v.name) for v in _visible_inputs(graph)]
    outs = [str(v.name) for v in graph.outputs]
    masks = []
    if any(f"fwd_{y}" in outs for y in outs):
        masks.append({x: f"fwd_{x}" in ins for x in ins})
    if any(f"adj_{y}" in ins for y in outs):
        masks.append({x: f"adj_{x}" in outs for x in ins})
    if not masks:
        return None
    if len(masks) == 2 and masks[0] != masks[1]:
        raise CasadiContractError(
            "family: the model's names form both a forward and an adjoint derivative signature "
            f"that disagree on which inputs are differentiable ({masks[0]} against {masks[1]}); "
            "CasADi cannot load it. Rename the fwd_/adj_ inputs and outputs."
        )
    return masks[0]


def siblings_on_disk(target: Path) -> list[Path]:
    """Files next to ``target`` that CasADi would take for its siblings."""
    if not target.parent.is_dir():
        return []
    found = []
    for p in target.parent.iterdir():
        m = _SIBLING.match(p.name)
        if m and m.group(2) == target.name:
            found.append(p)
    data = target.parent / (target.name + ".data")
    if data.exists():
        found.append(data)
    return found


def check_member(
    kind: str,
    model: ir.Model,
    family_models: Mapping[str, ir.Model],
    layout: Layout,
    diff_inputs: Sequence[str],
) -> None:
    """Checks one member of a family against the contract; raises CasadiContractError."""
    if kind == "f":
        for v in (*model.graph.inputs, *model.graph.outputs):
            shape_dims(v)
        return
    if kind == "jac":
        return
    mode, _, rest = kind.partition("_")
    parent_kind = rest or "f"
    parent = family_models.get(parent_kind)
    if parent is None:
        raise CasadiContractError(
            f"{kind}_f.onnx: its parent {parent_kind} is missing from the family; CasADi reaches "
            f"{kind} only through it"
        )
    _check_sibling(kind, mode, model, parent, family_models, layout, diff_inputs)


def check_embedded(kind: str, proto: onnx.ModelProto) -> None:
    """Refuses a member whose weights are external data, which CasADi cannot load.

    Raises:
        CasadiContractError: If an initializer of ``proto`` is stored as external data.
    """
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise CasadiContractError(
                f"{kind}: initializer {tensor.name!r} is stored as external data; CasADi hands "
                "the model to onnxruntime as bytes and session creation fails. Embed the weights "
                "(onnx.load(path) then onnx.save(model, path) without external data, or "
                "torch.onnx.export(..., external_data=False))."
            )


def _visible_inputs(graph: ir.Graph) -> list[ir.Value]:
    return [v for v in graph.inputs if v.name not in graph.initializers]


def seed_dimension(prefix: str) -> str:
    """CasADi's seed dimension for a prefix: ``fwd_`` -> ``nfwd``, ``adj2_`` -> ``nadj2``."""
    return "n" + prefix.rstrip("_")


def _diff_chain(
    kind: str, family_models: Mapping[str, ir.Model], diff_inputs: Sequence[str]
) -> tuple[list[str], list[str]]:
    """The differentiable inputs and differentiated outputs of the model behind ``kind``."""
    root = family_models["f"].graph
    diff_in = list(diff_inputs)
    diff_out = [str(y.name) for y in root.outputs if is_float(y)]
    if kind == "f":
        return diff_in, diff_out
    words = kind.split("_")
    current = "f"
    for mode in reversed(words):
        graph = family_models[current].graph
        prefix = diff_prefix(io_names(graph), mode)
        if mode == "fwd":
            seeds = [prefix + x for x in diff_in]
            diff_out = [prefix + y for y in diff_out]
        else:
            seeds = [prefix + y for y in diff_out]
            diff_out = [prefix + x for x in diff_in]
        diff_in = [*diff_in, *seeds]
        current = mode if current == "f" else f"{mode}_{current}"
    return diff_in, diff_out


def _check_sibling(
    kind: str,
    mode: str,
    model: ir.Model,
    parent: ir.Model,
    family_models: Mapping[str, ir.Model],
    layout: Layout,
    diff_inputs: Sequence[str],
) -> None:
    label = f"{kind}_f.onnx"
    pg, g = parent.graph, model.graph
    parent_kind = kind.partition("_")[2] or "f"
    diff_in, diff_out = _diff_chain(parent_kind, family_models, diff_inputs)
    prefix = diff_prefix(io_names(pg), mode)
    dim = seed_dimension(prefix)
    inputs = {v.name: v for v in _visible_inputs(g)}
    outputs = {v.name: v for v in g.outputs}
    p_inputs = {v.name: v for v in _visible_inputs(pg)}
    p_outputs = {v.name: v for v in pg.outputs}
    for name, v in p_inputs.items():
        if name not in inputs:
            raise CasadiContractError(
                f"{label}: the input {name!r} of its parent is missing; CasADi would evaluate "
                "the derivative without it and return wrong numbers."
            )
        _same_type(label, inputs[name], v, f"input {name!r}")
    if mode == "fwd":
        seeds = {prefix + x: p_inputs[x] for x in diff_in}
        results = {prefix + y: p_outputs[y] for y in diff_out}
    else:
        seeds = {prefix + y: p_outputs[y] for y in diff_out}
        results = {prefix + x: p_inputs[x] for x in diff_in}
    for name, primal in seeds.items():
        if name not in inputs:
            raise CasadiContractError(
                f"{label}: the seed input {name!r} is missing; CasADi requires a seed for every "
                f"differentiable {'input' if mode == 'fwd' else 'output'} "
                + ("('incomplete adj signature')." if mode == "adj" else "of its parent.")
            )
        _check_seeded(label, inputs[name], primal, dim, layout)
    for name, primal in results.items():
        if name not in outputs:
            raise CasadiContractError(
                f"{label}: the output {name!r} is missing; CasADi would treat "
                f"{name[len(prefix) :]!r} as non-differentiable and silently use a zero derivative."
            )
        _check_seeded(label, outputs[name], primal, dim, layout)
    allowed = set(p_inputs) | set(seeds) | {f"out_{y}" for y in p_outputs}
    unknown = [n for n in inputs if n not in allowed]
    if unknown:
        raise CasadiContractError(
            f"{label}: inputs {unknown} are neither inputs of its parent nor seeds; CasADi feeds "
            "NaN to inputs it does not know."
        )


def _same_type(label: str, got: ir.Value, want: ir.Value, what: str) -> None:
    if got.dtype != want.dtype:
        raise CasadiContractError(
            f"{label}: {what} has element type {got.dtype}, expected {want.dtype} like the "
            "value it belongs to"
        )


def _check_seeded(label: str, got: ir.Value, primal: ir.Value, dim: str, layout: Layout) -> None:
    _same_type(label, got, primal, f"{got.name!r}")
    want = seeded_shape(shape_dims(primal), dim, layout)
    have = shape_dims(got)
    if [str(dim_product(d)) for d in have] != [str(dim_product(d)) for d in want]:
        raise CasadiContractError(
            f"{label}: {got.name!r} has shape {have}, expected {want}: the seed count must be "
            f"the named symbolic dimension {dim!r} "
            + (
                "in CasADi's rx(n*c) seed-major layout"
                if layout == "casadi"
                else "as a trailing axis"
            )
            + "; CasADi rejects fixed seed sizes for more than one seed."
        )


def check_family(
    path: str | os.PathLike[str],
    inputs: Sequence[str] | None = None,
    layout: Layout = "casadi",
) -> list[str]:
    """Checks a family on disk against CasADi's contract.

    Args:
        path: The model file; its siblings are found beside it.
        inputs: The inputs that must be differentiable (default: every FLOAT/DOUBLE input).
        layout: The layout the siblings were written in.

    Returns:
        The kinds found (``"f"`` first).

    Raises:
        CasadiContractError: With the file and the broken rule.
    """
    target = Path(path)
    data = target.parent / (target.name + ".data")
    models: dict[str, ir.Model] = {}
    for p in [target, *(s for s in siblings_on_disk(target) if s != data)]:
        kind = "f" if p == target else p.name[: -len(target.name) - 1]
        proto = onnx.load_model(str(p), load_external_data=False)
        check_embedded(p.name, proto)
        models[kind] = ir.from_proto(proto)
    order = sorted(models, key=lambda k: (k != "f", k.count("_"), k))
    root = models["f"].graph
    if inputs is None:
        mask = casadi_diff_mask(root)
        inputs = (
            [n for n, d in mask.items() if d]
            if mask is not None
            else [str(v.name) for v in _visible_inputs(root) if is_float(v)]
        )
    diff = list(inputs)
    for kind in order:
        check_member(kind, models[kind], models, layout, diff)
    return order
