"""``onnax unroll IN.onnx OUT.onnx``: loops of a known trip count replaced by their bodies."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from onnax.cli.common import Progress, load, refuse_overwrite, save

__all__ = ["register"]


def _unroll(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.api import unroll

    refuse_overwrite(args.model, [Path(args.result)])
    progress(f"reading {args.model}")
    model = load(args.model)
    loops = sum(1 for g in model.graphs() for n in g if n.op_type in ("Scan", "Loop"))
    progress(f"unroll: {loops} Scan/Loop nodes")
    out = unroll(model, args.max_steps)
    save(out, model, args.result)
    progress.done()
    left = sum(1 for g in out.graphs() for n in g if n.op_type in ("Scan", "Loop"))
    print(
        f"wrote {args.result}: {len(out.graph)} nodes; Scan/Loop nodes {loops} -> {left}"
        + (" (the others have no static trip count)" if left else "")
    )
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``unroll``."""
    p = sub.add_parser(
        "unroll",
        help="replace Scan/Loop nodes of a known trip count by copies of their body",
        parents=[common],
    )
    p.add_argument("model", help="input .onnx file")
    p.add_argument("result", help="output .onnx file")
    p.add_argument(
        "--max-steps", type=int, help="leave loops of more iterations than this (default: no limit)"
    )
    p.set_defaults(func=_unroll)
