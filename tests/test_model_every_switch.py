"""Every switch of model/config.py, read from the dataclass: a new field is tested the moment it
exists, with no test to edit (docs/adding-a-switch.md).

The switches are ModelConfig's bool fields (negated) and its `_CHOICES` fields (each other value),
one at a time, in every architecture and attention path (tests/model_bits.py lists them). Each:
- trains a step: a finite loss and a finite gradient reaching every parameter;
- changes the logits (else it is not wired in), except where it says it has no effect (NO_EFFECT);
- decodes with the KV cache as by full recomputation; a model that cannot cache (decoder_mask
  future_only) says so in `start_decoding`, which then recomputes on both paths;
- gives the same logits and gradients on the manual attention path as on the fused kernel;
and the default leaves today's bits alone: tests/fixtures/model_bits.json holds the weights, logits
and gradients of every model a default, a switch or a preset built when it was recorded, and those
configs, which set no field added since, build the same bits now (tests/model_bits.py).
"""
from __future__ import annotations

import json
import typing

import pytest
import torch

from model import ModelConfig, build_model
from model.config import _CHOICES, ARCHS, ATTENTION_IMPLS
from model.generate import _greedy_pick, decode_loop
from pipeline import cpu_numerics
from tests.model_bits import FIXTURE, TINY, batch, fingerprint, switch_variants, valid, variant_id

VARIANTS = switch_variants()
# (switch, value) -> the archs where it changes nothing, by design: say why beside each.
NO_EFFECT = {
    ("share_embeddings", False): [a for a in ARCHS if a != "encoder_decoder"],  # one stack, one table
}


def _fields(arch: str, impl: str, variant: dict, **kw) -> dict:
    return {**TINY, "arch": arch, "attention_impl": impl, **variant, **kw}


def _cases(impls=ATTENTION_IMPLS, with_default: bool = False) -> list:
    return [pytest.param(arch, impl, variant, id=f"{arch}-{impl}-{variant_id(variant)}")
            for arch in ARCHS for impl in impls for variant in ([{}] if with_default else []) + VARIANTS
            if valid(**_fields(arch, impl, variant)) is not None]


def _model(arch: str, impl: str, variant: dict, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**_fields(arch, impl, variant, **kw)))


SRC, TGT_IN, TGT_OUT = batch(TINY["vocab_size"])


def test_the_switches_are_every_bool_and_every_choice_of_the_config():
    hints = typing.get_type_hints(ModelConfig)
    flipped = {name for v in VARIANTS for name in v}
    assert flipped == {n for n, t in hints.items() if t is bool} | (set(_CHOICES) - {"arch", "attention_impl"})
    for name, choices in _CHOICES.items():
        if name not in ("arch", "attention_impl"):
            assert {v[name] for v in VARIANTS if name in v} == set(choices) - {getattr(ModelConfig(), name)}
    for variant in VARIANTS:  # refused with some arch is fine (future_only + prefix_lm), with all is not
        assert any(valid(**_fields(arch, "sdpa", variant)) for arch in ARCHS), variant
    for key, archs in NO_EFFECT.items():
        assert dict([key]) in VARIANTS and set(archs) <= set(ARCHS), key


@pytest.mark.parametrize("arch, impl, variant", _cases(with_default=True))
def test_every_switch_trains_one_step(arch, impl, variant):
    model = _model(arch, impl, variant, dropout=0.1).train()
    _, loss = model(SRC, TGT_IN, TGT_OUT)
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    counts = model.param_counts()
    assert counts["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch, impl, variant", _cases(impls=["sdpa"]))
def test_every_switch_changes_the_logits(arch, impl, variant):
    base = _model(arch, impl, {}, dropout=0.0).eval()
    model = _model(arch, impl, variant, dropout=0.0).eval()
    with torch.no_grad():
        same = torch.allclose(base(SRC, TGT_IN)[0], model(SRC, TGT_IN)[0], rtol=0, atol=1e-6)
    [(name, value)] = variant.items()
    assert same == (arch in NO_EFFECT.get((name, value), ())), \
        f"{variant_id(variant)} {'changes nothing' if same else 'changes the logits'} in {arch} (NO_EFFECT)"


@pytest.mark.parametrize("arch, impl, variant", _cases(with_default=True))
def test_every_switch_decodes_the_same_with_and_without_the_kv_cache(arch, impl, variant):
    model = _model(arch, impl, variant, dropout=0.1).double().eval()  # dropout off in eval: must not leak in
    with torch.no_grad():
        cached, cached_logits = decode_loop(model, SRC, 8, _greedy_pick, use_cache=True)
        full, full_logits = decode_loop(model, SRC, 8, _greedy_pick, use_cache=False)
        caches = model.start_decoding(SRC, use_cache=True).caches
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-10, rtol=0)
    if caches is None:  # cannot cache (future_only): every later token changes the earlier positions
        assert model.cfg.decoder_mask != "causal"
        return
    tgt_in = torch.cat([torch.full((SRC.shape[0], 1), model.cfg.bos_id), full[:, :-1]], dim=1)
    with torch.no_grad():
        logits, _ = model(SRC, tgt_in)
    torch.testing.assert_close(full_logits, logits, atol=1e-10, rtol=0)


@pytest.mark.usefixtures("torch_fused_kernel")  # torch's kernel, not the routed CPU formula
@pytest.mark.parametrize("arch, impl, variant", _cases(impls=["manual"], with_default=True))
def test_every_switch_gives_the_same_on_the_manual_path_as_on_the_fused_kernel(arch, impl, variant):
    models = [_model(arch, i, variant, dropout=0.0).double() for i in ATTENTION_IMPLS]
    states = [m.state_dict() for m in models]
    assert list(states[0]) == list(states[1]) and all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    results = []
    for m in models:
        logits, loss = m(SRC, TGT_IN, TGT_OUT)
        loss.backward()
        results.append((logits, {n: p.grad for n, p in m.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-10, rtol=1e-10)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], atol=1e-10, rtol=1e-10, msg=name)


RECORDED = json.loads(FIXTURE.read_text(encoding="utf-8"))
PINNED = cpu_numerics.describe()["pinned"]


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_the_default_leaves_every_recorded_model_bit_for_bit(name):
    """init: the weights (any machine); forward and grads wherever the CPU kernels are pinned and the
    products routed (pipeline/cpu_numerics.py: any x86-64 CPU with AVX2, any thread count), as the
    suite runs them; regenerate with `python -m tests.model_bits` only to change a model."""
    record = RECORDED[name]
    got = fingerprint(record["config"])
    assert got["init"] == record["init"], f"{name}: other initial weights (or creation order) than recorded"
    if not PINNED:
        pytest.skip("the initial weights match; logits and gradients are promised only where the CPU kernels are "
                    f"pinned, and here they are not ({cpu_numerics.describe()['matmul']})")
    assert got["forward"] == record["forward"], f"{name}: other logits than recorded"
    assert got["grads"] == record["grads"], f"{name}: other gradients than recorded"


def test_the_record_covers_every_arch_attention_path_and_the_default_study():
    names = set(RECORDED)
    for arch in ARCHS:
        for impl in ATTENTION_IMPLS:
            assert f"tiny/{arch}/{impl}/default" in names
    assert {n.split("/")[1] for n in names if n.startswith("study/")} >= {"baseline"}
