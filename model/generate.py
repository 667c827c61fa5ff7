"""Autoregressive decoding: greedy, beam search, and temperature / top-k / top-p sampling.

All strategies drive the model through `start_decoding` / `decode_step`, so they run with the
KV cache (default) or by full recomputation (use_cache=False, the reference in the tests), for
every architecture. Decoding stops when every row has produced eos, or after max_new_tokens, or
when the model's max_len is reached. Dropout is off while decoding.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

from model.config import ModelConfig


class Decodable(Protocol):
    """What decoding needs of a model (TransformerBase has it). Typed here rather than imported, so
    that transformer.py can offer `model.generate(...)` without the two modules importing each other."""
    cfg: ModelConfig
    training: bool

    def parameters(self) -> Any: ...
    def eval(self) -> Any: ...
    def train(self, mode: bool = True) -> Any: ...
    def start_decoding(self, src: Tensor, use_cache: bool = True) -> Any: ...
    def decode_step(self, state: Any, tokens: Tensor) -> Tensor: ...
    def prompt_len(self, src: Tensor) -> int: ...

STRATEGIES = ("greedy", "beam", "sample")


def generate(model: Decodable, src: Tensor | None, max_new_tokens: int = 64,
             strategy: str = "greedy", beam_size: int = 4, length_penalty: float = 1.0,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             generator: torch.Generator | None = None, use_cache: bool = True) -> list[list[int]]:
    """Returns one list of token ids per source row: no bos, cut before the first eos.

    beam: keeps beam_size hypotheses per row ranked by summed log-probability; the final choice
    divides by length**length_penalty (length counts eos; 0 = no normalisation).
    sample: softmax(logits / temperature), restricted to the top_k tokens (0 = all) and to the
    smallest set with cumulative probability >= top_p (1.0 = all), drawn with `generator`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy == "beam" and beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if strategy == "sample" and (temperature <= 0 or not 0 < top_p <= 1 or top_k < 0):
        raise ValueError(f"sampling needs temperature > 0, 0 < top_p <= 1, top_k >= 0; got "
                         f"temperature={temperature}, top_p={top_p}, top_k={top_k}")
    device = next(model.parameters()).device
    if src is None:
        src = torch.empty(1, 0, dtype=torch.long, device=device)  # one unconditional sequence
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if strategy == "beam":
                tokens = beam_search(model, src, max_new_tokens, beam_size, length_penalty, use_cache)
            else:
                pick = next_token_picker(strategy, temperature, top_k, top_p, generator)
                tokens, _ = decode_loop(model, src, max_new_tokens, pick, use_cache)
    finally:
        model.train(was_training)
    return [_trim(row, model.cfg.eos_id, model.cfg.pad_id) for row in tokens.tolist()]


def _budget(model: Decodable, src: Tensor, max_new_tokens: int, fed: int = 1) -> int:
    """Tokens we may generate: feeding `fed` tokens (bos, or a prompt) and then all but the last of n
    new ones after the source needs prompt_len + fed - 1 + n <= max_len."""
    return max(0, min(max_new_tokens, model.cfg.max_len - model.prompt_len(src) - (fed - 1)))


def next_token_picker(strategy: str = "greedy", temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      generator: torch.Generator | None = None) -> Callable[[Tensor], Tensor]:
    """logits (B, V) -> next tokens (B,): argmax (greedy), or a draw (sample) as `generate` says."""
    return _greedy_pick if strategy == "greedy" else _sampler(temperature, top_k, top_p, generator)


def _greedy_pick(logits: Tensor) -> Tensor:
    return logits.argmax(dim=-1)


def _sampler(temperature: float, top_k: int, top_p: float,
             generator: torch.Generator | None) -> Callable[[Tensor], Tensor]:
    def pick(logits: Tensor) -> Tensor:
        logits = logits.float() / temperature  # (B, V)
        if 0 < top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            # drop a token when the ones before it already reach top_p (the first always stays)
            drop = probs.cumsum(dim=-1) - probs >= top_p
            logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = logits.softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    return pick


