"""Exports the real-model corpus that tests/test_real_models.py differentiates, with references.

Run with a Python that has torch, transformers, timm and onnxscript (the tests need none of them):

    python examples/export_real_models.py [--out tests/data/real] [--only gpt2,resnet18]

Each architecture is a small random-weight configuration of a model users hold (hidden 32-64,
two layers, 32 px images), seeded, in eval mode. Every parameter is redrawn from a seeded normal
so that no two weights are equal (LayerNorm's ones, biases' zeros): the exported initializers are
then matched to the PyTorch parameters by value, whatever the exporter renamed or transposed.
Three exports per architecture, weights embedded (the files are tens of kilobytes):

* ``<arch>.dynamo.onnx``: ``torch.onnx.export(..., dynamo=True)``, opset 18, static shapes;
* ``<arch>.torchscript.onnx``: ``dynamo=False``, opset 17 (what most files in the wild are);
* ``<arch>.dynbatch.onnx``: the dynamo export with a symbolic batch dimension.

An exporter that fails on an architecture is reported and skipped. The dynamo exporter's per-node
stack traces are dropped (more than half of each file); nothing else is changed.

``<arch>.npz`` holds float64 PyTorch references computed on the same weights (the float32 values,
widened), for the scalar loss ``sum(y * r)`` of the single output ``y``:

* ``input/<name>``: the example inputs (float32 or int64), batch 2; ``loss_weights``: ``r``;
* ``output``: ``y``; ``grad_input``: d loss / d first input; ``jvp_direction``, ``jvp_output``:
  a seeded tangent ``v`` of the first input and ``J v``; ``hvp_output``: the derivative of
  ``grad_input`` along ``v`` (forward over reverse);
* ``vmap_input``: K perturbed copies of the first input stacked on a new axis 0 (other inputs
  shared); ``vmap_output``: ``y`` of each;
* ``param_grad/<parameter>``: d loss / d parameter; ``param_per_example/<parameter>``: d loss_k /
  d parameter for each of the K examples (stored float32: K times the weights, and exact to 6e-8);
* ``<export>/matched``: JSON ``{initializer: [parameter, transposed]}`` for every float
  initializer of ``<arch>.<export>.onnx`` whose value is a parameter (or its transpose, as
  TorchScript's constant folding stores Linear weights). ``<export>/buffers``: the initializers
  that are buffers (BatchNorm statistics, not weights). The others (constant-folded slices such
  as GPT-2's position embedding) are covered by finite differences in the tests.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from onnx.external_data_helper import set_external_data
from torch import nn

# The torchvision wheel in a CPU-only venv may carry CUDA kernels that cannot load; timm imports
# torchvision, whose import registers fake kernels for these two operators and fails when they
# were never defined. Defining their schemas first lets timm import (no model here uses them).
try:
    import torchvision  # noqa: F401
except (ImportError, RuntimeError):
    _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")
    _TORCHVISION_SCHEMAS.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_SCHEMAS.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

import transformers

BATCH = 2
SEQ = 8
PIXELS = 32
EXAMPLES = 2  # K of the per-example references


class Text(nn.Module):
    """A transformers base model as users export it: embeddings in, last hidden state out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(inputs_embeds=inputs_embeds, attention_mask=attention_mask)
        return out.last_hidden_state


class Image(nn.Module):
    """An image model: pixels in, one tensor (logits or the last hidden state) out."""

    def __init__(self, model: nn.Module, hidden_state: bool = False) -> None:
        super().__init__()
        self.model = model
        self.hidden_state = hidden_state

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if self.hidden_state:
            return self.model(pixel_values=pixel_values).last_hidden_state
        return self.model(pixel_values)


@dataclass
class Arch:
    name: str
    build: Callable[[], nn.Module]
    text: bool


def _tf_config(cls: type, **kwargs: object) -> object:
    config = cls(bos_token_id=None, eos_token_id=None, pad_token_id=None, **kwargs)
    config._attn_implementation = "eager"
    return config


