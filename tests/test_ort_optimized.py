"""Models that onnxruntime itself optimized and saved, transformed by onnax.

onnxruntime's optimizer writes fused ``com.microsoft`` operators (``ORT_ENABLE_EXTENDED``) and, on
x86 CPUs, the ``com.microsoft.nchwc`` blocked layout (``ORT_ENABLE_ALL``) into the model it saves
(``SessionOptions.optimized_model_filepath``). Here the real-model corpus is saved that way at
test time, one exporter per architecture, and grad, jvp and vmap of the saved model are checked
against the float64 PyTorch references of the original (``tests/data/real``), the weights (renamed,
fused and reordered by the optimizer, so without references) against central differences of the
saved model's loss along a random direction. Every derivative must be plain default-domain ONNX:
each contrib operator has a default-domain spelling.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnax
from onnax.rules.nchwc import block_size
from oracles import run
from test_real_models import (
    DATA,
    FLOOR,
    feeds_of,
    first_input,
    matched,
    refs_of,
    rel_err,
    with_loss,
)

LEVELS = {
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# One exporter per architecture, chosen for the fused operators its saved model holds; the
# sets are checked exactly, so an onnxruntime that fuses differently shows here first.
MS = "com.microsoft"
BERT_LIKE = {"FusedMatMul", "SkipLayerNormalization", "Gelu"}
GPT2_LIKE = {"FusedMatMul", "SkipLayerNormalization", "FastGelu"}
MODELS: dict[str, dict[str, set[str]]] = {
    "bert.torchscript.onnx": {"extended": BERT_LIKE, "all": BERT_LIKE},
    "gpt2.dynamo.onnx": {"extended": GPT2_LIKE, "all": GPT2_LIKE},
    "vit.torchscript.onnx": {
        "extended": BERT_LIKE,
        "all": BERT_LIKE | {"nchwc::Conv", "nchwc::ReorderOutput"},
    },
    "resnet18.torchscript.onnx": {
        "extended": {"FusedConv"},
        "all": {
            "nchwc::Conv",
            "nchwc::MaxPool",
            "nchwc::GlobalAveragePool",
            "nchwc::ReorderOutput",
        },
    },
    "convnext_atto.dynamo.onnx": {
        "extended": set(),
        "all": {"nchwc::Conv", "nchwc::ReorderInput", "nchwc::ReorderOutput"},
    },
    "llama.dynamo.onnx": {
        "extended": {"FusedMatMul", "QuickGelu"},
        "all": {"FusedMatMul", "QuickGelu"},
    },
}
TOL = 1e-4  # of the reference's largest entry, as in test_real_models


@functools.cache
def saved(file: str, level: str) -> bytes:
    """The model as onnxruntime optimizes and saves it at ``level``."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = LEVELS[level]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "optimized.onnx"
        options.optimized_model_filepath = str(out)
        ort.InferenceSession(
            onnx.load(str(DATA / file)).SerializeToString(),
            options,
            providers=["CPUExecutionProvider"],
        )
        return onnx.load(str(out)).SerializeToString()


def model_of(file: str, level: str) -> ir.Model:
    return ir.from_proto(onnx.ModelProto.FromString(saved(file, level)))


def contrib_ops(model: ir.Model) -> set[tuple[str, str]]:
    return {
        (n.domain, n.op_type)
        for n in model.graph.all_nodes()
        if n.domain.startswith("com.microsoft")
    }


def check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    err = rel_err(got, want, FLOOR * float(np.max(np.abs(want))))
    assert err <= TOL, f"{what}: max error {err:.2e} of the reference's largest entry"


PARAMS = [
    pytest.param(f, level, id=f"{f.removesuffix('.onnx')}-{level}")
    for f in MODELS
    for level in LEVELS
]


@pytest.mark.parametrize(("file", "level"), PARAMS)
def test_saved_model_holds_the_fused_operators(file: str, level: str) -> None:
    if level == "all" and not block_size():
        pytest.skip("no NCHWc kernels on this CPU: ORT_ENABLE_ALL saves what EXTENDED does")
    found = contrib_ops(model_of(file, level))
    ops = {op if d == MS else f"{d.removeprefix(MS + '.')}::{op}" for d, op in found}
    assert ops == MODELS[file][level]


