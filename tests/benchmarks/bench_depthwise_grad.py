"""Depthwise and patch Conv weight gradients: which form onnxruntime's CPU kernels run fastest.

Usage::

    uv run python tests/benchmarks/bench_depthwise_grad.py [--batches 8,1] [--rounds 5]
        [--cases convnext,mobilenet,patches]

Times ``dW[c, q] = sum_{n,o} g[n,c,o] x_pad[n,c,o*s+q*d]`` of a depthwise Conv (``x [N,C,H,H]``,
cotangent ``g``) in each candidate form, side by side in one process (one onnxruntime thread,
interleaved rounds, medians; ratios are the classic form's time over the form's, above 1: faster):

* ``onnax:<form>``: the vjp of the Conv w.r.t. its weight as onnax emits it with
  ``choose_form`` forced to ``<form>`` (its forward Conv pruned): ``classic`` (a Conv of ``x``
  with ``g`` as the kernel), ``im2col`` (one-hot 3-D Conv extraction + Transpose + batched
  matrix-vector MatMul), ``depthwise`` (Slice + Mul + ReduceSum per kernel offset),
  ``banded`` and, for one example at stride 1, ``toeplitz`` (both
  :mod:`onnax.rules._conv_grad_depthwise`);
* ``im2col_mv``: the im2col with the product the other way round, ``[N*C, K, P] @ [N*C, P, 1]``
  summed over the batch (no Transpose), built as a plain graph (``bench_conv_grad.py``).

Cases: convnext-tiny's 7x7 depthwise Convs (pads 3) at its four stages, and mobilenet-like 3x3
and 5x5 ones, to place the thresholds of ``choose_form``. ``patches``: Convs whose windows tile
the input (convnext's 4x4 stem and 2x2 downsamples, 8x8 and ViT's 16x16 patch embeddings), the
classic form against the im2col. Each line also gives the node count of each onnax form.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
from bench_conv_grad import SHAPES, Kind, _interleaved, _session, form_im2col_dw
from onnx import TensorProto, helper

CASES: dict[str, list[tuple[int, int, int, int]]] = {
    # (kernel, stride, size, channels); pads k // 2.
    "convnext": [(7, 1, 56, 96), (7, 1, 28, 192), (7, 1, 14, 384), (7, 1, 7, 768)],
    "mobilenet": [
        (3, 1, 112, 32),
        (3, 1, 56, 144),
        (3, 1, 28, 192),
        (3, 1, 14, 576),
        (3, 1, 7, 960),
        (5, 1, 28, 240),
        (5, 1, 14, 480),
        (5, 1, 7, 960),
        (5, 2, 28, 240),
    ],
}

ONNAX_FORMS = ["classic", "im2col", "depthwise", "banded"]


def conv_model(n: int, c: int, h: int, k: int, s: int, m: int = 0, group: int = 0) -> ir.Model:
    """``y = Conv(x, W)`` with static shapes.

    Depthwise with pads ``k // 2`` (``group`` 0), else ``m`` output channels in ``group``
    groups without pads.
    """
    p = k // 2 if group == 0 else 0
    m, group = (c, c) if group == 0 else (m, group)
    ho = (h + 2 * p - k) // s + 1
    node = helper.make_node(
        "Conv", ["x", "W"], ["y"], group=group, pads=[p] * 4, strides=[s, s], kernel_shape=[k, k]
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, h]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [m, c // group, k, k]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, m, ho, ho])],
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def onnax_weight_gradient(model: ir.Model, form: str) -> ir.Model:
    """The vjp w.r.t. ``W`` with the form forced, only the weight gradient kept."""
    import onnax
    from onnax.rules import _conv_grad

    chosen = _conv_grad.choose_form
    _conv_grad.choose_form = lambda *args: form  # type: ignore[assignment]
    try:
        vm = onnax.vjp(model, ["W"])
    finally:
        _conv_grad.choose_form = chosen  # type: ignore[assignment]
    outputs = list(vm.graph.outputs)
    vm.graph.outputs.clear()
    vm.graph.outputs.append(outputs[-1])
    ir.passes.common.RemoveUnusedNodesPass()(vm)
    return vm


def bench(cases: Sequence[tuple[int, int, int, int]], batches: Sequence[int], rounds: int) -> None:
    import onnax

    rng = np.random.default_rng(0)
    for k, s, h, c in cases:
        p = k // 2
        ho = (h + 2 * p - k) // s + 1
        for n in batches:
            model = conv_model(n, c, h, k, s)
            x = rng.standard_normal((n, c, h, h)).astype(np.float32)
            w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
            g = rng.standard_normal((n, c, ho, ho)).astype(np.float32)
            vm = onnax.vjp(model, ["W"])
            ct = vm.graph.inputs[-1].name
            feeds = {"x": x, "W": w, ct: g}
            runs: dict[str, Callable[[], object]] = {}
            nodes: dict[str, int] = {}
            ref = None
            # The Toeplitz GEMM is built for one example at stride 1 only.
            toeplitz = ["toeplitz"] if n == 1 and s == 1 else []
            for form in [*ONNAX_FORMS, *toeplitz]:
                wg = onnax_weight_gradient(model, form)
                nodes[form] = len(list(wg.graph))
                sess = _session(ir.to_proto(wg))
                names = {i.name for i in sess.get_inputs()}
                fd = {key: v for key, v in feeds.items() if key in names}
                out = sess.run(None, fd)[0]
                ref = out if ref is None else ref
                err = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30))
                assert err < 1e-4, (form, err)
                runs[f"onnax:{form}"] = lambda sess=sess, fd=fd: sess.run(None, fd)
            if s == 1:
                SHAPES.update(x=[n, c, h, h], g=[n, c, ho, ho])
                sess = _session(form_im2col_dw(n, c, c, h, Kind("dw", k, s, p, 0), c))
                fd = {"x": x, "g": g}
                out = sess.run(None, fd)[0]
                assert float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30)) < 1e-4
                runs["im2col_mv"] = lambda sess=sess, fd=fd: sess.run(None, fd)
            med = _interleaved(runs, rounds)
            base = med["onnax:classic"]
            cells = "  ".join(
                f"{f.removeprefix('onnax:')}={1e3 * t:7.2f} ({base / t:5.2f}x)"
                for f, t in med.items()
            )
            counts = " ".join(f"{f}:{c_}" for f, c_ in nodes.items())
            print(
                f"{k}x{k}/s{s} N={n} {h:3d}x{h:<3d} C={c:4d}  {cells}  [nodes {counts}]",
                flush=True,
            )


PATCH_CASES = [
    # (input channels, output channels, size, kernel = stride): convnext-tiny's stem and
    # downsamples, ViT-S/16's patch embedding.
    (3, 96, 224, 4),
    (96, 192, 56, 2),
    (192, 384, 28, 2),
    (384, 768, 14, 2),
    (3, 384, 224, 8),
    (3, 384, 224, 16),
]


def bench_patches(batches: Sequence[int], rounds: int) -> None:
    """Non-overlapping Convs (stride == kernel): the weight gradient in each onnax form."""
    import onnax

    rng = np.random.default_rng(0)
    for c, m, h, k in PATCH_CASES:
        ho = h // k
        for n in batches:
            model = conv_model(n, c, h, k, k, m, 1)
            feeds = {
                "x": rng.standard_normal((n, c, h, h)).astype(np.float32),
                "W": rng.standard_normal((m, c, k, k)).astype(np.float32),
            }
            feeds[onnax.vjp(model, ["W"]).graph.inputs[-1].name] = rng.standard_normal(
                (n, m, ho, ho)
            ).astype(np.float32)
            runs: dict[str, Callable[[], object]] = {}
            nodes: dict[str, int] = {}
            ref = None
            for form in ["classic", "im2col"]:
                wg = onnax_weight_gradient(model, form)
                nodes[form] = len(list(wg.graph))
                sess = _session(ir.to_proto(wg))
                names = {i.name for i in sess.get_inputs()}
                fd = {key: v for key, v in feeds.items() if key in names}
                out = sess.run(None, fd)[0]
                ref = out if ref is None else ref
                err = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30))
                assert err < 1e-4, (form, err)
                runs[form] = lambda sess=sess, fd=fd: sess.run(None, fd)
            med = _interleaved(runs, rounds)
            base = med["classic"]
            cells = "  ".join(f"{f}={1e3 * t:7.2f} ({base / t:5.2f}x)" for f, t in med.items())
            counts = " ".join(f"{f}:{c_}" for f, c_ in nodes.items())
            print(
                f"{k}x{k}/s{k} N={n} {h:3d}x{h:<3d} C={c:4d} M={m:4d}  {cells}  [nodes {counts}]",
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="8,1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cases", default="convnext,mobilenet,patches")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    names = args.cases.split(",")
    cases = [case for name in names if name != "patches" for case in CASES[name]]
    bench(cases, batches, args.rounds)
    if "patches" in names:
        bench_patches(batches, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
