"""Compiled training compiles a bounded number of times, whatever the batch shapes.

Seq2seq batches come in many shapes (length buckets). A compile counter (torch's own testing
backend: it counts the graphs dynamo hands over and runs them eagerly, so this is fast on CPU)
sees how often the training step is compiled over more than eight distinct batch shapes, batches
of one example and one-token sides included: once, for every architecture.

On CUDA, inductor adds guards of its own that a CPU build never reaches: the fused attention
kernels' alignment (AlignedAttentionCounter below adds them the same way), which recompiled the
step at every source or target length that was, or was not, a multiple of 8 (three compilations of
tests/test_gpu.py's run on an H200, torch 2.11).
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.fx.experimental.symbolic_shapes import guard_or_false, sym_and

from model import ModelConfig, build_model
from model.config import ARCHS
from pipeline.training.batching import ATTENTION_ALIGN, pad_for_compile
from pipeline.training.trainer import compiled

pytestmark = pytest.mark.slow  # torch.compile: seconds a test, and a C++ compiler run on a cold cache

PAD = 0
# (rows, source length, target length): sizes of 1, equal sizes (dynamo would share a symbol), odd ones
SHAPES = [(4, 6, 6), (1, 9, 5), (3, 1, 7), (2, 5, 1), (5, 12, 3), (1, 1, 1), (7, 3, 11), (6, 6, 2), (2, 14, 14),
          (8, 2, 9), (3, 3, 3)]


def batch(rows: int, s: int, t: int, gen: torch.Generator) -> tuple:
    src = torch.randint(4, 40, (rows, s), generator=gen)
    tgt_in = torch.randint(4, 40, (rows, t), generator=gen)
    tgt_out = torch.randint(4, 40, (rows, t), generator=gen)
    if rows > 1:  # ragged rows, right-padded as collate pads them
        src[0, max(1, s // 2):] = PAD
        tgt_in[0, max(1, t // 2):] = PAD
        tgt_out[0, max(1, t // 2):] = PAD
    return src, tgt_in, tgt_out


class AlignedAttentionCounter(CompileCounter):
    """A CompileCounter that first adds the guards inductor's CUDA lowering of the fused attention
    adds (torch/_inductor/lowering.py sdpa_constraint -> ir.is_aligned_realized_tensor, torch 2.10+):
    with a mask (the memory-efficient kernel) the mask's strides, without one (flash attention) the
    per-query statistics (B, H, Lq), must be multiples of 8 elements. One guard per call, true or
    false for the first batch; a batch that flips it compiles the step again, as on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.attention_calls = 0

    def __call__(self, gm, example_inputs):
        for node in gm.graph.nodes:
            if node.target is not torch._C._nn.scaled_dot_product_attention:
                continue
            self.attention_calls += 1
            mask = node.kwargs.get("attn_mask")
            if mask is not None:
                strides = mask.meta["example_value"].stride()[:-1]
            else:
                _, heads, queries = node.args[0].meta["example_value"].shape[:3]
                strides = (heads * queries, queries)
            guard_or_false(sym_and(*(s % 8 == 0 for s in strides)))
        return super().__call__(gm, example_inputs)


def model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                   d_ff=32, dropout=0.0, max_len=64, arch=arch, pad_id=PAD))


@pytest.mark.parametrize("arch", ARCHS)
def test_the_training_step_compiles_once_over_many_batch_shapes(arch):
    torch._dynamo.reset()
    net, counter = model(arch), CompileCounter()
    step = compiled(net, torch.device("cpu"), dynamic=True, backend=counter)
    gen = torch.Generator().manual_seed(0)
    frames = []
    assert len(set(SHAPES)) > 8
    for shape in SHAPES:
        _, loss = step(*pad_for_compile(batch(*shape, gen), PAD))
        loss.backward()
        frames.append(counter.frame_count)
    # The first batch compiles every graph of the step (decoder-only models break the graph where
    # they pack source and target: a data-dependent length); no later shape compiles anything.
    assert frames == [frames[0]] * len(SHAPES), frames
    assert frames[0] <= (1 if arch == "encoder_decoder" else 5)


