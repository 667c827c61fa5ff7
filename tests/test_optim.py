"""The train stage's own foreach AdamW and LR schedule against torch's, bit for bit."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from pipeline.training.optim import ForeachAdamW, LambdaSchedule, lr_factor, make_optimizer, make_scheduler, param_groups


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(11, 8), nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 11))


def loss_of(m: nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randint(0, 11, (4, 5), generator=g), torch.randint(0, 11, (4 * 5,), generator=g)
    return nn.functional.cross_entropy(m(x).reshape(-1, 11), y)


def factor(step: int) -> float:
    return lr_factor(step, "cosine", 3, 20, 0.1)


def train(m: nn.Module, opt, sched, steps: range, unused: nn.Parameter | None = None) -> list[list[torch.Tensor]]:
    seen = []
    for step in steps:
        loss_of(m, step).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        seen.append([p.detach().clone() for p in m.parameters()])
    return seen


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_foreach_adamw_is_torchs_bit_for_bit(weight_decay):
    ours_model, torch_model = model(), model()
    ours = ForeachAdamW(param_groups(ours_model, weight_decay), lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    theirs = torch.optim.AdamW(param_groups(torch_model, weight_decay), lr=3e-3, betas=(0.9, 0.99), eps=1e-8,
                               foreach=True)
    a = train(ours_model, ours, LambdaSchedule(ours, factor), range(20))
    b = train(torch_model, theirs, torch.optim.lr_scheduler.LambdaLR(theirs, factor), range(20))
    for step, (pa, pb) in enumerate(zip(a, b)):
        assert all(torch.equal(x, y) for x, y in zip(pa, pb)), f"step {step}"
    for p, q in zip(ours_model.parameters(), torch_model.parameters()):
        assert torch.equal(ours.state[p]["exp_avg"], theirs.state[q]["exp_avg"])
        assert torch.equal(ours.state[p]["exp_avg_sq"], theirs.state[q]["exp_avg_sq"])
    assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"]


def test_a_resumed_optimizer_and_schedule_continue_exactly():
    straight = model()
    opt = ForeachAdamW(param_groups(straight, 0.1), lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    want = train(straight, opt, LambdaSchedule(opt, factor), range(12))[-1]
    first = model()
    opt = ForeachAdamW(param_groups(first, 0.1), lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    sched = LambdaSchedule(opt, factor)
    train(first, opt, sched, range(6))
    saved = {"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    resumed = model()
    resumed.load_state_dict(saved["model"])
    opt = ForeachAdamW(param_groups(resumed, 0.1), lr=3e-3, betas=(0.9, 0.99), eps=1e-8)
    sched = LambdaSchedule(opt, factor)
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    got = train(resumed, opt, sched, range(6, 12))[-1]
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    with pytest.raises(ValueError, match="parameter groups do not match"):
        ForeachAdamW(param_groups(nn.Linear(2, 2), 0.1)[:1], 1e-3, (0.9, 0.99), 1e-8).load_state_dict(saved["opt"])


def test_the_cpu_optimizer_is_ours_and_gpu_or_bf16_keep_torchs_fused_kernel():
    m = model()
    assert isinstance(make_optimizer(m, 1e-3, (0.9, 0.99), 1e-8, 0.1, torch.device("cpu")), ForeachAdamW)
    fused = make_optimizer(m, 1e-3, (0.9, 0.99), 1e-8, 0.1, torch.device("cpu"), precision="bf16")
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"]
    assert isinstance(make_scheduler(fused, "cosine", 3, 20, 0.1), torch.optim.lr_scheduler.LambdaLR)


def test_an_eager_cpu_training_step_does_not_import_the_compiler():
    """What the class is for: torch._dynamo's ~1.5 s import stays out of an eager CPU train stage."""
    code = ("import sys, torch\nfrom torch import nn\n"
            "from pipeline.training.optim import make_optimizer, make_scheduler\n"
            "m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))\n"
            "opt = make_optimizer(m, 1e-3, (0.9, 0.99), 1e-8, 0.1, torch.device('cpu'))\n"
            "sched = make_scheduler(opt, 'cosine', 2, 10, 0.1)\n"
            "m(torch.randn(2, 4)).sum().backward()\n"
            "torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\n"
            "opt.step(); sched.step(); opt.zero_grad()\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
