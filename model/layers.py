"""Norms, the feed-forward block, the residual/norm wrapper and the Transformer layer.

`Sublayer` is the only place that knows about pre/post norm and residual on/off; every attention
and FFN block goes through it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor, nn

from model import exact
from model.attention import KVCache, MultiHeadAttention
from model.config import ModelConfig


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU with the tanh approximation (GPT-2's and nanoGPT's at 23a8e701, written out there as new_gelu)."""
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": gelu_tanh,
                                                       "silu": F.silu}


def make_dropout(p: float) -> nn.Dropout | None:
    """None at p = 0, where dropout is the identity: calling a module that does nothing still costs
    microseconds per use, a measurable share of a small model's step (benchmarks.gpt_step)."""
    return nn.Dropout(p) if p > 0 else None


def dropout(module: nn.Dropout | None, x: Tensor) -> Tensor:
    return x if module is None else module(x)


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm (the same parameters, state dict and outputs) whose CPU gradients do not depend
    on the thread count (model/exact.py)."""

    def forward(self, x: Tensor) -> Tensor:
        return exact.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "none":
        return nn.Identity()
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)  # thread-count-free gradients
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)  # no mean subtraction, no bias


class FeedForward(nn.Module):
    """Position-wise FFN: w_out(dropout(act(w_in x))); for swiglu, w_out(silu(x W) * (x V)).
    The hidden dropout is cfg.ffn_hidden_dropout (none at 0, as in GPT-2).

    SwiGLU's two input matrices are fused into one (D, 2*hidden) projection.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.ffn_hidden
        self.gated = cfg.ffn == "swiglu"
        self.act = F.silu if self.gated else _ACTIVATIONS[cfg.ffn]
        self.w_in = nn.Linear(cfg.d_model, 2 * hidden if self.gated else hidden, bias=cfg.bias)
        self.w_out = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)
        self.dropout = make_dropout(cfg.ffn_hidden_dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.w_in(x)
        if self.gated:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        return self.w_out(dropout(self.dropout, h))


class Sublayer(nn.Module):
    """Residual connection, dropout and norm around one sublayer function.

    post: norm(x + dropout(f(x)))  (paper);  pre: x + dropout(f(norm(x))).
    Without residual the `x +` is dropped and everything else stays.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = make_norm(cfg)
        self.dropout = make_dropout(cfg.dropout)
        self.pre, self.residual = cfg.norm_position == "pre", cfg.residual
        # What the skip connection adds instead of x; None (always, except inside
        # model.knockout.knockout) adds x itself. A hook cannot reach it: post-norm's sum is inside the norm.
        self.skip: Callable[[Tensor], Tensor] | None = None

    def forward(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        skip = x if self.skip is None else self.skip(x)
        if self.pre:
            y = dropout(self.dropout, fn(self.norm(x)))
            return skip + y if self.residual else y
        y = dropout(self.dropout, fn(x))
        return self.norm(skip + y if self.residual else y)


@dataclass
class LayerCache:
    """Decoding cache of one layer: its self-attention keys/values and its cross-attention ones."""

    self_kv: KVCache = field(default_factory=KVCache)
    cross_kv: KVCache = field(default_factory=KVCache)

    def reorder(self, index: Tensor) -> None:
        self.self_kv.reorder(index)
        self.cross_kv.reorder(index)


@dataclass
class AttentionInputs:
    """What self-attention needs besides x; built once per stack forward, shared by its layers."""

    attn_mask: Tensor | None = None
    is_causal: bool = False
    rope: Callable[[Tensor, Tensor], Tensor] | None = None
    pos: Tensor | None = None
    uniform_rows: Tensor | None = None  # queries that attend uniformly (decoder_mask future_only)


class Layer(nn.Module):
    """Self-attention, optional cross-attention (decoder of encoder_decoder), FFN."""

    def __init__(self, cfg: ModelConfig, cross: bool) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.self_sub = Sublayer(cfg)
        self.cross_attn = MultiHeadAttention(cfg, cross=True) if cross else None
        self.cross_sub = Sublayer(cfg) if cross else None
        self.ffn = FeedForward(cfg)
        self.ffn_sub = Sublayer(cfg)

    def forward(self, x: Tensor, self_in: AttentionInputs, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, cache: LayerCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, dict[str, Tensor]]:
        weights: dict[str, Tensor] = {}

        def self_block(h: Tensor) -> Tensor:
            out, w = self.self_attn(h, attn_mask=self_in.attn_mask, is_causal=self_in.is_causal,
                                    rope=self_in.rope, pos=self_in.pos,
                                    cache=cache.self_kv if cache else None, need_weights=need_weights,
                                    uniform_rows=self_in.uniform_rows)
            if w is not None:
                weights["self"] = w
            return out

        def cross_block(h: Tensor) -> Tensor:
            out, w = self.cross_attn(h, memory=memory, attn_mask=memory_mask,
                                     cache=cache.cross_kv if cache else None, need_weights=need_weights)
            if w is not None:
                weights["cross"] = w
            return out

        x = self.self_sub(x, self_block)
        if self.cross_attn is not None:
            x = self.cross_sub(x, cross_block)
        x = self.ffn_sub(x, self.ffn)
        return x, weights
