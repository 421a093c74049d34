"""``onnax linearize IN.onnx OUT_DIR``: writes ``OUT_DIR/forward.onnx`` and ``OUT_DIR/linear.onnx``.

Errors are raised as :class:`~onnax.errors.OnnaxError`; the ``onnax`` entry point prints them
as one paragraph and exits with status 2, as for the other subcommands.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnax.errors import OnnaxError

__all__ = ["LinearizeCliError", "add_parser", "register", "run"]

FORWARD = "forward.onnx"
LINEAR = "linear.onnx"


class LinearizeCliError(OnnaxError):
    """A bad argument of ``onnax linearize`` (a missing model, a result path that is a file)."""


def add_parser(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Adds the ``linearize`` subcommand to ``subparsers`` (from ``add_subparsers``).

    ``parents`` are parsers whose flags it shares (the main command's ``--debug``, ``--quiet``).

    Returns:
        The new subparser; its ``func`` default is :func:`run`.
    """
    p: argparse.ArgumentParser = subparsers.add_parser(
        "linearize",
        parents=list(parents),
        help="forward model (primal + residuals) and linear model (residuals + fwd_<x> -> "
        "fwd_<y>): IN.onnx -> DIR/",
    )
    p.add_argument("model", help="input .onnx file")
    p.add_argument("result", help=f"output directory for {FORWARD} and {LINEAR}")
    p.add_argument("--inputs", help="comma-separated input names (default: float inputs)")
    p.add_argument(
        "--outputs",
        help="comma-separated output names (default: float outputs; on a derivative model, "
        "its grad_/fwd_/adj_ outputs)",
    )
    p.add_argument(
        "--accumulate",
        default="model",
        choices=["model", "float32"],
        help="arithmetic of FLOAT16/BFLOAT16 derivatives: the model's types (default) or sums "
        "in float32",
    )
    p.set_defaults(func=run)
    return p


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``linearize`` to the ``onnax`` command."""
    add_parser(sub, parents=[common])


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _save(model: ir.Model, source: ir.Model, path: Path) -> None:
    # Weights kept as external data by the source go beside the result the same way: inline they
    # could exceed protobuf's 2 GB.
    external = any(
        isinstance(v.const_value, ir.ExternalTensor) for v in source.graph.initializers.values()
    )
    if external:
        ir.save(model, path, external_data=path.name + ".data")
    else:
        ir.save(model, path)


def run(args: argparse.Namespace, progress: object = None) -> int:
    """Runs ``onnax linearize``; returns the exit status (0).

    ``progress`` is accepted (and unused) so that the entry point can call every subcommand
    the same way.

    Raises:
        LinearizeCliError: The model file is missing or the result is an existing file.
        OnnaxError: The transform refused the model (see :func:`onnax.linearization.linearize`).
    """
    from onnax.linearization import linearize

    source, result = Path(args.model), Path(args.result)
    if not source.is_file():
        raise LinearizeCliError(f"linearize: no such file: {source}")
    if result.exists() and not result.is_dir():
        raise LinearizeCliError(
            f"linearize: the result {str(result)!r} is a file, expected a directory to hold "
            f"{FORWARD} and {LINEAR}. Give a directory (it is created if missing)."
        )
    model = ir.load(source)
    forward, linear = linearize(model, _names(args.inputs), _names(args.outputs), args.accumulate)
    result.mkdir(parents=True, exist_ok=True)
    _save(forward, model, result / FORWARD)
    _save(linear, model, result / LINEAR)
    n_primal = len(model.graph.outputs)
    residuals = [str(v.name) for v in list(forward.graph.outputs)[n_primal:]]
    tangents = [str(v.name) for v in linear.graph.inputs][len(residuals) :]
    print(
        f"wrote {result / FORWARD}: {len(forward.graph)} nodes, residual outputs {residuals}\n"
        f"wrote {result / LINEAR}: {len(linear.graph)} nodes, inputs {residuals} + {tangents}, "
        f"outputs {[str(v.name) for v in linear.graph.outputs]}"
    )
    return 0
