"""Decoding: KV cache == full recomputation, and the search strategies on a scripted model."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from model import ModelConfig, build_model
from model.config import ARCHS, NORM_POSITIONS, POSITIONALS
from model.generate import decode_loop, _greedy_pick
from model.transformer import DecodeState, TransformerBase


V, PAD, BOS, EOS = 31, 0, 2, 3


def _model(arch, positional="sinusoidal", **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2,
                      d_ff=32, dropout=0.1, max_len=24, arch=arch, positional=positional, **kw)
    return build_model(cfg).double()


def _src():
    src = torch.randint(4, V, (3, 6), generator=torch.Generator().manual_seed(0))
    src[1, 4:] = PAD
    src[2, 1:] = PAD
    return src


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("norm_position", NORM_POSITIONS)
def test_kv_cache_equals_full_recomputation(arch, positional, norm_position):
    model = _model(arch, positional, norm_position=norm_position).eval()
    src = _src()
    with torch.no_grad():
        cached, cached_logits = decode_loop(model, src, 10, _greedy_pick, use_cache=True)
        full, full_logits = decode_loop(model, src, 10, _greedy_pick, use_cache=False)
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-10, rtol=0)
    # and the step logits are what a plain forward on bos + generated tokens gives
    tgt_in = torch.cat([torch.full((3, 1), BOS), full[:, :-1]], dim=1)
    logits, _ = model(src, tgt_in)
    torch.testing.assert_close(full_logits, logits, atol=1e-10, rtol=0)


def test_future_only_decoding_is_the_forward_bit_for_bit_with_the_source_encoded_once():
    """Seed 000's mask decodes by recomputation (a new token changes every earlier position): each
    step's logits are the plain forward's, bit for bit in float32, with the encoder run once."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2,
                                    d_ff=32, dropout=0.1, max_len=24, decoder_mask="future_only")).eval()
    src, calls = _src(), []
    model.encoder.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        out, step_logits = decode_loop(model, src, 8, _greedy_pick, use_cache=False)
        assert len(calls) == 1
        fed = torch.cat([torch.full((3, 1), BOS), out], dim=1)
        for t in range(out.shape[1]):
            assert torch.equal(step_logits[:, t], model(src, fed[:, :t + 1])[0][:, -1])


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_and_sampling_same_with_and_without_cache(arch):
    model = _model(arch, "rope")
    src = _src()
    for kwargs in (dict(strategy="beam", beam_size=3, length_penalty=0.6),
                   dict(strategy="sample", temperature=0.8, top_k=5, top_p=0.9)):
        outs = [model.generate(src, 8, use_cache=c, generator=torch.Generator().manual_seed(1), **kwargs)
                for c in (True, False)]
        assert outs[0] == outs[1]
        assert len(outs[0]) == 3 and all(EOS not in row for row in outs[0])
    assert model.training  # generate restores the mode it found


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_of_one_is_greedy_and_top_k_one_is_greedy(arch):
    model = _model(arch)
    src = _src()
    greedy = model.generate(src, 8)
    assert model.generate(src, 8, strategy="beam", beam_size=1) == greedy
    assert model.generate(src, 8, strategy="sample", top_k=1) == greedy
    assert model.generate(src, 8, strategy="sample", top_p=1e-6) == greedy


@pytest.mark.parametrize("arch", ["decoder_only", "prefix_lm"])
def test_unconditional_generation_and_max_len(arch):
    model = _model(arch)
    out = model.generate(None, max_new_tokens=100, strategy="sample", temperature=5.0,
                         generator=torch.Generator().manual_seed(0))
    assert len(out) == 1 and len(out[0]) <= model.cfg.max_len
    prompt = torch.randint(4, V, (1, 20), generator=torch.Generator().manual_seed(0))
    # 20 source positions leave 4 for the target in max_len 24
    assert all(len(row) <= 4 for row in model.generate(prompt, 100, strategy="beam", beam_size=2))


# -- strategies on a scripted Markov model: the next-token distribution depends on the last token
class MarkovLM(TransformerBase):
    """logits = table[last token]; counts decode_step calls."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__(ModelConfig(vocab_size=table.shape[0], d_model=2, n_heads=1, d_ff=2,
                                     arch="decoder_only", max_len=64))
        self.table, self.calls = table, 0

    def start_decoding(self, src, use_cache=True):
        return DecodeState(batch={"last": torch.full((src.shape[0],), BOS)})

    def decode_step(self, state, tokens):
        self.calls += 1
        state.batch["last"] = tokens
        return self.table[tokens]


def _markov(seed=0, vocab=6):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * 2
    table[:, [PAD, 1, BOS]] = -math.inf  # never emitted: only 4.. and eos
    return MarkovLM(table)


def _sequence_score(model, seq):
    """Summed log-prob of seq (ending at eos or not) from bos."""
    logp, last = 0.0, BOS
    for tok in seq:
        logp += model.table[last].log_softmax(-1)[tok].item()
        last = tok
    return logp


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_with_a_wide_beam_finds_the_best_sequence(length_penalty, seed):
    model = _markov(seed)
    n, emit = 3, [EOS, 4, 5]
    candidates = []  # every finished sequence up to n tokens, and every unfinished one of n
    for length in range(1, n + 1):
        for seq in itertools.product(emit, repeat=length):
            if EOS in seq[:-1] or (length < n and seq[-1] != EOS):
                continue
            candidates.append(seq)
    best = max(candidates, key=lambda s: _sequence_score(model, s) / len(s) ** length_penalty)
    got = model.generate(torch.zeros(1, 0, dtype=torch.long), n, strategy="beam", beam_size=27,
                         length_penalty=length_penalty)
    assert got == [[t for t in best if t != EOS]]


def test_generation_stops_at_eos():
    table = torch.full((6, 6), -math.inf, dtype=torch.float64)
    table[BOS, 4], table[4, 5], table[5, EOS], table[EOS, 4] = 0.0, 0.0, 0.0, 0.0
    model = MarkovLM(table)
    src = torch.zeros(2, 0, dtype=torch.long)
    assert model.generate(src, 50) == [[4, 5], [4, 5]]
    assert model.calls == 3  # bos->4, 4->5, 5->eos, then every row is done
    assert model.generate(src, 2) == [[4, 5], [4, 5]]  # max_new_tokens cuts before eos
    assert model.generate(src, 50, strategy="beam", beam_size=3) == [[4, 5], [4, 5]]


def test_top_k_and_top_p_restrict_the_support():
    table = torch.full((8, 8), -math.inf, dtype=torch.float64)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    table[:, 4:] = probs.log()  # tokens 4, 5, 6, 7
    model = MarkovLM(table)
    src = torch.zeros(200, 0, dtype=torch.long)

    def support(**kw):
        rows = model.generate(src, 1, strategy="sample", generator=torch.Generator().manual_seed(0), **kw)
        return {row[0] for row in rows}

    assert support() == {4, 5, 6, 7}
    assert support(top_k=2) == {4, 5}
    assert support(top_p=0.7) == {4, 5}  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7
    assert support(top_p=0.5) == {4}
    assert support(temperature=0.05) == {4}
    with pytest.raises(ValueError, match="temperature"):
        model.generate(src, 1, strategy="sample", temperature=0.0)
    with pytest.raises(ValueError, match="strategy"):
        model.generate(src, 1, strategy="nucleus")
