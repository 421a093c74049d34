"""onnxruntime's fused operators (``com.microsoft``), as its optimizer writes them into saved models.

``SessionOptions.optimized_model_filepath`` at ``ORT_ENABLE_EXTENDED`` or above, and the
``onnxruntime.transformers`` optimizer, fold chains of ONNX operators into these. Each is covered
by a *lowering* that writes the chain back out in default-domain operators: the expansion pass
applies it to the nodes a transform reaches, so that the derivative (and the batched model) is
plain ONNX, differentiated and batched by the rules of the primitives, while nodes the transform
does not reach keep their fused kernels.

Covered: FusedMatMul, Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd, FusedGemm, FusedConv,
SkipLayerNormalization, SkipSimplifiedLayerNormalization and onnxruntime's default-domain
SimplifiedLayerNormalization (which onnx.checker does not know: ``prepare`` checks the rest of
the model around it); Attention and MultiHeadAttention are in :mod:`onnax.rules.ms_attention`,
the NCHWc layout in :mod:`onnax.rules.nchwc`. The formulas follow onnxruntime's ``docs/ContribOperators.md`` and
its CPU kernels; ``tests/rules/test_microsoft.py`` checks each lowered primal against the kernel.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.registry import OpRules
from onnax.rules._fused import activation, layer_norm, refuse, rms_norm, typed

__all__ = ["MS"]

MS = "com.microsoft"


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _present(node: ir.Node, i: int) -> ir.Value:
    v = _input(node, i)
    if v is None:
        raise refuse(node, f"required input {i} is missing", "give the node its input")
    return v


def _plus(em: Emitter, x: ir.Value, other: ir.Value | None) -> ir.Value:
    return x if other is None else typed(em.op("Add", [x, other]), x)


def _erf_gelu(em: Emitter, x: ir.Value) -> ir.Value:
    # 0.5 x (1 + erf(x / sqrt 2)), the exact form of onnxruntime's Gelu kernel
    scaled = em.op("Mul", [x, em.scalar(1.0 / math.sqrt(2.0), like=x)])
    cdf = em.op("Add", [em.scalar(1.0, like=x), em.op("Erf", [scaled])])
    return em.op("Mul", [em.op("Mul", [x, em.scalar(0.5, like=x)]), cdf])


# --------------------------------------------------------------------------- activations
gelu = OpRules("Gelu", since=1, domain=MS)


@gelu.lowering
def _gelu(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    return [_erf_gelu(em, _present(node, 0))]


bias_gelu = OpRules("BiasGelu", since=1, domain=MS)


@bias_gelu.lowering
def _bias_gelu(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    return [_erf_gelu(em, _plus(em, _present(node, 0), _present(node, 1)))]


fast_gelu = OpRules("FastGelu", since=1, domain=MS)


@fast_gelu.lowering
def _fast_gelu(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = X + bias (the optional input 1)
    x = _plus(em, _present(node, 0), _input(node, 1))
    cube = em.op("Mul", [em.op("Mul", [x, x]), x])
    inner = em.op("Add", [x, em.op("Mul", [cube, em.scalar(0.044715, like=x)])])
    arg = em.op("Mul", [inner, em.scalar(math.sqrt(2.0 / math.pi), like=x)])
    cdf = em.op("Add", [em.scalar(1.0, like=x), em.op("Tanh", [arg])])
    return [em.op("Mul", [em.op("Mul", [x, em.scalar(0.5, like=x)]), cdf])]


quick_gelu = OpRules("QuickGelu", since=1, domain=MS)


@quick_gelu.lowering
def _quick_gelu(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    x = _present(node, 0)
    alpha = node.attributes.get_float("alpha", 1.702)
    gate = em.op("Sigmoid", [em.op("Mul", [x, em.scalar(alpha, like=x)])])
    return [em.op("Mul", [x, gate])]


bias_add = OpRules("BiasAdd", since=1, domain=MS)


@bias_add.lowering
def _bias_add(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    x, bias, skip = _present(node, 0), _present(node, 1), _present(node, 2)
    return [em.op("Add", [em.op("Add", [x, bias]), skip])]


# ----------------------------------------------------------------- matrix products, conv
fused_matmul = OpRules("FusedMatMul", since=1, domain=MS)


def _last_two_swapped(em: Emitter, node: ir.Node, v: ir.Value) -> ir.Value:
    rank = v.shape.rank() if v.shape is not None else None
    if rank is None:
        raise refuse(
            node,
            f"a transposed operand {v.name!r} has unknown rank",
            "give the operand a shape of known rank (value_info)",
        )
    if rank < 2:
        return v  # onnxruntime ignores trans on a vector operand
    perm = [*range(rank - 2), rank - 1, rank - 2]
    return em.transpose(v, perm)


@fused_matmul.lowering
def _fused_matmul(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    a, b = _present(node, 0), _present(node, 1)
    like, attrs = a, node.attributes
    for batch in ("transBatchA", "transBatchB"):
        if attrs.get_int(batch, 0):
            raise refuse(
                node,
                f"{batch}=1 is not lowered (onnax reproduces transA, transB and alpha)",
                "re-save the model at ORT_ENABLE_BASIC, which leaves MatMul and Transpose apart",
            )
    if attrs.get_int("transA", 0):
        a = _last_two_swapped(em, node, a)
    if attrs.get_int("transB", 0):
        b = _last_two_swapped(em, node, b)
    y = em.op("MatMul", [a, b])
    alpha = attrs.get_float("alpha", 1.0)
    if alpha != 1.0:
        y = em.op("Mul", [y, em.scalar(alpha, like=like)])
    return [y]


fused_gemm = OpRules("FusedGemm", since=1, domain=MS)


@fused_gemm.lowering
def _fused_gemm(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    attrs = node.attributes
    gemm = em.op(
        "Gemm",
        list(node.inputs[:3]),
        {
            "alpha": attrs.get_float("alpha", 1.0),
            "beta": attrs.get_float("beta", 1.0),
            "transA": attrs.get_int("transA", 0),
            "transB": attrs.get_int("transB", 0),
        },
    )
    typed(gemm, _present(node, 0))
    params = [
        attrs.get_float(name, default)
        for name, default in (("activation_alpha", 0.01), ("activation_beta", 0.5))
    ]
    name = attrs.get_string("activation", "")
    if name == "HardSigmoid":
        params = [attrs.get_float("activation_alpha", 0.2), attrs.get_float("activation_beta", 0.5)]
    elif name == "Clip":
        raise refuse(node, "FusedGemm carries no Clip bounds", "re-save at ORT_ENABLE_BASIC")
    return [activation(em, node, gemm, name, params)]


fused_conv = OpRules("FusedConv", since=1, domain=MS)

CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
"""The Conv attributes a fused convolution carries over (the rest configure the fusion)."""


def conv_attributes(node: ir.Node) -> dict[str, object]:
    """The default-domain Conv attributes of a fused convolution node."""
    return {k: a.value for k, a in node.attributes.items() if k in CONV_ATTRIBUTES}


@fused_conv.lowering
def _fused_conv(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # activation(Conv(X, W, B) + Z), Z the optional input 3 (a fused residual Add)
    x = _present(node, 0)
    conv = typed(em.op("Conv", list(node.inputs[:3]), conv_attributes(node)), x)
    y = _plus(em, conv, _input(node, 3))
    params = node.attributes.get_floats("activation_params", [])
    return [activation(em, node, y, node.attributes.get_string("activation", ""), params)]


# ------------------------------------------------------------------------ normalisation
skip_ln = OpRules("SkipLayerNormalization", since=1, domain=MS)

SKIP_EPSILON = 1e-12
"""onnxruntime's default epsilon of the Skip*LayerNormalization schemas."""


