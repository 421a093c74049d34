"""Makes the PyTorch reference data of the training tests (losses and optimizer trajectories).

Run with a Python that has torch and numpy (onnx is not needed):

    /work/torchvenv/bin/python tests/data/training/make_refs.py

It writes ``losses.npz``/``losses.json`` (inputs, loss values and gradients of every loss case)
and ``optimizers.npz``/``optimizers.json`` (initial weights, batches, and the loss and parameters
after each step of each ``torch.optim`` configuration) next to itself. Every input is drawn here
with a seeded numpy generator and stored, so the tests use exactly these numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent

LOSS_CASES: list[dict[str, Any]] = [
    {"name": "mse_mean", "kind": "mse", "shape": [6, 3]},
    {
        "name": "mse_sum_weighted",
        "kind": "mse",
        "shape": [6, 3],
        "reduction": "sum",
        "weight": True,
    },
    {"name": "l1_mean", "kind": "l1", "shape": [6, 3]},
    {"name": "l1_weighted", "kind": "l1", "shape": [6, 2, 2], "weight": True},
    {"name": "huber_mean", "kind": "huber", "shape": [6, 3], "delta": 0.7},
    {"name": "huber_sum", "kind": "huber", "shape": [6, 3], "delta": 1.5, "reduction": "sum"},
    {"name": "ce_indices", "kind": "cross_entropy", "shape": [6, 4]},
    {"name": "ce_indices_sum", "kind": "cross_entropy", "shape": [6, 4], "reduction": "sum"},
    {
        "name": "ce_ignore_smooth",
        "kind": "cross_entropy",
        "shape": [6, 4],
        "ignore": True,
        "label_smoothing": 0.2,
    },
    {"name": "ce_spatial", "kind": "cross_entropy", "shape": [3, 4, 5], "ignore": True},
    {
        "name": "ce_weighted",
        "kind": "cross_entropy",
        "shape": [6, 4],
        "weight": True,
        "ignore": True,
    },
    {"name": "ce_probabilities", "kind": "cross_entropy", "shape": [6, 4], "probabilities": True},
    {
        "name": "ce_probabilities_smooth",
        "kind": "cross_entropy",
        "shape": [6, 4],
        "probabilities": True,
        "label_smoothing": 0.1,
        "reduction": "sum",
    },
    {"name": "bce_mean", "kind": "bce_with_logits", "shape": [6, 3]},
    {
        "name": "bce_weighted_sum",
        "kind": "bce_with_logits",
        "shape": [6, 3],
        "weight": True,
        "reduction": "sum",
    },
    {"name": "nll_mean", "kind": "nll", "shape": [6, 4], "ignore": True},
    {"name": "nll_sum", "kind": "nll", "shape": [6, 4], "reduction": "sum"},
]
IGNORE = -100


def _loss_inputs(case: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    shape = case["shape"]
    x = rng.standard_normal(shape).astype(np.float32) * 2
    if case["kind"] == "nll":
        x = np.log(np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)).astype(np.float32)
    feeds: dict[str, np.ndarray] = {"x": x}
    if case["kind"] in ("cross_entropy", "nll") and not case.get("probabilities"):
        t_shape = [shape[0], *shape[2:]]
        t = rng.integers(0, shape[1], size=t_shape).astype(np.int64)
        if case.get("ignore"):
            t.reshape(-1)[::3] = IGNORE
        feeds["target"] = t
    elif case.get("probabilities"):
        p = rng.random(shape) + 0.1
        feeds["target"] = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    elif case["kind"] == "bce_with_logits":
        feeds["target"] = rng.random(shape).astype(np.float32)
    else:
        # |x - target| >= 0.2: away from the kink of l1 (and, mostly, of huber), so a one-ulp
        # difference cannot flip a branch.
        feeds["target"] = (x + rng.choice([-1.0, 1.0], shape) * (0.2 + rng.random(shape))).astype(
            np.float32
        )
    if case.get("weight"):
        feeds["weight"] = (rng.random(shape[0]) + 0.5).astype(np.float32)
    return feeds


def _torch_loss(case: dict[str, Any], feeds: dict[str, np.ndarray]) -> tuple[float, np.ndarray]:
    x = torch.tensor(feeds["x"], requires_grad=True)
    t = torch.tensor(feeds["target"])
    kind, reduction = case["kind"], case.get("reduction", "mean")
    weighted = "weight" in feeds
    how = "none" if weighted else reduction
    if kind == "mse":
        per = F.mse_loss(x, t, reduction=how)
    elif kind == "l1":
        per = F.l1_loss(x, t, reduction=how)
    elif kind == "huber":
        per = F.huber_loss(x, t, reduction=how, delta=case["delta"])
    elif kind == "bce_with_logits":
        per = F.binary_cross_entropy_with_logits(x, t, reduction=how)
    elif kind == "cross_entropy":
        per = F.cross_entropy(
            x,
            t,
            reduction=how,
            ignore_index=IGNORE,
            label_smoothing=case.get("label_smoothing", 0.0),
        )
    else:
        per = F.nll_loss(x, t, reduction=how, ignore_index=IGNORE)
    if weighted:
        w = torch.tensor(feeds["weight"]).reshape([-1] + [1] * (per.dim() - 1))
        total = (per * w).sum()
        if reduction == "sum":
            loss = total
        elif t.dtype == torch.int64:
            loss = total / (t != IGNORE).sum()
        else:
            loss = total / per.numel()
    else:
        loss = per
    loss.backward()
    assert x.grad is not None
    return float(loss.detach()), x.grad.numpy()


def make_losses() -> None:
    rng = np.random.default_rng(1234)
    arrays: dict[str, np.ndarray] = {}
    for case in LOSS_CASES:
        feeds = _loss_inputs(case, rng)
        value, grad = _torch_loss(case, feeds)
        for k, v in feeds.items():
            arrays[f"{case['name']}/{k}"] = v
        arrays[f"{case['name']}/loss"] = np.array(value, dtype=np.float32)
        arrays[f"{case['name']}/grad_x"] = grad
    np.savez_compressed(HERE / "losses.npz", **arrays)
    meta = {"torch": torch.__version__, "ignore_index": IGNORE, "cases": LOSS_CASES}
    (HERE / "losses.json").write_text(json.dumps(meta, indent=1) + "\n")


OPT_CASES: list[dict[str, Any]] = [
    {"name": "sgd", "optimizer": "SGD", "args": {"lr": 0.1}},
    {
        "name": "sgd_momentum_dampening_wd",
        "optimizer": "SGD",
        "args": {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
        "lrs": [0.1, 0.05, 0.05, 0.02, 0.02],
    },
    {
        "name": "sgd_nesterov",
        "optimizer": "SGD",
        "args": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    },
    {"name": "adam", "optimizer": "Adam", "args": {"lr": 0.01}},
    {
        "name": "adam_l2_amsgrad",
        "optimizer": "Adam",
        "args": {
            "lr": 0.01,
            "betas": [0.8, 0.99],
            "eps": 1e-6,
            "weight_decay": 0.1,
            "amsgrad": True,
        },
    },
    {"name": "adamw", "optimizer": "AdamW", "args": {"lr": 0.01, "weight_decay": 0.05}},
    {"name": "adamw_clip", "optimizer": "AdamW", "args": {"lr": 0.02}, "max_grad_norm": 0.3},
    {
        "name": "sgd_mse_frozen",
        "optimizer": "SGD",
        "args": {"lr": 0.1, "momentum": 0.5},
        "loss": "mse",
        "frozen": ["fc1.*"],
    },
]
STEPS, BATCH, N_IN, HIDDEN, N_OUT = 5, 8, 4, 5, 3


def _mlp_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "fc1.weight": (rng.standard_normal((N_IN, HIDDEN)) / np.sqrt(N_IN)).astype(np.float32),
        "fc1.bias": (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        "fc2.weight": (rng.standard_normal((HIDDEN, N_OUT)) / np.sqrt(HIDDEN)).astype(np.float32),
        "fc2.bias": (0.1 * rng.standard_normal(N_OUT)).astype(np.float32),
    }


def make_optimizers() -> None:
    rng = np.random.default_rng(99)
    init = _mlp_weights(rng)
    xs = rng.standard_normal((STEPS, BATCH, N_IN)).astype(np.float32)
    labels = rng.integers(0, N_OUT, size=(STEPS, BATCH)).astype(np.int64)
    values = rng.standard_normal((STEPS, BATCH, N_OUT)).astype(np.float32)
    arrays: dict[str, np.ndarray] = {f"init/{k}": v for k, v in init.items()}
    arrays.update({"x": xs, "labels": labels, "values": values})
    for case in OPT_CASES:
        params = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
        frozen = [k for k in params if any(k.startswith(f[:-1]) for f in case.get("frozen", []))]
        for k in frozen:
            params[k].requires_grad_(False)
        trained = [p for k, p in params.items() if k not in frozen]
        args = dict(case["args"])
        if "betas" in args:
            args["betas"] = tuple(args["betas"])
        opt = getattr(torch.optim, case["optimizer"])(trained, **args)
        for s in range(STEPS):
            if "lrs" in case:
                for group in opt.param_groups:
                    group["lr"] = case["lrs"][s]
            opt.zero_grad()
            x = torch.tensor(xs[s])
            y = torch.tanh(x @ params["fc1.weight"] + params["fc1.bias"])
            y = y @ params["fc2.weight"] + params["fc2.bias"]
            if case.get("loss") == "mse":
                loss = F.mse_loss(y, torch.tensor(values[s]))
            else:
                loss = F.cross_entropy(y, torch.tensor(labels[s]))
            loss.backward()
            if "max_grad_norm" in case:
                torch.nn.utils.clip_grad_norm_(trained, case["max_grad_norm"])
            opt.step()
            arrays[f"{case['name']}/loss/{s}"] = np.array(float(loss.detach()), dtype=np.float32)
            for k, p in params.items():
                arrays[f"{case['name']}/{k}/{s}"] = p.detach().numpy().copy()
    np.savez_compressed(HERE / "optimizers.npz", **arrays)
    meta = {"torch": torch.__version__, "steps": STEPS, "cases": OPT_CASES}
    (HERE / "optimizers.json").write_text(json.dumps(meta, indent=1) + "\n")


if __name__ == "__main__":
    torch.manual_seed(0)
    make_losses()
    make_optimizers()
