"""Random operators: Dropout, RandomNormalLike, RandomUniformLike, Bernoulli, Multinomial.

Inference Dropout copies its input, so its tangent is the input's; training mode is refused by
the jvp rule (a transformed model cannot reproduce the mask). The other operators have no jvp
rules: a sample on a path that carries a derivative is refused by the linearization with its
own message. Under vmap they follow the ``randomness`` policy of the pass: ``"different"`` draws
an independent sample per example, ``"same"`` draws one sample and shares it ("error", the
default, is refused by the pass before any rule runs; Dropout in training mode refuses it
itself).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from onnax.core.batching import Batcher, refuse_batched
from onnax.core.diagnostics import node_label, op_label
from onnax.core.emit import Emitter
from onnax.core.registry import Args, BatchResult, OpRules, Tangents
from onnax.errors import UnsupportedOperatorError
from onnax.rules._patterns import attributes_of, batch_data, original_input

__all__: list[str] = []


# ------------------------------------------------------------------------------- Dropout
dropout = OpRules("Dropout", since=7)


@dropout.jvp
def _dropout_jvp(em: Emitter, node: ir.Node, tangents: Tangents) -> list[ir.Value | None]:
    """Inference Dropout copies its input; the mask is boolean and has no tangent.

    Training mode is refused: the derivative would be that of the mask drawn in the same run,
    and a transformed model draws its own mask. onnxruntime's seeded Dropout advances its
    generator on every run (measured with onnxruntime 1.32: consecutive runs of one session
    drop different elements), so neither the primal nor its derivative is reproducible, and
    finite differences, which compare runs, could not check one.
    """
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None:
        flag = ir.convenience.get_const_tensor(training)
        if flag is None or bool(flag.numpy().reshape(-1)[0]):
            found = "computed at run time" if flag is None else "the constant true"
            raise UnsupportedOperatorError(
                f"jvp: no derivative rule for {op_label(node)} in training mode at opset "
                f"{em.opset} ({node_label(node)}): its training_mode input {training.name!r} is "
                f"{found}, expected absent or a constant false. Training-mode dropout draws a "
                "random mask, which a transformed model cannot reproduce. Remedy: export the "
                "model for inference (drop training_mode or make it a constant false), or feed "
                "the mask as a model input and multiply by it explicitly."
            )
    return [tangents[0], *[None] * (len(node.outputs) - 1)]


@dropout.batch
def _dropout_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
    """Dropout under vmap.

    In inference (no training_mode, or a constant false) Dropout copies its data and its mask
    is all true, elementwise: it applies to the batched data as it is, without the ratio and
    training inputs, which then do not matter (even batched). In training mode it draws a random
    mask, which follows vmap's randomness policy: "different" draws independent masks (Dropout
    of the batched data), "same" draws one mask for one example and applies it to all.
    """
    training = node.inputs[2] if len(node.inputs) > 2 else None
    flag = ir.convenience.get_const_tensor(training) if training is not None else None
    inference = training is None or (flag is not None and not bool(flag.numpy().reshape(-1)[0]))
    original = original_input(node)
    x = bx.materialize(batch_data(args), batched[0], original)
    n = len(node.outputs)
    if inference:
        outs = bx.op_multi("Dropout", [x], attributes_of(node), num_outputs=n)
        return list(outs), [True] * n
    assert training is not None
    if bx.randomness == "error":
        found = "computed at run time" if flag is None else "the constant true"
        raise UnsupportedOperatorError(
            f"vmap: {op_label(node)} at opset {bx.opset} ({node_label(node)}) may draw a random "
            f"mask inside the mapped function: its training_mode input {training.name!r} is "
            f"{found}. Remedy: choose how, vmap(..., randomness='different') for an independent "
            "mask per example, or randomness='same' for one mask shared by all examples; or "
            "export the model for inference (training_mode absent or a constant false)."
        )
    why = "a training-mode Dropout needs one ratio and one training flag for the whole batch"
    refuse_batched(bx, node, args, batched, {1: "ratio", 2: "training_mode"}, why)
    rest = list(args[1:])
    if bx.randomness == "different":
        outs = bx.op_multi("Dropout", [x, *rest], attributes_of(node), num_outputs=n)
        return list(outs), [True] * n
    # "same": Dropout of ones shaped like one example is the mask scaled by 1 / (1 - ratio).
    assert original.dtype is not None
    shape = bx.unbatched_shape(x, True, original)
    ones = bx.op("Expand", [bx.scalar(1.0, original.dtype), shape])
    scale, mask = bx.op_multi("Dropout", [ones, *rest], attributes_of(node), num_outputs=2)
    out: list[ir.Value | None] = [bx.op("Mul", [x, scale])]
    if n > 1:
        out.append(bx.materialize(mask, False, node.outputs[1]))
    return out, [True] * len(out)


# ------------------------------------------------------------------ RandomNormal/UniformLike
random_like = OpRules(("RandomNormalLike", "RandomUniformLike"))


@random_like.batch
def _like_batch(bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]) -> BatchResult:
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


# ------------------------------------------------------------------------------ Bernoulli
bernoulli = OpRules("Bernoulli", since=15)


@bernoulli.batch
def _bernoulli_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
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


# ---------------------------------------------------------------------------- Multinomial
multinomial = OpRules("Multinomial", since=7)


@multinomial.batch
def _multinomial_batch(
    bx: Batcher, node: ir.Node, args: Args, batched: Sequence[bool]
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
