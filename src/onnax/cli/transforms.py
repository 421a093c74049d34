"""``onnax grad|jvp|vjp|vmap|jacfwd|jacrev|hessian IN.onnx OUT.onnx [--check]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnax.cli.common import CliError, Progress, load, names, parse_axes, refuse_overwrite, save

__all__ = ["INCONCLUSIVE", "TRANSFORMS", "register"]

TRANSFORMS = ("grad", "jvp", "vjp", "vmap", "jacfwd", "jacrev", "hessian")

INCONCLUSIVE = 3
"""The exit status of a ``--check`` that could not decide (its point cannot judge the result,
or nothing was compared): not a failure (2), not a pass (0)."""

_HELPS = {
    "grad": "gradient of a rank-0 output",
    "jvp": "forward mode: + fwd_<x> -> + fwd_<y>",
    "vjp": "reverse mode: + adj_<y> -> + adj_<x>",
    "vmap": "map over a new batch dimension",
    "jacfwd": "full Jacobians jac_<y>_<x> by forward mode",
    "jacrev": "full Jacobians jac_<y>_<x> by reverse mode",
    "hessian": "Hessian hess_<y>_<x1>_<x2> of a rank-0 output",
}


def _apply(args: argparse.Namespace, model: ir.Model) -> ir.Model:
    from onnax import api

    if args.command == "vmap":
        return api.vmap(
            model,
            parse_axes(args.in_axes),
            parse_axes(args.out_axes),
            args.axis_size,
            args.randomness,
        )
    inputs = names(args.inputs)
    stop = names(args.stop_gradient)
    # passed only when given, so the API's own default stands otherwise
    extra = {"stop_gradient": stop} if stop else {}
    if args.command == "grad":
        return api.grad(model, inputs, args.output, args.accumulate, **extra, **_remat(args))
    if args.command == "vjp":
        return api.vjp(model, inputs, names(args.outputs), args.accumulate, **extra, **_remat(args))
    if args.command == "jvp":
        return api.jvp(model, inputs, names(args.outputs), args.accumulate, **extra)
    if args.command == "hessian":
        return api.hessian(model, inputs, args.output, **extra)
    transform: Callable[..., ir.Model] = getattr(api, args.command)
    return transform(model, inputs, names(args.outputs), **extra)


def parse_remat(text: str) -> str | list[str] | int:
    """``--remat``: ``store``, ``recompute``, an int byte budget or comma-separated op types."""
    text = text.strip()
    if text in ("store", "recompute"):
        return text
    if text.lstrip("-").isdigit():
        return int(text)
    return [op.strip() for op in text.split(",") if op.strip()]


def _remat(args: argparse.Namespace) -> dict[str, Any]:
    # passed only when given, so the API's own default stands otherwise
    return {"remat": parse_remat(args.remat)} if args.remat is not None else {}


def run_transform(args: argparse.Namespace, progress: Progress) -> int:
    """Reads, transforms and writes a model; with ``--check``, checks the result."""
    if args.check and getattr(args, "stop_gradient", None):
        raise CliError(
            "--check and --stop-gradient together: the check's reference, finite differences "
            "of the source model, differentiates through the stopped values, so it would "
            "report a mismatch for a correct result. Drop --check."
        )
    refuse_overwrite(args.model, [Path(args.result)])
    progress(f"reading {args.model}")
    model = load(args.model)
    progress(f"{args.command}: transforming {len(model.graph)} nodes")
    out = _apply(args, model)
    progress(f"writing {args.result}")
    save(out, model, args.result)
    progress.done()
    before_in = {v.name for v in model.graph.inputs}
    before_out = {v.name for v in model.graph.outputs}
    added_in = [v.name for v in out.graph.inputs if v.name not in before_in]
    added_out = [v.name for v in out.graph.outputs if v.name not in before_out]
    print(
        f"wrote {args.result}: {len(out.graph)} nodes, added inputs {added_in}, "
        f"added outputs {added_out}"
    )
    return _check(args, model, out, progress) if args.check else 0


def _check(args: argparse.Namespace, model: ir.Model, out: ir.Model, progress: Progress) -> int:
    from onnax.checking import check

    extra: dict[str, Any] = {}
    if args.command == "vmap":
        extra = {
            "in_axes": parse_axes(args.in_axes),
            "out_axes": parse_axes(args.out_axes),
            "axis_size": args.axis_size,
        }
    result = check(
        model,
        out,
        args.command,
        output=getattr(args, "output", None),
        seed=args.check_seed,
        progress=progress,
        **extra,
    )
    progress.done()
    print(result.format())
    if result.outcome == "wrong":
        failed = [r.output for r in result.rows if r.outcome == "wrong"]
        raise CliError(
            f"--check: {failed} disagree with their reference (rows marked FAIL above: the "
            "error exceeds the tolerance against "
            + (
                "the source run example by example"
                if args.command == "vmap"
                else "finite differences of the source"
            )
            + "). The derived model is wrong at this point: please report it with the model "
            "and this command line."
        )
    if result.outcome == "empty":
        print(
            f"onnax {args.command}: --check compared nothing: the result has no floating-point "
            "derivative output the check can match to the source's inputs and outputs, so it "
            "says nothing about the result. Select float inputs and outputs (--inputs, "
            "--outputs) to check them.",
            file=sys.stderr,
        )
        return INCONCLUSIVE
    if result.outcome == "inconclusive":
        unsure = [r.output for r in result.rows if r.outcome == "inconclusive"]
        print(
            f"onnax {args.command}: --check inconclusive at this point for {unsure}: finite "
            "differences disagree across steps (a kink or discontinuity near the random point), "
            "so they cannot judge the result. This is not a failure. Check another point with "
            f"--check-seed {args.check_seed + 1}.",
            file=sys.stderr,
        )
        return INCONCLUSIVE
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds one subcommand per transform."""
    for name in TRANSFORMS:
        p = sub.add_parser(name, help=f"{_HELPS[name]}: IN.onnx -> OUT.onnx", parents=[common])
        p.add_argument("model", help="input .onnx file")
        p.add_argument("result", help="output .onnx file")
        if name != "vmap":
            p.add_argument(
                "--inputs",
                help="comma-separated input or initializer names (default: float inputs)",
            )
        if name in ("grad", "hessian"):
            p.add_argument("--output", help="the rank-0 output (default: the only one)")
        elif name != "vmap":
            default = (
                "float outputs; on a derivative model, its grad_/fwd_/adj_ outputs"
                if name == "jvp"
                else "float outputs"
            )
            p.add_argument("--outputs", help=f"comma-separated output names (default: {default})")
        if name != "vmap":
            p.add_argument(
                "--stop-gradient",
                help="comma-separated main-graph value names whose derivative is zero "
                "(like jax.lax.stop_gradient)",
            )
        if name in ("grad", "jvp", "vjp"):
            p.add_argument(
                "--accumulate",
                default="model",
                choices=["model", "float32"],
                help="arithmetic of FLOAT16/BFLOAT16 derivatives: the model's types (default) or "
                "sums (reductions, MatMul, Conv, scatter-adds) in float32",
            )
        if name in ("grad", "vjp"):
            p.add_argument(
                "--remat",
                help="rematerialization of the reverse sweep's residuals (like jax.checkpoint): "
                "store (default), recompute, comma-separated op types whose outputs are stored "
                "(Conv,MatMul,Gemm), or a budget in bytes for the stored residuals",
            )
        if name == "vmap":
            p.add_argument(
                "--in-axes",
                help="batch axis per input: 0 (all), 0,None (by position) or x=0,w=None (by name)",
            )
            p.add_argument("--out-axes", help="batch axis per output, same forms (default 0)")
            p.add_argument("--axis-size", type=int, help="fixed batch size (default: symbolic)")
            p.add_argument("--randomness", default="error", choices=["error", "different", "same"])
        p.add_argument(
            "--check",
            action="store_true",
            help="check the result at a random point (against finite differences of the source, "
            "or for vmap a loop of single runs) and print a table; exit status 2 if it is "
            f"wrong, {INCONCLUSIVE} if the point cannot decide",
        )
        p.add_argument(
            "--check-seed", type=int, default=0, help="seed of --check's random point (default 0)"
        )
        p.set_defaults(func=run_transform)
