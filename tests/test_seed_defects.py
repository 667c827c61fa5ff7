"""Two switches that reproduce defects of the seed studies, to explain their numbers (never a
baseline): decoder_mask future_only, seed 000's attention-mask bug, and arch target_lm, seed 003's
"decoder-only" that read no source. What each computes, that both attention paths agree on it, that
the leak is one, and that both run through training, decoding, evaluation and the planner."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import yaml

from model import ModelConfig, build_model
from model.attention import MultiHeadAttention, future_only_mask
from model.config import ARCHS, ATTENTION_IMPLS, DECODER_MASKS, POSITIONALS
from pipeline.evaluate import evaluate
from pipeline.params import load_params
from pipeline.planning import estimate
from pipeline.train import flops_per_target_token
from pipeline.training.batching import read_manifest
from tests.test_evaluate_lm import CFG, CONTEXT, save_run, seq2seq_shards
from tests.test_plan import rows_for
from tests.tiny_project import tiny_params

V, PAD, BOS, EOS = 29, 0, 2, 3
FUTURE_ARCHS = [a for a in ARCHS if a != "prefix_lm"]  # prefix_lm + future_only is refused


def _cfg(arch="encoder_decoder", **kw) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=V, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2,
                                 d_ff=32, dropout=0.0, max_len=40, arch=arch), **kw})


def _model(arch="encoder_decoder", seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(_cfg(arch, **kw)).double().eval()


def _tokens(shape, seed):
    return torch.randint(4, V, shape, generator=torch.Generator().manual_seed(seed))


def _batch():
    src, tgt_in, tgt_out = _tokens((3, 6), 0), _tokens((3, 5), 1), _tokens((3, 5), 2)
    src[1, 3:] = PAD
    tgt_in[:, 0] = BOS
    tgt_in[2, 3:] = PAD
    tgt_out[2, 2:] = PAD
    return src, tgt_in, tgt_out


# -- defaults --------------------------------------------------------------------------------
def test_the_defaults_are_the_correct_model():
    cfg = ModelConfig()
    assert (cfg.decoder_mask, cfg.arch) == ("causal", "encoder_decoder")
    torch.manual_seed(0)
    model = build_model(_cfg("decoder_only"))
    assert not model.decoder.future_only and not model.target_only


# -- decoder_mask: future_only ---------------------------------------------------------------
def seed_attention(q, k, v):
    """Seed 000's attention, as its report prints it: masked_fill(mask == 0, -1e9) on the 0/-inf
    causal mask (torch.triu(torch.full((T, T), -inf), diagonal=1))."""
    t = q.shape[-2]
    mask = torch.triu(torch.full((t, t), float("-inf"), dtype=q.dtype), diagonal=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=-1) @ v


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_future_only_attention_is_the_seeds_masked_fill_forward_and_backward(impl):
    torch.manual_seed(0)
    mha = MultiHeadAttention(ModelConfig(d_model=16, n_heads=2, attention_impl=impl)).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    mask, uniform = future_only_mask(None, None, 0, 7, 7, x.device)
    out, _ = mha(x, attn_mask=mask, uniform_rows=uniform)
    q, k, v = mha._split(mha.qkv_proj(x), 3)
    ref = mha.out_proj(seed_attention(q, k, v).transpose(1, 2).reshape(2, 7, 16))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    grads = [torch.autograd.grad(y.square().sum(), [x, *mha.parameters()]) for y in (out, ref)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_the_last_row_is_the_plain_mean_of_the_values_whatever_its_scores(impl):
    """float32 and last-row scores far beyond 32: an additive -1e9 would round them to steps of 64
    (the float32 spacing at 1e9) and break the tie; the seed's replaced row is uniform."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(ModelConfig(d_model=16, n_heads=2, attention_impl=impl))
    x = torch.randn(2, 7, 16) * 8
    mask, uniform = future_only_mask(None, None, 0, 7, 7, x.device)
    q, k, v = mha._split(mha.qkv_proj(x), 3)
    assert (q[:, :, -1] @ k.transpose(-2, -1)).abs().max() / math.sqrt(8) > 64
    out, _ = mha(x, attn_mask=mask, uniform_rows=uniform)
    mean = mha.out_proj(v.mean(dim=2).reshape(2, 16))  # (B, H, Dh) -> (B, D): every key weighted 1/7
    torch.testing.assert_close(out[:, -1], mean, atol=1e-5, rtol=1e-5)
    _, weights = mha(x, attn_mask=mask, uniform_rows=uniform, need_weights=True)
    assert (weights[:, :, -1] == 1 / 7).all() and (weights[:, :, :-1].tril() == 0).all()


