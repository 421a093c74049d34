"""bench_training.py's handle on onnxruntime-training: its train step against onnax's gradient.

``training_ortt.py`` runs in a Python that has onnxruntime-training 1.19.2 (its own venv, see
that script); this side writes each case's primal, onnax's gradient w.r.t. the same weights and
the input to a scratch folder, runs the worker once over all of them, and prints its table.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx_ir as ir

import onnax

HERE = Path(__file__).resolve().parent


def torch_only_path(torch_python: str, dest: Path) -> Path:
    """A directory of links to ``torch_python``'s packages, without onnx, onnxruntime, numpy."""
    out = subprocess.run(
        [
            torch_python,
            "-c",
            "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    site = Path(out.stdout.strip())
    dest.mkdir(parents=True, exist_ok=True)
    for entry in site.iterdir():
        if entry.name.startswith(("onnx", "numpy", "pip", "setuptools", "_distutils")):
            continue
        link = dest / entry.name
        if not link.exists():
            link.symlink_to(entry)
    return dest


def against_ortt(
    cases: dict[str, tuple[ir.Model, np.ndarray, list[str]]],
    python: str,
    pythonpath: Path | None,
    rounds: int,
    scratch: Path,
) -> dict[str, dict[str, object]]:
    """onnxruntime-training's train step against onnax's weight gradient (training_ortt.py).

    ``cases`` maps a case's name to its primal, its input ``x`` and the float32 weights both
    differentiate.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    spec = {}
    for i, (name, (primal, x, weights)) in enumerate(cases.items()):
        grad = onnax.grad(primal, inputs=weights, output="loss")
        paths = {k: scratch / f"case{i}.{k}" for k in ("model.onnx", "onnax.onnx", "x.npy")}
        ir.save(primal, paths["model.onnx"])
        ir.save(grad, paths["onnax.onnx"])
        np.save(paths["x.npy"], x)
        spec[name] = {
            "model": str(paths["model.onnx"]),
            "onnax": str(paths["onnax.onnx"]),
            "x": str(paths["x.npy"]),
            "weights": weights,
        }
    (scratch / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [python, str(HERE / "training_ortt.py"), str(scratch / "spec.json"), str(rounds)],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        print(f"onnxruntime-training worker failed: {out.stderr.strip().splitlines()[-1:]}")
        return {}
    result: dict[str, dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def report_ortt(results: dict[str, dict[str, object]]) -> None:
    if not results:
        return
    print("\nagainst onnxruntime-training 1.19.2 (grad w.r.t. every weight, its onnxruntime):")
    print(
        f"  {'model':<22} {'ortt/primal':>11} {'onnax/primal':>12} {'onnax/ortt':>10} {'ortt nodes':>10}"
    )
    for name, r in results.items():
        if "error" in r:
            print(f"  {name:<22} does not build: {r['error']}")
            continue
        primal, ortt = float(r["primal"]), float(r["ortt"])  # type: ignore[arg-type]
        onnax_t = r.get("onnax")
        ours = (
            f"{float(onnax_t) / primal:>12.2f} {float(onnax_t) / ortt:>10.2f}"  # type: ignore[arg-type]
            if onnax_t is not None
            else f"{'-':>12} {'-':>10}  ({r.get('onnax_error')})"
        )
        print(f"  {name:<22} {ortt / primal:>11.2f} {ours} {r['ortt_nodes']:>10}")
