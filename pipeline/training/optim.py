"""AdamW with the usual exemptions, and the learning-rate schedules.

Weight decay applies to matrices of linear layers only: norms, biases and embeddings are exempt
(decaying them pulls gains and token vectors towards zero for no regularisation benefit).
`decay_embeddings` decays every matrix, embedding tables included: nanoGPT's (and GPT-2's) rule,
for presets that match those recipes.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool = False) -> list[dict]:
    decay, no_decay = [], []
    exempt = set()
    spare_embeddings = not decay_embeddings
    for module in model.modules():
        is_embedding = isinstance(module, nn.Embedding)
        if (is_embedding and spare_embeddings) or "norm" in type(module).__name__.lower():
            exempt.update(id(p) for p in module.parameters(recurse=False))
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or id(p) in exempt or ("embed" in name and spare_embeddings):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, lr: float, betas, eps: float, weight_decay: float,
                   device: torch.device, decay_embeddings: bool = False) -> torch.optim.AdamW:
    # The fused kernel exists for CUDA tensors only. On CPU torch defaults to a Python loop over
    # parameters; the multi-tensor (foreach) path does the same maths with far fewer kernel calls.
    fused = device.type == "cuda"
    groups = param_groups(model, weight_decay, decay_embeddings)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=fused, foreach=not fused)


def lr_factor(step: int, schedule: str, warmup: int, total: int, floor: float) -> float:
    """Multiplier of the base learning rate at optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / (step + 1))
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return floor + (1 - floor) * (1 - progress)
    raise ValueError(f"train.schedule: unknown schedule {schedule!r}")


def make_scheduler(optimizer, schedule: str, warmup: int, total: int, floor: float):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, schedule, warmup, total, floor))
