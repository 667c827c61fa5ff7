"""Encoder-decoder Transformer (the paper's architecture)."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import LayerCache
from model.stack import Stack
from model.transformer import DecodeState, TransformerBase


class EncoderDecoder(TransformerBase):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        # Shared embeddings (the default) need one vocabulary for both sides, which the single
        # SentencePiece model gives; otherwise the source gets its own table.
        self.src_embed = None if cfg.share_embeddings else nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = Stack(cfg, cfg.n_encoder_layers, cross=False, bidirectional=True)
        # future_only (seed 000's mask bug) attends to later positions, whose relative-bias buckets
        # only a bidirectional table tells apart.
        future = cfg.decoder_mask == "future_only"
        self.decoder = Stack(cfg, cfg.n_decoder_layers, cross=True, bidirectional=future, future_only=future)
        self._init_weights()

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D) and its key mask (B, 1, 1, S), True = real token."""
        memory, mask, _ = self._encode(src)
        return memory, mask

    def _encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, list[dict[str, Tensor]]]:
        if src is None or src.dim() != 2 or src.shape[1] == 0:
            raise ValueError("encoder_decoder needs a non-empty src of shape (B, S)")
        self._check_len(src.shape[1], "source")
        key_valid = src != self.cfg.pad_id  # (B, S)
        # An all-padding source would leave queries with nothing to attend to (NaN); let them see
        # position 0. Right-padded real sources already have a real token there.
        key_valid[:, 0] = True
        mask = key_valid[:, None, None, :]  # (B, 1, 1, S)
        pos = torch.arange(src.shape[1], device=src.device)
        memory, weights = self.encoder(self._embed(src, self.src_embed), pos, mask=mask,
                                       need_weights=need_weights)
        return memory, mask, weights

    def decode(self, tgt_in: Tensor, memory: Tensor | None, memory_mask: Tensor, q_start: int = 0,
               caches: list[LayerCache] | None = None,
               need_weights: bool = False) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """tgt_in (B, T) at positions q_start.. -> decoder output (B, T, D). No key-padding mask in
        self-attention: targets are right-padded, so causality already hides the padding."""
        self._check_len(q_start + tgt_in.shape[1], "target")
        pos = torch.arange(q_start, q_start + tgt_in.shape[1], device=tgt_in.device)
        return self.decoder(self._embed(tgt_in), pos, causal=True, q_start=q_start, memory=memory,
                            memory_mask=memory_mask, caches=caches, need_weights=need_weights)

    def forward(self, src: Tensor | None, tgt_in: Tensor,
                tgt_out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        memory, memory_mask = self.encode(src)
        h, _ = self.decode(tgt_in, memory, memory_mask)
        logits = self._logits(h)  # (B, T, V)
        return logits, self._loss(logits, tgt_out)

    def _attention_maps(self, src: Tensor | None, tgt_in: Tensor) -> dict[str, Tensor]:
        memory, mask, enc_w = self._encode(src, need_weights=True)
        _, dec_w = self.decode(tgt_in, memory, mask, need_weights=True)
        return {"encoder.self": enc_w[-1]["self"][0].mean(0),  # (H, S, S) -> (S, S)
                "decoder.self": dec_w[-1]["self"][0].mean(0),  # (T, T)
                "decoder.cross": dec_w[-1]["cross"][0].mean(0)}  # (T, S)

    def _step_full(self, batch: dict[str, Tensor]) -> Tensor:
        # The forward's steps, with the source encoded once: its encoding is the same at every step
        # (the same bits), and recomputing it made a future_only model's decoding ~3x slower.
        if "memory" not in batch:
            batch["memory"], batch["memory_mask"] = self.encode(batch["src"])
        h, _ = self.decode(batch["history"], batch["memory"], batch["memory_mask"])
        return self._logits(h)

    def _start_cached(self, src: Tensor) -> DecodeState:
        memory, memory_mask = self.encode(src)
        caches = [LayerCache() for _ in self.decoder.layers]
        # memory is only needed until the first step fills the cross-attention caches.
        return DecodeState(batch={"memory": memory, "memory_mask": memory_mask}, caches=caches)

    def _step_cached(self, state: DecodeState, tokens: Tensor) -> Tensor:
        memory = state.batch.pop("memory", None)
        h, _ = self.decode(tokens[:, None], memory, state.batch["memory_mask"], q_start=state.step,
                           caches=state.caches)
        state.step += 1
        return self._logits(h[:, -1])  # (B, V)
