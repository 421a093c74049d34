"""Export a PyTorch MLP to ONNX and write its CasADi family next to it.

    python examples/torch_to_casadi.py [OUTDIR]        # default: generated/

Needs PyTorch (`pip install torch`) and onnax. PyTorch exports the primal model only; onnax writes
the derivative siblings CasADi looks for: adj_f.onnx (gradients, Jacobians) and fwd_adj_f.onnx
(exact Hessians), plus fwd_f.onnx for f.forward(n). Then run examples/casadi_side.py.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch

from onnax.casadi import family


class Dynamics(torch.nn.Module):
    """A small network x' = f(x, u) of the kind used as a learned model in optimal control."""

    def __init__(self, states: int = 4, controls: int = 2, hidden: int = 16) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(states + controls, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(hidden, states),
        )

    def forward(self, x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return x + 0.1 * self.net(torch.cat([x, u], dim=-1))


def export(module: torch.nn.Module, path: Path) -> None:
    """torch.onnx.export with the weights inside the file and float64 precision."""
    args = (torch.zeros(4, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    kwargs = {"input_names": ["x", "u"], "output_names": ["x_next"], "opset_version": 18}
    try:
        # external_data=False: CasADi cannot follow an f.onnx.data sidecar (family() would
        # embed it anyway, but a model file that works on its own is the better artifact).
        torch.onnx.export(module, args, str(path), dynamo=True, external_data=False, **kwargs)
    except TypeError:  # an older PyTorch without the dynamo exporter's keywords
        torch.onnx.export(module, args, str(path), **kwargs)


def main(outdir: str = "generated") -> None:
    torch.manual_seed(0)
    module = Dynamics().double().eval()
    target = Path(outdir) / "f.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        exported = Path(tmp) / "dynamics.onnx"
        export(module, exported)
        model = ir.load(exported)
        fam = family(model, target, kinds=("adj", "fwd_adj", "fwd"))
    for kind, path in fam.files.items():
        print(f"{kind:<8} {path}")
    print(f"differentiable inputs: {list(fam.inputs)}, outputs: {list(fam.outputs)}")
    # The reference values casadi_side.py compares against, from PyTorch's autograd.
    x = torch.linspace(-0.5, 0.5, 4, dtype=torch.float64)
    u = torch.tensor([0.3, -0.2], dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(module, (x, u))
    w = torch.linspace(1.0, 2.0, 4, dtype=torch.float64)
    hess = torch.autograd.functional.hessian(lambda x: module(x, u) @ w, x)
    np.savez(
        Path(outdir) / "torch_reference.npz",
        x=x.numpy(),
        u=u.numpy(),
        w=w.numpy(),
        y=module(x, u).detach().numpy(),
        jac_x=jac[0].numpy(),
        jac_u=jac[1].numpy(),
        hess_x=hess.numpy(),
    )
    print(f"wrote {Path(outdir) / 'torch_reference.npz'}; now run examples/casadi_side.py {outdir}")


if __name__ == "__main__":
    main(*sys.argv[1:])
