"""Scaled dot-product attention (eq. 1, written out, and PyTorch's fused kernel) and multi-head attention.

Masks follow torch.nn.functional.scaled_dot_product_attention: a bool `attn_mask` is True where a
query may attend, a float one is added to the logits; both broadcast to (B, H, Lq, Lk). Where the
CPU's bits would depend on the thread count or the CPU, model/exact.py steps in.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import exact
from model.config import ModelConfig

AttendFn = Callable[..., tuple[Tensor, Tensor | None]]


@exact.one_thread_per_pair
def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d) + mask) v, as in the paper (eq. 1).

    q (B, H, Lq, Dh), k and v (B, H, Lk, Dh). Returns (output (B, H, Lq, Dh), weights (B, H, Lq, Lk));
    the weights are before dropout, so they are the attention distribution.
    """
    # The scale on q, not on the (Lq, Lk) scores; masks as -inf added, whose backward is free: each
    # saves a pass over the scores both ways, which is most of this path's time at small head sizes.
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)  # (B, H, Lq, Lk)
    if is_causal:
        lq, lk = scores.shape[-2:]
        scores = scores + torch.full((lq, lk), float("-inf"), dtype=scores.dtype, device=q.device).triu(1)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=scores.dtype, device=q.device).masked_fill(
                ~attn_mask, float("-inf"))
        scores = scores + attn_mask
    weights = exact.softmax(scores)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights


@exact.one_thread_per_pair
def fused_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False) -> tuple[Tensor, None]:
    """PyTorch's fused kernel (flash / memory-efficient / math); same maths, no weights returned."""
    if exact.writes_out(q, dropout_p):
        return scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                            is_causal=is_causal)[0], None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal), None


def combine_masks(mask: Tensor | None, bias: Tensor | None, causal: bool, q_start: int, q_len: int,
                  k_len: int, device: torch.device) -> tuple[Tensor | None, bool]:
    """Merge a bool mask, an additive bias and causality into one (attn_mask, is_causal) pair.

    Once per stack forward, not per layer. Plain causal attention stays a flag (the fused kernel's
    fastest path); cached decoding (q_start > 0) needs a mask aligned to the end of the keys.
    """
    if causal and q_start == 0 and q_len == k_len and mask is None and bias is None:
        return None, True
    if causal and q_len > 1:
        q_pos = torch.arange(q_start, q_start + q_len, device=device)
        causal_mask = torch.arange(k_len, device=device)[None, :] <= q_pos[:, None]  # (Lq, Lk)
        mask = causal_mask if mask is None else mask & causal_mask
    if bias is None:
        return mask, False
    if mask is None:
        return bias, False
    return bias.masked_fill(~mask, float("-inf")), False


def future_only_mask(mask: Tensor | None, bias: Tensor | None, q_start: int, q_len: int, k_len: int,
                     device: torch.device) -> tuple[Tensor, Tensor]:
    """Seed study 000's decoder mask (ModelConfig.decoder_mask future_only) as (attn_mask, uniform_rows).

    The seed ran `scores.masked_fill(mask == 0, -1e9)` on a mask that is -inf above the diagonal:
    query i keeps keys j > i only, and the last query, every score -1e9, attends uniformly. Where a
    row keeps a key, -1e9 and -inf give the same softmax, so the mask is j > i. The row that keeps
    none comes back in `uniform_rows` (Lq, 1): MultiHeadAttention zeroes its query and the mask
    opens it, so its scores are 0 on both paths and, as through replaced scores, no gradient flows.
    (An additive -1e9 would not do: s - 1e9 rounds to steps of 64 in float32, and gradients flow.)
    """
    if mask is not None or q_start != 0 or q_len != k_len:
        raise ValueError("decoder_mask='future_only' attends over the whole sequence at once "
                         "(no KV cache, no key mask)")
    j = torch.arange(k_len, device=device)
    allowed = j[None, :] > j[:, None]  # (L, L): strictly the future
    uniform_rows = ~allowed.any(dim=-1, keepdim=True)  # (L, 1): the last row
    allowed = allowed | uniform_rows
    if bias is None:
        return allowed, uniform_rows
    # The seed replaced the whole row, bias included: the uniform row gets no bias either.
    return bias.masked_fill(uniform_rows, 0.0).masked_fill(~allowed, float("-inf")), uniform_rows


