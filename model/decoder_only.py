"""Decoder-only Transformer (arch decoder_only), prefix LM (arch prefix_lm) and target-only LM
(arch target_lm).

One sequence per example: the real (unpadded) source tokens, then tgt_in, whose leading bos is
the separator: [s_1 .. s_n, bos, t_1 .. t_m]. Each row is packed left-aligned, so a source's
padding never sits between it and its target and positions do not depend on the batch: padded
and unpadded batches give the same logits (not under decoder_mask future_only, seed 000's bug,
where the trailing padding is a later position too). Logits and loss cover the target positions only.
prefix_lm lets the source positions attend to each other in both directions. target_lm drops
the source whatever the caller passes (seed study 003's "decoder-only"): its sequence is
[bos, t_1 .. t_m], a language model of the targets, scored on the same target tokens as the
others, and decoding is unconditional from bos.

Generation left-pads the prompts instead (so all rows are fed their next token together), with
per-row positions and a key mask, which gives the same logits as the packed forward.
"""
from __future__ import annotations

import torch
from torch import Tensor

from model.config import ModelConfig
from model.layers import LayerCache
from model.stack import Stack
from model.transformer import DecodeState, TransformerBase


class DecoderOnly(TransformerBase):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.prefix_lm = cfg.arch == "prefix_lm"
        self.target_only = cfg.arch == "target_lm"  # the source is never read
        future = cfg.decoder_mask == "future_only"  # seed 000's mask bug: attends to later positions
        # The relative bias needs future buckets only where attention can look ahead (the prefix,
        # or every position under future_only).
        self.decoder = Stack(cfg, cfg.n_decoder_layers, cross=False, bidirectional=self.prefix_lm or future,
                             future_only=future)
        self._init_weights()

    def _src_len(self, src: Tensor | None, batch: int, device: torch.device) -> Tensor:
        if self.target_only or src is None or src.shape[1] == 0:
            return torch.zeros(batch, dtype=torch.long, device=device)
        return (src != self.cfg.pad_id).sum(dim=1)  # (B,): sources are right-padded

    def prompt_len(self, src: Tensor) -> int:
        return int(self._src_len(src, src.shape[0], src.device).max()) if src.shape[0] else 0

    def _pack(self, src: Tensor | None, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Returns seq (B, L) = [source, tgt_in, pad...] left-aligned per row, and src_len (B,)."""
        b, t = tgt_in.shape
        src_len = self._src_len(src, b, tgt_in.device)
        if self.target_only or src is None or src.shape[1] == 0:
            return tgt_in, src_len
        length = int(src_len.max()) + t
        j = torch.arange(length, device=tgt_in.device)[None, :]  # (1, L)
        tgt_idx = j - src_len[:, None]  # (B, L): index into tgt_in
        from_src = src.gather(1, j.clamp(max=src.shape[1] - 1).expand(b, -1))
        from_tgt = tgt_in.gather(1, tgt_idx.clamp(0, t - 1))
        seq = torch.where(j < src_len[:, None], from_src, from_tgt)
        return seq.masked_fill(tgt_idx >= t, self.cfg.pad_id), src_len

    def _run(self, src: Tensor | None, tgt_in: Tensor,
             need_weights: bool = False) -> tuple[Tensor, Tensor, list[dict[str, Tensor]]]:
        seq, src_len = self._pack(src, tgt_in)
        length = seq.shape[1]
        self._check_len(length, "source + target")
        j = torch.arange(length, device=seq.device)
        mask, prefix = None, self.prefix_lm and length > tgt_in.shape[1]  # no source: plain causal
        if prefix:
            # query i may see key j if j <= i, or if j is in the source (bidirectional prefix).
            mask = (j[None, :] <= j[:, None])[None] | (j[None, None, :] < src_len[:, None, None])
            mask = mask[:, None]  # (B, 1, L, L)
        h, weights = self.decoder(self._embed(seq), j, mask=mask, causal=not prefix,
                                  need_weights=need_weights)
        return h, src_len, weights

    def forward(self, src: Tensor | None, tgt_in: Tensor,
                tgt_out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        h, src_len, _ = self._run(src, tgt_in)
        if h.shape[1] != tgt_in.shape[1]:
            idx = src_len[:, None] + torch.arange(tgt_in.shape[1], device=h.device)  # (B, T)
            h = h.gather(1, idx[:, :, None].expand(-1, -1, h.shape[-1]))  # (B, T, D)
        logits = self._logits(h)
        return logits, self._loss(logits, tgt_out)

    def _attention_maps(self, src: Tensor | None, tgt_in: Tensor) -> dict[str, Tensor]:
        """The single self-attention map cut into the three blocks the encoder-decoder has
        (source->source, target->target, target->source); padded source columns are zero."""
        _, src_len, weights = self._run(src, tgt_in, need_weights=True)
        full = weights[-1]["self"][0].mean(0)  # (L, L)
        s, t = int(src_len[0]), tgt_in.shape[1]
        maps = {"decoder.self": full[s:s + t, s:s + t]}
        if src is not None and not self.target_only:
            width = src.shape[1]
            maps["encoder.self"] = full.new_zeros(width, width)
            maps["encoder.self"][:s, :s] = full[:s, :s]
            maps["decoder.cross"] = full.new_zeros(t, width)
            maps["decoder.cross"][:, :s] = full[s:s + t, :s]
        return maps

    def _start_cached(self, src: Tensor) -> DecodeState:
        """Prefill the caches with the sources, left-padded to the longest one."""
        b, device = src.shape[0], src.device
        src_len = self._src_len(src, b, device)
        p = self.prompt_len(src)
        self._check_len(p, "source")
        pad_left = p - src_len  # (B,)
        idx = torch.arange(p, device=device)[None, :] - pad_left[:, None]  # (B, P) index into src
        valid = idx >= 0
        caches = [LayerCache() for _ in self.decoder.layers]
        state = DecodeState(batch={"key_valid": valid, "pad_left": pad_left}, caches=caches, step=p)
        if p > 0:
            prompt = torch.where(valid, src.gather(1, idx.clamp(min=0)), self.cfg.pad_id)
            j = torch.arange(p, device=device)
            allowed = valid[:, None, :]  # (B, 1, P): keys
            if not self.prefix_lm:  # the whole prompt is source, so prefix_lm sees all of it
                allowed = allowed & (j[None, :] <= j[:, None])[None]
            allowed = allowed | torch.eye(p, dtype=torch.bool, device=device)  # pad rows: no empty row
            self.decoder(self._embed(prompt), idx.clamp(min=0), mask=allowed[:, None], caches=caches)
        return state

    def _step_cached(self, state: DecodeState, tokens: Tensor) -> Tensor:
        self._check_len(state.step + 1, "source + target")
        key_valid = torch.cat([state.batch["key_valid"], torch.ones_like(tokens, dtype=torch.bool)[:, None]], 1)
        state.batch["key_valid"] = key_valid
        pos = (state.step - state.batch["pad_left"])[:, None]  # (B, 1): this row's own position
        h, _ = self.decoder(self._embed(tokens[:, None]), pos, mask=key_valid[:, None, None, :],
                            q_start=state.step, caches=state.caches)
        state.step += 1
        return self._logits(h[:, -1])
