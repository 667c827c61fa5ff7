"""Position information: absolute (sinusoidal, learned), rotary (RoPE) and T5 relative bias.

Absolute positions are added to the token embeddings once per stack; RoPE rotates q and k inside
self-attention; the relative bias is added to the self-attention logits. `pos` arguments are
LongTensors of absolute positions, shape (L,) when shared by the batch or (B, L) when each
example has its own offset (left-padded prompts during decoder-only generation).
"""
from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model): sin on even, cos on odd channels, wavelengths 2pi .. 10000*2pi (paper 3.5)."""
    inv_freq = [math.exp(i * (-math.log(10000.0) / d_model)) for i in range(0, d_model, 2)]
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = _sin_cos(max_len, inv_freq, math.sin)
    table[:, 1::2] = _sin_cos(max_len, inv_freq, math.cos)[:, : d_model // 2]
    return table


def _sin_cos(max_len: int, inv_freq: list[float], fn) -> Tensor:
    """fn(p * f) for each position p and frequency f, in float64 by Python's math, then float32.
    Not torch.sin: on the CPU its float64 kernel is MKL's, whose bits differ between CPU makers
    (pipeline/cpu_numerics.py); a table built once per model can afford the scalar loop."""
    return torch.tensor([[fn(p * f) for f in inv_freq] for p in range(max_len)], dtype=torch.float64).float()


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
        inv_freq = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
        cos, sin = _sin_cos(max_len, inv_freq, math.cos), _sin_cos(max_len, inv_freq, math.sin)  # (max_len, Dh/2)
        # the same angle for both halves: (max_len, Dh)
        self.register_buffer("cos", torch.cat([cos, cos], dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat([sin, sin], dim=-1), persistent=False)

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
    large = _log_buckets(num_buckets, max_exact, max_distance, rel.device)
    return bucket + torch.where(dist < max_exact, dist, large[dist.clamp(max=max_distance)])


@functools.lru_cache(maxsize=None)
def _log_buckets(num_buckets: int, max_exact: int, max_distance: int, device: torch.device) -> Tensor:
    """The log-spaced bucket of each distance 0..max_distance (those under max_exact unused), by
    Python's math: torch.log's CPU kernel is MKL's, whose bits differ between CPU makers
    (pipeline/cpu_numerics.py), and one ulp moves a distance across a bucket's edge."""
    span = math.log(max_distance / max_exact)
    return torch.tensor([min(max_exact + int(math.log(max(d, 1) / max_exact) / span * (num_buckets - max_exact)),
                             num_buckets - 1) for d in range(max_distance + 1)], device=device)


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