def _gpt2() -> nn.Module:
    config = _tf_config(
        transformers.GPT2Config,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        n_positions=SEQ,
        vocab_size=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return Text(transformers.GPT2Model(config))


def _bert() -> nn.Module:
    config = _tf_config(
        transformers.BertConfig,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        vocab_size=16,
        type_vocab_size=1,
    )
    return Text(transformers.BertModel(config, add_pooling_layer=False))


def _distilbert() -> nn.Module:
    config = _tf_config(
        transformers.DistilBertConfig,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=SEQ,
        vocab_size=16,
    )
    return Text(transformers.DistilBertModel(config))


def _llama() -> nn.Module:
    # Grouped-query attention: 4 query heads share 2 key/value heads; RMSNorm; rotary positions.
    config = _tf_config(
        transformers.LlamaConfig,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQ,
        vocab_size=16,
    )
    return Text(transformers.LlamaModel(config))


def _t5_encoder() -> nn.Module:
    config = _tf_config(
        transformers.T5Config,
        d_model=32,
        d_kv=8,
        num_heads=4,
        d_ff=64,
        num_layers=2,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        vocab_size=16,
        dropout_rate=0.0,
    )
    return Text(transformers.T5EncoderModel(config))


def _vit() -> nn.Module:
    config = _tf_config(
        transformers.ViTConfig,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=PIXELS,
        patch_size=8,
    )
    return Image(transformers.ViTModel(config, add_pooling_layer=False), hidden_state=True)


def _resnet18() -> nn.Module:
    # resnet18's BasicBlock and stem, one block per stage at a sixteenth of the final width.
    from timm.models.resnet import BasicBlock, ResNet

    return Image(
        ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, channels=(8, 16, 24, 32), stem_width=8)
    )


def _narrow_head(model: nn.Module, width: int = 64, classes: int = 10) -> nn.Module:
    """Replaces a timm MobileNet/EfficientNet head (1x1 conv to 1024-1280, classifier) by a narrow one.

    The generators fix the head width, and at 32 px it would hold most of the weights.
    """
    head = model.conv_head
    model.conv_head = nn.Conv2d(head.in_channels, width, 1, bias=head.bias is not None)
    model.num_features = model.head_hidden_size = width
    norm = getattr(model, "bn2", None)  # EfficientNet's BatchNormAct2d after the head conv
    if norm is not None:
        act = norm.act
        model.bn2 = type(norm)(width)
        model.bn2.act = act
    model.classifier = nn.Linear(width, classes)
    return model


def _mobilenetv3_small() -> nn.Module:
    from timm.models.mobilenetv3 import _gen_mobilenet_v3

    # mobilenetv3_small's blocks (squeeze-excite, hard-swish) at an eighth of the width, one per stage.
    model = _gen_mobilenet_v3("mobilenetv3_small_050", 0.125, depth_multiplier=0.34, num_classes=10)
    return Image(_narrow_head(model))


def _efficientnet_b0() -> nn.Module:
    from timm.models.efficientnet import _gen_efficientnet

    return Image(
        _narrow_head(
            _gen_efficientnet(
                "efficientnet_b0", channel_multiplier=0.125, depth_multiplier=0.25, num_classes=10
            )
        )
    )


def _convnext_atto() -> nn.Module:
    # convnext_atto's block (conv_mlp) at depth 1 per stage and a fraction of the width.
    from timm.models.convnext import ConvNeXt

    return Image(ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), conv_mlp=True, num_classes=10))


def _vit_tiny() -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    return Image(
        VisionTransformer(
            img_size=PIXELS, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10
        )
    )


def _regnet() -> nn.Module:
    from timm.models.regnet import RegNet, RegNetCfg

    return Image(RegNet(RegNetCfg(depth=4, w0=8, wa=12.0, wm=1.5, group_size=8), num_classes=10))


ARCHS = [
    Arch("gpt2", _gpt2, text=True),
    Arch("bert", _bert, text=True),
    Arch("distilbert", _distilbert, text=True),
    Arch("llama", _llama, text=True),
    Arch("t5_encoder", _t5_encoder, text=True),
    Arch("vit", _vit, text=False),
    Arch("resnet18", _resnet18, text=False),
    Arch("mobilenetv3_small", _mobilenetv3_small, text=False),
    Arch("efficientnet_b0", _efficientnet_b0, text=False),
    Arch("convnext_atto", _convnext_atto, text=False),
    Arch("vit_tiny", _vit_tiny, text=False),
    Arch("regnet", _regnet, text=False),
]


def randomize(module: nn.Module, seed: int) -> None:
    """Redraws every parameter and BatchNorm statistic so that all are distinct and nontrivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim == 1 and leaf == "weight":  # norm scales stay around one
                p.copy_(1.0 + 0.1 * r)
            else:
                fan_in = max(1, p[0].numel()) if p.ndim > 1 else max(1, p.numel())
                p.copy_(r / math.sqrt(fan_in) * (1.0 if p.ndim > 1 else 0.1))
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))


def example_inputs(arch: Arch, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if arch.text:
        mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
        mask[1, -3:] = 0  # the second sequence is padded
        return {"inputs_embeds": torch.randn(BATCH, SEQ, 32, generator=g), "attention_mask": mask}
    return {"pixel_values": torch.randn(BATCH, 3, PIXELS, PIXELS, generator=g)}


def export(module: nn.Module, inputs: dict[str, torch.Tensor], kind: str, path: Path) -> None:
    """Exports ``module``; BatchNorm stays a BatchNormalization node (see below)."""
    args = tuple(inputs.values())
    names = list(inputs)
    # Both exporters fold eval-mode BatchNorm into the preceding Conv by default, and a folded
    # weight is no PyTorch parameter: nothing would check its gradient but float32 differences,
    # which ReLU kinks make unreliable. With BatchNorm kept, every weight has a reference (and
    # BatchNormalization is differentiated too). Folded Conv graphs are test_zoo's subject.
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())
    if kind == "torchscript":
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=names,
            output_names=["y"],
            training=torch.onnx.TrainingMode.PRESERVE if has_bn else torch.onnx.TrainingMode.EVAL,
        )
        return
    dynamic = None
    if kind == "dynbatch":
        batch = torch.export.Dim("batch", min=1, max=64)
        dynamic = {n: {0: batch} for n in names}
    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        opset_version=18,
        input_names=names,
        output_names=["y"],
        dynamic_shapes=dynamic,
        external_data=False,
        optimize=not has_bn,
    )
    assert program is not None
    program.save(str(path), external_data=False)


def strip_metadata(model: onnx.ModelProto) -> None:
    """Drops the dynamo exporter's per-node stack traces: more than half of a small file."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""


