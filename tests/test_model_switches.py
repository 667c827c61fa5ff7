"""Every switch is real: each combination builds and trains a step; parameter counts add up."""
from __future__ import annotations

import dataclasses
import itertools
import typing

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import ModelConfig, build_model
from model.config import ARCHS, ATTENTION_IMPLS, FFNS, NORM_POSITIONS, NORMS, POSITIONALS
from model.layers import FeedForward


# Full product of the structural switches (800 cases). The flags, the attention path and every
# other bool field of ModelConfig (read from the dataclass: a new one joins by itself), rotate
# across it: every (arch, positional) pair (a block of 40 cases) meets all their combinations if
# there are no more than 40 (32 with five flags), their pairing with norm/ffn/residual shifting by
# one from block to block; with more, each block meets 40 of them and the blocks together all.
# norm="none" and relative_bias have their own test below, to keep each block long.
# tests/test_model_every_switch.py tests each switch alone in every arch and attention path.
STRUCTURAL = list(itertools.product(ARCHS, POSITIONALS, [n for n in NORMS if n != "none"], NORM_POSITIONS, FFNS,
                                    (True, False)))
FLAG_FIELDS = [f.name for f in dataclasses.fields(ModelConfig)
               if typing.get_type_hints(ModelConfig)[f.name] is bool and f.name not in ("residual", "relative_bias")]
FLAGS = list(itertools.product(ATTENTION_IMPLS, *[(True, False)] * len(FLAG_FIELDS)))
BLOCK = len(STRUCTURAL) // (len(ARCHS) * len(POSITIONALS))  # cases per (arch, positional)
SHIFT = 1 if len(FLAGS) <= BLOCK else BLOCK  # from one block to the next
assert len(FLAGS) == len(ATTENTION_IMPLS) * 2 ** len(FLAG_FIELDS) <= len(STRUCTURAL)


