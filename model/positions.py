"""Position information: absolute (sinusoidal, learned), rotary (RoPE) and T5 relative bias.

Absolute positions are added to the token embeddings once per stack; RoPE rotates q and k inside
self-attention; the relative bias is added to the self-attention logits. `pos` arguments are
LongTensors of absolute positions, shape (L,) when shared by the batch or (B, L) when each
example has its own offset (left-padded prompts during decoder-only generation).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model): sin on even, cos on odd channels, wavelengths 2pi .. 10000*2pi (paper 3.5)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq)[:, : d_model // 2]
    return table.float()


class AbsolutePositions(nn.Module):
    """Adds a sinusoidal (fixed) or learned (trained) position vector to each token embedding."""

    def __init__(self, kind: str, max_len: int, d_model: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "sinusoidal":
            # Not persistent: it is a function of (max_len, d_model), so checkpoints stay small.
            self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)
        elif kind == "learned":
            self.embedding = nn.Embedding(max_len, d_model)
            nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        else:
            raise ValueError(f"AbsolutePositions: unknown kind {kind!r}")

    def forward(self, x: Tensor, pos: Tensor) -> Tensor:
        if self.kind == "learned":  # an embedding lookup: its backward is cheaper than indexing's
            return x + self.embedding(pos).to(x.dtype)  # (L, D) or (B, L, D), broadcast over the batch
        return x + self.table[pos].to(x.dtype)


class Rotary(nn.Module):
    """RoPE (Su et al., 2021), rotate-half layout: the score q_m . k_n depends only on m - n."""

    def __init__(self, head_dim: int, max_len: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv_freq  # (max_len, Dh/2)
        angles = torch.cat([angles, angles], dim=-1)  # (max_len, Dh): same angle for both halves
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, pos: Tensor) -> Tensor:
        """x (B, H, L, Dh) rotated by the angles of `pos` ((L,) or (B, L))."""
        cos, sin = self.cos[pos].to(x.dtype), self.sin[pos].to(x.dtype)  # (L, Dh) or (B, L, Dh)
        if pos.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, Dh): broadcast over heads
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def relative_bucket(rel: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5 bucketing of rel = key_pos - query_pos: exact buckets for small distances, log-spaced
    up to max_distance. Causal mode has buckets only for the past (rel <= 0)."""
    bucket = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (rel > 0).long() * num_buckets  # the future gets its own half
        dist = rel.abs()
    else:
        dist = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    # clamp(min=1) only avoids log(0) on entries that torch.where discards anyway.
    log_ratio = torch.log(dist.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(dist < max_exact, dist, large)


class RelativePositionBias(nn.Module):
    """Per-head scalar bias on attention logits indexed by bucketed relative distance (T5).

    One table per stack, shared by all its layers, as in T5.
    """

    def __init__(self, n_heads: int, num_buckets: int, max_distance: int, bidirectional: bool) -> None:
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.embedding.weight, std=0.02)  # small: starts nearly position-agnostic

    def forward(self, q_start: int, q_len: int, k_len: int) -> Tensor:
        """(1, H, q_len, k_len) bias for queries at q_start.. and keys at 0..k_len-1."""
        device = self.embedding.weight.device
        q = torch.arange(q_start, q_start + q_len, device=device)
        k = torch.arange(k_len, device=device)
        buckets = relative_bucket(k[None, :] - q[:, None], self.bidirectional, self.num_buckets,
                                  self.max_distance)  # (Lq, Lk)
        return self.embedding(buckets).permute(2, 0, 1)[None]  # (1, H, Lq, Lk)
