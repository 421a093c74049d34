"""The onnxruntime-training side of bench_training.py: its gradient graph against onnax's.

Runs in a Python with onnxruntime-training 1.19.2 (never in the project's environment)::

    uv venv /tmp/ortt && uv pip install --python /tmp/ortt onnxruntime-training==1.19.2 \\
        "numpy<2" onnx==1.16.2
    PYTHONPATH=DIR /tmp/ortt/bin/python tests/benchmarks/training_ortt.py SPEC.json ROUNDS

onnxruntime-training imports torch at import time; ``DIR`` holds links to a torch install's
packages without its onnx, onnxruntime and numpy (bench_training.py's ``--ortt-pythonpath``
makes one). ``SPEC.json`` maps a case name to ``{"model": primal .onnx with outputs y and loss,
"onnax": onnax's gradient of loss w.r.t. the weights, "x": .npy input, "weights": [names]}``.

For each case it builds onnxruntime-training's artifacts (``generate_artifacts``, no loss block
added: the model's ``loss`` output is the loss, the same weights require gradients) from a copy
of the primal respelled where ortt 1.19.2 has no gradient builder for the exported form (``Sum``
as ``Add`` chains, LayerNormalization's optional statistics declared: the same function), and times,
in this one onnxruntime and in interleaved rounds at one thread after a warm-up: the primal
(an InferenceSession), onnxruntime-training's ``Module`` train step (forward + gradient graph,
gradients reset lazily) and onnax's gradient model (an InferenceSession). It prints one JSON
object: per case the medians in seconds, the node counts and domains of the training graph, or
the error ``generate_artifacts`` raised.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.training import artifacts
from onnxruntime.training.api import CheckpointState, Module


def _options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def _loss_only(path: str) -> onnx.ModelProto:
    """The primal with ``loss`` as its only output: the training graph's loss."""
    model = onnx.load(path)
    keep = [o for o in model.graph.output if o.name == "loss"]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    return respelled(model)


def respelled(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (in place) in the forms onnxruntime-training 1.19.2 has gradient builders for.

    The same function: every ``Sum`` as ``Add`` nodes, every LayerNormalization with its
    optional statistics declared (:func:`_sum_as_add`, :func:`_layer_norm_statistics`).
    """
    return _layer_norm_statistics(_sum_as_add(model))


def _sum_as_add(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every ``Sum`` spelled as a chain of ``Add`` nodes: the same function.

    onnxruntime-training 1.19.2 has no gradient builder for ``Sum`` ("The gradient builder has
    not been registered: Sum"), which the light zoo's resnet50 and shufflenet use for their
    residual additions (opset 9), so it could not build their training graphs at all. Only its
    copy of the model is rewritten; onnax's gradient is of the model as it is.
    """
    nodes = []
    for node in model.graph.node:
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        total = node.input[0]
        for k, term in enumerate(node.input[1:], start=1):
            last = k == len(node.input) - 1
            out = node.output[0] if last else f"{node.output[0]}__sum{k}"
            nodes.append(
                onnx.helper.make_node("Add", [total, term], [out], name=f"{node.name}_{k}")
            )
            total = out
        if len(node.input) == 1:
            nodes.append(
                onnx.helper.make_node("Identity", [total], [node.output[0]], name=node.name)
            )
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _brief(message: str, limit: int = 400) -> str:
    """``message`` on one line, at most ``limit`` characters: its start and its end.

    onnxruntime-training's errors open with a source location and close with what failed (the
    operator whose gradient builder is missing: "... not been registered: Sum"), so a cut that
    keeps only the start drops the part that says what to change.
    """
    flat = " ".join(message.split())
    if len(flat) <= limit:
        return flat
    head = limit // 3
    return f"{flat[:head]} ... {flat[-(limit - head - 5) :]}"


def _layer_norm_statistics(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every ``LayerNormalization`` with its optional ``Mean`` and ``InvStdDev`` outputs declared.

    onnxruntime-training 1.19.2's gradient builder for LayerNormalization reads the node's
    saved statistics, outputs 1 and 2, and fails when the node has only ``Y`` ("GradientBuilderBase::
    O(size_t, bool) const i < node_->OutputDefs().size() was false"), as every LayerNormalization
    that torch's exporters write has: the gpt2, bert, vit and convnext of this benchmark built
    no training graph at all. The outputs are the node's own (same kernel, same ``Y``); nothing
    reads them but ortt's gradient. Only ortt's copy is changed; onnax differentiates the model
    as exported.
    """
    for node in model.graph.node:
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        while len(node.output) < 3:
            node.output.append(f"{node.output[0]}__statistic{len(node.output)}")
    return model


def case(item: dict[str, Any], rounds: int, scratch: Path) -> dict[str, Any]:
    model = _loss_only(item["model"])
    try:
        artifacts.generate_artifacts(
            model,
            requires_grad=item["weights"],
            frozen_params=[
                i.name for i in model.graph.initializer if i.name not in set(item["weights"])
            ],
            loss=None,
            artifact_directory=str(scratch),
        )
    except Exception as err:  # a refusal is the finding: report it and go on
        return {"error": _brief(f"generate_artifacts: {type(err).__name__}: {err}")}
    graph = onnx.load(str(scratch / "training_model.onnx")).graph
    domains = collections.Counter(n.domain or "ai.onnx" for n in graph.node)
    x = np.load(item["x"])
    state = CheckpointState.load_checkpoint(str(scratch / "checkpoint"))
    module = Module(
        str(scratch / "training_model.onnx"),
        state,
        str(scratch / "eval_model.onnx"),
        session_options=_options(),
    )
    module.train()
    primal = ort.InferenceSession(item["model"], _options(), providers=["CPUExecutionProvider"])
    try:
        grad = ort.InferenceSession(item["onnax"], _options(), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnax's opset may be newer than this onnxruntime's
        grad, grad_error = None, _brief(f"{type(err).__name__}: {err}")
    else:
        grad_error = None
    names = [i.name for i in primal.get_inputs()]
    feeds = {names[0]: x}

    def train_step() -> None:
        module(x)
        module.lazy_reset_grad()

    runs: dict[str, Any] = {"primal": lambda: primal.run(None, feeds), "ortt": train_step}
    if grad is not None:
        runs["onnax"] = lambda: grad.run(None, feeds)
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for fn in runs.values():
        fn()
        fn()
    for _ in range(rounds):
        for key, fn in runs.items():
            start = time.perf_counter()
            fn()
            samples[key].append(time.perf_counter() - start)
    result: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    result["ortt_nodes"] = len(graph.node)
    result["ortt_domains"] = dict(domains)
    if grad_error:
        result["onnax_error"] = grad_error
    return result


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    rounds = int(sys.argv[2])
    out = {}
    for name, item in spec.items():
        with tempfile.TemporaryDirectory() as scratch:
            out[name] = case(item, rounds, Path(scratch))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