def match_initializers(
    model: onnx.ModelProto, params: dict[str, np.ndarray]
) -> dict[str, tuple[str, bool]]:
    """ONNX float initializer -> (parameter, transposed), by exact value."""
    matched: dict[str, tuple[str, bool]] = {}
    for init in model.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        value = numpy_helper.to_array(init)
        for pname, p in params.items():
            if value.shape == p.shape and np.array_equal(value, p):
                matched[init.name] = (pname, False)
                break
            if value.ndim == 2 and value.shape == p.T.shape and np.array_equal(value, p.T):
                matched[init.name] = (pname, True)
                break
    return matched


def references(
    module: nn.Module, inputs: dict[str, torch.Tensor], seed: int
) -> dict[str, np.ndarray]:
    """float64 outputs, gradients, jvp, hvp and per-example gradients of sum(y * r)."""
    m64 = _double_copy(module)
    params = dict(m64.named_parameters())
    first, *rest = inputs
    x = inputs[first].double()
    others = [inputs[n] for n in rest]
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        y = m64(x, *others)
    # Rounded to float32: the tests feed these same values to the float32 models.
    r = torch.randn(y.shape, generator=g).double()
    v = torch.randn(x.shape, generator=g).double()

    def loss(xx: torch.Tensor) -> torch.Tensor:
        return (m64(xx, *others) * r).sum()

    out: dict[str, np.ndarray] = {"loss_weights": r.float().numpy(), "output": y.numpy()}
    # Per-example gradients are K times the weights: float32 storage keeps the folder small and
    # is exact to 6e-8 relative, far below the float32 models' own error.
    xx = x.clone().requires_grad_(True)
    total = loss(xx)
    # Parameters the forward never reads (the token embedding, fed inputs_embeds) get None.
    grads = torch.autograd.grad(total, [xx, *params.values()], create_graph=True, allow_unused=True)
    out["grad_input"] = grads[0].detach().numpy()
    for (pname, _), gp in zip(params.items(), grads[1:], strict=True):
        if gp is not None:
            out[f"param_grad/{pname}"] = gp.detach().numpy()
    # Forward over reverse: the derivative of grad_input along v, through double backward.
    # Where torch has no double backward (hardsigmoid), float64 central differences of the
    # gradient instead: exact to ~1e-9 at eps = 1e-6 unless a kink lies within eps of the point.
    try:
        (hv,) = torch.autograd.grad(grads[0], xx, grad_outputs=v)
    except RuntimeError as err:
        print(f"  hvp by differences of the gradient ({str(err).splitlines()[0]})")
        eps = 1e-6

        def grad_at(t: torch.Tensor) -> torch.Tensor:
            t = t.clone().requires_grad_(True)
            return torch.autograd.grad(loss(t), t)[0]

        hv = (grad_at(x + eps * v) - grad_at(x - eps * v)) / (2 * eps)
    out["hvp_output"] = hv.detach().numpy()
    out["jvp_direction"] = v.float().numpy()
    _, jv = torch.func.jvp(lambda t: m64(t, *others), (x,), (v,))
    out["jvp_output"] = jv.detach().numpy()
    # Per-example: K perturbed copies of the first input, other inputs shared, the same r.
    xs = x.unsqueeze(0) + 0.1 * torch.randn((EXAMPLES, *x.shape), generator=g, dtype=torch.float64)
    xs = xs.float().double()  # what the float32 test feeds
    out["vmap_input"] = xs.float().numpy()
    ys = []
    for k in range(EXAMPLES):
        total = loss(xs[k])
        gk = torch.autograd.grad(total, list(params.values()), allow_unused=True)
        for pname, gp in zip(params, gk, strict=True):
            if gp is None:
                continue
            out.setdefault(
                f"param_per_example/{pname}", np.zeros((EXAMPLES, *gp.shape), np.float32)
            )
            out[f"param_per_example/{pname}"][k] = gp.numpy()
        with torch.no_grad():
            ys.append(m64(xs[k], *others))
    out["vmap_output"] = torch.stack(ys).numpy()
    return out


