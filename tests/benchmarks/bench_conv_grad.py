"""Conv weight gradients: which form onnxruntime's CPU kernels run fastest.

Usage::

    uv run python tests/benchmarks/bench_conv_grad.py [--batches 1,8] [--rounds 5]
        [--kinds 1x1,1x1_s2,3x3,3x3_s2,dw3x3,dw3x3_s2,g3x3] [--sizes 56x64,28x128,14x256,7x512]
        [--no-block] [--torch-python /work/torchvenv/bin/python]

Part one times the weight-gradient subgraph alone, ``dW = sum_{n,o} g[n,m,o] x[n,c,o*s+q*d]``
for ``x [N,C,H,W]`` and the cotangent ``g [N,M,Ho,Wo]``, in each candidate form, built here as
plain ONNX graphs (so the candidates know nothing of the rules):

* ``conv``: the classic form, a Conv of ``x`` (batch and channels swapped) with ``g`` as the
  kernel, stride and dilation exchanged (onnax's form before this benchmark);
* ``matmul``: 1x1 kernels; ``x`` strided by a Slice where ``s > 1``, then the product over
  ``N * H * W`` as a batched ``MatMul`` ``g [N,M,P] @ xᵀ [N,P,C]`` summed over ``N``;
* ``im2col``: a one-hot Conv extracting the ``K = kh*kw`` window elements of every channel,
  ``[N*C,1,H,W] -> [N, C*K, P]`` (per group ``[N, g, Cg*K, P]``), and the same batched MatMul
  per group;
* ``slices``: the same columns from ``K`` strided Slices of the padded input, concatenated;
* ``channels``/``channels_left``: the im2col channels first (``[C*K, N*P]``, the batch on the
  unit axis of the 3-D one-hot Conv) and one GEMM over ``N*P`` (onnax's form for 2-D kernels);
  ``_left`` with the columns as the MatMul's left operand and ``g`` channels last;
* ``mulsum`` (depthwise only): ``sum_{n,o} g * x_q`` per offset as Mul + ReduceSum over the
  ``K`` shifted slices;
* ``im2col_dw`` / ``im2col_mulsum`` (depthwise only): the one-hot im2col ``[N, C, K, P]``
  contracted with ``g`` by a matrix-vector product per example and channel, or by one
  broadcasting Mul and one ReduceSum over ``(N, P)``; ``channels``/``channels_left`` as above
  with one group per channel.

Part two times ``onnax.grad`` of a small resnet-like block (1x1 -> 3x3 -> 1x1 bottleneck with a
strided 3x3, a depthwise 3x3 and a grouped 3x3, residual Adds, Relu) w.r.t. every weight over
its primal. Part three (``--torch-python``) times ``torch.nn.grad.conv2d_weight`` on the same
sizes. Everything at one onnxruntime thread, interleaved rounds, medians; ratios are
old / new (above 1: the new form is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


@dataclass
class Kind:
    """One Conv kind: kernel, stride, pad, groups (``g = 0``: depthwise)."""

    name: str
    k: int
    s: int
    p: int
    g: int


KINDS = {
    "1x1": Kind("1x1", 1, 1, 0, 1),
    "1x1_s2": Kind("1x1_s2", 1, 2, 0, 1),
    "3x3": Kind("3x3", 3, 1, 1, 1),
    "3x3_s2": Kind("3x3_s2", 3, 2, 1, 1),
    "dw3x3": Kind("dw3x3", 3, 1, 1, 0),
    "dw3x3_s2": Kind("dw3x3_s2", 3, 2, 1, 0),
    "g3x3": Kind("g3x3", 3, 1, 1, 4),
}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


SHAPES: dict[str, list[int]] = {}
"""The static shapes of ``x`` and ``g`` of the case being built: onnxruntime's layout
transformations (NCHWc) depend on them, so the forms are timed with them declared."""


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "wg",
        [
            helper.make_tensor_value_info("x", F, SHAPES.get("x")),
            helper.make_tensor_value_info("g", F, SHAPES.get("g")),
        ],
        [helper.make_tensor_value_info("dw", F, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _ints(name: str, values: Sequence[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def form_conv(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """Conv of x (channels as batch) with g as the kernel (the old form)."""
    ho = (h + 2 * kd.p - kd.k) // kd.s + 1
    end = (ho - 1) * kd.s + kd.k - h - kd.p  # tight end pad
    nodes = []
    inits = []
    src = "x"
    if end < 0:  # trailing input no window reads: cropped (onnax crops with a Pad)
        h += end
        inits += [_ints("c0", [0, 0]), _ints("c1", [h, h]), _ints("cax", [2, 3])]
        nodes.append(helper.make_node("Slice", ["x", "c0", "c1", "cax"], ["xc"]))
        src, end = "xc", 0
    if groups == 1:
        nodes.append(helper.make_node("Transpose", [src], ["xt"], perm=[1, 0, 2, 3]))
    else:
        inits += [_ints("s1", [n, groups, c // groups, h, h]), _ints("s2", [c // groups, -1, h, h])]
        nodes += [
            helper.make_node("Reshape", [src, "s1"], ["xs"]),
            helper.make_node("Transpose", ["xs"], ["xg"], perm=[2, 1, 0, 3, 4]),
            helper.make_node("Reshape", ["xg", "s2"], ["xt"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["g"], ["gt"], perm=[1, 0, 2, 3]),
        helper.make_node(
            "Conv",
            ["xt", "gt"],
            ["o"],
            dilations=[kd.s, kd.s],
            strides=[1, 1],
            group=groups,
            pads=[kd.p, kd.p, end, end],
        ),
        helper.make_node("Transpose", ["o"], ["dw"], perm=[1, 0, 2, 3]),
    ]
    return _model(nodes, inits)


def form_matmul(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """1x1: a batched MatMul over the (strided) positions, summed over the batch."""
    nodes, inits = [], [_ints("r3", [0, 0, -1]), _ints("ax0", [0]), _ints("wshape", [m, c, 1, 1])]
    src = "x"
    if kd.s != 1:
        ho = (h - 1) // kd.s + 1
        inits += [_ints("st", [0, 0]), _ints("en", [ho * kd.s] * 2), _ints("ax", [2, 3])]
        inits += [_ints("sp", [kd.s, kd.s])]
        nodes.append(helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["xs"]))
        src = "xs"
    nodes += [
        helper.make_node("Reshape", [src, "r3"], ["xf"]),
        helper.make_node("Reshape", ["g", "r3"], ["gf"]),
        helper.make_node("Transpose", ["xf"], ["xft"], perm=[0, 2, 1]),
    ]
    if n == 1:
        inits.append(_ints("r2", [m, c]))
        nodes += [
            helper.make_node("MatMul", ["gf", "xft"], ["p"]),
            helper.make_node("Reshape", ["p", "wshape"], ["dw"]),
        ]
    else:
        nodes += [
            helper.make_node("MatMul", ["gf", "xft"], ["p"]),
            helper.make_node("ReduceSum", ["p", "ax0"], ["ps"], keepdims=0),
            helper.make_node("Reshape", ["ps", "wshape"], ["dw"]),
        ]
    return _model(nodes, inits)


def form_matmul_flat(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """1x1, stride 1: ``[M, N*P] @ [N*P, C]`` after moving the batch next to the positions."""
    inits = [_ints("r2", [0, -1]), _ints("wshape", [m, c, 1, 1])]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2, 3]),
        helper.make_node("Transpose", ["g"], ["gt"], perm=[1, 0, 2, 3]),
        helper.make_node("Reshape", ["xt", "r2"], ["xf"]),
        helper.make_node("Reshape", ["gt", "r2"], ["gf"]),
        helper.make_node("Gemm", ["gf", "xf"], ["p"], transB=1),
        helper.make_node("Reshape", ["p", "wshape"], ["dw"]),
    ]
    return _model(nodes, inits)


def _grouped_product(
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    cols: str,
    n: int,
    c: int,
    m: int,
    kd: Kind,
    groups: int,
) -> None:
    """cols [N, C*K, P] and g -> dw [M, C/g, k, k] through a batched MatMul per group."""
    kk = kd.k * kd.k
    inits += [
        _ints("cshape", [n, groups, -1, 0] if False else [n, groups, (c // groups) * kk, -1]),
        _ints("gshape", [n, groups, m // groups, -1]),
        _ints("ax0", [0]),
        _ints("wshape", [m, c // groups, kd.k, kd.k]),
    ]
    nodes += [
        helper.make_node("Reshape", [cols, "cshape"], ["cg"]),
        helper.make_node("Reshape", ["g", "gshape"], ["gg"]),
        helper.make_node("Transpose", ["cg"], ["cgt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["gg", "cgt"], ["p"]),  # [N, g, Mg, Cg*K]
        helper.make_node("ReduceSum", ["p", "ax0"], ["ps"], keepdims=0),
        helper.make_node("Reshape", ["ps", "wshape"], ["dw"]),
    ]


def form_im2col(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """One-hot Conv im2col + batched MatMul per group."""
    kk = kd.k * kd.k
    onehot = np.eye(kk, dtype=np.float32).reshape(kk, 1, kd.k, kd.k)
    inits = [
        numpy_helper.from_array(onehot, "onehot"),
        _ints("single", [-1, 1, h, h]),
        _ints("cols", [n, c * kk, -1]),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "single"], ["xs"]),
        helper.make_node("Conv", ["xs", "onehot"], ["pc"], strides=[kd.s] * 2, pads=[kd.p] * 4),
        helper.make_node("Reshape", ["pc", "cols"], ["cl"]),
    ]
    _grouped_product(nodes, inits, "cl", n, c, m, kd, groups)
    return _model(nodes, inits)


def form_im2col3d(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """The one-hot im2col as a 3-D Conv over a unit axis (onnxruntime does not reorder it to
    its blocked NCHWc layout, which pads the K output channels to 16 and reorders back)."""
    kk = kd.k * kd.k
    onehot = np.eye(kk, dtype=np.float32).reshape(kk, 1, 1, kd.k, kd.k)
    inits = [
        numpy_helper.from_array(onehot, "onehot"),
        _ints("single", [-1, 1, 1, h, h]),
        _ints("cols", [n, c * kk, -1]),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "single"], ["xs"]),
        helper.make_node(
            "Conv", ["xs", "onehot"], ["pc"], strides=[1] + [kd.s] * 2, pads=[0, kd.p, kd.p] * 2
        ),
        helper.make_node("Reshape", ["pc", "cols"], ["cl"]),
    ]
    _grouped_product(nodes, inits, "cl", n, c, m, kd, groups)
    return _model(nodes, inits)


def form_channels(
    n: int, c: int, m: int, h: int, kd: Kind, groups: int, left: bool = False
) -> onnx.ModelProto:
    """The im2col channels first: ``x`` as ``[C, 1, N, H, W]``, the one-hot 3-D Conv with the
    batch on its unit-kernel axis writes ``[C*K, N*P]`` and one GEMM over ``N*P`` (per group a
    batched MatMul) contracts it with ``g [M, N*P]``; ``left``: ``cols @ g [N*P, M]`` (``g``
    channels last) and the small result transposed (onnax's choice up to 64 channels)."""
    kk = kd.k * kd.k
    onehot = np.eye(kk, dtype=np.float32).reshape(kk, 1, 1, kd.k, kd.k)
    inits = [
        numpy_helper.from_array(onehot, "onehot"),
        _ints("single", [c, 1, n, h, h]),
        _ints("wshape", [m, c // groups, kd.k, kd.k]),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2, 3]),
        helper.make_node("Reshape", ["xt", "single"], ["xs"]),
        helper.make_node(
            "Conv", ["xs", "onehot"], ["pc"], strides=[1] + [kd.s] * 2, pads=[0, kd.p, kd.p] * 2
        ),
    ]
    if groups == 1 and left:
        inits += [_ints("cols", [c * kk, -1]), _ints("glast", [-1, m])]
        nodes += [
            helper.make_node("Reshape", ["pc", "cols"], ["cl"]),
            helper.make_node("Transpose", ["g"], ["gt"], perm=[0, 2, 3, 1]),
            helper.make_node("Reshape", ["gt", "glast"], ["gl"]),
            helper.make_node("MatMul", ["cl", "gl"], ["p"]),  # [C*K, M]
            helper.make_node("Transpose", ["p"], ["pt"], perm=[1, 0]),
            helper.make_node("Reshape", ["pt", "wshape"], ["dw"]),
        ]
    elif groups == 1:
        inits += [_ints("cols", [c * kk, -1]), _ints("rows", [m, -1])]
        nodes += [
            helper.make_node("Reshape", ["pc", "cols"], ["cl"]),
            helper.make_node("Transpose", ["g"], ["gt"], perm=[1, 0, 2, 3]),
            helper.make_node("Reshape", ["gt", "rows"], ["gm"]),
            helper.make_node("Gemm", ["gm", "cl"], ["p"], transB=1),  # [M, C*K]
            helper.make_node("Reshape", ["p", "wshape"], ["dw"]),
        ]
    elif left:
        inits += [
            _ints("cols", [groups, (c // groups) * kk, -1]),
            _ints("gsplit", [n, groups, m // groups, -1]),
            _ints("glast", [groups, -1, m // groups]),
        ]
        nodes += [
            helper.make_node("Reshape", ["pc", "cols"], ["cl"]),  # [g, Cg*K, N*P]
            helper.make_node("Reshape", ["g", "gsplit"], ["gs"]),  # [N, g, Mg, P]
            helper.make_node("Transpose", ["gs"], ["gt"], perm=[1, 0, 3, 2]),  # [g, N, P, Mg]
            helper.make_node("Reshape", ["gt", "glast"], ["gl"]),
            helper.make_node("MatMul", ["cl", "gl"], ["p"]),  # [g, Cg*K, Mg]
            helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
            helper.make_node("Reshape", ["pt", "wshape"], ["dw"]),
        ]
    else:
        inits += [
            _ints("cols", [groups, (c // groups) * kk, -1]),
            _ints("rows", [groups, m // groups, -1]),
        ]
        nodes += [
            helper.make_node("Reshape", ["pc", "cols"], ["cl"]),
            helper.make_node("Transpose", ["cl"], ["clt"], perm=[0, 2, 1]),
            helper.make_node("Transpose", ["g"], ["gt"], perm=[1, 0, 2, 3]),
            helper.make_node("Reshape", ["gt", "rows"], ["gm"]),
            helper.make_node("MatMul", ["gm", "clt"], ["p"]),  # [g, Mg, Cg*K]
            helper.make_node("Reshape", ["p", "wshape"], ["dw"]),
        ]
    return _model(nodes, inits)


def form_channels_left(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """:func:`form_channels` with the columns as the MatMul's left operand."""
    return form_channels(n, c, m, h, kd, groups, left=True)


def _shifted_slices(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], h: int, kd: Kind
) -> list[str]:
    """The K strided slices ``x_pad[:, :, qi + s*i, qj + s*j]`` of the padded input."""
    ho = (h + 2 * kd.p - kd.k) // kd.s + 1
    inits += [_ints("pads", [0, 0, kd.p, kd.p, 0, 0, kd.p, kd.p]), _ints("ax", [2, 3])]
    inits += [_ints("sp", [kd.s, kd.s])]
    nodes.append(helper.make_node("Pad", ["x", "pads"], ["xp"]))
    names = []
    for qi in range(kd.k):
        for qj in range(kd.k):
            tag = f"{qi}_{qj}"
            inits += [_ints(f"st{tag}", [qi, qj])]
            inits += [_ints(f"en{tag}", [qi + (ho - 1) * kd.s + 1, qj + (ho - 1) * kd.s + 1])]
            nodes.append(
                helper.make_node("Slice", ["xp", f"st{tag}", f"en{tag}", "ax", "sp"], [f"x{tag}"])
            )
            names.append(f"x{tag}")
    return names


def form_slices(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """Slice-based im2col + batched MatMul per group."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    parts = _shifted_slices(nodes, inits, h, kd)
    inits += [_ints("ax2", [2]), _ints("cols", [n, -1, 0] if False else [n, c * len(parts), -1])]
    for p in parts:
        nodes.append(helper.make_node("Unsqueeze", [p, "ax2"], [f"u{p}"]))
    nodes += [
        helper.make_node("Concat", [f"u{p}" for p in parts], ["cc"], axis=2),  # [N,C,K,Ho,Wo]
        helper.make_node("Reshape", ["cc", "cols"], ["cl"]),
    ]
    _grouped_product(nodes, inits, "cl", n, c, m, kd, groups)
    return _model(nodes, inits)


def form_mulsum(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """Depthwise: one Mul + ReduceSum over (N, Ho, Wo) per kernel offset."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    parts = _shifted_slices(nodes, inits, h, kd)
    inits += [_ints("axr", [0, 2, 3]), _ints("wshape", [c, 1, kd.k, kd.k])]
    for p in parts:
        nodes.append(helper.make_node("Mul", [p, "g"], [f"m{p}"]))
        nodes.append(helper.make_node("ReduceSum", [f"m{p}", "axr"], [f"r{p}"], keepdims=0))
        nodes.append(helper.make_node("Unsqueeze", [f"r{p}", "ax2"], [f"u{p}"]))
    inits.append(_ints("ax2", [1]))
    nodes += [
        helper.make_node("Concat", [f"u{p}" for p in parts], ["cc"], axis=1),  # [C, K]
        helper.make_node("Reshape", ["cc", "wshape"], ["dw"]),
    ]
    return _model(nodes, inits)


def form_im2col_dw(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """Depthwise: one-hot im2col ``[N*C, K, P]``, a batched matrix-vector product with
    ``g [N*C, P, 1]``, summed over the batch."""
    kk = kd.k * kd.k
    onehot = np.eye(kk, dtype=np.float32).reshape(kk, 1, kd.k, kd.k)
    inits = [
        numpy_helper.from_array(onehot, "onehot"),
        _ints("single", [-1, 1, h, h]),
        _ints("r3", [0, 0, -1]),
        _ints("ax", [2]),
        _ints("nck", [n, c, kk]),
        _ints("ax0", [0]),
        _ints("wshape", [c, 1, kd.k, kd.k]),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "single"], ["xs"]),
        helper.make_node("Conv", ["xs", "onehot"], ["pc"], strides=[kd.s] * 2, pads=[kd.p] * 4),
        helper.make_node("Reshape", ["pc", "r3"], ["cl"]),  # [N*C, K, P]
        helper.make_node("Flatten", ["g"], ["gf"], axis=2),  # [N*C, P]
        helper.make_node("Unsqueeze", ["gf", "ax"], ["gu"]),  # [N*C, P, 1]
        helper.make_node("MatMul", ["cl", "gu"], ["p"]),  # [N*C, K, 1]
        helper.make_node("Reshape", ["p", "nck"], ["pr"]),
        helper.make_node("ReduceSum", ["pr", "ax0"], ["ps"], keepdims=0),
        helper.make_node("Reshape", ["ps", "wshape"], ["dw"]),
    ]
    return _model(nodes, inits)


def form_im2col_mulsum(n: int, c: int, m: int, h: int, kd: Kind, groups: int) -> onnx.ModelProto:
    """Depthwise: one-hot im2col ``[N, C, K, P]``, one broadcasting Mul with ``g [N, C, 1, P]``
    and one ReduceSum over ``(N, P)``."""
    kk = kd.k * kd.k
    onehot = np.eye(kk, dtype=np.float32).reshape(kk, 1, kd.k, kd.k)
    inits = [
        numpy_helper.from_array(onehot, "onehot"),
        _ints("single", [-1, 1, h, h]),
        _ints("r4", [n, c, kk, -1]),
        _ints("g4", [n, c, 1, -1]),
        _ints("ax", [0, 3]),
        _ints("wshape", [c, 1, kd.k, kd.k]),
    ]
    nodes = [
        helper.make_node("Reshape", ["x", "single"], ["xs"]),
        helper.make_node("Conv", ["xs", "onehot"], ["pc"], strides=[kd.s] * 2, pads=[kd.p] * 4),
        helper.make_node("Reshape", ["pc", "r4"], ["cl"]),  # [N, C, K, P]
        helper.make_node("Reshape", ["g", "g4"], ["gu"]),  # [N, C, 1, P]
        helper.make_node("Mul", ["cl", "gu"], ["p"]),
        helper.make_node("ReduceSum", ["p", "ax"], ["ps"], keepdims=0),  # [C, K]
        helper.make_node("Reshape", ["ps", "wshape"], ["dw"]),
    ]
    return _model(nodes, inits)


FORMS: dict[str, Callable[..., onnx.ModelProto]] = {
    "im2col_dw": form_im2col_dw,
    "im2col_mulsum": form_im2col_mulsum,
    "conv": form_conv,
    "matmul": form_matmul,
    "matmul_flat": form_matmul_flat,
    "im2col": form_im2col,
    "im2col3d": form_im2col3d,
    "slices": form_slices,
    "mulsum": form_mulsum,
    "channels": form_channels,
    "channels_left": form_channels_left,
}


def forms_for(kd: Kind) -> list[str]:
    if kd.k == 1:
        return ["conv", "matmul"] + (["matmul_flat"] if kd.s == 1 else [])
    if kd.g == 0:
        forms = ["conv", "im2col", "im2col3d", "im2col_dw", "im2col_mulsum", "slices", "mulsum"]
        return [*forms, "channels", "channels_left"]
    if kd.g == 1:
        return ["conv", "im2col", "im2col3d", "slices", "channels", "channels_left"]
    return ["conv", "im2col", "im2col3d", "slices", "channels", "channels_left"]


def _interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # warm up
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_forms(
    kinds: Sequence[str], sizes: Sequence[tuple[int, int]], batches: Sequence[int], rounds: int
) -> None:
    print("== weight-gradient subgraph, ms (median), ratio conv/form ==")
    rng = np.random.default_rng(0)
    for name in kinds:
        kd = KINDS[name]
        for h, c in sizes:
            groups = c if kd.g == 0 else kd.g
            m = c
            ho = (h + 2 * kd.p - kd.k) // kd.s + 1
            for n in batches:
                x = rng.standard_normal((n, c, h, h)).astype(np.float32)
                g = rng.standard_normal((n, m, ho, ho)).astype(np.float32)
                feeds = {"x": x, "g": g}
                SHAPES.update(x=list(x.shape), g=list(g.shape))
                runs: dict[str, Callable[[], object]] = {}
                ref = None
                for form in forms_for(kd):
                    sess = _session(FORMS[form](n, c, m, h, kd, groups))
                    out = sess.run(None, feeds)[0]
                    if ref is None:
                        ref = out
                    else:
                        err = float(np.abs(out - ref).max() / (np.abs(ref).max() + 1e-30))
                        assert err < 1e-4, (name, form, err)
                    runs[form] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)
                med = _interleaved(runs, rounds)
                base = med["conv"]
                cells = "  ".join(f"{f}={1e3 * t:8.2f} ({base / t:5.2f}x)" for f, t in med.items())
                print(f"{name:7s} N={n} {h:3d}x{h:<3d} C={c:4d}  {cells}", flush=True)


# ------------------------------------------------------------------ onnax.grad of a block
def resnet_block(n: int, c: int = 64, h: int = 28) -> ir.Model:
    """A bottleneck with the Conv kinds of resnet/mobilenet/resnext, loss = sum(y * r)."""
    rng = np.random.default_rng(1)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        scale = 1.0 / np.sqrt(np.prod(shape[1:]))
        return numpy_helper.from_array(
            (scale * rng.standard_normal(shape)).astype(np.float32), name
        )

    inits = [
        w("w1", c, c, 1, 1),
        w("w2", c, c, 3, 3),
        w("w3", c, c, 1, 1),
        w("wd", c, 1, 3, 3),
        w("wg", c, c // 4, 3, 3),
        w("ws", 2 * c, c, 3, 3),
        w("wp", 2 * c, c, 1, 1),
        w("r", 2 * c, h // 2, h // 2),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["b1"]),
        helper.make_node("Conv", ["b1", "w2"], ["a2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a2"], ["b2"]),
        helper.make_node("Conv", ["b2", "wd"], ["a3"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("Conv", ["a3", "wg"], ["a4"], pads=[1, 1, 1, 1], group=4),
        helper.make_node("Conv", ["a4", "w3"], ["a5"]),
        helper.make_node("Add", ["a5", "x"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["b5"]),
        helper.make_node("Conv", ["b5", "ws"], ["a6"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["b5", "wp"], ["a7"], strides=[2, 2]),
        helper.make_node("Add", ["a6", "a7"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["y"]),
        helper.make_node("Mul", ["y", "r"], ["yr"]),
        helper.make_node("ReduceSum", ["yr"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", F, [n, c, h, h])],
        [helper.make_tensor_value_info("loss", F, [])],
        inits,
    )
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def _classic_grad(model: ir.Model, weights: list[str]) -> ir.Model:
    """``onnax.grad`` with every weight gradient in the classic form (the form before)."""
    import onnax
    from onnax.rules import _conv_grad

    chosen = _conv_grad.choose_form
    _conv_grad.choose_form = lambda *args: "classic"  # type: ignore[assignment]
    try:
        return onnax.grad(model, weights)
    finally:
        _conv_grad.choose_form = chosen  # type: ignore[assignment]


def bench_block(batches: Sequence[int], rounds: int) -> None:
    import onnax

    print("== onnax.grad of a resnet-like block w.r.t. every weight, over its primal ==")
    for n in batches:
        model = resnet_block(n)
        weights = [v.name for v in model.graph.initializers.values() if v.name != "r"]
        models = {"classic": _classic_grad(model, weights), "new": onnax.grad(model, weights)}
        x = np.random.default_rng(2).standard_normal((n, 64, 28, 28)).astype(np.float32)
        feeds = {"x": x}
        sessions = {"primal": _session(ir.to_proto(model))}
        sessions.update({k: _session(ir.to_proto(m)) for k, m in models.items()})
        outs = {k: s.run(None, feeds) for k, s in sessions.items()}
        for a, b in zip(outs["classic"], outs["new"], strict=True):
            assert np.allclose(a, b, rtol=1e-3, atol=1e-3 * float(np.abs(a).max()))
        med = _interleaved(
            {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sessions.items()}, rounds
        )
        cells = []
        for k, m in models.items():
            ops = [node.op_type for node in m.graph]
            cells.append(
                f"{k}: {1e3 * med[k]:.2f} ms = {med[k] / med['primal']:.2f} x primal, "
                f"{len(ops)} nodes (Conv {ops.count('Conv')}, MatMul {ops.count('MatMul')})"
            )
        print(
            f"N={n}: primal {1e3 * med['primal']:.2f} ms; "
            + "; ".join(cells)
            + f"; classic/new {med['classic'] / med['new']:.2f}",
            flush=True,
        )


# ------------------------------------------------------------------ data gradients
def _data_model(
    nodes: list[onnx.NodeProto], w: np.ndarray, g: list[int], x: list[int]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "dx",
        [helper.make_tensor_value_info("g", F, g)],
        [helper.make_tensor_value_info("dx", F, x)],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3).copy(), "wf"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def bench_data(sizes: Sequence[tuple[int, int]], batches: Sequence[int], rounds: int) -> None:
    """The data gradient of a strided 3x3 Conv (pads 1, stride 2): the ConvTranspose against
    zeros inserted between the cotangent's elements and a stride-1 Conv with the flipped
    weight; and of a stride-1 3x3 Conv: the flipped Conv against the ConvTranspose."""
    print("== data gradient, ms (median), ratio ConvTranspose/form ==")
    rng = np.random.default_rng(0)
    for h, c in sizes:
        for n in batches:
            w = (rng.standard_normal((c, c, 3, 3)) / 30).astype(np.float32)
            for s_ in (2, 1):
                ho = (h + 2 - 3) // s_ + 1
                g = rng.standard_normal((n, c, ho, ho)).astype(np.float32)
                xs = [n, c, h, h]
                forms = {
                    # The end pad that gives back exactly h (the tail no window reads).
                    "convT": [
                        helper.make_node(
                            "ConvTranspose",
                            ["g", "w"],
                            ["dx"],
                            strides=[s_, s_],
                            pads=[1, 1, 1 - (h - 1) % s_, 1 - (h - 1) % s_],
                        )
                    ],
                }
                if s_ == 1:
                    forms["flipped"] = [
                        helper.make_node("Conv", ["g", "wf"], ["dx"], pads=[1, 1, 1, 1])
                    ]
                else:
                    # [N,M,Ho,1,Wo,1] padded to [N,M,Ho,2,Wo,2]: the zeros between the elements.
                    forms["zeros_flipped"] = [
                        helper.make_node("Reshape", ["g", "s6"], ["g6"]),
                        helper.make_node("Pad", ["g6", "p6"], ["z6"]),
                        helper.make_node("Reshape", ["z6", "s4"], ["z"]),
                        helper.make_node(
                            "Conv", ["z", "wf"], ["dx"], pads=[1, 1, 1 + h - 2 * ho, 1 + h - 2 * ho]
                        ),
                    ]
                runs: dict[str, Callable[[], object]] = {}
                ref = None
                for form, nodes in forms.items():
                    m = _data_model(nodes, w, list(g.shape), xs)
                    m.graph.initializer.extend(
                        [
                            _ints("s6", [n, c, ho, 1, ho, 1]),
                            _ints("p6", [0] * 6 + [0, 0, 0, 1, 0, 1]),
                            _ints("s4", [n, c, 2 * ho, 2 * ho]),
                        ]
                    )
                    sess = _session(m)
                    out = sess.run(None, {"g": g})[0]
                    ref = out if ref is None else ref
                    assert out.shape == ref.shape and np.allclose(out, ref, rtol=1e-3, atol=1e-3), (
                        form
                    )
                    runs[form] = lambda sess=sess, g=g: sess.run(None, {"g": g})
                med = _interleaved(runs, rounds)
                base = med["convT"]
                cells = "  ".join(f"{f}={1e3 * t:7.2f} ({base / t:5.2f}x)" for f, t in med.items())
                print(f"stride {s_} N={n} {h:3d}x{h:<3d} C={c:4d}  {cells}", flush=True)


# ------------------------------------------------------------ Linear weight gradients
def _linear_model(nodes: list[onnx.NodeProto], x: list[int], g: list[int]) -> onnx.ModelProto:
    h, o = x[-1], g[-1]
    inits = [_ints("ax0", [0]), _ints("fx", [-1, h]), _ints("fg", [-1, o])]
    graph = helper.make_graph(
        nodes,
        "lin",
        [helper.make_tensor_value_info("x", F, x), helper.make_tensor_value_info("g", F, g)],
        [helper.make_tensor_value_info("dw", F, [h, o])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


LINEAR_FORMS: dict[str, list[onnx.NodeProto]] = {
    # x [B, S, H], g [B, S, O] -> dW [H, O] = sum_{b,s} x[b,s,:]ᵀ g[b,s,:]
    "batched": [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["xt", "g"], ["p"]),
        helper.make_node("ReduceSum", ["p", "ax0"], ["dw"], keepdims=0),
    ],
    "flat_gemm": [
        helper.make_node("Reshape", ["x", "fx"], ["xf"]),
        helper.make_node("Reshape", ["g", "fg"], ["gf"]),
        helper.make_node("Gemm", ["xf", "gf"], ["dw"], transA=1),
    ],
    "flat_matmul": [
        helper.make_node("Reshape", ["x", "fx"], ["xf"]),
        helper.make_node("Reshape", ["g", "fg"], ["gf"]),
        helper.make_node("Transpose", ["xf"], ["xt"], perm=[1, 0]),
        helper.make_node("MatMul", ["xt", "gf"], ["dw"]),
    ],
}


def bench_linear(rounds: int) -> None:
    """Weight gradients of Linear layers: 2-D (Transpose + MatMul against Gemm transA) and over
    ``[B, S, H]`` (a batched MatMul summed over B against one flattened product)."""
    print("== Linear weight gradient dW = xᵀ g, ms (median), ratio batched/form ==")
    rng = np.random.default_rng(0)
    for b, s_, h, o in [
        (1, 8, 512, 512),
        (8, 1, 512, 512),
        (1, 128, 512, 2048),
        (8, 128, 512, 512),
        (8, 128, 512, 2048),
        (8, 197, 384, 1536),
        (32, 16, 64, 64),
    ]:
        x = rng.standard_normal((b, s_, h)).astype(np.float32)
        g = rng.standard_normal((b, s_, o)).astype(np.float32)
        feeds = {"x": x, "g": g}
        runs: dict[str, Callable[[], object]] = {}
        ref = None
        for form, nodes in LINEAR_FORMS.items():
            sess = _session(_linear_model(nodes, list(x.shape), list(g.shape)))
            out = sess.run(None, feeds)[0]
            ref = out if ref is None else ref
            assert np.allclose(out, ref, rtol=1e-3, atol=1e-3 * float(np.abs(ref).max()))
            runs[form] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)
        med = _interleaved(runs, rounds)
        base = med["batched"]
        cells = "  ".join(f"{f}={1e3 * t:7.2f} ({base / t:5.2f}x)" for f, t in med.items())
        print(f"B={b:2d} S={s_:3d} H={h:4d} O={o:4d}  {cells}", flush=True)


TORCH_SNIPPET = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
cases = json.loads(sys.argv[1])
out = []
for name, n, c, m, h, k, s, p, groups, rounds in cases:
    x = torch.randn(n, c, h, h)
    ho = (h + 2 * p - k) // s + 1
    g = torch.randn(n, m, ho, ho)
    fn = lambda: torch.nn.grad.conv2d_weight(x, (m, c // groups, k, k), g, s, p, 1, groups)
    fn()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    out.append(statistics.median(ts))
print(json.dumps(out))
"""


def bench_torch(
    python: str,
    kinds: Sequence[str],
    sizes: Sequence[tuple[int, int]],
    batches: Sequence[int],
    rounds: int,
) -> None:
    cases = []
    for name in kinds:
        kd = KINDS[name]
        for h, c in sizes:
            groups = c if kd.g == 0 else kd.g
            for n in batches:
                cases.append([name, n, c, c, h, kd.k, kd.s, kd.p, groups, rounds])
    try:
        done = subprocess.run(
            [python, "-c", TORCH_SNIPPET, json.dumps(cases)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"torch comparison skipped: {exc}")
        return
    print("== torch.nn.grad.conv2d_weight, 1 thread, ms (median) ==")
    for case, t in zip(cases, json.loads(done.stdout), strict=True):
        name, n, c, _, h = case[:5]
        print(f"{name:7s} N={n} {h:3d}x{h:<3d} C={c:4d}  torch={1e3 * t:8.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--sizes", default="56x64,28x128,14x256,7x512")
    parser.add_argument("--no-forms", action="store_true", help="skip the subgraph forms")
    parser.add_argument("--no-block", action="store_true", help="skip onnax.grad of the block")
    parser.add_argument("--no-linear", action="store_true", help="skip the Linear forms")
    parser.add_argument("--no-data", action="store_true", help="skip the data gradients")
    parser.add_argument("--torch-python", default=None)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    kinds = args.kinds.split(",")
    sizes = [(int(h), int(c)) for h, c in (s.split("x") for s in args.sizes.split(","))]
    if not args.no_forms:
        bench_forms(kinds, sizes, batches, args.rounds)
    if not args.no_block:
        bench_block(batches, args.rounds)
    if not args.no_data:
        bench_data(sizes, batches, args.rounds)
    if not args.no_linear:
        bench_linear(args.rounds)
    if args.torch_python:
        bench_torch(args.torch_python, kinds, sizes, batches, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