def _skip_sum(em: Emitter, node: ir.Node, bias_index: int) -> ir.Value:
    x = _present(node, 0)
    s = typed(em.op("Add", [x, _present(node, 1)]), x)
    return _plus(em, s, _input(node, bias_index))


@skip_ln.lowering
def _skip_layer_norm(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # (input + skip + bias) layer-normalised over the last axis; outputs: output, mean,
    # inv_std_var, input_skip_bias_sum
    s = _skip_sum(em, node, 4)
    epsilon = node.attributes.get_float("epsilon", SKIP_EPSILON)
    y, mean, inv_std = layer_norm(
        em, node, s, _present(node, 2), _input(node, 3), axis=-1, epsilon=epsilon
    )
    return [y, mean, inv_std, s]


skip_rms = OpRules("SkipSimplifiedLayerNormalization", since=1, domain=MS)


@skip_rms.lowering
def _skip_simplified_layer_norm(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # inputs input, skip, gamma, bias; outputs output, mean (unused), inv_std_var, sum
    s = _skip_sum(em, node, 3)
    epsilon = node.attributes.get_float("epsilon", SKIP_EPSILON)
    y, _, inv_rms = rms_norm(em, node, s, _present(node, 2), axis=-1, epsilon=epsilon)
    return [y, None, inv_rms, s]


# onnxruntime registers SimplifiedLayerNormalization in the default domain (an operator of its
# own, not an ONNX one), where its optimizer writes it for T5 and LLaMA-style RMSNorm.
simplified_ln = OpRules("SimplifiedLayerNormalization", since=1)


@simplified_ln.lowering
def _simplified_layer_norm(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    attrs = node.attributes
    y, _, inv_rms = rms_norm(
        em,
        node,
        _present(node, 0),
        _input(node, 1),
        axis=attrs.get_int("axis", -1),
        epsilon=attrs.get_float("epsilon", 1e-5),
    )
    return [y, inv_rms]
