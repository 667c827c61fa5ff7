"""Compiled training compiles a bounded number of times, whatever the batch shapes.

Seq2seq batches come in many shapes (length buckets). A compile counter (torch's own testing
backend: it counts the graphs dynamo hands over and runs them eagerly, so this is fast on CPU)
sees how often the training step is compiled over more than eight distinct batch shapes, batches
of one example and one-token sides included: once, for every architecture.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from model import ModelConfig, build_model
from pipeline.training.batching import pad_for_compile
from pipeline.training.trainer import compiled

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


def model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                   d_ff=32, dropout=0.0, max_len=64, arch=arch, pad_id=PAD))


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only", "prefix_lm"])
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


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only", "prefix_lm"])
def test_the_padding_changes_neither_the_loss_nor_the_gradients(arch):
    gen = torch.Generator().manual_seed(1)
    for shape in [(1, 9, 5), (3, 1, 7), (2, 5, 1), (1, 1, 1)]:
        plain = batch(*shape, gen)
        padded = pad_for_compile(plain, PAD)
        assert min(min(t.shape) for t in padded) >= 2
        grads = []
        for b in (plain, padded):
            net = model(arch)
            _, loss = net(*b)
            loss.backward()
            grads.append((loss.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None]))
        torch.testing.assert_close(grads[0][0], grads[1][0])
        for a, b in zip(grads[0][1], grads[1][1]):
            torch.testing.assert_close(a, b)


def test_a_compiled_training_run_compiles_its_step_once(tiny_shards, tmp_path, monkeypatch):
    """Through the train stage: length-bucketed batches of many shapes, one compilation."""
    from pipeline.train import run
    from pipeline.training import trainer
    from tests.test_trainer import resolved

    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")
    torch._dynamo.reset()
    counter, shapes, real_compile, real_pad = CompileCounter(), set(), torch.compile, trainer.pad_for_compile
    monkeypatch.setattr(trainer.torch, "compile", lambda m, **kw: real_compile(m, **{**kw, "backend": counter}))

    def pad(batch, pad_id):
        shapes.add(tuple(tuple(t.shape) for t in batch))
        return real_pad(batch, pad_id)
    monkeypatch.setattr(trainer, "pad_for_compile", pad)
    metrics = run(tiny_shards / "shards", "v", 0, resolved(compile=True), "x", tmp_path / "out", tmp_path / "ckpt")
    assert metrics["compile"] is True and len(shapes) > 8
    assert counter.frame_count == 1