def _case(i: int) -> dict:
    arch, positional, norm, norm_position, ffn, residual = STRUCTURAL[i]
    impl, *flags = FLAGS[(i % BLOCK + i // BLOCK * SHIFT) % len(FLAGS)]
    return dict(arch=arch, positional=positional, norm=norm, norm_position=norm_position, ffn=ffn,
                residual=residual, attention_impl=impl, **dict(zip(FLAG_FIELDS, flags)),
                n_heads=1 if i % 7 == 0 else 2)


def _tiny(**switches) -> ModelConfig:
    return ModelConfig(vocab_size=13, d_model=8, n_encoder_layers=1, n_decoder_layers=1, d_ff=6,
                       max_len=12, rel_buckets=4, rel_max_distance=8,
                       **{"n_heads": 2, "dropout": 0.1, **switches})


SRC = torch.tensor([[5, 6, 7], [8, 9, 0]])
TGT_IN = torch.tensor([[2, 10, 11], [2, 12, 0]])
TGT_OUT = torch.tensor([[10, 11, 3], [12, 3, 0]])


def _trains_one_step(cfg: ModelConfig, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = build_model(cfg).train()
    _, loss = model(SRC, TGT_IN, TGT_OUT)
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name  # no dead or broken part
    # Every parameter lands in a named component; only the relative-position bias is "other".
    assert (model.param_counts()["other"] > 0) == (cfg.positional == "relative" or cfg.relative_bias)
    return model


def _pairwise_cover(cases: list[dict]) -> set[int]:
    """Indices of cases that, together, hold every pair of (switch, value)s any case holds: greedy,
    the case with the most pairs not yet held first (ties: the lowest index)."""
    def pairs(case):
        return set(itertools.combinations(sorted(case.items(), key=str), 2))
    held, wanted = [pairs(c) for c in cases], set().union(*(pairs(c) for c in cases))
    chosen = set()
    while wanted:
        best = max(range(len(cases)), key=lambda i: (len(held[i] & wanted), -i))
        chosen.add(best)
        wanted -= held[best]
    return chosen


# The quick tier trains the pairwise cover (every two switches' values met at least once, 5% of the
# cases); the full suite every case: a fault needing three switches at once shows only there.
QUICK_CASES = _pairwise_cover([_case(i) for i in range(len(STRUCTURAL))])


@pytest.mark.parametrize("i", [pytest.param(i, id="-".join(str(v) for v in s),
                                            marks=() if i in QUICK_CASES else pytest.mark.slow)
                               for i, s in enumerate(STRUCTURAL)])
def test_every_switch_combination_trains_one_step(i):
    _trains_one_step(_tiny(**_case(i)), seed=i)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("norm_position", NORM_POSITIONS)
@pytest.mark.parametrize("extra", [dict(norm="none"), dict(relative_bias=True, positional="sinusoidal"),
                                   dict(relative_bias=True, positional="learned", norm="none")],
                         ids=["no-norm", "sinusoidal+relative", "learned+relative-no-norm"])
def test_no_norm_and_added_relative_bias_train_one_step(arch, norm_position, extra):
    model = _trains_one_step(_tiny(arch=arch, norm_position=norm_position, **extra), seed=0)
    if extra.get("norm") == "none":
        assert model.param_counts()["norms"] == 0


def test_every_flag_value_is_covered():
    cases = [_case(i) for i in range(len(STRUCTURAL))]
    for key in cases[0]:
        assert len({c[key] for c in cases}) >= 2, key
    seen = set()
    for arch, positional in itertools.product(ARCHS, POSITIONALS):
        flags = {tuple(c[k] for k in ("attention_impl", *FLAG_FIELDS))
                 for c in cases if (c["arch"], c["positional"]) == (arch, positional)}
        assert len(flags) == min(len(FLAGS), BLOCK)
        seen |= flags
    assert len(seen) == len(FLAGS)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_tiny_model_learns_a_fixed_batch(arch):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=13, d_model=32, n_heads=4, n_encoder_layers=1,
                                    n_decoder_layers=2, d_ff=64, dropout=0.0, arch=arch))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        _, loss = model(SRC, TGT_IN, TGT_OUT)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.25 * first


def test_dropout_only_in_training_mode():
    model = build_model(_tiny(dropout=0.5))
    a, b = model(SRC, TGT_IN)[0], model(SRC, TGT_IN)[0]
    assert not torch.allclose(a, b)
    model.eval()
    torch.testing.assert_close(model(SRC, TGT_IN)[0], model(SRC, TGT_IN)[0])


def test_param_counts_closed_form_for_the_paper_layout():
    d, ff, v, n_enc, n_dec = 16, 40, 50, 2, 3
    cfg = ModelConfig(vocab_size=v, d_model=d, n_heads=4, n_encoder_layers=n_enc, n_decoder_layers=n_dec, d_ff=ff)
    counts = build_model(cfg).param_counts()
    assert counts == {
        "embeddings": v * d,  # one table: shared and tied
        "attention": (n_enc + 2 * n_dec) * (4 * d * d + 4 * d),
        "ffn": (n_enc + n_dec) * (2 * d * ff + ff + d),
        "norms": (2 * n_enc + 3 * n_dec) * 2 * d,
        "other": 0,
        "total": v * d + (n_enc + 2 * n_dec) * (4 * d * d + 4 * d) + (n_enc + n_dec) * (2 * d * ff + ff + d)
        + (2 * n_enc + 3 * n_dec) * 2 * d,
    }


def test_param_counts_follow_the_switches():
    base = dict(vocab_size=50, d_model=16, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=48)
    count = lambda **kw: build_model(ModelConfig(**{**base, **kw})).param_counts()  # noqa: E731
    ref = count()
    assert count(tie_output=False)["embeddings"] == ref["embeddings"] + 50 * 16
    assert count(share_embeddings=False)["embeddings"] == ref["embeddings"] + 50 * 16
    assert count(positional="learned")["embeddings"] == ref["embeddings"] + 2 * 512 * 16  # per stack
    assert count(positional="relative")["other"] == 2 * 32 * 4  # one table per stack
    assert count(relative_bias=True) == {**ref, "other": 2 * 32 * 4, "total": ref["total"] + 2 * 32 * 4}
    assert count(norm="none")["norms"] == 0 and count(norm="none")["total"] == ref["total"] - ref["norms"]
    assert count(norm_position="pre")["norms"] == ref["norms"] + 2 * 2 * 16  # final norms
    assert count(norm="rmsnorm")["norms"] == ref["norms"] // 2  # no bias
    assert count(bias=False, ffn="swiglu")["ffn"] == count(bias=False)["ffn"]  # 2/3 rule: equal
    assert count(arch="decoder_only")["attention"] == ref["attention"] // 3  # no cross-attention


# What each FFN choice computes, written out with torch's own functions: h = x W_in (+ b), then W_out.
_FFN_ACTIVATION = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact (erf)
    "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
    "silu": F.silu,
    "swiglu": lambda h: F.silu(h.chunk(2, dim=-1)[0]) * h.chunk(2, dim=-1)[1],
}


