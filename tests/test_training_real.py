"""A training step on an exported model of the real-model corpus (tests/data/real, torch.onnx
dynamo export of a small ViT): fine-tuning the head on one fixed batch lowers the loss, and the
first SGD update is exactly ``-lr`` times onnax.grad of the same loss model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

import onnax
from onnax import training
from oracles import run
from training_models import session

REAL = Path(__file__).resolve().parent / "data" / "real"


def test_vit_head_fine_tuning() -> None:
    # onnx.load reads the shared <arch>.weights file in, so the model serialises on its own.
    model = ir.from_proto(onnx.load(str(REAL / "vit_tiny.dynamo.onnx")))
    with np.load(REAL / "vit_tiny.npz") as refs:
        x = refs["input/pixel_values"]
    with_loss = training.add_loss(model, str(model.graph.outputs[0].name), "cross_entropy")
    batch = {"pixel_values": x, "target": np.array([1, 7])}
    sgd = training.step(with_loss, params="model.head.*", optimizer=training.SGD(lr=0.5))
    state = training.initial_state(sgd)
    out = dict(zip([o.name for o in session(sgd).get_outputs()],
                   session(sgd).run(None, {**batch, **state}), strict=True))  # fmt: skip
    grads = run(onnax.grad(with_loss, inputs=["model.head.weight"], output="loss"), batch)
    np.testing.assert_allclose(
        out["model.head.weight.new"] - state["model.head.weight"],
        -0.5 * grads["grad_model.head.weight"],
        rtol=1e-4, atol=1e-6,
    )  # fmt: skip
    adamw = training.step(with_loss, params="model.head.*", optimizer=training.AdamW(lr=1e-2))
    sess = session(adamw)
    names = [o.name for o in sess.get_outputs()]
    state = training.initial_state(adamw)
    losses = []
    for _ in range(4):
        out = dict(zip(names, sess.run(None, {**batch, **state}), strict=True))
        state = {i: out[o] for i, o in training.carry(adamw)}
        losses.append(float(out["loss"]))
    assert losses[-1] < 0.8 * losses[0], losses


def test_weights_in_a_side_file_are_saved_with_the_copy(tmp_path: Path) -> None:
    """ir.load keeps the corpus weights in vit_tiny.weights, referenced relative to the source;
    trained_model and train-step save their own side file, so the copies load anywhere."""
    import argparse

    import onnxruntime as ort

    from onnax.training import cli

    model = ir.load(REAL / "vit_tiny.dynamo.onnx")
    with np.load(REAL / "vit_tiny.npz") as refs:
        x = refs["input/pixel_values"]
    head = model.graph.initializers["model.head.bias"].const_value
    assert head is not None
    bias = np.arange(head.shape[0], dtype=np.float32)
    training.trained_model(model, {"model.head.bias": bias}, tmp_path / "t.onnx")
    assert (tmp_path / "t.onnx.data").exists()
    from_disk = ort.InferenceSession(str(tmp_path / "t.onnx"), providers=["CPUExecutionProvider"])
    in_memory = ir.from_proto(onnx.load(str(REAL / "vit_tiny.dynamo.onnx")))
    # The bias is added last: the logits move by the change of the bias.
    want = run(in_memory, {"pixel_values": x})["y"] - head.numpy() + bias
    np.testing.assert_allclose(
        from_disk.run(None, {"pixel_values": x})[0], want, rtol=1e-5, atol=1e-6
    )
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train-step", str(REAL / "vit_tiny.dynamo.onnx"), str(tmp_path / "o"),
                              "--output", "y", "--loss", "cross_entropy", "--params", "model.head.*"])  # fmt: skip
    assert cli.run(args) == 0
    sess = ort.InferenceSession(
        str(tmp_path / "o" / "step.onnx"), providers=["CPUExecutionProvider"]
    )
    state = dict(np.load(tmp_path / "o" / "state.npz"))
    loss = sess.run(["loss"], {"pixel_values": x, "target": np.array([1, 7]), **state})[0]
    assert np.isfinite(loss)
