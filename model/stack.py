"""A stack of Transformer layers with its position handling and (pre-norm) final norm."""
from __future__ import annotations

from torch import Tensor, nn

from model.attention import combine_masks, future_only_mask
from model.config import ModelConfig
from model.layers import AttentionInputs, Layer, LayerCache, dropout, make_dropout, make_norm
from model.positions import AbsolutePositions, RelativePositionBias, Rotary


class Stack(nn.Module):
    """Encoder (bidirectional), decoder (causal, cross=True) or single decoder-only stack.

    Input: token embeddings (already scaled). Absolute positions and embedding dropout are applied
    here, so each stack owns its position table (learned tables are not shared between stacks).
    future_only: a causal forward attends to strictly later positions instead (seed 000's mask
    bug, ModelConfig.decoder_mask); only the decoders set it.
    """

    def __init__(self, cfg: ModelConfig, n_layers: int, cross: bool, bidirectional: bool,
                 future_only: bool = False) -> None:
        super().__init__()
        self.future_only = future_only
        kind = cfg.positional
        self.abs_pos = AbsolutePositions(kind, cfg.max_len, cfg.d_model) if kind in ("sinusoidal", "learned") else None
        self.rope = Rotary(cfg.head_dim, cfg.max_len, cfg.rope_theta) if kind == "rope" else None
        self.rel_bias = (RelativePositionBias(cfg.n_heads, cfg.rel_buckets, cfg.rel_max_distance, bidirectional)
                         if kind == "relative" or cfg.relative_bias else None)
        self.dropout = make_dropout(cfg.dropout)
        self.layers = nn.ModuleList(Layer(cfg, cross) for _ in range(n_layers))
        # Post-norm already ends every layer with a norm; pre-norm leaves the residual stream
        # unnormalised, so it needs one at the end.
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else None

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor | None = None, causal: bool = False,
                q_start: int = 0, memory: Tensor | None = None, memory_mask: Tensor | None = None,
                caches: list[LayerCache] | None = None,
                need_weights: bool = False) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """x (B, L, D) embeddings at absolute positions `pos` ((L,) or (B, L)).

        mask: bool, broadcastable to (B, 1, L, q_start + L), True = may attend. causal: add the
        causal constraint (future_only: the seed's strictly-later one instead, no mask allowed).
        q_start: number of keys already in `caches` (cached decoding).
        memory/memory_mask: encoder output and its key mask (B, 1, 1, S) for cross-attention.
        Returns the output (B, L, D) and, per layer, the attention weights if need_weights.
        """
        if self.abs_pos is not None:
            x = self.abs_pos(x, pos)
        x = dropout(self.dropout, x)
        length = x.shape[1]
        k_len = q_start + length
        bias = self.rel_bias(q_start, length, k_len) if self.rel_bias is not None else None
        uniform_rows = None
        if causal and self.future_only:
            attn_mask, uniform_rows = future_only_mask(mask, bias, q_start, length, k_len, x.device)
            is_causal = False
        else:
            attn_mask, is_causal = combine_masks(mask, bias, causal, q_start, length, k_len, x.device)
        self_in = AttentionInputs(attn_mask, is_causal, self.rope, pos, uniform_rows)
        all_weights = []
        for i, layer in enumerate(self.layers):
            x, weights = layer(x, self_in, memory, memory_mask, caches[i] if caches else None, need_weights)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights
