"""Knock-outs change exactly what they name, and nothing once the context is left."""
from __future__ import annotations

import pytest
import torch

from model import ModelConfig, build_model
from model.knockout import COUNTERPARTS, Knock, check, knockout, plan, record_means

SRC = torch.tensor([[5, 6, 7, 9], [8, 9, 4, 0]])
TGT_IN = torch.tensor([[2, 10, 11, 4], [2, 12, 0, 0]])
TGT_OUT = torch.tensor([[10, 11, 4, 3], [12, 3, 0, 0]])


def _model(**switches):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=16, d_model=16, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=24,
                      max_len=16, dropout=0.0, **switches)
    return build_model(cfg).eval()


def _means(model):
    with record_means(model) as means:
        for row in range(SRC.shape[0]):
            model(SRC[row:row + 1], TGT_IN[row:row + 1])
    return means


def _every_knock(model, means):
    for name, mode, knocks in plan(model.cfg):
        with knockout(model, *knocks, means=means):
            yield name, mode, model(SRC, TGT_IN, TGT_OUT)


@pytest.mark.parametrize("switches", [{}, {"norm_position": "pre", "positional": "learned"},
                                      {"arch": "decoder_only", "positional": "rope", "attention_impl": "manual"}])
def test_knockout_of_nothing_and_after_exit_is_the_plain_forward(switches):
    model = _model(**switches)
    logits, loss = model(SRC, TGT_IN, TGT_OUT)
    with knockout(model):
        same_logits, same_loss = model(SRC, TGT_IN, TGT_OUT)
    assert torch.equal(logits, same_logits) and torch.equal(loss, same_loss)
    means = _means(model)
    changed = {name for name, mode, (knocked, _) in _every_knock(model, means) if not torch.equal(knocked, logits)}
    assert "positional" in changed and "residual.all" in changed and "heads_but_one" in changed
    after, after_loss = model(SRC, TGT_IN, TGT_OUT)  # every hook and switch removed again
    assert torch.equal(after, logits) and torch.equal(after_loss, loss)


@pytest.mark.parametrize("attn", ["self", "cross"])
def test_zeroing_a_head_equals_zeroing_its_columns_of_the_output_projection(attn):
    model = _model()
    knock = Knock("head", stack="decoder", attn=attn, layer=1, head=2)
    with knockout(model, knock):
        knocked, _ = model(SRC, TGT_IN)
    proj = getattr(model.decoder.layers[1], f"{attn}_attn").out_proj
    with torch.no_grad():
        proj.weight[:, 8:12] = 0.0  # head 2 of 4 at d_model 16: channels 8..11 of the concatenated heads
    manual, _ = model(SRC, TGT_IN)
    torch.testing.assert_close(knocked, manual, rtol=0, atol=1e-6)
    assert not torch.equal(knocked, _model()(SRC, TGT_IN)[0])


def test_a_decoder_knockout_leaves_the_encoder_alone():
    model = _model()
    memory, _ = model.encode(SRC)
    for knock in (Knock("head", "decoder", 0, "cross", 1), Knock("ffn", "decoder", 1), Knock("residual", "decoder", 0)):
        with knockout(model, knock):
            assert torch.equal(model.encode(SRC)[0], memory)
            assert not torch.equal(model(SRC, TGT_IN)[0], _model()(SRC, TGT_IN)[0])


def test_mean_ablation_of_a_head_adds_the_recorded_mean_through_the_projection():
    model = _model()
    means = _means(model)
    head_mean = means["decoder.0.self.heads"][4:8]  # head 1
    with knockout(model, Knock("head", "decoder", 0, "self", 1, mode="mean"), means=means):
        mean_ablated, _ = model(SRC, TGT_IN)
    proj = model.decoder.layers[0].self_attn.out_proj
    with knockout(model, Knock("head", "decoder", 0, "self", 1)), torch.no_grad():
        proj.bias += proj.weight[:, 4:8] @ head_mean  # zeroed head + its mean's contribution
        manual, _ = model(SRC, TGT_IN)
    torch.testing.assert_close(mean_ablated, manual, rtol=0, atol=1e-5)


def test_recorded_means_are_means_over_the_tokens_seen():
    model = _model()
    seen = []
    hook = model.decoder.layers[1].ffn.register_forward_hook(lambda m, a, out: seen.append(out.reshape(-1, 16)))
    means = _means(model)
    hook.remove()
    torch.testing.assert_close(means["decoder.1.ffn.out"], torch.cat(seen).mean(0))


def test_mean_ablation_without_means_is_an_error_naming_the_activation():
    model = _model()
    with pytest.raises(ValueError, match="decoder.0.ffn.out"):
        with knockout(model, Knock("ffn", "decoder", 0, mode="mean")):
            pass


def test_knockouts_apply_to_cached_generation():
    model = _model()
    plain = model.generate(SRC, max_new_tokens=6, use_cache=True)
    with knockout(model, Knock("positional")):
        cached = model.generate(SRC, max_new_tokens=6, use_cache=True)
        recomputed = model.generate(SRC, max_new_tokens=6, use_cache=False)
    assert cached == recomputed
    assert model.generate(SRC, max_new_tokens=6, use_cache=True) == plain


def test_plan_counts_and_counterparts():
    cfg = _model().cfg
    names = [name for name, mode, _ in plan(cfg, modes=["zero"])]
    # 3 attentions x 2 layers x 4 heads, heads_but_one, 6 attention + 4 ffn sublayers, positions, 4 + 1 residual
    assert len(names) == 24 + 1 + 6 + 4 + 1 + 5
    assert set(COUNTERPARTS) <= set(names)
    (_, _, but_one), = [p for p in plan(cfg, modes=["zero"]) if p[0] == "heads_but_one"]
    assert len(but_one) == 3 * 2 * 3 and all(k.head != 0 for k in but_one)
    assert "positional" not in {n for n, _, _ in plan(_model(positional="none").cfg)}  # parts=None: what it has
    rope = _model(positional="rope").cfg
    assert ("positional", "mean") not in {(n, m) for n, m, _ in plan(rope)}  # no mean rotation


@pytest.mark.parametrize("kwargs, arch, message", [
    ({"heads": [4]}, "encoder_decoder", r"^heads: head 4 is beyond the model's n_heads=4"),
    ({"attentions": ["cross"]}, "decoder_only", r"^attentions: 'cross': a decoder_only model has self-attention only"),
    ({"parts": ["mlp"]}, "encoder_decoder", r"^parts: 'mlp'"),
    ({"modes": ["half"]}, "encoder_decoder", r"^modes: 'half'"),
])
def test_plan_names_the_argument_the_model_lacks(kwargs, arch, message):
    with pytest.raises(ValueError, match=message):
        plan(_model(arch=arch).cfg, **kwargs)


def test_check_rejects_parts_the_model_lacks():
    cfg = _model(arch="decoder_only").cfg
    with pytest.raises(ValueError, match="^stack 'encoder'"):
        check(cfg, Knock("ffn", stack="encoder"))
    with pytest.raises(ValueError, match="^attn 'cross'"):
        check(cfg, Knock("attention", attn="cross"))
    with pytest.raises(ValueError, match="^layer 2"):
        check(cfg, Knock("ffn", layer=2))
    with pytest.raises(ValueError, match="^residual"):
        check(_model(residual=False).cfg, Knock("residual"))
    with pytest.raises(ValueError, match="^positional"):
        check(_model(positional="none").cfg, Knock("positional"))
