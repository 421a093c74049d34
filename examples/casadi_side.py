"""Load a family in CasADi and check gradients, Jacobians and exact Hessians.

    python examples/casadi_side.py [OUTDIR]            # default: generated/

Reads OUTDIR/f.onnx (written by examples/torch_to_casadi.py, or any family(..., kinds=("adj",
"fwd_adj", "fwd")) of a model with inputs x [4], u [2] and an output of shape [4]). Every derivative
CasADi computes from the siblings is compared with central finite differences of f.onnx run in
onnxruntime, and with PyTorch's autograd when OUTDIR/torch_reference.npz exists. Needs
`pip install "onnax[casadi]"`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from onnax.casadi import check_family, use_onnxruntime


def main(outdir: str = "generated") -> None:
    path = Path(outdir) / "f.onnx"
    check_family(path)  # the files follow CasADi's contract
    use_onnxruntime()  # CASADI_ONNXRUNTIME_LIB, before the first create()
    import casadi as ca

    f = ca.GraphBuilder(str(path)).create("f")
    print(f)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def primal(x: np.ndarray, u: np.ndarray) -> np.ndarray:
        return session.run(None, {"x": x, "u": u})[0]

    ref_file = Path(outdir) / "torch_reference.npz"
    ref = dict(np.load(ref_file)) if ref_file.exists() else None
    x0 = ref["x"] if ref else np.linspace(-0.5, 0.5, 4)
    u0 = ref["u"] if ref else np.array([0.3, -0.2])
    w = ref["w"] if ref else np.linspace(1.0, 2.0, 4)

    x, u = ca.MX.sym("x", 4), ca.MX.sym("u", 2)
    y = f(x, u)
    derivatives = ca.Function(
        "derivatives",
        [x, u],
        [
            y,
            ca.jacobian(y, x),  # from adj_f.onnx (or fwd_f.onnx)
            ca.jacobian(y, u),
            ca.gradient(ca.dot(y, w), x),  # a reverse sweep: adj_f.onnx with one seed
            ca.hessian(ca.dot(y, w), x)[0],  # exact: fwd_adj_f.onnx
        ],
    )
    value, jac_x, jac_u, grad_x, hess_x = (np.asarray(d.full()) for d in derivatives(x0, u0))

    def fd_jac(fun, at: np.ndarray, eps: float = 1e-6) -> np.ndarray:
        cols = []
        for j in range(at.size):
            e = np.zeros_like(at)
            e[j] = eps
            cols.append((fun(at + e) - fun(at - e)) / (2 * eps))
        return np.stack(cols, axis=1)

    want_jx = fd_jac(lambda v: primal(v, u0), x0)
    want_ju = fd_jac(lambda v: primal(x0, v), u0)
    want_h = fd_jac(lambda v: fd_jac(lambda z: primal(z, u0), v).T @ w, x0, eps=1e-4)
    rows = [
        ("f(x, u)", value.ravel(), primal(x0, u0)),
        ("jacobian in x", jac_x, want_jx),
        ("jacobian in u", jac_u, want_ju),
        ("gradient of w·f", grad_x.ravel(), want_jx.T @ w),
        ("hessian of w·f", hess_x, want_h),
    ]
    print(f"{'quantity':<18} {'max |err| vs FD':>16}")
    for name, got, want in rows:
        err = float(np.max(np.abs(got - want)))
        print(f"{name:<18} {err:>16.2e}")
        assert err < (1e-5 if "hessian" in name else 1e-7), (
            f"{name} differs from finite differences"
        )
    if ref:
        for name, got, want in [
            ("f vs torch", value.ravel(), ref["y"]),
            ("jac x vs torch", jac_x, ref["jac_x"]),
            ("jac u vs torch", jac_u, ref["jac_u"]),
            ("hessian vs torch", hess_x, ref["hess_x"]),
        ]:
            err = float(np.max(np.abs(got - want)))
            print(f"{name:<18} {err:>16.2e}")
            # Two float64 runtimes, not two derivative methods: onnxruntime's and PyTorch's Tanh
            # kernels differ by a few 1e-10, and the differences pass on to the derivatives.
            assert err < 1e-8, f"{name}: CasADi and PyTorch disagree"
    print("CasADi's derivatives from the family agree")


if __name__ == "__main__":
    main(*sys.argv[1:])
