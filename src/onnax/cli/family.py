"""``onnax family IN.onnx DIR/f.onnx``: a CasADi-ready family of derivative models."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import onnx_ir as ir

from onnax.cli.common import Progress, load, names, parse_dims, refuse_overwrite

__all__ = ["register"]


def _family(args: argparse.Namespace, progress: Progress) -> int:
    from onnax.casadi import CasadiContractError, check_family, family

    target = Path(args.result)
    # The family rewrites f.onnx and every <kind>_f.onnx beside it (stale ones are removed).
    sibling = Path(args.model).name.endswith(f"_{target.name}")
    refuse_overwrite(
        args.model, [target, target.parent / Path(args.model).name] if sibling else [target]
    )
    progress(f"reading {args.model}")
    model = load(args.model)
    kinds = names(args.kinds) or ["adj", "fwd_adj"]
    progress(f"family: building {', '.join(kinds)} for {len(model.graph)} nodes")
    try:
        fam = family(
            model,
            args.result,
            inputs=names(args.inputs),
            outputs=names(args.outputs),
            layout=args.layout,
            kinds=kinds,
            dims=parse_dims(args.dim),
        )
    except CasadiContractError as err:
        if "symbolic dimensions" in str(err):
            raise CasadiContractError(
                f"{err} On the command line: --dim NAME=4 binds, --dim NAME=symbolic keeps."
            ) from err
        raise
    progress.done()
    print(f"wrote the family of {fam.path} ({fam.layout} layout):")
    for kind, path in fam.files.items():
        m = ir.load(path)
        print(f"  {path.name:<24} {kind:<8} {len(m.graph):>6} nodes")
    print(f"differentiable inputs {list(fam.inputs)}, parameters {list(fam.parameters)}")
    if fam.values:
        print(f"initializers now inputs (feed their stored values): {sorted(fam.values)}")
    symbolic = [k for k, v in fam.dims.items() if v is None]
    if symbolic:
        print(f"symbolic dimensions {symbolic}: bind them with GraphBuilder(path).bind_dim(...)")
    if args.check:
        progress("--check: checking the files against the CasADi contract")
        check_family(fam.path, list(fam.inputs), fam.layout)
        progress.done()
        print("contract check: ok")
    return 0


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    """Adds ``family``."""
    fam = sub.add_parser(
        "family", help="write a CasADi family: IN.onnx -> DIR/f.onnx + siblings", parents=[common]
    )
    fam.add_argument("model", help="input .onnx file")
    fam.add_argument("result", help="the model file to write, e.g. generated/f.onnx")
    fam.add_argument("--layout", default="casadi", choices=["casadi", "onnx"])
    fam.add_argument(
        "--kinds",
        help="comma-separated siblings (default adj,fwd_adj; also fwd, fwd_fwd, adj_adj, jac)",
    )
    fam.add_argument("--inputs", help="differentiable inputs (default: float inputs)")
    fam.add_argument("--outputs", help="outputs (default and required: every float output)")
    fam.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="bind a symbolic dimension (N=4) or keep it (N=symbolic); repeatable",
    )
    fam.add_argument(
        "--check", action="store_true", help="re-read the files and check the contract"
    )
    fam.set_defaults(func=_family)
