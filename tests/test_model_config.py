"""ModelConfig: round trip, defaults = the paper, and one clear error per kind of nonsense."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from model import ModelConfig, build_model


def test_defaults_are_the_paper_base_model():
    cfg = ModelConfig()
    assert (cfg.arch, cfg.norm, cfg.norm_position, cfg.ffn, cfg.positional) == (
        "encoder_decoder", "layernorm", "post", "relu", "sinusoidal")
    assert cfg.residual and cfg.scale_embeddings and cfg.share_embeddings and cfg.tie_output
    assert (cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff) == (512, 8, 6, 6, 2048)


def test_asdict_round_trips():
    cfg = ModelConfig(vocab_size=100, d_model=32, n_heads=4, arch="prefix_lm", positional="rope",
                      ffn="swiglu", norm="rmsnorm", norm_position="pre", residual=False, dropout=0)
    again = ModelConfig(**dataclasses.asdict(cfg))
    assert again == cfg
    assert isinstance(again.dropout, float)  # an int given for a float field is stored as float


@pytest.mark.parametrize("overrides, field", [
    (dict(d_model=30, n_heads=4), "d_model"),
    (dict(d_model=12, n_heads=4, positional="rope"), "positional"),  # head size 3: odd
    (dict(arch="transformer_xl"), "arch"),
    (dict(positional="alibi"), "positional"),
    (dict(norm="batchnorm"), "norm"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(ffn="tanh"), "ffn"),
    (dict(attention_impl="flash"), "attention_impl"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(n_heads=0), "n_heads"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(n_encoder_layers=0), "n_encoder_layers"),
    (dict(n_decoder_layers=0), "n_decoder_layers"),
    (dict(max_len=0), "max_len"),
    (dict(d_ff=0), "d_ff"),
    (dict(rope_theta=0.0), "rope_theta"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(rel_buckets=2), "rel_buckets"),
    (dict(rel_buckets=32, rel_max_distance=16), "rel_max_distance"),
    (dict(bos_id=0), "bos_id"),
    (dict(eos_id=0), "eos_id"),
    (dict(pad_id=100, vocab_size=100), "pad_id"),
    (dict(residual="yes"), "residual"),
    (dict(residual=1), "residual"),
    (dict(d_model=64.0), "d_model"),
    (dict(n_heads=True), "n_heads"),
    (dict(arch=None), "arch"),
    (dict(relative_bias=True, positional="rope"), "relative_bias"),
    (dict(relative_bias=True, positional="relative"), "relative_bias"),
    (dict(relative_bias=True, positional="none"), "relative_bias"),
])
def test_rejects_nonsense_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**overrides)


def test_accepts_edge_values():
    ModelConfig(arch="decoder_only", n_encoder_layers=0)  # single stack: encoder count unused
    ModelConfig(d_model=24, n_heads=4, positional="rope")  # even head size 6
    ModelConfig(d_model=8, n_heads=1)  # single head


def test_build_model_from_dict_rejects_unknown_key():
    with pytest.raises(ValueError, match="n_layers"):
        build_model({"n_layers": 3})


def test_swiglu_hidden_keeps_parameter_budget():
    assert ModelConfig(ffn="swiglu", d_ff=3072).ffn_hidden == 2048
    assert ModelConfig(ffn="swiglu", d_ff=1024).ffn_hidden == 683
    assert ModelConfig(ffn="relu", d_ff=1024).ffn_hidden == 1024
