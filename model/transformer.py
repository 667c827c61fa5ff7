"""What every architecture shares: token embeddings, output layer, loss, decoding state,
parameter counts, and the public generate / attention_maps entry points.

Subclasses (EncoderDecoder, DecoderOnly) implement `forward`, `_attention_maps` and the cached
decoding pair `_start_cached` / `_step_cached`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import MultiHeadAttention
from model.config import ModelConfig
from model.generate import generate
from model.layers import FeedForward, LayerCache
from model.positions import AbsolutePositions, RelativePositionBias

COMPONENTS = ("embeddings", "attention", "ffn", "norms", "other")


@dataclass
class DecodeState:
    """Everything incremental decoding carries between steps.

    `batch` holds batch-first tensors that follow beam reordering; `caches` is None when decoding
    by full recomputation (the reference the KV cache is tested against).
    """

    batch: dict[str, Tensor]
    caches: list[LayerCache] | None = None
    step: int = 0  # positions already fed to the (decoder) stack

    def reorder(self, index: Tensor) -> None:
        """Keep/duplicate batch rows by `index` (beam expansion and beam search reordering)."""
        self.batch = {k: v.index_select(0, index) for k, v in self.batch.items()}
        for cache in self.caches or []:
            cache.reorder(index)


class TransformerBase(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)  # target (or only / shared) tokens
        # Untied: a separate projection to the vocabulary; no bias, like the tied case.
        self.head = None if cfg.tie_output else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.emb_scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0

    def _init_weights(self) -> None:
        """cfg.init: xavier (below) or gpt2 (_init_gpt2).

        Xavier-uniform linear layers as in nn.Transformer; token embeddings N(0, 1/d_model) so that
        after the sqrt(d_model) scale they have unit variance and tied logits start O(1)."""
        if self.cfg.init == "gpt2":
            self._init_gpt2()
            return
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for table in (self.embed, getattr(self, "src_embed", None)):
            if table is not None:
                nn.init.normal_(table.weight, std=self.cfg.d_model**-0.5)

    def _init_gpt2(self) -> None:
        """GPT-2's scheme, as nanoGPT's model.py has it: every linear weight and embedding table
        (tokens, learned positions, an untied head) N(0, 0.02), zero biases, norms left at one; then
        the projections that write into the residual stream (attention's output, the FFN's second
        matrix) N(0, 0.02 / sqrt(n)), n = the residual sublayers of their stack (2 a layer, 3 with
        cross-attention), so that the stream's variance at the top does not grow with depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for stack in (getattr(self, "encoder", None), self.decoder):
            if stack is None:
                continue
            n = sum(2 if layer.cross_attn is None else 3 for layer in stack.layers)
            for layer in stack.layers:
                writers = [layer.self_attn.out_proj, layer.ffn.w_out]
                if layer.cross_attn is not None:
                    writers.append(layer.cross_attn.out_proj)
                for proj in writers:
                    nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(n))

    # -- shared pieces -------------------------------------------------------------------------
    def _embed(self, tokens: Tensor, table: nn.Embedding | None = None) -> Tensor:
        x = (table or self.embed)(tokens)  # (B, L, D)
        return x * self.emb_scale if self.emb_scale != 1.0 else x  # x * 1.0 would still cost an op and its backward

    def _logits(self, h: Tensor) -> Tensor:
        return self.head(h) if self.head is not None else F.linear(h, self.embed.weight)

    def _loss(self, logits: Tensor, tgt_out: Tensor | None) -> Tensor | None:
        if tgt_out is None:
            return None
        logits = logits.reshape(-1, logits.shape[-1])
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()  # a half-precision log-softmax over the vocabulary loses bits
        return F.cross_entropy(logits, tgt_out.reshape(-1), ignore_index=self.cfg.pad_id)

    def _check_len(self, length: int, what: str) -> None:
        if length > self.cfg.max_len:
            raise ValueError(f"{what} length {length} exceeds ModelConfig.max_len={self.cfg.max_len}")

    # -- public API ----------------------------------------------------------------------------
    def forward(self, src: Tensor | None, tgt_in: Tensor,
                tgt_out: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """src (B, S) right-padded (None: no source), tgt_in (B, T) starting with bos, tgt_out (B, T)
        next tokens with pad where there is no target. Returns logits (B, T, V) and the mean
        cross-entropy over non-pad targets (None without tgt_out)."""
        raise NotImplementedError

    def param_counts(self) -> dict[str, int]:
        """Parameters by component (shared tensors counted once): embeddings (token tables, learned
        positions, untied output layer), attention, ffn, norms, other (relative-position bias), total."""
        kind_of: dict[int, str] = {}
        for module in self.modules():  # parents come first, so the owning block decides the kind
            kind = self._component(module)
            if kind is not None:
                for p in module.parameters():
                    kind_of.setdefault(id(p), kind)
        counts = dict.fromkeys(COMPONENTS, 0)
        for p in self.parameters():  # deduplicated
            counts[kind_of.get(id(p), "other")] += p.numel()
        counts["total"] = sum(counts.values())
        return counts

    def _component(self, module: nn.Module) -> str | None:
        if isinstance(module, MultiHeadAttention):
            return "attention"
        if isinstance(module, FeedForward):
            return "ffn"
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            return "norms"
        if isinstance(module, RelativePositionBias):
            return "other"
        if isinstance(module, (nn.Embedding, AbsolutePositions)) or module is self.head:
            return "embeddings"
        return None

    @torch.no_grad()
    def attention_maps(self, src: Tensor | None, tgt_in: Tensor) -> dict[str, Tensor]:
        """Last-layer attention of batch item 0, averaged over heads, dropout off:
        "encoder.self" (S, S), "decoder.self" (T, T), "decoder.cross" (T, S)."""
        was_training = self.training
        self.eval()
        try:
            maps = self._attention_maps(None if src is None else src[:1], tgt_in[:1])
        finally:
            self.train(was_training)
        return {k: v.float().cpu() for k, v in maps.items()}

    def _attention_maps(self, src: Tensor | None, tgt_in: Tensor) -> dict[str, Tensor]:
        raise NotImplementedError

    def generate(self, src: Tensor | None, max_new_tokens: int = 64, strategy: str = "greedy",
                 beam_size: int = 4, length_penalty: float = 1.0, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
                 use_cache: bool = True) -> list[list[int]]:
        """Decode a continuation per source row: token ids without bos, cut before eos.

        See model.generate.generate for the strategies. src None: one unconditional sequence
        (decoder-only archs).
        """
        return generate(self, src, max_new_tokens=max_new_tokens, strategy=strategy,
                        beam_size=beam_size, length_penalty=length_penalty, temperature=temperature,
                        top_k=top_k, top_p=top_p, generator=generator, use_cache=use_cache)

    # -- incremental decoding ------------------------------------------------------------------
    def start_decoding(self, src: Tensor, use_cache: bool = True) -> DecodeState:
        """State before the first target token. src (B, S), possibly (B, 0) for no source.

        decoder_mask future_only always recomputes: there every position attends to later ones,
        so each new token changes the outputs (and keys) of all the positions before it, which a
        cache would keep stale. Slower, and the samples of a model trained with that leak are
        garbage, but the evaluate stage runs as for any model."""
        if use_cache and self.cfg.decoder_mask == "causal":
            return self._start_cached(src)
        history = torch.empty(src.shape[0], 0, dtype=torch.long, device=src.device)
        return DecodeState(batch={"src": src, "history": history})

    def decode_step(self, state: DecodeState, tokens: Tensor) -> Tensor:
        """Feed one token per row (B,) and return the logits (B, V) for the next one."""
        if state.caches is not None:
            return self._step_cached(state, tokens)
        # Reference path: run the full forward on everything fed so far.
        state.batch["history"] = torch.cat([state.batch["history"], tokens[:, None]], dim=1)
        state.step += 1
        return self._step_full(state.batch)[:, -1]

    def _step_full(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits (B, T, V) of everything fed so far: the forward pass."""
        logits, _ = self(batch["src"], batch["history"])
        return logits

    def prompt_len(self, src: Tensor) -> int:
        """Positions taken before the first target token (decoder-only: the longest source)."""
        return 0

    def _start_cached(self, src: Tensor) -> DecodeState:
        raise NotImplementedError

    def _step_cached(self, state: DecodeState, tokens: Tensor) -> Tensor:
        raise NotImplementedError