def float_weights(model: ir.Model) -> list[str]:
    return [
        str(n)
        for n, v in model.graph.initializers.items()
        if v.const_value is not None
        and v.const_value.dtype == ir.DataType.FLOAT
        and v.const_value.shape.rank() > 0
        and n != "loss_weights"
    ]


def loss_model_of(file: str, level: str) -> ir.Model:
    return with_loss(model_of(file, level), refs_of(file)["loss_weights"])


@functools.cache
def full_grad(file: str, level: str) -> list[np.ndarray]:
    """The outputs of grad w.r.t. the input and every float weight of the saved model."""
    model = loss_model_of(file, level)
    grad = onnax.grad(model, [first_input(file), *float_weights(model)], output="loss")
    assert not contrib_ops(grad), contrib_ops(grad)
    return list(run(grad, feeds_of(file)).values())


@pytest.mark.parametrize(("file", "level"), PARAMS)
def test_grad_input_and_weights(file: str, level: str) -> None:
    refs, x = refs_of(file), first_input(file)
    model = loss_model_of(file, level)
    weights = float_weights(model)
    feeds = feeds_of(file)
    outs = full_grad(file, level)
    start = len(model.graph.outputs)
    check(outs[0], refs["output"], f"{file} at {level}: primal")
    check(outs[start], refs["grad_input"], f"{file} at {level}: grad w.r.t. {x}")
    # Weights the optimizer kept are checked against PyTorch's gradients (with the scale floor
    # of test_real_models: a few are zero in exact arithmetic, attention's key bias). Those it
    # fused, folded or reordered have no reference: the gradient is checked by the adjoint
    # identity against a jvp along a random direction of all of them (central differences of
    # these ReLU networks in float32 cross kinks at every usable step size).
    table = matched(file)
    expected = {}
    for n in weights:
        if n in table:
            pname, transposed = table[n]
            ref = refs[f"param_grad/{pname}"]
            expected[n] = np.swapaxes(ref, -1, -2) if transposed else ref
    floor = FLOOR * max(float(np.max(np.abs(r))) for r in [refs["grad_input"], *expected.values()])
    grads = dict(zip(weights, outs[start + 1 :], strict=True))
    for n, want in expected.items():
        err = rel_err(grads[n], want, floor)
        assert err <= TOL, f"{file} at {level}: grad w.r.t. {n}: max error {err:.2e}"
    others = [n for n in weights if n not in expected]
    rng = np.random.default_rng(0)
    direction = {n: rng.standard_normal(grads[n].shape).astype(np.float32) for n in others}
    forward = onnax.jvp(model, [x, *others], ["loss"])
    assert not contrib_ops(forward), contrib_ops(forward)
    tangents = {f"fwd_{n}": v for n, v in direction.items()}
    tangents[f"fwd_{x}"] = np.zeros_like(feeds[x])
    fwd_loss = run(forward, {**feeds, **tangents})["fwd_loss"]
    parts = [np.sum(grads[n].astype(np.float64) * v) for n, v in direction.items()]
    scale = sum(abs(float(p)) for p in parts)
    assert abs(float(fwd_loss) - sum(parts)) <= 1e-4 * scale, (
        f"{file} at {level}: jvp along the weights {float(fwd_loss)}, <grad, v> {sum(parts)}"
    )


@pytest.mark.parametrize(("file", "level"), PARAMS)
def test_jvp(file: str, level: str) -> None:
    refs, x = refs_of(file), first_input(file)
    jvp = onnax.jvp(model_of(file, level), [x])
    assert not contrib_ops(jvp), contrib_ops(jvp)
    outs = list(run(jvp, {**feeds_of(file), f"fwd_{x}": refs["jvp_direction"]}).values())
    check(outs[0], refs["output"], f"{file} at {level}: primal")
    check(outs[1], refs["jvp_output"], f"{file} at {level}: jvp")


