"""The PyTorch side of bench_training.py: builds, exports and times the benchmark networks.

Runs in a Python with torch, transformers and timm (never in the project's environment; the
unit tests need none of them). bench_training.py calls it; by hand::

    /path/to/torch-venv/bin/python tests/benchmarks/training_torch.py --out DIR
        [--models resnet18,gpt2,bert,vit_s16,convnext_tiny] [--batches 1,8] [--tiny]
        [--rounds 7] [--no-time]

For each model and batch size it writes ``DIR/<model>.b<batch>.onnx`` (TorchScript exporter,
opset 17, random seeded weights, eval mode, weights embedded or as external data when large)
with two outputs: ``y`` (logits, or the last hidden state) and ``loss = sum(y * r)`` for a fixed
seeded ``r`` stored in the file. ``DIR/<model>.b<batch>.npz`` holds the example inputs and
``DIR/<model>.b<batch>.torch.json`` the medians, over interleaved rounds at one thread, of:
forward (no grad), forward + backward w.r.t. every parameter, forward + backward w.r.t. the
input only, ``torch.func.vmap(grad)`` per-example parameter gradients (batch > 1), and
``torch.func.jvp(grad)`` w.r.t. the input (a Hessian-vector product); and ``saved_bytes``, the
activations autograd keeps for the backward of every parameter.

``--tiny`` shrinks every network (two layers, narrow) for a quick check of the pipeline.

``--serve`` times on request instead, for bench_training.py to interleave with onnxruntime's
runs (see ``serve()``).

``--onnx2torch FILE...`` instead converts given ONNX files (one input ``x``, outputs ``y`` and
``loss``, an ``.npz`` beside each with ``x``: training_zoo.py's light-zoo CNNs) with onnx2torch
and writes the same timings next to each; a timing the converted module cannot run (say
``torch.func.vmap`` through a converted operator) is left out and its error printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

try:  # see examples/export_real_models.py: a CPU venv's torchvision may not load
    import torchvision  # noqa: F401
except (ImportError, RuntimeError):
    _TV = torch.library.Library("torchvision", "DEF")
    _TV.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TV.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

import timm
import transformers

SEQ = 128
PIXELS = 224


class WithLoss(nn.Module):
    """``(y, sum(y * r))`` of a network ``y = net(x)``, ``r`` a fixed buffer."""

    def __init__(self, net: nn.Module, out_shape: tuple[int, ...], seed: int) -> None:
        super().__init__()
        self.net = net
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer(
            "r", torch.randn(out_shape, generator=gen) / np.sqrt(np.prod(out_shape))
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.net(x)
        return y, (y * self.r).sum()


class Decoder(nn.Module):
    """A transformers causal LM body: token ids in, last hidden state out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).last_hidden_state


def _gpt2(tiny: bool) -> nn.Module:
    layers, hidden = (2, 64) if tiny else (6, 512)
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=hidden, n_head=8, n_positions=SEQ, vocab_size=4096
    )
    return Decoder(transformers.GPT2Model(config))


def _bert(tiny: bool) -> nn.Module:
    layers, hidden = (2, 64) if tiny else (12, 768)
    config = transformers.BertConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=4 if tiny else 12,
        intermediate_size=4 * hidden,
        max_position_embeddings=SEQ,
        vocab_size=4096,
    )
    return Decoder(transformers.BertModel(config, add_pooling_layer=False))


def _timm(name: str) -> Callable[[bool], nn.Module]:
    def build(tiny: bool) -> nn.Module:
        extra: dict[str, object] = {"img_size": 64} if tiny and name.startswith("vit") else {}
        return timm.create_model(name, pretrained=False, num_classes=10 if tiny else 1000, **extra)

    return build


MODELS: dict[str, tuple[Callable[[bool], nn.Module], str]] = {
    "resnet18": (_timm("resnet18"), "image"),
    "gpt2": (_gpt2, "text"),
    "bert": (_bert, "text"),
    "vit_s16": (_timm("vit_small_patch16_224"), "image"),
    "convnext_tiny": (_timm("convnext_tiny"), "image"),
}


