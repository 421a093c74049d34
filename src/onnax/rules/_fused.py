"""Pieces shared by the lowerings of onnxruntime's fused operators (com.microsoft, nchwc).

onnxruntime's optimizer folds an activation into the operator before it (``FusedConv``,
``FusedGemm``, ``com.microsoft.nchwc::Conv``). Its kernels apply the activation through MLAS,
which knows Relu, LeakyRelu, Tanh, Sigmoid (``Logistic``), Clip and HardSigmoid; each is spelled
here with the default-domain operator of the same name, whose rules the expansion then uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.errors import UnsupportedOperatorError

__all__ = ["ACTIVATIONS", "activation", "layer_norm", "refuse", "rms_norm", "typed"]


def typed(value: ir.Value, like: ir.Value) -> ir.Value:
    """``value`` given the element type of ``like``, for constants built after it.

    Emitted values carry no type until shape inference runs on the expansion; the lowerings
    here only emit type-preserving operators, so the operand's type is the result's.
    """
    if like.dtype is not None:
        value.dtype = like.dtype
    return value


ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")
"""The activations onnxruntime fuses into Conv and Gemm (MLAS activation kinds)."""


def refuse(node: ir.Node, what: str, remedy: str) -> UnsupportedOperatorError:
    """The error of a lowering that meets a form of the operator it does not reproduce."""
    return UnsupportedOperatorError(
        f"lowering of {op_label(node)} ({node_label(node)}): {what}. Remedy: {remedy}."
    )


def activation(
    em: Emitter, node: ir.Node, x: ir.Value, name: str, params: Sequence[float]
) -> ir.Value:
    """``x`` through the fused activation ``name`` with its parameters (``""``: none).

    Args:
        em: The emitter.
        node: The fused node (for messages).
        x: The pre-activation value.
        name: The activation attribute (``Relu``, ``LeakyRelu``, ...).
        params: Its parameters in onnxruntime's order (LeakyRelu: alpha; Clip: min, max;
            HardSigmoid: alpha, beta).
    """
    if not name:
        return x

    def param(i: int, default: float) -> float:
        return float(params[i]) if len(params) > i else default

    if name in ("Relu", "Tanh", "Sigmoid"):
        return em.op(name, [x])
    if name == "LeakyRelu":
        return em.op("LeakyRelu", [x], {"alpha": param(0, 0.01)})
    if name == "HardSigmoid":
        return em.op("HardSigmoid", [x], {"alpha": param(0, 0.2), "beta": param(1, 0.5)})
    if name == "Clip" and len(params) >= 2:
        if em.opset >= 11:
            low, high = em.scalar(params[0], like=x), em.scalar(params[1], like=x)
            return em.op("Clip", [x, low, high])
        return em.op("Clip", [x], {"min": float(params[0]), "max": float(params[1])})
    raise refuse(
        node,
        f"fused activation {name!r} with parameters {list(params)} is not one onnxruntime's "
        f"kernels apply (expected one of {', '.join(ACTIVATIONS)}; Clip with min and max)",
        "re-save the model at a lower optimization level (ORT_ENABLE_BASIC keeps the "
        "activation a node of its own)",
    )


def _axes(node: ir.Node, x: ir.Value, axis: int) -> list[int]:
    """The normalised axes ``axis..rank-1``, negative so that no rank is needed when it is."""
    if axis < 0:
        return list(range(axis, 0))
    rank = x.shape.rank() if x.shape is not None else None
    if rank is None:
        raise refuse(
            node,
            f"axis {axis} is non-negative and the rank of {x.name!r} is unknown",
            "give the input a shape of known rank (onnx.shape_inference, or value_info)",
        )
    return list(range(axis - rank, 0))


def layer_norm(
    em: Emitter,
    node: ir.Node,
    x: ir.Value,
    scale: ir.Value | None,
    bias: ir.Value | None,
    *,
    axis: int,
    epsilon: float,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``(y, mean, inv_std)`` of layer normalisation over ``axis..rank-1`` (kept dims).

    Spelled with ReduceMean rather than LayerNormalization, which exists only from opset 17
    (and before that is onnxruntime's own operator of the same name).
    """
    axes = _axes(node, x, axis)
    mean = em.reduce("ReduceMean", x, axes, keepdims=True)
    centred = em.op("Sub", [x, mean])
    var = em.reduce("ReduceMean", em.op("Mul", [centred, centred]), axes, keepdims=True)
    inv_std = em.op(
        "Reciprocal", [em.op("Sqrt", [em.op("Add", [var, em.scalar(epsilon, like=x)])])]
    )
    y = em.op("Mul", [centred, inv_std])
    if scale is not None:
        y = em.op("Mul", [y, scale])
    if bias is not None:
        y = em.op("Add", [y, bias])
    return y, mean, inv_std


def rms_norm(
    em: Emitter, node: ir.Node, x: ir.Value, scale: ir.Value | None, *, axis: int, epsilon: float
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``(y, mean_square, inv_rms)`` of root-mean-square normalisation over ``axis..rank-1``."""
    axes = _axes(node, x, axis)
    mean_square = em.reduce("ReduceMean", em.op("Mul", [x, x]), axes, keepdims=True)
    inv_rms = em.op(
        "Reciprocal",
        [em.op("Sqrt", [em.op("Add", [mean_square, em.scalar(epsilon, like=x)])])],
    )
    y = em.op("Mul", [x, inv_rms])
    if scale is not None:
        y = em.op("Mul", [y, scale])
    return y, mean_square, inv_rms