@dataclass
class KVCache:
    """Keys and values (B, H, L, Dh) of one attention layer, kept between decoding steps."""

    k: Tensor | None = None
    v: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search reordering / expansion)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class MultiHeadAttention(nn.Module):
    """All heads in one batched computation; q/k/v from one fused projection (self-attention) or
    a q projection plus a fused k/v projection (cross-attention). A switch inside attention reads
    its ModelConfig field here."""

    def __init__(self, cfg: ModelConfig, cross: bool = False) -> None:
        super().__init__()
        d_model, bias = cfg.d_model, cfg.bias
        self.n_heads, self.head_dim, self.cross, self.dropout = cfg.n_heads, cfg.head_dim, cross, cfg.attention_dropout
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        # qk_norm: one RMSNorm for the queries, one for the keys, over each head's head_dim features.
        self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        # Chosen once here, never per call (the weights for attention maps use the manual path).
        self.attend: AttendFn = fused_attention if cfg.attention_impl == "sdpa" else scaled_dot_product_attention

    def _split(self, x: Tensor, n: int) -> tuple[Tensor, ...]:
        """(B, L, n*H*Dh) -> n tensors (B, H, L, Dh). Split, then view each: the backward is one
        concatenation into the projection's gradient (a view of the whole would stack and permute)."""
        b, length, _ = x.shape
        return tuple(t.view(b, length, self.n_heads, self.head_dim).transpose(1, 2)
                     for t in x.split(self.n_heads * self.head_dim, dim=-1))

    def forward(self, x: Tensor, memory: Tensor | None = None, attn_mask: Tensor | None = None,
                is_causal: bool = False, rope: Callable[[Tensor, Tensor], Tensor] | None = None,
                pos: Tensor | None = None, cache: KVCache | None = None,
                need_weights: bool = False, uniform_rows: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x (B, L, D) -> (B, L, D), plus weights (B, H, L, Lk) when need_weights.

        Self-attention appends this call's keys/values to `cache`; cross-attention fills it from
        `memory` on the first call and reuses it afterwards. `rope(t, pos)` rotates q and k.
        uniform_rows (L, 1), True where a query attends uniformly to every key (future_only_mask).
        """
        b, length, d = x.shape
        if self.cross:
            q = self._split(self.q_proj(x), 1)[0]  # (B, H, L, Dh)
            if self.q_norm is not None:
                q = self.q_norm(q)
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v
            else:
                k, v = self._split(self.kv_proj(memory), 2)  # each (B, H, S, Dh)
                if self.k_norm is not None:
                    k = self.k_norm(k)
                if cache is not None:
                    cache.k, cache.v = k, v
        else:
            q, k, v = self._split(self.qkv_proj(x), 3)  # each (B, H, L, Dh)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if rope is not None:
                q, k = rope(q, pos), rope(k, pos)
            if uniform_rows is not None:
                q = q.masked_fill(uniform_rows, 0.0)  # scores of 0: a uniform softmax (future_only_mask)
            if cache is not None:
                if cache.k is not None:
                    k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)
                cache.k, cache.v = k, v
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(q.dtype)  # the fused kernel wants one dtype (autocast, bf16)
        attend = scaled_dot_product_attention if need_weights else self.attend
        dropout_p = self.dropout if self.training else 0.0
        out, weights = attend(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
        out = out.transpose(1, 2).reshape(b, length, d)  # (B, L, H*Dh)
        return self.out_proj(out), weights