def decode_loop(model: Decodable, src: Tensor, max_new_tokens: int, pick: Callable[[Tensor], Tensor],
                use_cache: bool = True, prompt: Tensor | None = None,
                on_step: Callable[[], object] | None = None) -> tuple[Tensor, Tensor]:
    """One token per row per step chosen by `pick(logits)`; rows that finished get pad.

    `prompt` (B, P): the tokens fed one at a time before the first pick, in place of bos (a language
    model's context, fed causally as it trained; pipeline.evaluate's continuations). `on_step` is
    called after each token fed (a progress bar). Returns tokens (B, n) and the logits each step
    saw (B, n, V); n <= max_new_tokens.
    """
    cfg = model.cfg
    b = src.shape[0]
    state = model.start_decoding(src, use_cache)
    if prompt is None:
        prompt = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    for t in range(prompt.shape[1] - 1):
        model.decode_step(state, prompt[:, t])
        if on_step is not None:
            on_step()
    token = prompt[:, -1]
    finished = torch.zeros(b, dtype=torch.bool, device=src.device)
    out, step_logits = [], []
    for _ in range(_budget(model, src, max_new_tokens, prompt.shape[1])):
        logits = model.decode_step(state, token)  # (B, V)
        if on_step is not None:
            on_step()
        token = pick(logits).masked_fill(finished, cfg.pad_id)
        out.append(token)
        step_logits.append(logits)
        finished |= token == cfg.eos_id
        if finished.all():
            break
    if not out:
        return src.new_zeros(b, 0), torch.zeros(b, 0, cfg.vocab_size, device=src.device)
    return torch.stack(out, dim=1), torch.stack(step_logits, dim=1)


def beam_search(model: Decodable, src: Tensor, max_new_tokens: int, beam_size: int,
                length_penalty: float, use_cache: bool = True) -> Tensor:
    """Returns the best hypothesis per row (B, n), padded after eos.

    A finished beam stays in the beam with its score frozen (its only continuation is pad at
    log-prob 0), so beams compete on summed log-probability; length normalisation is applied
    when choosing the final hypothesis.
    """
    cfg = model.cfg
    b, k, device = src.shape[0], beam_size, src.device
    state = model.start_decoding(src, use_cache)
    state.reorder(torch.arange(b, device=device).repeat_interleave(k))  # (B*K) rows, beam-major per row
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: keep one so the first step does not repeat it
    tokens = torch.zeros(b * k, 0, dtype=torch.long, device=device)
    lengths = torch.zeros(b * k, device=device)
    finished = torch.zeros(b * k, dtype=torch.bool, device=device)
    token = torch.full((b * k,), cfg.bos_id, dtype=torch.long, device=device)
    for _ in range(_budget(model, src, max_new_tokens)):
        logp = model.decode_step(state, token).float().log_softmax(dim=-1)  # (B*K, V)
        logp = logp.masked_fill(logp.isnan(), float("-inf"))  # all -inf logits: a dead beam, not NaN
        vocab = logp.shape[-1]
        logp[finished] = float("-inf")
        logp[finished, cfg.pad_id] = 0.0
        cand = (scores.reshape(-1, 1) + logp).view(b, k * vocab)
        scores, flat = cand.topk(k, dim=-1)  # (B, K)
        rows = (torch.arange(b, device=device)[:, None] * k + flat // vocab).reshape(-1)  # parent beams
        token = (flat % vocab).reshape(-1)
        state.reorder(rows)
        tokens = torch.cat([tokens[rows], token[:, None]], dim=1)
        lengths = lengths[rows] + (~finished[rows]).float()
        finished = finished[rows] | (token == cfg.eos_id)
        if finished.all():
            break
    normalised = scores / lengths.view(b, k).clamp(min=1) ** length_penalty
    best = normalised.argmax(dim=-1) + torch.arange(b, device=device) * k  # (B,)
    return tokens[best]


def _trim(row: list[int], eos_id: int, pad_id: int) -> list[int]:
    if eos_id in row:
        row = row[: row.index(eos_id)]
    return [t for t in row if t != pad_id]
