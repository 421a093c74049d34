"""onnxruntime's fused attention (``com.microsoft::Attention``, ``MultiHeadAttention``).

Written by the ``onnxruntime.transformers`` optimizer for BERT- and GPT-style models. The
lowerings reproduce onnxruntime's CPU kernels for the forms they run without a cache: projections
(Attention) or separate query, key and value (MultiHeadAttention, 3-D ``[B, S, D]`` each), a
2-D key padding mask ``[B, L]`` (1 keeps a key, 0 masks it), an additive ``attention_bias``, and
``unidirectional`` (causal). A masked score is *replaced* by ``mask_filter_value`` (default
-10000), as the kernels do, before the softmax over the keys. Past/present key-value caches,
packed or 1-D mask formats and rotary embeddings are refused with a message.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from onnax.core.emit import Emitter
from onnax.core.registry import OpRules
from onnax.rules._fused import refuse, typed

__all__: list[str] = []

MS = "com.microsoft"


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


def _refuse_inputs(node: ir.Node, names: dict[int, str]) -> None:
    for i, name in names.items():
        if _input(node, i) is not None:
            raise refuse(
                node,
                f"input {i} ({name}) is given; the lowering covers attention without a cache",
                "export the model without past key/values, or leave the node out of the transform",
            )


def _split(em: Emitter, x: ir.Value, sizes: Sequence[int], axis: int) -> tuple[ir.Value, ...]:
    if em.opset >= 13:
        return em.op_multi("Split", [x, em.ints(sizes)], {"axis": axis}, num_outputs=len(sizes))
    return em.op_multi("Split", [x], {"axis": axis, "split": list(sizes)}, num_outputs=len(sizes))


def _heads(em: Emitter, v: ir.Value, heads: int) -> ir.Value:
    """``[B, S, N*h]`` as ``[B, N, S, h]``."""
    split = em.op("Reshape", [v, em.ints([0, 0, heads, -1])])
    return typed(em.transpose(split, [0, 2, 1, 3]), v)


def _key_mask(em: Emitter, node: ir.Node, mask: ir.Value, keys: ir.Value) -> ir.Value:
    """``[B, 1, 1, L]``: which keys a query may see.

    A 2-D mask ``[B, L]`` keeps the keys where it is positive; a 1-D one ``[B]`` holds each
    example's number of keys (right padding, as the ``onnxruntime.transformers`` optimizer
    writes ``ReduceSum`` of the attention mask).
    """
    rank = mask.shape.rank() if mask.shape is not None else None
    if rank == 2:
        zero = em.const(np.zeros((), mask.dtype.numpy()))  # type: ignore[union-attr]
        return em.unsqueeze(em.op("Greater", [mask, zero]), [1, 2])
    if rank == 1:
        count = em.slice(em.op("Shape", [keys]), [2], [3], [0])  # L, from [B, N, L, h]
        positions = em.op("Range", [em.ints([0]), count, em.ints([1])])
        lengths = em.op("Cast", [mask], {"to": ir.DataType.INT64})
        valid = em.op("Less", [em.unsqueeze(positions, [0]), em.unsqueeze(lengths, [1])])
        return em.unsqueeze(valid, [1, 2])
    raise refuse(
        node,
        f"the mask has rank {rank}; the lowering reads a key padding mask [batch, keys] or "
        "key counts [batch]",
        "give the mask as [batch, keys] with 1 for kept keys",
    )


def _attend(
    em: Emitter,
    node: ir.Node,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    *,
    heads: int,
    head_size: int,
    key_mask: ir.Value | None,
    bias: ir.Value | None,
) -> ir.Value:
    """softmax(Q K^T scale + bias, masked) V, back as ``[B, S, N*hv]``."""
    attrs = node.attributes
    scale = attrs.get_float("scale", 0.0) or 1.0 / math.sqrt(head_size)
    qh, kh, vh = _heads(em, q, heads), _heads(em, k, heads), _heads(em, v, heads)
    scores = em.op("MatMul", [qh, em.transpose(kh, [0, 1, 3, 2])])
    scores = typed(em.op("Mul", [scores, em.scalar(scale, like=q)]), q)
    if bias is not None:
        scores = typed(em.op("Add", [scores, bias]), q)
    keep: ir.Value | None = None
    if key_mask is not None:
        keep = _key_mask(em, node, key_mask, kh)
    if attrs.get_int("unidirectional", 0):
        # key j is visible from query i when j <= i (no cache: the keys are the queries)
        shape = em.op("Shape", [scores])
        square = em.op(
            "ConstantOfShape",
            [em.slice(shape, [2], [4], [0])],
            {"value": ir.tensor(np.ones(1, np.int64))},
        )
        causal = em.op("Cast", [em.op("Trilu", [square], {"upper": 0})], {"to": ir.DataType.BOOL})
        keep = causal if keep is None else em.op("And", [keep, causal])
    if keep is not None:
        fill = em.scalar(attrs.get_float("mask_filter_value", -10000.0), like=q)
        scores = typed(em.op("Where", [keep, scores, fill]), q)
    weights = em.op("Softmax", [scores], {"axis": -1})
    context = em.op("MatMul", [weights, vh])
    merged = em.transpose(context, [0, 2, 1, 3])
    return em.op("Reshape", [merged, em.ints([0, 0, -1])])


attention = OpRules("Attention", since=1, domain=MS)


@attention.lowering
def _attention(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # inputs: input, weights, bias, mask_index, past, attention_bias, past_sequence_length
    _refuse_inputs(node, {4: "past", 6: "past_sequence_length"})
    x, w = _input(node, 0), _input(node, 1)
    if x is None or w is None:
        raise refuse(node, "input or weights is missing", "give the node both")
    attrs = node.attributes
    heads = attrs.get_int("num_heads", 0)
    if attrs.get_int("do_rotary", 0) or attrs.get_int("past_present_share_buffer", 0):
        raise refuse(node, "rotary or shared-buffer attention is not lowered", "re-export without")
    width = w.shape[1] if w.shape is not None and w.shape.rank() == 2 else None
    sizes = attrs.get_ints("qkv_hidden_sizes", [])
    if not sizes and isinstance(width, int):
        sizes = [width // 3] * 3
    if len(sizes) != 3 or heads <= 0:
        raise refuse(
            node,
            f"num_heads={heads} and qkv_hidden_sizes={sizes} (weights of width {width})",
            "give num_heads, and a static weight width or qkv_hidden_sizes",
        )
    qkv = typed(em.op("MatMul", [x, w]), x)
    if _input(node, 2) is not None:
        qkv = typed(em.op("Add", [qkv, node.inputs[2]]), x)
    q, k, v = _split(em, qkv, sizes, -1)
    for part in (q, k, v):
        typed(part, x)
    out = _attend(
        em,
        node,
        q,
        k,
        v,
        heads=heads,
        head_size=sizes[0] // heads,
        key_mask=_input(node, 3),
        bias=_input(node, 5),
    )
    return [out, None]


mha = OpRules("MultiHeadAttention", since=1, domain=MS)


@mha.lowering
def _multi_head_attention(em: Emitter, node: ir.Node) -> list[ir.Value | None]:
    # inputs: query, key, value, bias, key_padding_mask, attention_bias, past_key, past_value
    _refuse_inputs(node, {6: "past_key", 7: "past_value"})
    q, k, v = _input(node, 0), _input(node, 1), _input(node, 2)
    if (
        q is None
        or k is None
        or v is None
        or any(t.shape is None or t.shape.rank() != 3 for t in (q, k, v))
    ):
        raise refuse(
            node,
            "query, key and value are not all given as 3-D [batch, sequence, hidden]",
            "give separate 3-D query, key and value (packed forms are not lowered)",
        )
    heads = node.attributes.get_int("num_heads", 0)
    hidden = q.shape[2]  # type: ignore[index]
    hidden_v = v.shape[2]  # type: ignore[index]
    if heads <= 0 or not isinstance(hidden, int) or not isinstance(hidden_v, int):
        raise refuse(
            node, f"num_heads={heads} with hidden size {hidden}", "give static hidden sizes"
        )
    bias = _input(node, 3)
    if bias is not None:
        qb, kb, vb = _split(em, bias, [hidden, hidden, hidden_v], 0)
        q = typed(em.op("Add", [q, qb]), q)
        k = typed(em.op("Add", [k, kb]), q)
        v = typed(em.op("Add", [v, vb]), q)
    out = _attend(
        em,
        node,
        q,
        k,
        v,
        heads=heads,
        head_size=hidden // heads,
        key_mask=_input(node, 4),
        bias=_input(node, 5),
    )
    return [out, None, None]
