"""benchmarks/fused_ce.py: the output layer's cross-entropy in row chunks gives the plain one's loss and
gradients; the 124M benchmark times it beside the others and drops a runner that fails alone."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.fused_ce import FusedHead, linear_cross_entropy
from benchmarks.gpt_step import gpt_config
from benchmarks.gpu_bench import _runners, _warm_up
from model import build_model

TINY = dict(vocab_size=97, d_model=32, n_heads=4, n_layers=2, d_ff=64, context=16)


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors, retain_graph=True)


@pytest.mark.parametrize("chunk", [4, 7, 64])  # several chunks, a ragged last one, one chunk
def test_the_chunked_loss_and_gradients_are_the_plain_ones(chunk):
    torch.manual_seed(0)
    h = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(31, 8, requires_grad=True)
    t = torch.randint(0, 31, (20,))
    t[[2, 3, 11]] = -100  # ignored rows: no loss, no gradient, not counted in the mean
    plain = F.cross_entropy(F.linear(h, w), t, ignore_index=-100)
    fused = linear_cross_entropy(h, w, t, -100, chunk)
    torch.testing.assert_close(fused, plain)
    for a, b in zip(grads(3.0 * fused, h, w), grads(3.0 * plain, h, w)):  # the upstream gradient scales them
        torch.testing.assert_close(a, b)
    assert grads(fused, h)[0][[2, 3, 11]].abs().max() == 0


def test_our_model_with_the_fused_head_trains_as_it_does_with_its_own():
    torch.manual_seed(0)
    cfg = gpt_config(**TINY)
    model = build_model(cfg).train()
    x, y = torch.randint(4, 97, (3, 16)), torch.randint(4, 97, (3, 16))
    y[0, :5] = cfg.pad_id
    params = list(model.parameters())
    _, plain = model(None, x, y)
    _, fused = FusedHead(model, chunk=10)(None, x, y)
    torch.testing.assert_close(fused, plain)
    for a, b in zip(grads(fused, *params), grads(plain, *params)):  # the tied embedding's two paths summed
        torch.testing.assert_close(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the benchmark steps: bf16 products, float32 loss
        _, plain16 = model(None, x, y)
        _, fused16 = FusedHead(model, chunk=10)(None, x, y)
    assert fused16.dtype == plain16.dtype == torch.float32
    torch.testing.assert_close(fused16, plain16, rtol=1e-3, atol=1e-3)


@pytest.mark.slow  # torch.compile's wrappers import Dynamo: ~2 s
def test_the_benchmark_times_the_fused_head_with_the_mfu_question():
    cfg = gpt_config(**TINY)
    models = {name: build_model(cfg) for name in ("ours", "nanogpt_style", "reference")}
    _, large, phases = _runners(models, lambda model, runner, b: (lambda: None), 2, 4, compile_models=True)
    assert phases[0] == [f"{n}_compiled_b4" for n in ("ours", "ours_loss_only", "ours_fused_ce", "nanogpt_style")]


def test_a_runner_that_fails_is_dropped_alone_with_its_error():
    def fails():
        raise RuntimeError("the compiler said no\nand much more")
    runs = {"a": lambda: None, "b": fails}
    out = {"warmup_and_compile_s": 0.0, "phases_done": 0}
    assert _warm_up(["a", "b"], runs, set(), out)
    assert list(runs) == ["a"] and out["b_error"] == "RuntimeError: the compiler said no"
    assert not _warm_up(["c"], {"c": fails}, set(), out)  # a phase with no runner left times nothing


@pytest.mark.slow
def test_torch_compile_traces_the_fused_head_whole():
    """The GPU compiles it with Inductor; what Dynamo and AOTAutograd make of it (one graph, no break
    at the autograd.Function, its loop unrolled) is the same on any device: traced here on the CPU."""
    torch.manual_seed(0)
    model = build_model(gpt_config(**TINY)).train()
    x, y = torch.randint(4, 97, (2, 16)), torch.randint(4, 97, (2, 16))
    params = list(model.parameters())
    _, plain = model(None, x, y)
    compiled = torch.compile(FusedHead(model, chunk=10), fullgraph=True, dynamic=False, backend="aot_eager")
    _, fused = compiled(None, x, y)
    torch.testing.assert_close(fused, plain)
    for a, b in zip(grads(fused, *params), grads(plain, *params)):
        torch.testing.assert_close(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the benchmark's step: autocast inside the graph
        _, plain16 = model(None, x, y)
        _, fused16 = compiled(None, x, y)
    torch.testing.assert_close(fused16, plain16, rtol=1e-3, atol=1e-3)
