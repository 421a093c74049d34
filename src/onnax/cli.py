"""The ``onnax`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import onnx_ir as ir

from onnax.api import grad, jvp, vjp
from onnax.errors import OnnaxError

__all__ = ["main"]


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n for n in text.split(",") if n]


def _demo(args: argparse.Namespace) -> int:
    from onnax.demo import format_table, run_demo

    print("onnax demo: a two-layer float64 regression loss, four derived models, each run in")
    print("onnxruntime and compared with central finite differences of the primal model.\n")
    rows = run_demo(seed=args.seed)
    print(format_table(rows))
    print("\nall derivatives agree with finite differences")
    return 0


def _transform(args: argparse.Namespace) -> int:
    model = ir.load(args.model)
    if args.command == "jvp":
        out = jvp(model, _names(args.inputs), _names(args.outputs))
    elif args.command == "vjp":
        out = vjp(model, _names(args.inputs), _names(args.outputs))
    else:
        out = grad(model, _names(args.inputs), args.output)
    ir.save(out, args.result)
    added_in = [v.name for v in out.graph.inputs[len(model.graph.inputs) :]]
    added_out = [v.name for v in out.graph.outputs[len(model.graph.outputs) :]]
    print(f"wrote {args.result}: added inputs {added_in}, added outputs {added_out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnax`` command."""
    parser = argparse.ArgumentParser(
        prog="onnax", description="JAX-style transforms of ONNX models."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run grad, jvp, vjp and jvp(grad) on a built-in model")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    for name, help_text in (("jvp", "forward mode"), ("vjp", "reverse mode"), ("grad", "gradient")):
        p = sub.add_parser(name, help=f"{help_text}: MODEL -> RESULT")
        p.add_argument("model", help="input .onnx file")
        p.add_argument("result", help="output .onnx file")
        p.add_argument("--inputs", help="comma-separated input names (default: float inputs)")
        if name == "grad":
            p.add_argument("--output", help="the rank-0 output (default: the only one)")
        else:
            p.add_argument(
                "--outputs", help="comma-separated output names (default: float outputs)"
            )
        p.set_defaults(func=_transform)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except OnnaxError as err:
        print(f"onnax {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