@pytest.mark.usefixtures("torch_fused_kernel")  # torch's kernel, not the routed CPU formula
@pytest.mark.parametrize("arch", FUTURE_ARCHS)
@pytest.mark.parametrize("positional", POSITIONALS)
def test_future_only_manual_equals_sdpa_forward_and_backward(arch, positional):
    models = [_model(arch, positional=positional, decoder_mask="future_only", attention_impl=impl)
              for impl in ATTENTION_IMPLS]
    models[1].load_state_dict(models[0].state_dict())
    results = []
    for m in models:
        logits, loss = m(*_batch())
        loss.backward()
        results.append((logits, {n: p.grad for n, p in m.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-10, rtol=1e-10)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], atol=1e-10, rtol=1e-10, msg=name)


@pytest.mark.parametrize("arch", FUTURE_ARCHS)
def test_future_only_position_sees_itself_and_later_tokens_and_the_last_sees_all(arch):
    """One decoder layer: changing target token k changes the outputs at positions <= k (k itself
    through the residual, earlier ones through attention), never those between k and the last,
    and always the last (the uniform average). With two layers the last position's layer-1 output,
    which holds every token, is a later position for all the others: every output changes."""
    src, tgt = _tokens((2, 6), 0), _tokens((2, 7), 1)
    tgt[:, 0] = BOS
    for layers in (1, 2):
        model = _model(arch, n_decoder_layers=layers, decoder_mask="future_only")
        logits, _ = model(src, tgt)
        for k in range(1, 7):
            changed = tgt.clone()
            changed[:, k] = (tgt[:, k] - 4 + 1) % (V - 4) + 4
            new, _ = model(src, changed)
            moved = [not torch.allclose(new[:, i], logits[:, i], atol=1e-12, rtol=0) for i in range(7)]
            expect = [i <= k or i == 6 for i in range(7)] if layers == 1 else [True] * 7
            assert moved == expect, (layers, k, moved)


@pytest.mark.parametrize("arch", FUTURE_ARCHS)
def test_future_only_attention_maps_see_strictly_later_positions_and_the_last_row_is_uniform(arch):
    model = _model(arch, decoder_mask="future_only", attention_impl="sdpa")
    src, tgt = _tokens((1, 4), 0), _tokens((1, 6), 1)
    full = model.attention_maps(src, tgt)
    self_map = full["decoder.self"]
    keys = 6 if arch != "decoder_only" else 4 + 6  # decoder_only: one softmax over source + target
    assert (self_map[:-1].tril() == 0).all()  # rows before the last: strictly later keys only
    torch.testing.assert_close(self_map[-1], torch.full((6,), 1 / keys))
    if arch == "decoder_only":  # the source positions see later ones too, the target included
        enc = full["encoder.self"]
        assert (enc.tril() == 0).all() and (full["decoder.cross"][:-1] == 0).all()
        torch.testing.assert_close(full["decoder.cross"][-1], torch.full((4,), 1 / keys))
    else:
        torch.testing.assert_close(self_map[:-1].sum(-1), torch.ones(5))


