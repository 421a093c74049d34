"""Random operators under vmap (RandomNormal/Uniform, their Like forms, Bernoulli, Multinomial).

They have no jvp rules: a sample on a path that carries a derivative is refused by the
linearization with its own message. Under vmap they follow the ``randomness`` policy of the pass:
``"different"`` draws an independent sample per example, ``"same"`` draws one sample and shares
it ("error", the default, is refused by the pass before any rule runs).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher
from onnax.core.diagnostics import node_label, op_label
from onnax.core.registry import batch_rules
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of

__all__: list[str] = []

BatchResult = tuple[list[ir.Value | None], list[bool]]


@batch_rules.register("RandomNormalLike", since_version=1)
@batch_rules.register("RandomUniformLike", since_version=1)
def _like_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    (x,), (arg,) = node.inputs, args
    assert x is not None and arg is not None
    if bx.randomness == "different":
        # The batched input has one slot per example, so every example gets its own draws.
        return [bx.op(node.op_type, [arg], attributes_of(node))], [True]
    # One example's worth of draws, shared: the sample depends only on the input's shape.
    template = bx.op("ConstantOfShape", [bx.unbatched_shape(arg, True, x)])
    return [bx.op(node.op_type, [template], attributes_of(node, dtype=_dtype_of(node, x)))], [False]


def _dtype_of(node: ir.Node, x: ir.Value) -> int:
    """The output element type: the ``dtype`` attribute, else the input's type."""
    if "dtype" in node.attributes:
        return node.attributes.get_int("dtype", 1)
    assert x.dtype is not None
    return int(x.dtype)


@batch_rules.register("Bernoulli", since_version=15)
def _bernoulli_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    (p,), (arg,) = node.inputs, args
    assert p is not None and arg is not None
    if bx.randomness == "different":
        return [bx.op("Bernoulli", [arg], attributes_of(node))], [True]
    # Shared draws with per-example probabilities: the same uniforms compared with each p.
    attrs: dict[str, object] = {"dtype": int(p.dtype)} if p.dtype is not None else {}
    if "seed" in node.attributes:
        attrs["seed"] = node.attributes.get_float("seed", 0.0)
    template = bx.op("ConstantOfShape", [bx.unbatched_shape(arg, True, p)])
    uniform = bx.op("RandomUniformLike", [template], attrs)
    hit = bx.op("Less", [uniform, arg])
    return [bx.op("Cast", [hit], {"to": _dtype_of(node, p)})], [True]


@batch_rules.register("Multinomial", since_version=7)
def _multinomial_batch(
    bx: Batcher, node: ir.Node, args: Sequence[ir.Value | None], batched: Sequence[bool]
) -> BatchResult:
    (logits,), (arg,) = node.inputs, args
    assert logits is not None and arg is not None
    if bx.randomness != "different":
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} ({node_label(node)}) with randomness='same' would need the "
            "same draws under different per-example distributions, which Multinomial cannot "
            "express. Use randomness='different', or give the logits in_axes None."
        )
    # [B, b, C] -> [B*b, C]: every row is an independent distribution either way.
    rows = bx.op("Reshape", [arg, bx.ints([-1, 0])])
    samples = bx.op("Multinomial", [rows], attributes_of(node))
    per_example = bx.unbatched_shape(arg, True, logits)
    batch_rows = bx.slice(per_example, [0], [1], [0])
    sample_size = bx.ints([node.attributes.get_int("sample_size", 1)])
    shape = bx.op("Concat", [bx.batch_size, batch_rows, sample_size], {"axis": 0})
    return [bx.op("Reshape", [samples, shape])], [True]
