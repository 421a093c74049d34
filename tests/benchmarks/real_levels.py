"""How much grad and vmap(grad) of the real-model corpus move with onnxruntime's optimization level.

    uv run python tests/benchmarks/real_levels.py [file-substring ...]

For every corpus file (tests/data/real) whose transforms succeed, prints the relative norm
difference ``|g_level - g_disable_all| / |g_disable_all|`` of the whole gradient (the input's and
every weight's, concatenated) at BASIC, EXTENDED and ALL, and the same distance of the
DISABLE_ALL result from the float64 PyTorch reference (matched tensors only). A failing transform
prints its error's first line instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnax
import test_real_models as corpus


def _flat(outs: list[np.ndarray], start: int) -> np.ndarray:
    return np.concatenate([o.astype(np.float64).ravel() for o in outs[start:]])


def _reference(file: str, names: list[str], per_example: bool) -> tuple[list[int], np.ndarray]:
    refs, table = corpus.refs_of(file), corpus.matched(file)
    picked, parts = [], []
    for i, n in enumerate(names):
        if i == 0 and not per_example:
            picked.append(i)
            parts.append(refs["grad_input"].ravel())
        elif n in table:
            pname, transposed = table[n]
            key = "param_per_example" if per_example else "param_grad"
            ref = refs[f"{key}/{pname}"].astype(np.float64)
            picked.append(i)
            parts.append((np.swapaxes(ref, -1, -2) if transposed else ref).ravel())
    return picked, np.concatenate(parts)


def measure(file: str) -> str:
    model = corpus.loss_model(file)
    x = corpus.first_input(file)
    names = [x, *corpus.weights(file)]
    start = len(model.graph.outputs)
    cells = []
    for label, per_example in (("grad", False), ("vmap(grad)", True)):
        try:
            g = onnax.grad(model, names, output="loss")
            feeds = corpus.feeds_of(file)
            if per_example:
                g = onnax.vmap(g, in_axes=corpus.in_axes(g))
                feeds = {**feeds, x: corpus.refs_of(file)["vmap_input"]}
        except Exception as err:  # report, do not stop the table
            cells.append(f"{label}: {type(err).__name__}: {str(err).splitlines()[0][:120]}")
            continue
        runs = {level: corpus.run_at(g, feeds, level) for level in corpus.LEVELS}
        base = _flat(runs["disable_all"], start)
        diffs = [
            np.linalg.norm(_flat(runs[level], start) - base) / np.linalg.norm(base)
            for level in ("basic", "extended", "all")
        ]
        picked, ref = _reference(file, names, per_example)
        got = np.concatenate(
            [runs["disable_all"][start + i].astype(np.float64).ravel() for i in picked]
        )
        to_ref = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        cells.append(
            f"{label}: basic {diffs[0]:.1e} extended {diffs[1]:.1e} all {diffs[2]:.1e}"
            f" | disable_all vs torch {to_ref:.1e}"
        )
    return "  ".join(cells)


def main() -> None:
    wanted = sys.argv[1:]
    for file in corpus.FILES:
        if wanted and not any(w in file for w in wanted):
            continue
        print(f"{file:34s} {measure(file)}", flush=True)


if __name__ == "__main__":
    main()