def test_every_ffn_choice_has_its_reference():
    assert set(_FFN_ACTIVATION) == set(FFNS)


@pytest.mark.parametrize("ffn", FFNS)
@pytest.mark.parametrize("bias", [True, False])
def test_every_ffn_choice_computes_its_function(ffn, bias):
    torch.manual_seed(0)
    block = FeedForward(ModelConfig(d_model=8, d_ff=12, ffn=ffn, bias=bias, dropout=0.0)).eval()
    x = 3 * torch.randn(2, 5, 8)  # wide enough that tanh-GELU and exact GELU part
    want = block.w_out(_FFN_ACTIVATION[ffn](block.w_in(x)))
    torch.testing.assert_close(block(x), want, rtol=0, atol=0)


def test_gelu_tanh_is_not_exact_gelu():
    torch.manual_seed(0)
    exact = FeedForward(ModelConfig(d_model=8, d_ff=12, ffn="gelu", dropout=0.0)).eval()
    tanh = FeedForward(ModelConfig(d_model=8, d_ff=12, ffn="gelu_tanh", dropout=0.0)).eval()
    tanh.load_state_dict(exact.state_dict())  # the same parameters: only the activation differs
    x = 3 * torch.randn(2, 5, 8)
    assert not torch.allclose(exact(x), tanh(x), rtol=0, atol=1e-6)
    h = exact.w_in(x)
    torch.testing.assert_close(tanh(x), tanh.w_out(F.gelu(h, approximate="tanh")), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("switch, off, on", [
    ("residual", False, True), ("scale_embeddings", False, True),
    ("positional", "none", "sinusoidal"), ("positional", "none", "rope"),
])
def test_weightless_switches_change_the_output(arch, switch, off, on):
    """Switches that add no parameters: the same weights must give different logits, else the
    flag is not wired in (the gradient check above cannot see a table that is never used)."""
    torch.manual_seed(0)
    a = build_model(_tiny(arch=arch, dropout=0.0, **{switch: off})).eval()
    b = build_model(_tiny(arch=arch, dropout=0.0, **{switch: on})).eval()
    b.load_state_dict(a.state_dict())  # strict: the switch must not change the parameters
    (la, _), (lb, _) = a(SRC, TGT_IN), b(SRC, TGT_IN)
    assert not torch.allclose(la, lb, atol=1e-4)


def test_prefix_lm_equals_decoder_only_with_one_layer_and_differs_with_two():
    # One layer: targets attend to the source's embeddings, whatever the source's own attention
    # pattern, so prefix_lm == decoder_only exactly (why the translation presets run it at two).
    src = torch.randint(4, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(4, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    out = {}
    for layers in (1, 2):
        for arch in ("decoder_only", "prefix_lm"):
            torch.manual_seed(0)
            cfg = ModelConfig(vocab_size=50, d_model=32, n_heads=2, n_encoder_layers=0,
                              n_decoder_layers=layers, d_ff=64, arch=arch, dropout=0.0)
            out[layers, arch] = build_model(cfg).eval()(src, tgt)[0]
    assert torch.equal(out[1, "decoder_only"], out[1, "prefix_lm"])
    assert not torch.allclose(out[2, "decoder_only"], out[2, "prefix_lm"])
