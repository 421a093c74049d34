"""The ``train-step`` subcommand: a training model, its step-0 state and a summary, on disk.

``onnax train-step model.onnx out/ --output logits --loss cross_entropy --optimizer adamw
--lr 1e-3 --frozen 'encoder.*'`` writes ``out/step.onnx``, ``out/state.npz`` (the arrays to feed
at step 0, by input name) and ``out/README.md`` (what goes in, what comes out, what to feed
back). The main command line adds it with :func:`add_parser`; :func:`run` does the work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from onnax.errors import OnnaxError
from onnax.training.losses import LOSSES, add_loss
from onnax.training.optimizers import SGD, Adam, AdamW, Optimizer
from onnax.training.state import carry, initial_state, layout, save
from onnax.training.step import step

__all__ = ["add_parser", "run", "summary"]

OPTIMIZERS = ("sgd", "adam", "adamw")


def add_parser(
    subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()
) -> argparse.ArgumentParser:
    """Adds ``train-step`` to an ``argparse`` subparsers object and returns its parser.

    ``parents`` are parsers whose flags it shares (the main command's ``--debug``, ``--quiet``).
    """
    p = subparsers.add_parser(
        "train-step",
        parents=list(parents),
        help="a training step (loss, gradients, optimizer update) as one ONNX model",
        description=(
            "Appends a loss to MODEL's output and writes OUT/step.onnx (inputs: batch, target, "
            "parameters, optimizer state, step, lr; outputs: loss, new parameters, new state), "
            "OUT/state.npz (the step-0 values of the carried inputs) and OUT/README.md."
        ),
    )
    p.add_argument("model", type=Path, help="the inference model (.onnx)")
    p.add_argument("out", type=Path, help="output directory (created if missing)")
    p.add_argument("--output", required=True, help="the model output the loss is computed on")
    p.add_argument("--loss", required=True, choices=LOSSES, help="the loss function")
    p.add_argument("--target", default="target", help="name of the target input (default: target)")
    p.add_argument("--reduction", default="mean", choices=("mean", "sum"))
    p.add_argument("--weight", default=None, help="add a per-example weight input of this name")
    p.add_argument("--probabilities", action="store_true", help="cross_entropy: soft targets")
    p.add_argument("--ignore-index", type=int, default=-100)
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--delta", type=float, default=1.0, help="huber threshold")
    p.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    p.add_argument("--lr", type=float, default=1e-3, help="default learning rate (an input too)")
    p.add_argument("--momentum", type=float, default=0.0, help="sgd")
    p.add_argument("--dampening", type=float, default=0.0, help="sgd")
    p.add_argument("--nesterov", action="store_true", help="sgd")
    p.add_argument("--weight-decay", type=float, default=None,
                   help="default 0 (sgd, adam), 0.01 (adamw)")  # fmt: skip
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999), help="adam, adamw")
    p.add_argument("--eps", type=float, default=1e-8, help="adam, adamw")
    p.add_argument("--amsgrad", action="store_true", help="adam, adamw")
    p.add_argument("--max-grad-norm", type=float, default=None, help="global-norm clipping")
    p.add_argument("--loss-scale", type=float, default=1.0, help="static loss scale (fp16)")
    p.add_argument("--params", action="append", default=None,
                   help="initializer name or fnmatch pattern to train (repeatable; default: all "
                   "float initializers)")  # fmt: skip
    p.add_argument("--frozen", action="append", default=[],
                   help="initializer name or fnmatch pattern to keep constant (repeatable)")  # fmt: skip
    p.set_defaults(func=_main_entry, command="train-step")
    return p


def _main_entry(args: argparse.Namespace, progress: object = None) -> int:
    """The form ``onnax.cli.main`` calls: ``func(args, progress)``."""
    return run(args)


def _optimizer(args: argparse.Namespace) -> Optimizer:
    decay = args.weight_decay
    if args.optimizer == "sgd":
        return SGD(
            lr=args.lr,
            momentum=args.momentum,
            dampening=args.dampening,
            nesterov=args.nesterov,
            weight_decay=decay or 0.0,
        )
    cls = AdamW if args.optimizer == "adamw" else Adam
    return cls(
        lr=args.lr,
        betas=(args.betas[0], args.betas[1]),
        eps=args.eps,
        weight_decay=(1e-2 if cls is AdamW else 0.0) if decay is None else decay,
        amsgrad=args.amsgrad,
    )


def run(args: argparse.Namespace) -> int:
    """Builds and writes the training step; returns the exit status (2 on an error).

    Errors print one line ``onnax train-step: <what failed, found/expected, remedy>`` on stderr.
    """
    try:
        if not args.model.is_file():
            raise FileNotFoundError(
                f"no model file at {str(args.model)!r}. Remedy: pass the path of an .onnx file."
            )
        model = ir.load(args.model)
        with_loss = add_loss(
            model,
            args.output,
            args.loss,
            target=args.target,
            reduction=args.reduction,
            weight=args.weight,
            probabilities=args.probabilities,
            ignore_index=args.ignore_index,
            label_smoothing=args.label_smoothing,
            delta=args.delta,
        )
        loss = str(with_loss.graph.outputs[-1].name)
        trainer = step(
            with_loss,
            loss,
            params=args.params,
            frozen=args.frozen,
            optimizer=_optimizer(args),
            max_grad_norm=args.max_grad_norm,
            loss_scale=args.loss_scale,
        )
        args.out.mkdir(parents=True, exist_ok=True)
        state = initial_state(trainer)
        path = args.out / "step.onnx"
        save(trainer, path)
        np.savez(args.out / "state.npz", **state)  # type: ignore[arg-type]
        (args.out / "README.md").write_text(summary(trainer, args.model.name))
    except (OnnaxError, ValueError, TypeError, OSError) as err:
        kind = "" if isinstance(err, OnnaxError) else f"{type(err).__name__}: "
        text = " ".join(str(err).split())
        print(f"onnax train-step: {kind}{text}", file=sys.stderr)
        return 2
    print(f"wrote {path}, {args.out / 'state.npz'} and {args.out / 'README.md'}")
    return 0


def _describe(value: ir.Value) -> str:
    dtype = value.dtype.name if value.dtype is not None else "?"
    dims = "?" if value.shape is None else "[" + ", ".join(str(d) for d in value.shape.dims) + "]"
    return f"{dtype} {dims}"


def summary(trainer: ir.Model, source: str) -> str:
    """A README-style description of a training model's inputs, outputs and loop."""
    record = layout(trainer)
    pairs = carry(trainer)
    fed_back = {i: o for i, o in pairs}
    defaults = set(trainer.graph.initializers)
    lines = [
        f"# Training step for `{source}`",
        "",
        f"`step.onnx` runs one training step of `{source}`: the loss `{record['loss']}`, its "
        f"gradients and the update of `{record.get('optimizer', '')}`, in plain ONNX (default "
        "domain only). Feed `state.npz` at step 0; after each run feed every output listed in "
        "the *feeds back* column to its input.",
        "",
        "## Inputs",
        "",
        "| input | type | role | step-0 value |",
        "|---|---|---|---|",
    ]
    params = record["params"]
    for v in trainer.graph.inputs:
        name = str(v.name)
        if name in params:
            role = "parameter" + (
                f" (FLOAT master of a {params[name]['dtype']} weight)"
                if params[name]["dtype"] in ("FLOAT16", "BFLOAT16")
                else ""
            )
        elif name == record.get("step"):
            role = "number of updates made so far"
        elif name == record.get("lr"):
            role = "learning rate"
        elif name in fed_back:
            role = "optimizer state"
        else:
            role = "batch / target"
        start = "state.npz" if name in fed_back else ("stored default" if name in defaults else "-")
        lines.append(f"| `{name}` | {_describe(v)} | {role} | {start} |")
    lines += ["", "## Outputs", "", "| output | type | feeds back |", "|---|---|---|"]
    back = {o: i for i, o in pairs}
    for v in trainer.graph.outputs:
        name = str(v.name)
        target = f"`{back[name]}`" if name in back else "-"
        lines.append(f"| `{name}` | {_describe(v)} | {target} |")
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "import numpy as np, onnxruntime as ort",
        'sess = ort.InferenceSession("step.onnx")',
        'state = dict(np.load("state.npz"))',
        f"carry = {pairs!r}",
        "for batch in batches:  # batch: {input name: array} for the batch and target inputs",
        "    outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {**batch, **state})))",
        "    state = {i: outs[o] for i, o in carry}",
        "```",
        "",
        "`onnax.training.trained_model(model, {param: state[param] ...})` writes the trained "
        "weights back into the inference model.",
        "",
    ]
    return "\n".join(lines)
