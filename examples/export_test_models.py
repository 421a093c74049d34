"""Exports the small PyTorch models that tests/test_torch_models.py differentiates.

Run with a Python that has torch and onnxscript (the tests themselves need no torch):

    python examples/export_test_models.py [--out tests/data]

Every model is exported with ``torch.onnx.export(..., dynamo=True)``, weights embedded, seeded, in
eval mode, to ``<out>/torch_<name>.onnx``. Each is a few kilobytes to a few hundred.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.silu(self.bn1(self.conv1(x)))
        x = F.avg_pool2d(F.silu(self.bn2(self.conv2(x))), 1)
        return self.fc(torch.flatten(x, 1))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class SDPA(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class SpatialTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loc = nn.Linear(2 * 6 * 6, 6)
        with torch.no_grad():  # start near the identity transform, as spatial transformers do
            self.loc.weight.mul_(0.1)
            self.loc.bias.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        theta = self.loc(torch.flatten(x, 1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def models() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return {
        "mlp": (MLP(), (randn(4, 6),)),
        "cnn_bn": (CNN(), (randn(2, 3, 8, 8),)),
        "transformer_encoder": (Encoder(), (randn(2, 5, 8),)),
        "sdpa": (SDPA(), (randn(2, 2, 5, 4), randn(2, 2, 5, 4), randn(2, 2, 5, 4))),
        "spatial_transformer": (SpatialTransformer(), (randn(2, 2, 6, 6),)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "data")
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, (module, example) in models().items():
        module.eval()
        if isinstance(module, CNN):
            with torch.no_grad():  # non-trivial running statistics, as after training
                for bn in (module.bn1, module.bn2):
                    bn.running_mean.uniform_(-0.5, 0.5)
                    bn.running_var.uniform_(0.5, 1.5)
        path = out / f"torch_{name}.onnx"
        # The exporter's optimizer would fold eval-mode BatchNorm into the Conv weights.
        program = torch.onnx.export(
            module, example, dynamo=True, external_data=False, optimize=not isinstance(module, CNN)
        )
        assert program is not None
        program.save(str(path), external_data=False)
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
