"""Digests of the transforms' outputs, to show that a speed-up leaves every emitted model the same.

Usage::

    uv run python tests/benchmarks/output_digests.py OUT.json [--zoo] [--compare BEFORE.json]

Runs jvp, vjp and vmap on every model of ``tests/data``; jvp, vjp, grad, jvp(grad), vmap and
vmap(grad) on bench_scale's residual network at 1k nodes; and with ``--zoo`` jvp and vjp of the
nine light-zoo models as bench_zoo prepares them (opset 17, no value_info). For each it records
the SHA-256 of ``SerializeToString()`` (or the error) and the transform's CPU seconds, and writes
them to OUT.json. ``--compare`` lists the entries whose digest differs from an earlier file's
(made on the code before a change, say from a checkout of main) and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

import onnx_ir as ir

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import bench_scale  # noqa: E402 (after the path set-up)

import onnax  # noqa: E402

DATA = os.path.join(os.path.dirname(HERE), "data")


def _digest(fn: Callable[[], ir.Model]) -> dict[str, object]:
    start = time.process_time()
    try:
        result = fn()
    except Exception as err:  # the digest of a failure is its message
        return {"digest": f"error {type(err).__name__}: {err}"[:300], "seconds": 0.0}
    seconds = time.process_time() - start
    data = ir.to_proto(result).SerializeToString()
    return {"digest": hashlib.sha256(data).hexdigest(), "seconds": seconds}


def _zoo_models() -> list[tuple[str, ir.Model, str, str]]:
    import zoo
    from onnax.passes.prepare import prepare

    models = []
    for name in zoo.LIGHT_MODELS:
        model = prepare(zoo.load(name), "bench")
        graph = model.graph
        for v in list(graph.inputs):
            if v.name in graph.initializers:
                graph.inputs.remove(v)
        model.ir_version = 8
        for v in [o for n in graph for o in n.outputs]:
            if not v.is_graph_output():
                v.shape = None
                v.type = None
        image = str(zoo.image_input(model).name)
        output = str(next(iter(graph.outputs)).name)
        models.append((name, model, image, output))
    return models


def digests(zoo: bool) -> dict[str, dict[str, object]]:
    """The digest and CPU seconds of every transform run, by ``model/transform``."""
    onnax.jvp(bench_scale.residual_network(24), inputs="X")  # lazy imports out of the timings
    out: dict[str, dict[str, object]] = {}
    for path in sorted(glob.glob(os.path.join(DATA, "*.onnx"))):
        name = os.path.basename(path)[: -len(".onnx")]
        model = ir.load(path)
        for transform in (onnax.jvp, onnax.vjp, onnax.vmap):
            out[f"{name}/{transform.__name__}"] = _digest(lambda: transform(model))  # noqa: B023
    scale = bench_scale.residual_network(1000)
    runs: dict[str, Callable[[], ir.Model]] = {
        name: (lambda fn=fn: fn(scale)) for name, fn in bench_scale.TRANSFORMS.items()
    }
    runs["vmap"] = lambda: onnax.vmap(scale)
    runs["vmap_grad"] = lambda: onnax.vmap(onnax.grad(scale, inputs="X"), in_axes={"X": 0})
    for name, run in runs.items():
        out[f"scale1k/{name}"] = _digest(run)
    if zoo:
        for name, model, image, output in _zoo_models():
            for fn in (onnax.jvp, onnax.vjp):
                key = f"zoo_{name}/{fn.__name__}"
                out[key] = _digest(lambda: fn(model, [image], [output]))  # noqa: B023
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--zoo", action="store_true")
    parser.add_argument("--compare", default=None)
    args = parser.parse_args(argv)
    result = digests(args.zoo)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for key, entry in result.items():
        print(f"{key:45} {entry['seconds']:8.3f} s  {str(entry['digest'])[:16]}")
    if args.compare is None:
        return 0
    with open(args.compare) as f:
        before = json.load(f)
    changed = [k for k in result if k in before and before[k]["digest"] != result[k]["digest"]]
    print(f"\n{len(changed)} of {len(result)} outputs differ from {args.compare}: {changed}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
