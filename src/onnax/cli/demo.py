"""``onnax demo``: the built-in example, checked against finite differences."""

from __future__ import annotations

import argparse
from typing import Any

from onnax.cli.common import Progress

__all__ = ["register"]


def _demo(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.demo import format_table, run_demo

    print("onnax demo: a two-layer float64 regression loss, four derived models, each run in")
    print("onnxruntime and compared with central finite differences of the primal model.\n")
    rows = run_demo(seed=args.seed)
    print(format_table(rows))
    print("\nall derivatives agree with finite differences")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``demo``."""
    demo = sub.add_parser(
        "demo", help="run grad, jvp, vjp and jvp(grad) on a built-in model", parents=[common]
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