def _train(arch: str, decoder_mask: str, steps: int = 40) -> float:
    """Random targets, independent of the source: the next target token is the only thing to read."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=20, d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                    d_ff=64, dropout=0.0, max_len=32, arch=arch, norm_position="pre",
                                    decoder_mask=decoder_mask))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        tgt = torch.randint(4, 20, (16, 8), generator=gen)
        src = torch.randint(4, 20, (16, 5), generator=gen)
        _, loss = model(src, torch.cat([torch.full((16, 1), BOS), tgt], 1),
                        torch.cat([tgt, torch.full((16, 1), EOS)], 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_the_leak_drives_the_train_loss_towards_zero_where_causal_cannot_learn(arch):
    causal, leak = _train(arch, "causal"), _train(arch, "future_only")
    assert causal > 2.0  # 8 of 9 targets uniform over 16 tokens: ln 16 = 2.77 each
    assert leak < 0.5 and leak < 0.2 * causal


@pytest.mark.parametrize("arch", FUTURE_ARCHS)
@pytest.mark.parametrize("strategy", ["greedy", "beam", "sample"])
def test_future_only_decoding_recomputes_every_step(arch, strategy):
    model = _model(arch, decoder_mask="future_only")
    src = _batch()[0]
    assert model.start_decoding(src).caches is None  # no KV cache: later tokens change earlier outputs
    outs = [model.generate(src, max_new_tokens=5, strategy=strategy, generator=torch.Generator().manual_seed(0),
                           use_cache=c) for c in (True, False)]
    assert outs[0] == outs[1] and len(outs[0]) == 3
    # What a decoding step reads is the full forward's last position on the prefix so far.
    state = model.start_decoding(src)
    tokens = [BOS, 7, 9]
    for t in tokens:
        step = model.decode_step(state, torch.full((3,), t))
    full, _ = model(src, torch.tensor([tokens] * 3))
    torch.testing.assert_close(step, full[:, -1])


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only", "target_lm"])
def test_the_evaluate_stage_runs_a_future_only_model(tiny_shards, tmp_path, arch):
    shards = seq2seq_shards(tiny_shards, "summarization", tmp_path)
    manifest = read_manifest(shards)
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=manifest["vocab_size"], d_model=32, n_heads=4, n_encoder_layers=1,
                                    n_decoder_layers=2, d_ff=64, dropout=0.0, arch=arch, decoder_mask="future_only",
                                    pad_id=manifest["pad_id"], bos_id=manifest["bos_id"], eos_id=manifest["eos_id"]))
    run = save_run(model.eval(), tmp_path / "run")
    evaluate(shards, tiny_shards / "tokenizer", run, tmp_path / "eval", CFG, 1024, CONTEXT, 4)
    ev = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert math.isfinite(ev["test_loss"]) and math.isfinite(ev["val_loss"]) and ev["n_decoded"] >= 1


# -- arch: target_lm -------------------------------------------------------------------------
def test_target_lm_never_reads_the_source_and_is_decoder_only_without_one():
    model = _model("target_lm")
    src, tgt_in, _ = _batch()
    logits, _ = model(src, tgt_in)
    for other in (_tokens((3, 9), 5), torch.full((3, 2), PAD), None):
        torch.testing.assert_close(model(other, tgt_in)[0], logits, atol=0, rtol=0)
    same_weights = _model("decoder_only")
    same_weights.load_state_dict(model.state_dict())  # the very same parameters
    torch.testing.assert_close(same_weights(None, tgt_in)[0], logits, atol=1e-12, rtol=0)
    assert not torch.allclose(same_weights(src, tgt_in)[0], logits)  # decoder_only does read it


def test_target_lm_loss_is_over_the_same_target_tokens_as_decoder_only():
    src, tgt_in, tgt_out = _batch()
    outputs = {arch: _model(arch)(src, tgt_in, tgt_out) for arch in ("target_lm", "decoder_only")}
    for logits, loss in outputs.values():
        assert logits.shape == (3, 5, V)  # one row of logits per target position, source or not
        picked = logits.log_softmax(-1).gather(-1, tgt_out[..., None])[..., 0]
        torch.testing.assert_close(loss, -picked[tgt_out != PAD].mean())


@pytest.mark.parametrize("positional", POSITIONALS)
@pytest.mark.parametrize("decoder_mask", DECODER_MASKS)
def test_target_lm_and_future_only_train_a_step(positional, decoder_mask):
    for arch in (["target_lm"] if decoder_mask == "causal" else FUTURE_ARCHS):
        torch.manual_seed(0)
        model = build_model(_cfg(arch, positional=positional, decoder_mask=decoder_mask, dropout=0.1)).train()
        _, loss = model(*_batch())
        loss.backward()
        assert torch.isfinite(loss)
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), (arch, name)


@pytest.mark.parametrize("strategy", ["greedy", "beam"])
def test_target_lm_decodes_unconditionally_from_bos(strategy):
    model = _model("target_lm")
    src = _batch()[0]
    out = model.generate(src, max_new_tokens=6, strategy=strategy)
    assert out == model.generate(src, max_new_tokens=6, strategy=strategy, use_cache=False)
    assert out == model.generate(_tokens((3, 4), 9), max_new_tokens=6, strategy=strategy)  # any source
    assert out == model.generate(None, max_new_tokens=6, strategy=strategy) * 3  # = no source at all
    assert model.prompt_len(src) == 0


def test_the_planner_counts_target_lm_without_its_source():
    target, packed = (_cfg(arch, d_model=32, n_heads=4, max_len=64) for arch in ("target_lm", "decoder_only"))
    with torch.device("meta"):
        target_model, packed_model = build_model(target), build_model(packed)
    per_token = flops_per_target_token(target_model, target, 30.0, 10.0)
    assert per_token == flops_per_target_token(packed_model, packed, 0.0, 10.0)
    assert per_token < flops_per_target_token(packed_model, packed, 30.0, 10.0) / 3
    assert (estimate.activation_bytes(target_model, target, 4, 30, 10, bf16=False)
            == estimate.activation_bytes(packed_model, packed, 4, 0, 10, bf16=False))
    # Without data: the batch still holds the sources (the same batches as every variant), but
    # only the target has to fit the model's max_len.
    assert estimate.guessed_shape(target, {"batch_tokens": 800}, (60, 20)) == (10, 60, 20)
    assert estimate.guessed_shape(packed, {"batch_tokens": 800}, (60, 20)) == (12, 44, 20)


def test_a_study_with_both_switches_is_checked_and_planned(tmp_path):
    params = tiny_params(ablations={"baseline": {}, "seed_003_decoder_only": {"model": {"arch": "target_lm"}},
                                    "seed_000_mask": {"model": {"decoder_mask": "future_only"}}})
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    rows = {r.variant: r for r in rows_for(load_params(path), None)}
    assert rows["seed_003_decoder_only"].flops_per_token < rows["baseline"].flops_per_token
    assert rows["seed_000_mask"].params == rows["baseline"].params
    assert rows["seed_000_mask"].flops_per_token == rows["baseline"].flops_per_token


# -- validation ------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (dict(decoder_mask="anti_causal"), r"^ModelConfig\.decoder_mask must be one of"),
    (dict(decoder_mask=None), r"^ModelConfig\.decoder_mask must be str"),
    (dict(arch="source_lm"), r"^ModelConfig\.arch must be one of"),
    (dict(arch="prefix_lm", decoder_mask="future_only"), r"^ModelConfig\.decoder_mask='future_only' .*prefix_lm"),
])
def test_bad_values_and_combinations_are_one_line_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message) as err:
        ModelConfig(**overrides)
    assert "\n" not in str(err.value)


def test_both_switches_round_trip_through_a_checkpoints_config():
    cfg = _cfg("target_lm", decoder_mask="future_only")
    again = build_model(dataclasses.asdict(cfg)).cfg
    assert (again.arch, again.decoder_mask) == ("target_lm", "future_only")
    old = {k: v for k, v in dataclasses.asdict(_cfg()).items() if k != "decoder_mask"}  # an older model.pt
    assert build_model(old).cfg.decoder_mask == "causal"
