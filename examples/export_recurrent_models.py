"""Exports the small recurrent test models kept under tests/data.

A 2-layer bidirectional ``nn.LSTM`` and the same ``nn.GRU`` (input 3, hidden 4; sequences of 5
steps, batch 2), each followed by a linear head and a mean of squares, so that the model has
one rank-0 output to differentiate. Exported with ``torch.onnx.export(..., dynamo=True)``, the
weights embedded in the single .onnx file.

Run with a Python that has torch, onnxscript and onnx (not a dependency of onnax):

    python examples/export_recurrent_models.py [output_dir]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

INPUT, HIDDEN, STEPS, BATCH = 3, 4, 5, 2


class Recurrent(nn.Module):
    """A 2-layer bidirectional LSTM or GRU with a linear head reduced to a scalar."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        cell = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cell(INPUT, HIDDEN, num_layers=2, bidirectional=True)
        self.head = nn.Linear(2 * HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)  # [T, B, 2H]
        return self.head(out).square().mean()


def export(kind: str, directory: Path) -> Path:
    torch.manual_seed(0 if kind == "lstm" else 1)
    model = Recurrent(kind).eval()
    x = torch.randn(STEPS, BATCH, INPUT)
    path = directory / f"torch_{kind}_2layer_bidir.onnx"
    program = torch.onnx.export(
        model,
        (x,),
        dynamo=True,
        input_names=["x"],
        output_names=["loss"],
        external_data=False,
    )
    assert program is not None
    program.save(str(path), external_data=False)
    return path


def main() -> None:
    default = Path(__file__).resolve().parent.parent / "tests" / "data"
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    directory.mkdir(parents=True, exist_ok=True)
    for kind in ("lstm", "gru"):
        print(export(kind, directory))


if __name__ == "__main__":
    main()
