"""The light-zoo CNNs of bench_training.py's ``--zoo``: resnet50, shufflenet and squeezenet.

The issue behind bench_training.py measured onnax's gradient w.r.t. every weight and the image of
these three against PyTorch autograd on the same network, converted with onnx2torch. This module
writes them the way bench_training.py reads its own exports: ``DIR/<name>.b<batch>.onnx`` with
one input ``x`` and the outputs ``y`` (the class probabilities) and ``loss = sum(y * r)``
(:func:`zoo.add_loss`), and ``DIR/<name>.b<batch>.npz`` with a seeded image. The models are
tests/zoo.py's (seeded random weights, converted to opset 17 by onnax's own preparation); batch
sizes above 1 are made by setting the image's batch dimension and the leading 1 of every Reshape
target (these graphs were exported at batch 1 with the batch written into their Reshapes).

PyTorch's side (``training_torch.py --onnx2torch``) converts each file with onnx2torch in the
torch venv and times it there (``DIR/<name>.b<batch>.torch.json``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import zoo  # noqa: E402  (tests/zoo.py, found through the path above)
from onnax.passes.prepare import prepare  # noqa: E402

ZOO_MODELS = ("resnet50", "shufflenet", "squeezenet")


def _rebatch(model: ir.Model, batch: int) -> None:
    """Sets the image's batch dimension and the leading 1 of every Reshape target to ``batch``."""
    image = zoo.image_input(model)
    assert image.shape is not None
    image.shape = ir.Shape([batch, *image.shape.dims[1:]])
    if batch == 1:
        return
    for node in model.graph:  # the shapes stored at batch 1 are inferred again by prepare
        for out in node.outputs:
            if out.is_graph_output() and out.shape is not None:
                out.shape = ir.Shape([batch, *out.shape.dims[1:]])
            else:
                out.shape = None
    for node in model.graph:
        if node.op_type != "Reshape" or len(node.inputs) < 2:
            continue
        target = node.inputs[1]
        if target is None or target.const_value is None:
            continue
        dims = target.const_value.numpy()
        if dims.size and dims[0] == 1:
            fresh = ir.Value(
                name=f"{target.name}__b{batch}",
                type=target.type,
                shape=target.shape,
                const_value=ir.tensor(np.concatenate([[batch], dims[1:]]).astype(dims.dtype)),
            )
            model.graph.register_initializer(fresh)
            model.graph.inputs.append(fresh)  # IR version 3: initializers are inputs too
            node.replace_input_with(1, fresh)


def _strip_dropout(model: ir.Model) -> None:
    """Replaces every Dropout (an identity at inference) by its input.

    onnx2torch indexes its converted Dropout's result as if it were the (output, mask) pair,
    which drops squeezenet's batch axis; without the node both sides run the same network.
    """
    for node in [n for n in model.graph if n.op_type == "Dropout"]:
        node.outputs[0].replace_all_uses_with(node.inputs[0])
        model.graph.remove(node, safe=True)


def zoo_primal(name: str, batch: int) -> tuple[ir.Model, np.ndarray]:
    """The zoo model ``name`` at ``batch`` with input ``x`` and outputs ``y`` and ``loss``."""
    model = zoo.load(name)
    _rebatch(model, batch)
    _strip_dropout(model)
    (y,) = list(model.graph.outputs)
    y.name = "y"
    zoo.add_loss(model)  # before preparing: at opset 9 the output is still a Softmax's
    model = prepare(model, "bench")
    graph = model.graph
    for v in list(graph.inputs):  # a current-IR model: initializers are not graph inputs
        if v.name in graph.initializers:
            graph.inputs.remove(v)
    model.ir_version = 8
    image = zoo.image_input(model)
    image.name = "x"
    assert image.shape is not None
    shape = [int(d) for d in image.shape.dims]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return model, x


def _file(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix)  # not with_suffix: ".b8" is no suffix to replace


def write_zoo(cache: Path, batches: list[int], torch_python: str | None, rounds: int) -> list[str]:
    """Writes every zoo model at every batch to ``cache`` (skipping what is there), then has
    ``torch_python`` time the ones without PyTorch timings. Returns the names written."""
    cache.mkdir(parents=True, exist_ok=True)
    stems = []
    for name in ZOO_MODELS:
        for batch in batches:
            stem = cache / f"{name}.b{batch}"
            if not _file(stem, ".onnx").exists():
                model, x = zoo_primal(name, batch)
                ir.save(model, _file(stem, ".onnx"))
                np.savez(_file(stem, ".npz"), x=x)
            stems.append(stem)
    untimed = [s for s in stems if not _file(s, ".torch.json").exists()]
    if untimed and torch_python:
        subprocess.run(
            [
                torch_python,
                str(HERE / "training_torch.py"),
                "--onnx2torch",
                *(str(_file(s, ".onnx")) for s in untimed),
                "--rounds",
                str(rounds),
            ],
            check=True,
        )
    return [s.name for s in stems]
