"""The train stage's own foreach AdamW and LR schedule against torch's, bit for bit."""
from __future__ import annotations

import math
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


@pytest.mark.multiprocess
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


@pytest.mark.parametrize("schedule", ["cosine", "linear", "inverse_sqrt", "constant"])
def test_warmup_start_one_and_zero_at_steps_0_1_and_warmup(schedule):
    """one (the default): lr (step+1)/warmup; zero: lr step/warmup (nanoGPT's get_lr at 23a8e701).
    After the warmup the two are the same schedule."""
    warmup, total = 100, 5000
    one = [lr_factor(s, schedule, warmup, total, 0.1) for s in (0, 1, warmup - 1, warmup, 1000)]
    assert one == [lr_factor(s, schedule, warmup, total, 0.1, "one") for s in (0, 1, warmup - 1, warmup, 1000)]
    assert one[:3] == [1 / 100, 2 / 100, 1.0]
    zero = [lr_factor(s, schedule, warmup, total, 0.1, "zero") for s in (0, 1, warmup - 1, warmup, 1000)]
    assert zero[:3] == [0.0, 1 / 100, 99 / 100]
    assert zero[3:] == one[3:]  # step warmup and on: the schedule itself, whatever the start
    if schedule in ("cosine", "linear", "constant"):
        assert zero[3] == 1.0  # the peak at step warmup
    assert lr_factor(0, schedule, 0, total, 0.1, "zero") == lr_factor(0, schedule, 0, total, 0.1, "one")  # no warmup


def test_warmup_start_zero_is_nanogpts_get_lr_at_23a8e701():
    def get_lr(it, learning_rate=1e-3, warmup_iters=100, lr_decay_iters=5000, min_lr=1e-4):
        if it < warmup_iters:
            return learning_rate * it / warmup_iters
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) * (learning_rate - min_lr)
    for it in (0, 1, 50, 99, 100, 101, 2500, 4999, 5000):
        assert 1e-3 * lr_factor(it, "cosine", 100, 5000, 0.1, "zero") == pytest.approx(get_lr(it), rel=1e-12, abs=1e-18)


def test_a_scheduler_with_warmup_start_zero_sets_lr_0_then_lr_over_warmup():
    opt = make_optimizer(model(), 1e-3, (0.9, 0.99), 1e-8, 0.1, torch.device("cpu"))
    sched = make_scheduler(opt, "cosine", 4, 20, 0.1, "zero")
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        sched.step()
    assert seen == pytest.approx([0.0, 1e-3 / 4, 2e-3 / 4, 3e-3 / 4, 1e-3])


def test_warmup_start_is_validated_with_one_line_naming_the_key(tmp_path):
    import typing

    from pipeline.params import ParamsError, TrainParams, load_params
    from pipeline.training.optim import WARMUP_STARTS

    assert typing.get_args(TrainParams.model_fields["warmup_start"].annotation) == WARMUP_STARTS
    assert TrainParams().warmup_start == "one"
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  warmup_start: half\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert "train.warmup_start" in str(err.value) and "half" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="^train.warmup_start: must be one of one, zero, got 'half'$"):
        lr_factor(0, "cosine", 10, 100, 0.1, "half")