@pytest.mark.parametrize(("file", "level"), PARAMS)
def test_vmap(file: str, level: str) -> None:
    refs, x = refs_of(file), first_input(file)
    model = model_of(file, level)
    axes = tuple(0 if i == 0 else None for i, _ in enumerate(model.graph.inputs))
    vm = onnax.vmap(model, in_axes=axes)
    assert not contrib_ops(vm), contrib_ops(vm)
    outs = list(run(vm, {**feeds_of(file), x: refs["vmap_input"]}).values())
    check(outs[0], refs["vmap_output"], f"{file} at {level}: vmap")


# A fused node the transform does not reach keeps its kernel; shape inference must see through it
# (onnax.rules._ort_shapes), or the rules downstream that need a rank refuse: grad w.r.t. the
# last weight alone, with every earlier FusedConv / NCHWc node left as it is.
LATE_WEIGHT = [
    pytest.param("resnet18.torchscript.onnx", "extended", id="resnet18-extended"),
    pytest.param("resnet18.torchscript.onnx", "all", id="resnet18-all"),
    pytest.param("convnext_atto.dynamo.onnx", "all", id="convnext-all"),
    pytest.param("vit.torchscript.onnx", "all", id="vit-all"),
]


@pytest.mark.parametrize(("file", "level"), LATE_WEIGHT)
def test_grad_of_a_late_weight_past_untouched_fused_nodes(file: str, level: str) -> None:
    model = loss_model_of(file, level)
    weights = float_weights(model)
    late = [n for n in weights if model.graph.initializers[n].const_value.shape.rank() > 1][-1]
    grad = onnax.grad(model, [late], output="loss")
    untouched = contrib_ops(grad)
    assert untouched, "every fused node was reached: the case tests nothing"
    got = run(grad, feeds_of(file))[f"grad_{late}"]
    want = full_grad(file, level)[len(model.graph.outputs) + 1 + weights.index(late)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.max(np.abs(want))))


# The onnxruntime.transformers optimizer fuses attention too (Attention with the key counts of
# the attention mask as a 1-D mask_index, BiasGelu, SkipLayerNormalization).
TRANSFORMERS = {
    "bert.torchscript.onnx": {"Attention", "BiasGelu", "SkipLayerNormalization"},
    "distilbert.torchscript.onnx": {"Attention", "BiasGelu", "SkipLayerNormalization"},
}


@functools.cache
def transformers_saved(file: str) -> bytes:
    from onnxruntime.transformers.optimizer import optimize_model

    # the corpus' BERT and DistilBERT: hidden size 32, 2 heads (examples/export_real_models.py)
    opt = optimize_model(
        onnx.load(str(DATA / file)), model_type="bert", num_heads=2, hidden_size=32, opt_level=0
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "optimized.onnx"
        opt.save_model_to_file(str(out))
        return onnx.load(str(out)).SerializeToString()


@pytest.mark.parametrize("file", list(TRANSFORMERS))
def test_transformers_optimizer_output(file: str) -> None:
    refs, x = refs_of(file), first_input(file)
    model = ir.from_proto(onnx.ModelProto.FromString(transformers_saved(file)))
    assert {op for _, op in contrib_ops(model)} == TRANSFORMERS[file]
    loss = with_loss(model, refs["loss_weights"])
    grad = onnax.grad(loss, [x], output="loss")
    jvp = onnax.jvp(model, [x])
    axes = tuple(0 if i == 0 else None for i, _ in enumerate(model.graph.inputs))
    vm = onnax.vmap(model, in_axes=axes)
    for derived in (grad, jvp, vm):
        assert not contrib_ops(derived), contrib_ops(derived)
    feeds = feeds_of(file)
    check(run(grad, feeds)[f"grad_{x}"], refs["grad_input"], f"{file}: grad")
    outs = list(run(jvp, {**feeds, f"fwd_{x}": refs["jvp_direction"]}).values())
    check(outs[0], refs["output"], f"{file}: primal")
    check(outs[1], refs["jvp_output"], f"{file}: jvp")
    batched = list(run(vm, {**feeds, x: refs["vmap_input"]}).values())
    check(batched[0], refs["vmap_output"], f"{file}: vmap")
