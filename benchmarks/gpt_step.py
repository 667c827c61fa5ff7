"""Our decoder-only training step vs a minimal GPT written the way nanoGPT's model.py is, at equal shape.

Run: python -m benchmarks.gpt_step [--threads 2] [--repeats 30] [--profile]
Prints one JSON object. The defaults are the nanogpt_shakespeare_char preset's shape. Both take the
same AdamW step on the same batch, interleaved after a warm-up; `ours_over_minimal` is the median
ratio of step times, paired per round. The minimal GPT is this project's own few lines, not
nanoGPT's code: the floor any GPT step pays at this shape.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import ModelConfig, build_model
from pipeline import cpu_numerics


def gpt_config(vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, context: int) -> ModelConfig:
    """Our decoder-only model in GPT-2's shape (token embeddings not scaled, as GPT-2 does not)."""
    return ModelConfig(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_encoder_layers=0,
                       n_decoder_layers=n_layers, d_ff=d_ff, dropout=0.0, max_len=context, arch="decoder_only",
                       positional="learned", norm="layernorm", norm_position="pre", ffn="gelu", bias=False,
                       tie_output=True, attention_impl="sdpa", scale_embeddings=False)


class MinimalBlock(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, d_ff, bias=False), nn.Linear(d_ff, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class MinimalGPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, d_ff: int, context: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(MinimalBlock(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        h = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), ignore_index=-1)


def steps(args) -> dict:
    torch.manual_seed(0)
    cfg = gpt_config(args.vocab, args.d_model, args.heads, args.layers, 4 * args.d_model, args.context)
    ours = build_model(cfg).train()
    minimal = MinimalGPT(args.vocab, args.d_model, args.heads, args.layers, 4 * args.d_model, args.context).train()
    params = {"ours": sum(p.numel() for p in ours.parameters()),
              "minimal": sum(p.numel() for p in minimal.parameters())}
    tokens = torch.randint(4, args.vocab, (args.batch, args.context + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    opt = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-3), "minimal": torch.optim.AdamW(minimal.parameters(), lr=1e-3)}
    losses = {"ours": lambda: ours(None, x, y)[1], "minimal": lambda: minimal(x, y)}

    def step(name: str) -> None:
        losses[name]().backward()
        opt[name].step()
        opt[name].zero_grad(set_to_none=True)
    return {"params": params, "step": step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30, help="rounds; each times --steps steps of each model")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
    torch.set_flush_denormal(True)  # as the train stage does
    built = steps(args)
    step = built["step"]
    for _ in range(10):
        step("ours"), step("minimal")
    times: dict[str, list[float]] = {"ours": [], "minimal": []}
    for r in range(args.repeats):
        for name in (("ours", "minimal") if r % 2 else ("minimal", "ours")):  # neither always goes first
            start = time.perf_counter()
            for _ in range(args.steps):
                step(name)
            times[name].append((time.perf_counter() - start) / args.steps)
    out = {"config": vars(args), "torch": torch.__version__, "params": built["params"],
           "ours_step_ms": round(1000 * statistics.median(times["ours"]), 3),
           "minimal_step_ms": round(1000 * statistics.median(times["minimal"]), 3),
           "ours_over_minimal": round(statistics.median(a / b for a, b in zip(times["ours"], times["minimal"])), 3)}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in ("ours", "minimal"):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    step(name)
            rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
            out[f"profile_{name}"] = {e.key: {"calls": e.count // 20, "self_cpu_us": round(e.self_cpu_time_total / 20)}
                                      for e in rows}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
