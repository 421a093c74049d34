"""``onnax info IN.onnx``: inputs, outputs, operators and the rules onnax has for them."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import onnx_ir as ir

from onnax.cli.common import Progress, load

__all__ = ["register"]


def _info(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.core.registry import batch_rules, jvp_rules, transpose_rules
    from onnax.core.selection import format_shape
    from onnax.rules import collect

    model = load(args.model)
    collect()
    try:
        # Inferred types and shapes for the listing; the file is described as it is otherwise.
        from onnax.passes.prepare import infer_shapes

        typed = model.clone()
        infer_shapes(typed)
        model = typed
    except Exception:
        pass
    graph = model.graph
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    print(f"{args.model}: ir_version {model.ir_version}, opsets {dict(model.opset_imports)}")

    def describe(v: ir.Value) -> str:
        dtype = v.dtype.name if v.dtype is not None else "?"
        return f"  {v.name:<24} {dtype:<8} {format_shape(v.shape)}"

    inputs = [v for v in graph.inputs if v.name not in graph.initializers]
    print(f"inputs ({len(inputs)}):")
    for v in inputs:
        print(describe(v))
    print(f"outputs ({len(graph.outputs)}):")
    for v in graph.outputs:
        print(describe(v))
    print(f"initializers: {len(graph.initializers)}")
    counts: Counter[tuple[str, str]] = Counter()
    for g in model.graphs():
        for node in g:
            counts[(node.domain, node.op_type)] += 1
    print(f"operators ({sum(counts.values())} nodes, {len(counts)} kinds):")
    head = f"  {'operator':<32} {'count':>5}  {'jvp':<4} {'vjp':<4} {'transpose':<9} {'vmap':<4}"
    print(head)
    missing: dict[str, list[str]] = {"jvp": [], "vjp": [], "vmap": []}
    for (domain, op), n in sorted(counts.items()):
        label = f"{domain}::{op}" if domain else op
        version = model.opset_imports.get(domain, opset) if domain else opset
        jvp = jvp_rules.lookup(domain, op, version) is not None
        tr = transpose_rules.lookup(domain, op, version) is not None
        vm = batch_rules.lookup(domain, op, version) is not None
        for key, ok in (("jvp", jvp), ("vjp", jvp), ("vmap", vm)):
            if not ok:
                missing[key].append(label)
        print(
            f"  {label:<32} {n:>5}  {_yes(jvp):<4} {_yes(jvp):<4} {_yes(tr) if tr else '-':<9} {_yes(vm):<4}"
        )
    print(
        "vjp is linearize + transpose: it needs the jvp rule; the transpose rules serve the "
        "linear operators jvp rules emit ('-': the operator is not linear)."
    )
    for key, ops in missing.items():
        print(f"lacking {key} rules: {', '.join(ops) if ops else 'none'}")
    return 0


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``info``."""
    info = sub.add_parser(
        "info", help="inputs, outputs, operators and rule coverage", parents=[common]
    )
    info.add_argument("model", help="input .onnx file")
    info.set_defaults(func=_info)