def example(kind: str, batch: int, tiny: bool, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "text":
        return torch.randint(0, 4096, (batch, 16 if tiny else SEQ), generator=gen)
    pixels = 64 if tiny else PIXELS
    return torch.randn((batch, 3, pixels, pixels), generator=gen)


def network(name: str, batch: int, tiny: bool) -> tuple[WithLoss, torch.Tensor]:
    """The benchmark network ``name`` with its loss, and its example input (both seeded)."""
    build, kind = MODELS[name]
    torch.manual_seed(0)
    net = build(tiny).eval()
    x = example(kind, batch, tiny, seed=1)
    with torch.no_grad():
        y = net(x)
    return WithLoss(net, tuple(y.shape), seed=2).eval(), x


def _timer(fn: Callable[[], object]) -> Callable[[], float]:
    def timed() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return timed


def saved_bytes(module: WithLoss, x: torch.Tensor) -> int:
    """Bytes of the activations autograd keeps for the backward of every parameter.

    Counted by storage, once each, through ``saved_tensors_hooks``; the parameters, buffers and
    the input are not activations and are left out.
    """
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    module.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = module(x)[1]
    loss.backward()
    module.zero_grad(set_to_none=True)
    held = {t.untyped_storage().data_ptr() for t in (*module.parameters(), *module.buffers(), x)}
    return sum(n for ptr, n in storages.items() if ptr not in held)


def computations(module: WithLoss, x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The forward and the derivative computations that run on ``module`` at ``x``.

    Each is run once (the warm-up); one the module cannot run (say ``torch.func.vmap`` through
    an operator onnx2torch converted) is left out and its error printed to stderr.
    """
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    floating = x.is_floating_point()

    def forward() -> None:
        with torch.no_grad():
            module(x)

    def backward_params() -> None:
        module.zero_grad(set_to_none=True)
        module(x)[1].backward()

    def backward_input() -> None:
        xi = x.detach().requires_grad_(True)
        torch.autograd.grad(module(xi)[1], xi)

    def loss_of(p: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, (p, buffers), (xi,))[1]

    def per_example() -> None:
        # one example at a time, as onnax's vmap(grad) of the batch-1 model computes it
        torch.func.vmap(torch.func.grad(loss_of), in_dims=(None, 0))(params, x.unsqueeze(1))

    def hvp_forward() -> None:
        g = torch.func.grad(loss_of, argnums=1)
        torch.func.jvp(lambda xi: g(params, xi), (x,), (torch.ones_like(x),))

    def hvp() -> None:
        # CPU flash attention has no forward-mode AD: the math kernel of attention has
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            hvp_forward()

    cases: dict[str, Callable[[], object]] = {
        "forward": forward,
        "backward_params": backward_params,
    }
    if floating:
        cases["backward_input"] = backward_input
        cases["hvp"] = hvp
    if x.shape[0] > 1:
        cases["per_example"] = per_example
    for name, fn in list(cases.items()):  # warm-up; what cannot run is reported, not timed
        try:
            fn()
        except Exception as error:  # any failure of a converted module
            print(
                f"  {name}: {type(error).__name__}: {str(error).splitlines()[0]}",
                file=sys.stderr,
            )
            del cases[name]
    return cases


def timings(module: WithLoss, x: torch.Tensor, rounds: int) -> dict[str, float]:
    """Medians over interleaved rounds of the forward and the derivative computations."""
    cases = computations(module, x)
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(_timer(fn)())
    return {name: statistics.median(s) for name, s in samples.items()}


def export(module: WithLoss, x: torch.Tensor, path: Path) -> None:
    torch.onnx.export(
        module,
        (x,),
        str(path),
        input_names=["x"],
        output_names=["y", "loss"],
        opset_version=17,
        dynamo=False,
        do_constant_folding=True,
    )


def _converted(path: Path) -> tuple[nn.Module, torch.Tensor]:
    """``path`` converted by onnx2torch, and the input ``x`` of the ``.npz`` beside it."""
    import onnx2torch

    stem = path.with_name(path.name.removesuffix(".onnx"))
    torch.manual_seed(0)
    module = onnx2torch.convert(str(path)).eval()
    return module, torch.from_numpy(np.load(stem.with_name(stem.name + ".npz"))["x"])


def serve() -> None:
    """Times computations on request, for bench_training.py to interleave with onnxruntime's.

    Requests come one JSON object a line on stdin, replies go one a line to the original
    stdout (anything else printed goes to stderr, so a library's print cannot break a reply):

    * ``{"load": {"model": name, "batch": b, "tiny": bool, "x": npz}}`` builds that network
      (as the export did: same seeds, so the same weights) and takes its input from the export's
      ``npz``; ``{"load": {"onnx": path}}`` converts an ONNX file with onnx2torch. Either way
      every computation is run once, and the reply names those that run, with ``saved_bytes``
      and the ``loss`` at ``x`` (for the caller to check that both sides run the same network).
    * ``{"time": name}`` runs one computation once and replies with its ``seconds``.
    """
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cases: dict[str, Callable[[], object]] = {}
    for line in sys.stdin:
        request = json.loads(line)
        if "load" in request:
            spec = request["load"]
            cases = {}  # the previous network's memory goes before the next one is built
            if "onnx" in spec:
                module, x = _converted(Path(spec["onnx"]))
            else:
                module, _ = network(spec["model"], int(spec["batch"]), bool(spec["tiny"]))
                x = torch.from_numpy(np.load(spec["x"])["x"])
            cases = computations(module, x)  # type: ignore[arg-type]
            with torch.no_grad():
                loss = float(module(x)[1])
            answer: dict[str, object] = {
                "cases": list(cases),
                "loss": loss,
                "saved_bytes": saved_bytes(module, x),  # type: ignore[arg-type]
            }
        else:
            answer = {"seconds": _timer(cases[request["time"]])()}
        reply.write(json.dumps(answer) + "\n")
        reply.flush()


def time_onnx(paths: list[Path], rounds: int) -> None:
    """Times each ONNX file as a module converted by onnx2torch (see the module doc)."""
    for path in paths:
        stem = path.with_name(path.name.removesuffix(".onnx"))
        module, x = _converted(path)
        result = timings(module, x, rounds)  # type: ignore[arg-type]
        result["saved_bytes"] = saved_bytes(module, x)  # type: ignore[arg-type]
        stem.with_name(stem.name + ".torch.json").write_text(json.dumps(result, indent=1))
        print(f"{stem.name} (onnx2torch): torch {result}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--onnx2torch", nargs="+", type=Path, default=None)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-time", action="store_true")
    parser.add_argument("--serve", action="store_true", help="time on request (see serve())")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.serve:
        serve()
        return
    if args.onnx2torch:
        time_onnx(args.onnx2torch, args.rounds)
        return
    if args.out is None:
        parser.error("--out is required without --onnx2torch")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            module, x = network(name, batch, args.tiny)
            stem = f"{name}.b{batch}"
            export(module, x, args.out / f"{stem}.onnx")
            np.savez(args.out / f"{stem}.npz", x=x.numpy())
            result = {} if args.no_time else timings(module, x, args.rounds)
            result["saved_bytes"] = saved_bytes(module, x)
            (args.out / f"{stem}.torch.json").write_text(json.dumps(result, indent=1))
            print(f"{name} batch {batch}: exported; torch {result}", flush=True)


if __name__ == "__main__":
    main()
