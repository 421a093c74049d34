"""The ``onnax`` command line.

``onnax grad|jvp|vjp|vmap|jacfwd|jacrev|hessian IN.onnx OUT.onnx`` writes a transformed model
(``--check`` checks it at a random point), ``onnax family IN.onnx DIR/f.onnx`` writes a CasADi
family, ``onnax unroll`` unrolls loops of a known trip count, ``onnax info IN.onnx`` describes a
model and the rules onnax has for its operators, and ``onnax demo`` runs the built-in example.
Errors print one paragraph and exit with status 2 (``--debug`` shows the traceback).

Each subcommand group is a module with a ``register(subparsers, common)`` function; adding a
subcommand is one module and one line in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from onnax.cli.common import CliError, Progress, parse_axes, parse_dims
from onnax.errors import OnnaxError

__all__ = ["SUBCOMMANDS", "CliError", "build_parser", "main", "parse_axes", "parse_dims"]

SUBCOMMANDS = (
    "onnax.cli.demo",
    "onnax.cli.transforms",
    "onnax.cli.linearize",
    "onnax.cli.family",
    "onnax.cli.unroll",
    "onnax.cli.train",
    "onnax.cli.info",
)
"""The modules that register subcommands, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnax`` command."""
    import onnax

    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not overwrite a flag given before the subcommand.
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback"
    )
    common.add_argument(
        "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress on stderr"
    )
    parser = argparse.ArgumentParser(
        prog="onnax",
        description="JAX-style transforms of ONNX models (grad, jvp, vjp, vmap, Jacobians, "
        "Hessians), and derivative families for CasADi.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"onnax {onnax.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        importlib.import_module(module).register(sub, common)
    return parser


def _paragraph(err: BaseException, command: str) -> str:
    text = " ".join(str(err).split())
    # Library messages start with the transform's name; the prefix printed says it already.
    if text.startswith(f"{command}: "):
        text = text[len(command) + 2 :]
    return text or type(err).__name__


def _silence_stdout() -> None:
    """Points stdout at /dev/null: the interpreter's last flush into a closed pipe is then quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (2 on any error)."""
    args = build_parser().parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    progress = Progress(quiet=bool(getattr(args, "quiet", False)))
    try:
        status = int(args.func(args, progress))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # The reader of our output went away (``| head``): not an error of the command.
        _silence_stdout()
        return 0
    except Exception as err:
        progress.done()
        if debug:
            traceback.print_exc()
        kind = "" if isinstance(err, OnnaxError) else f"{type(err).__name__}: "
        hint = "" if debug else " (--debug shows the traceback)"
        print(f"onnax {args.command}: {kind}{_paragraph(err, args.command)}{hint}", file=sys.stderr)
        return 2
