"""Causality and padding invariance for every architecture and position scheme, decoder-only
packing, and the attention maps the evaluate stage plots."""
from __future__ import annotations

import pytest
import torch

from model import ModelConfig, build_model
from model.config import ARCHS, ATTENTION_IMPLS, NORM_POSITIONS, POSITIONALS


V, PAD, BOS = 29, 0, 2


def _model(arch, positional="sinusoidal", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2,
                      d_ff=32, dropout=0.0, max_len=40, arch=arch, positional=positional, **kw)
    return build_model(cfg).double().eval()


def _tokens(shape, seed):
    return torch.randint(4, V, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm_position", NORM_POSITIONS)
def test_future_targets_never_change_earlier_logits(arch, positional, norm_position):
    model = _model(arch, positional, norm_position=norm_position)
    src = _tokens((2, 6), 0)
    src[1, 4:] = PAD
    tgt = _tokens((2, 8), 1)
    tgt[:, 0] = BOS
    logits, _ = model(src, tgt)
    for t in range(1, 8):
        changed = tgt.clone()
        changed[:, t:] = _tokens((2, 8 - t), 100 + t)
        new_logits, _ = model(src, changed)
        torch.testing.assert_close(new_logits[:, :t], logits[:, :t], atol=1e-12, rtol=0)
        assert not torch.allclose(new_logits[:, t:], logits[:, t:])  # the change did reach later steps


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_padded_batch_equals_each_row_alone(arch, positional, impl):
    model = _model(arch, positional, attention_impl=impl)
    src_lens, tgt_lens = [6, 3, 1], [5, 2, 4]
    src = torch.full((3, 6), PAD)
    tgt = torch.full((3, 5), PAD)
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        src[i, :s] = _tokens((s,), 10 + i)
        tgt[i, :t] = _tokens((t,), 20 + i)
        tgt[i, 0] = BOS
    batch_logits, _ = model(src, tgt)
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens)):
        alone, _ = model(src[i:i + 1, :s], tgt[i:i + 1, :t])
        torch.testing.assert_close(batch_logits[i, :t], alone[0], atol=1e-10, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_loss_ignores_padding_and_matches_per_row_cross_entropy(arch):
    model = _model(arch)
    src = _tokens((2, 5), 0)
    src[1, 3:] = PAD
    tgt_in = _tokens((2, 6), 1)
    tgt_in[:, 0] = BOS
    tgt_out = _tokens((2, 6), 2)
    tgt_out[1, 2:] = PAD
    tgt_in[1, 3:] = PAD
    logits, loss = model(src, tgt_in, tgt_out)
    logp = logits.log_softmax(-1)
    picked = logp.gather(-1, tgt_out[..., None])[..., 0]
    real = tgt_out != PAD
    torch.testing.assert_close(loss, -picked[real].mean())
    assert model(src, tgt_in)[1] is None


@pytest.mark.parametrize("positional", POSITIONALS)
def test_decoder_only_is_one_sequence_source_then_target(positional):
    """forward(src, tgt_in) == the LM run on concat(src, tgt_in), read at the target positions."""
    model = _model("decoder_only", positional)
    src, tgt = _tokens((1, 5), 0), _tokens((1, 4), 1)
    tgt[:, 0] = BOS
    logits, _ = model(src, tgt)
    lm_logits, _ = model(None, torch.cat([src, tgt], dim=1))
    torch.testing.assert_close(logits, lm_logits[:, 5:], atol=1e-12, rtol=0)
    empty, _ = model(torch.full((1, 3), PAD), tgt)  # an all-padding source is no source
    torch.testing.assert_close(empty, model(None, tgt)[0], atol=1e-12, rtol=0)


def test_prefix_lm_source_attends_both_ways_decoder_only_does_not():
    src, tgt = _tokens((1, 5), 0), _tokens((1, 4), 1)
    tgt[:, 0] = BOS
    prefix = _model("prefix_lm").attention_maps(src, tgt)["encoder.self"]
    causal = _model("decoder_only").attention_maps(src, tgt)["encoder.self"]
    upper = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert (prefix[upper] > 0).all()
    assert (causal[upper] == 0).all()
    # source positions only attend within the source, in both archs
    torch.testing.assert_close(prefix.sum(-1), torch.ones(5))
    torch.testing.assert_close(causal.sum(-1), torch.ones(5))


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_maps_shapes_and_rows(arch):
    model = _model(arch)
    model.train()
    src = _tokens((2, 6), 0)
    src[0, 4:] = PAD
    tgt = _tokens((2, 5), 1)
    tgt[:, 0] = BOS
    maps = model.attention_maps(src, tgt)
    assert model.training  # restored
    if arch == "target_lm":  # the source is never read: the target's map alone, each row a distribution
        assert set(maps) == {"decoder.self"} and (maps["decoder.self"].triu(1) == 0).all()
        torch.testing.assert_close(maps["decoder.self"].sum(-1), torch.ones(5))
        return
    assert maps["encoder.self"].shape == (6, 6)
    assert maps["decoder.self"].shape == (5, 5)
    assert maps["decoder.cross"].shape == (5, 6)
    assert (maps["decoder.self"].triu(1) == 0).all()  # causal
    assert (maps["decoder.cross"][:, 4:] == 0).all()  # padded source columns get nothing
    assert (maps["encoder.self"][:4, 4:] == 0).all()
    torch.testing.assert_close(maps["encoder.self"][:4].sum(-1), torch.ones(4))
    if arch == "encoder_decoder":  # separate softmaxes: every block is a distribution
        torch.testing.assert_close(maps["decoder.self"].sum(-1), torch.ones(5))
        torch.testing.assert_close(maps["decoder.cross"].sum(-1), torch.ones(5))
    else:  # one softmax over source + target
        total = maps["decoder.self"].sum(-1) + maps["decoder.cross"].sum(-1)
        torch.testing.assert_close(total, torch.ones(5))
    if arch != "encoder_decoder":
        assert set(model.attention_maps(None, tgt)) == {"decoder.self"}


def test_too_long_input_is_a_clear_error():
    model = _model("decoder_only")
    with pytest.raises(ValueError, match="max_len"):
        model(_tokens((1, 30), 0), _tokens((1, 20), 1))
    with pytest.raises(ValueError, match="src"):
        _model("encoder_decoder")(None, _tokens((1, 3), 1))