def _double_copy(module: nn.Module) -> nn.Module:
    import copy

    m64 = copy.deepcopy(module).double()
    m64.eval()
    # timm's fused attention (scaled_dot_product_attention) has no forward-mode or double
    # derivative on CPU; the unfused path computes the same function.
    for sub in m64.modules():
        if hasattr(sub, "fused_attn"):
            sub.fused_attn = False
    return m64


def prune(stored: dict[str, np.ndarray]) -> None:
    """Drops the references of parameters that no export stores (BatchNorm folded into a Conv)."""
    used = set()
    for key, value in stored.items():
        if key.endswith("/matched"):
            used.update(pname for pname, _ in json.loads(str(value)).values())
    for key in list(stored):
        if key.startswith("param_") and key.split("/", 1)[1] not in used:
            del stored[key]


def build(arch: Arch, out: Path, seed: int) -> None:
    torch.manual_seed(seed)
    module = arch.build()
    randomize(module, seed)
    module.eval()
    inputs = example_inputs(arch, seed)
    params = {n: p.detach().numpy().copy() for n, p in module.named_parameters()}
    buffers = {n: b.numpy().copy() for n, b in module.named_buffers() if b.dtype == torch.float32}
    refs = references(module, inputs, seed)
    stored: dict[str, np.ndarray] = {f"input/{n}": t.numpy() for n, t in inputs.items()}
    stored.update(refs)
    for kind in ("dynamo", "torchscript", "dynbatch"):
        path = out / f"{arch.name}.{kind}.onnx"
        try:
            with torch.no_grad():
                export(module, inputs, kind, path)
        except Exception as err:
            print(f"{arch.name} {kind}: export failed: {type(err).__name__}: {str(err)[:200]}")
            path.unlink(missing_ok=True)
            continue
        model = onnx.load(str(path))
        strip_metadata(model)
        onnx.save(model, str(path))
        matched = match_initializers(model, params)
        stats = match_initializers(model, buffers)
        stored[f"{kind}/buffers"] = np.array(json.dumps(sorted(stats)))
        floats = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT]
        stored[f"{kind}/matched"] = np.array(json.dumps(matched, sort_keys=True))
        print(
            f"wrote {path} ({path.stat().st_size} bytes, {len(matched)}/{len(floats)} float"
            f" initializers matched to {len(params)} parameters)"
        )
    save_references(out / f"{arch.name}.npz", stored)
    share_weights(out, arch.name)


def save_references(path: Path, stored: dict[str, np.ndarray]) -> None:
    """Saves the references, rounded once to float32.

    Rounding the float64 results costs 6e-8 relative, a thousandth of the tests' tolerance, and
    halves the folder.
    """
    prune(stored)
    rounded = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in stored.items()}
    np.savez_compressed(path, **rounded)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def share_weights(out: Path, arch: str) -> None:
    """Moves the initializers of an architecture's exports into one ``<arch>.weights`` file.

    Equal tensors (the same parameter in both exporters' graphs) are stored once; each graph
    references them by offset. Tensors under 256 bytes (shape constants, scalars) stay inline.
    """
    blob = bytearray()
    offsets: dict[bytes, int] = {}
    location = f"{arch}.weights"
    for kind in ("dynamo", "torchscript", "dynbatch"):
        path = out / f"{arch}.{kind}.onnx"
        if not path.exists():
            continue
        model = onnx.load(str(path))
        for init in model.graph.initializer:
            data = numpy_helper.to_array(init)
            raw = data.astype(data.dtype.newbyteorder("<")).tobytes()
            if len(raw) < 256:
                continue
            if raw not in offsets:
                offsets[raw] = len(blob)
                blob.extend(raw)
            for field in ("float_data", "int32_data", "int64_data", "double_data"):
                init.ClearField(field)
            init.raw_data = raw  # set_external_data wants it, then it moves out
            set_external_data(init, location, offset=offsets[raw], length=len(raw))
            init.ClearField("raw_data")
        onnx.save(model, str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    (out / location).write_bytes(bytes(blob))
    print(f"wrote {out / location} ({len(blob)} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "data" / "real")
    )
    parser.add_argument("--only", default="", help="comma-separated architecture names")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    for i, arch in enumerate(ARCHS):
        if only and arch.name not in only:
            continue
        try:
            build(arch, out, seed=i)
        except Exception as err:  # one architecture failing must not stop the others
            print(f"{arch.name}: FAILED: {type(err).__name__}: {str(err).splitlines()[0]}")
    manifest = sorted(p.name for p in out.glob("*.onnx"))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
