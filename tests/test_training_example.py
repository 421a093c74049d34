"""examples/train_on_device.py runs small: the loss falls in the IO-binding loop, and the loop's
weights equal those of plain ``session.run`` calls fed back by ``carry``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from onnax import training
from training_models import session

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_on_device.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_on_device", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_on_device"] = module
    spec.loader.exec_module(module)
    return module


def test_example_runs_small(example: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert example.main(["--steps", "12", "--batch", "8"]) == 0
    out = capsys.readouterr().out
    assert "cnn: loss" in out and "transformer: loss" in out


@pytest.mark.parametrize("kind", ["cnn", "transformer"])
def test_io_binding_loop_equals_plain_runs(example: ModuleType, kind: str) -> None:
    rng = np.random.default_rng(0)
    raw = example.cnn_weights(rng) if kind == "cnn" else example.transformer_weights(rng)
    weights = {k: v if v.dtype == np.int64 else v.astype(np.float32) for k, v in raw.items()}
    xs, ys = example.batches(kind, 4, 8, seed=3)
    losses, params, _, _ = example.train_onnx(kind, weights, xs, ys)
    model = example.cnn_model(weights) if kind == "cnn" else example.transformer_model(weights)
    st = training.step(
        training.add_loss(model, "logits", "cross_entropy"),
        frozen=example.FROZEN[kind],
        optimizer=training.AdamW(lr=example.LR, weight_decay=example.WEIGHT_DECAY),
    )
    sess = session(st)
    names = [o.name for o in sess.get_outputs()]
    state = training.initial_state(st)
    x_name = "x" if kind == "cnn" else "tokens"
    for s in range(4):
        out = dict(
            zip(names, sess.run(None, {x_name: xs[s], "target": ys[s], **state}), strict=True)
        )
        assert out["loss"] == np.float32(losses[s])
        state = {i: out[o] for i, o in training.carry(st)}
    for name, value in params.items():
        np.testing.assert_array_equal(value, state[name], err_msg=name)
