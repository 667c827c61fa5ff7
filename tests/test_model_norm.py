"""model/layers.py LayerNorm (model/exact.py): torch's LayerNorm in every output, with weight and bias gradients that do not
depend on the number of CPU threads (the whole training run: tests/test_trainer.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from model.layers import LayerNorm


def pair(bias: bool, d: int = 64) -> tuple[nn.LayerNorm, LayerNorm]:
    torch.manual_seed(0)
    theirs = nn.LayerNorm(d, bias=bias)
    nn.init.normal_(theirs.weight)
    if bias:
        nn.init.normal_(theirs.bias)
    ours = LayerNorm(d, bias=bias)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def grads(norm: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    norm.zero_grad(set_to_none=True)
    norm(x).backward(dy)
    return [x.grad] + [p.grad for p in norm.parameters()]


@pytest.mark.parametrize("bias", [True, False])
def test_outputs_are_torchs_bit_for_bit_and_gradients_equal_up_to_rounding(bias):
    theirs, ours = pair(bias)
    x, dy = torch.randn(8, 32, 64), torch.randn(8, 32, 64)
    assert torch.equal(ours(x), theirs(x))
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    mine, reference = grads(ours, x, dy), grads(theirs, x, dy)
    assert len(mine) == (3 if bias else 2)
    assert torch.equal(mine[0], reference[0])  # the input gradient: torch's own kernel
    for a, b in zip(mine[1:], reference[1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_gradients_pass_gradcheck_in_float64():
    ours = LayerNorm(6).double()
    nn.init.normal_(ours.weight)
    nn.init.normal_(ours.bias)
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    # The weight and bias go in as inputs, so that gradcheck perturbs them too (ours uses them).
    assert torch.autograd.gradcheck(lambda x, w, b: ours(x), (x, ours.weight, ours.bias))


def test_bf16_autocast_on_cpu_gives_float32_parameter_gradients():
    theirs, ours = pair(True)
    x, dy = torch.randn(4, 16, 64), torch.randn(4, 16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mine = grads(ours, x.bfloat16(), dy.bfloat16())
    reference = grads(theirs, x, dy)
    assert [g.dtype for g in mine] == [torch.bfloat16, torch.float32, torch.float32]
    for a, b in zip(mine[1:], reference[1:]):
        # measured: at most 0.048 off float32's (gradients up to ~23): bf16 inputs, float32 sums
        torch.testing.assert_close(a, b, rtol=0, atol=0.1)


def bits_at_each_thread_count(make, x: torch.Tensor, dy: torch.Tensor) -> set[tuple[bytes, ...]]:
    """The gradients' bits from a fresh `make()` at 1, 2, 3 and 4 threads: one entry if they never change."""
    before, seen = torch.get_num_threads(), set()
    try:
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            seen.add(tuple(g.numpy().tobytes() for g in grads(make(), x, dy)))
    finally:
        torch.set_num_threads(before)
    return seen


def test_the_weight_and_bias_gradients_are_the_same_bits_at_any_thread_count():
    """What torch's own LayerNorm does at this size (it differed between 1 and 2 threads on the CPU
    model/exact.py's layer_norm was written on) is a fact about torch, measured by benchmarks/cpu_numerics.py;
    ours must never differ, and RMSNorm's whole training run is checked in tests/test_trainer.py."""
    x, dy = torch.randn(64, 256, 128), torch.randn(64, 256, 128)
    assert len(bits_at_each_thread_count(lambda: pair(True, 128)[1], x, dy)) == 1
