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


def uses_fused(device: torch.device, precision: str) -> bool:
    """Whether AdamW runs its fused kernel: on CUDA always; on CPU with bf16 only.

    torch has a fused CPU AdamW (2.4+), 2.5-5x faster per optimizer step than foreach here, but it
    rounds differently in the last bit of float32 (6.7e-8 apart after 50 steps of a small MLP), and
    400 steps amplify that: the default fp32 CPU runs keep foreach, whose results are bit-identical
    to the per-parameter loop's and to every CPU result committed so far. bf16 gives up those bits
    anyway, so there the fused kernel is free speed.
    """
    return device.type == "cuda" or (device.type == "cpu" and precision == "bf16")


def make_optimizer(model: nn.Module, lr: float, betas, eps: float, weight_decay: float,
                   device: torch.device, decay_embeddings: bool = False, precision: str = "fp32") -> torch.optim.AdamW:
    # Not fused: the multi-tensor (foreach) path does the per-parameter loop's maths in far fewer
    # kernel calls.
    fused = uses_fused(device, precision)
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
