"""The ``train-step`` subcommand, through its own argparse parser (the main CLI wires it in)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest

from onnax import training
from onnax.training import cli
from training_models import mlp, run_all


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="onnax")
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    ir.save(mlp(), path)
    return path


def test_writes_step_state_and_summary(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [
        "train-step", str(model_path), str(out), "--output", "Y", "--loss", "cross_entropy",
        "--optimizer", "adamw", "--lr", "1e-2", "--frozen", "fc1.*", "--max-grad-norm", "1",
    ]  # fmt: skip
    args = parse(argv)
    assert args.func(args, None) == 0
    trainer = ir.load(out / "step.onnx")
    state = dict(np.load(out / "state.npz"))
    assert set(state) == {i for i, _ in training.carry(trainer)}
    assert "fc1.weight" not in state and "fc2.weight.exp_avg" in state
    rng = np.random.default_rng(0)
    batch = {"X": rng.standard_normal((8, 4)).astype(np.float32), "target": rng.integers(0, 3, 8)}
    got = run_all(trainer, {**batch, **state})
    direct = training.step(
        training.add_loss(mlp(), "Y", "cross_entropy"),
        frozen="fc1.*",
        optimizer=training.AdamW(lr=1e-2),
        max_grad_norm=1.0,
    )
    want = run_all(direct, {**batch, **training.initial_state(direct)})
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    readme = (out / "README.md").read_text()
    assert "# Training step for `m.onnx`" in readme
    assert "| `fc2.weight.exp_avg` | FLOAT [5, 3] | optimizer state | state.npz |" in readme
    assert "| `fc2.weight.new` | FLOAT [5, 3] | `fc2.weight` |" in readme
    assert "| `lr` | FLOAT [] | learning rate | stored default |" in readme


def test_sgd_options_reach_the_optimizer(model_path: Path, tmp_path: Path) -> None:
    args = parse([
        "train-step", str(model_path), str(tmp_path / "o"), "--output", "Y", "--loss", "mse",
        "--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.1",
    ])  # fmt: skip
    assert cli.run(args) == 0
    record = training.layout(ir.load(tmp_path / "o" / "step.onnx"))
    assert record["optimizer"] == (
        "SGD(lr=0.001, momentum=0.9, dampening=0.0, nesterov=True, weight_decay=0.1)"
    )
    assert set(record["state"]["fc1.weight"]) == {"momentum_buffer"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--output", "logits"], "onnax train-step: add_loss(mse): no graph output named 'logits'"),
        (["--output", "Y", "--frozen", "enc.*"], "frozen entry 'enc.*' matches no float"),
        (["--output", "Y", "--optimizer", "sgd", "--nesterov"], "nesterov=True needs momentum"),
    ],
)
def test_errors_are_one_line_with_status_2(
    model_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    args = parse(["train-step", str(model_path), str(tmp_path / "o"), "--loss", "mse", *extra])
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o" / "step.onnx").exists()


def test_missing_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["train-step", str(tmp_path / "none.onnx"), str(tmp_path), "--output", "Y",
                  "--loss", "mse"])  # fmt: skip
    assert cli.run(args) == 2
    assert "no model file at" in capsys.readouterr().err
