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
                   device: torch.device, decay_embeddings: bool = False, precision: str = "fp32"):
    """AdamW with the groups above: torch's fused kernel where `uses_fused`, else the multi-tensor
    (foreach) update, which does the per-parameter loop's maths in far fewer kernel calls."""
    fused = uses_fused(device, precision)
    groups = param_groups(model, weight_decay, decay_embeddings)
    if fused:
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, fused=True)
    return ForeachAdamW(groups, lr=lr, betas=tuple(betas), eps=eps)


class ForeachAdamW:
    """torch.optim.AdamW(foreach=True)'s update (amsgrad, maximize, capturable off), bit for bit.

    Why not torch's own: every torch.optim.Optimizer imports torch._dynamo, the compiler's
    front end, when it is built and on its first step (their methods are wrapped to stay out of
    compiled graphs), and that import is ~1.5 s of a CPU train stage's ~3 s fixed cost, paid by
    every run of a study for nothing: an eager run never compiles. (A compiled run imports it
    anyway, and a fused one keeps torch's class.) tests/test_optim.py checks the parameters and
    moments against torch's for every step, and a save/resume.
    """

    def __init__(self, groups: list[dict], lr: float, betas: tuple[float, float], eps: float) -> None:
        self.param_groups = [{**g, "params": list(g["params"]), "lr": lr, "betas": betas, "eps": eps} for g in groups]
        self.state: dict[torch.Tensor, dict] = {}

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p not in self.state:
                    self.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                     "exp_avg_sq": torch.zeros_like(p)}
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            grads = [p.grad for p in params]
            states = [self.state[p] for p in params]
            steps = [st["step"] for st in states]
            avgs, sqs = [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states]
            # torch's own order of operations, so the floats round alike.
            torch._foreach_add_(steps, torch.tensor(1.0), alpha=1.0)
            if wd != 0:
                torch._foreach_mul_(params, 1 - lr * wd)
            torch._foreach_lerp_(avgs, grads, 1 - beta1)
            torch._foreach_mul_(sqs, beta2)
            torch._foreach_addcmul_(sqs, grads, grads, 1 - beta2)
            step_size = [(lr / (1 - beta1 ** s.item())) * -1 for s in steps]
            bias2_sqrt = [(1 - beta2 ** s.item()) ** 0.5 for s in steps]
            denom = torch._foreach_sqrt(sqs)
            torch._foreach_div_(denom, bias2_sqrt)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, avgs, denom, step_size)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self._params():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict:
        """torch's layout: state by parameter index, groups listing their indices."""
        index = {p: i for i, p in enumerate(self._params())}
        return {"state": {index[p]: {k: v.clone() for k, v in st.items()} for p, st in self.state.items()},
                "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                  "params": [index[p] for p in g["params"]]} for g in self.param_groups]}

    def load_state_dict(self, saved: dict) -> None:
        params = self._params()
        groups = saved["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("optimizer state: its parameter groups do not match the model's")
        for group, g in zip(self.param_groups, groups):
            group.update({k: v for k, v in g.items() if k != "params"})
        self.state = {}
        for i, st in saved["state"].items():
            p = params[int(i)]
            self.state[p] = {"step": st["step"].clone(), "exp_avg": st["exp_avg"].to(p.device),
                             "exp_avg_sq": st["exp_avg_sq"].to(p.device)}


class LambdaSchedule:
    """torch's LambdaLR for the optimizers above (each group's lr = its initial lr x fn(step)),
    without torch.optim's scheduler, which accepts only torch's optimizers."""

    def __init__(self, optimizer, fn) -> None:
        self.optimizer, self.fn, self.last_epoch = optimizer, fn, -1
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.step()

    def step(self) -> None:
        self.last_epoch += 1
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * self.fn(self.last_epoch)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list[float]:
        return self._last_lr

    def state_dict(self) -> dict:
        return {"last_epoch": self.last_epoch, "_last_lr": self._last_lr}

    def load_state_dict(self, saved: dict) -> None:
        self.last_epoch, self._last_lr = saved["last_epoch"], saved["_last_lr"]


WARMUP_STARTS = ("one", "zero")


def lr_factor(step: int, schedule: str, warmup: int, total: int, floor: float, warmup_start: str = "one") -> float:
    """Multiplier of the base learning rate at optimizer step `step` (0-based).

    Warmup (train.warmup_start): one, (step + 1) / warmup, so step warmup - 1 reaches 1; zero,
    step / warmup, so step 0 trains at 0 and step warmup reaches 1 (nanoGPT's get_lr at 23a8e701).
    """
    if warmup_start not in WARMUP_STARTS:
        raise ValueError(f"train.warmup_start: must be one of {', '.join(WARMUP_STARTS)}, got {warmup_start!r}")
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup if warmup_start == "one" else step / warmup
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


def make_scheduler(optimizer, schedule: str, warmup: int, total: int, floor: float, warmup_start: str = "one"):
    def factor(step: int) -> float:
        return lr_factor(step, schedule, warmup, total, floor, warmup_start)
    if isinstance(optimizer, ForeachAdamW):
        return LambdaSchedule(optimizer, factor)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