def test_without_the_padding_a_batch_of_one_example_compiles_again():
    """The bound above is the padding's doing: unpadded, sizes of 1 recompile."""
    torch._dynamo.reset()
    net, counter = model("encoder_decoder"), CompileCounter()
    step = compiled(net, torch.device("cpu"), dynamic=True, backend=counter)
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        step(*batch(*shape, gen))[1].backward()
    assert counter.frame_count > 1


@pytest.mark.usefixtures("torch_fused_kernel")  # CUDA's fused attention, played on the CPU
@pytest.mark.parametrize("multiple, graphs", [(1, "several"), (ATTENTION_ALIGN, "one")])
def test_lengths_in_multiples_of_eight_keep_the_cuda_attention_guards_true(multiple, graphs):
    """The encoder-decoder's attention sees the source and target lengths; padded to multiples of
    8, every batch satisfies the alignment guards the first one set."""
    torch._dynamo.reset()
    net, counter = model("encoder_decoder"), AlignedAttentionCounter()
    step = compiled(net, torch.device("cpu"), dynamic=True, backend=counter)
    gen = torch.Generator().manual_seed(0)
    for shape in SHAPES + [(3, 8, 5), (2, 5, 16)]:  # a source, then a target, 8-aligned as they come
        step(*pad_for_compile(batch(*shape, gen), PAD, multiple, max_len=64))[1].backward()
    assert counter.attention_calls > 0  # the model ran the fused kernel (attention_impl sdpa)
    assert (counter.frame_count == 1) == (graphs == "one"), counter.frame_count


def test_padding_to_a_multiple_stops_at_max_len():
    src, tgt_in, tgt_out = pad_for_compile(batch(3, 9, 61, torch.Generator().manual_seed(0)), PAD,
                                           ATTENTION_ALIGN, max_len=62)
    assert src.shape == (3, 16) and tgt_in.shape == tgt_out.shape == (3, 62)
    assert (src[:, 9:] == PAD).all() and (tgt_in[:, 61:] == PAD).all() and (tgt_out[:, 61:] == PAD).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_padding_changes_neither_the_loss_nor_the_gradients(arch):
    gen = torch.Generator().manual_seed(1)
    for shape in [(1, 9, 5), (3, 1, 7), (2, 5, 1), (1, 1, 1)]:
        plain = batch(*shape, gen)
        padded = pad_for_compile(plain, PAD, ATTENTION_ALIGN)
        assert min(min(t.shape) for t in padded) >= 2 and all(t.shape[1] % ATTENTION_ALIGN == 0 for t in padded)
        grads = []
        for b in (plain, padded):
            net = model(arch)
            _, loss = net(*b)
            loss.backward()
            grads.append((loss.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None]))
        torch.testing.assert_close(grads[0][0], grads[1][0])
        for a, b in zip(grads[0][1], grads[1][1]):
            torch.testing.assert_close(a, b)


@pytest.mark.usefixtures("torch_fused_kernel")  # CUDA's fused attention, played on the CPU
def test_a_compiled_training_run_compiles_its_step_once(tiny_shards, tmp_path, monkeypatch):
    """Through the train stage as tests/test_gpu.py runs it on CUDA (bf16 autocast, fused AdamW,
    evaluation and checkpoints between steps), with CUDA's attention guards: length-bucketed
    batches of many shapes, one compilation."""
    from pipeline.train import run
    from pipeline.training import trainer
    from tests.test_trainer import resolved

    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")
    torch._dynamo.reset()
    counter, shapes, real_compile, real_pad = AlignedAttentionCounter(), set(), torch.compile, trainer.pad_for_compile
    # The counter stands in for inductor, so inductor's own options (shape_padding) are not passed on.
    monkeypatch.setattr(trainer.torch, "compile", lambda m, options=None, **kw: real_compile(m, **{**kw, "backend": counter}))

    def pad(batch, *args, **kwargs):
        shapes.add(tuple(tuple(t.shape) for t in batch))
        return real_pad(batch, *args, **kwargs)
    monkeypatch.setattr(trainer, "pad_for_compile", pad)
    metrics = run(tiny_shards / "shards", "v", 0, resolved(compile=True, precision="bf16"), "x", tmp_path / "out",
                  tmp_path / "ckpt")
    assert metrics["compile"] is True and metrics["precision"] == "bf16" and len(shapes) > 8
    assert counter.attention_calls > 0
    assert counter.frame_count == 1
