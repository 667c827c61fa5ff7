"""Training-step speed of our encoder-decoder vs torch.nn.Transformer, and manual vs sdpa attention.

Run: python -m benchmarks.model_speed [--device cuda --dtype bf16] [--repeats 5] [--threads 2] ...
Prints one JSON object to stdout.

Every model does the same step (a post-norm ReLU encoder-decoder with tied embeddings, dropout 0.1,
padding and causal masks, AdamW); the reference wraps nn.Transformer in exactly that (its final
LayerNorms kept, ~free). ours_equal_work puts dropout on attention weights as nn.Transformer does;
ours_default (the paper's placement) does not, so sdpa may use flash; ours_default_manual is that
with the written-out attention. Models run interleaved after warm-up so the machine's drift hits
all alike; each figure is the median over repeats, in wall-clock and in process CPU time.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model import ModelConfig, build_model
from model.positions import sinusoidal_table
from pipeline import cpu_numerics

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ReferenceTransformer(nn.Module):
    """torch.nn.Transformer with the same embedding/positions/output head as our model."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Same init as ours: nn.Embedding's N(0, 1) with the sqrt(d) scale and tying saturates the
        # softmax into denormal gradients, ~3x slower on CPU for no reason of nn.Transformer's.
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.register_buffer("pos", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers,
                                          cfg.n_decoder_layers, cfg.d_ff, cfg.dropout, batch_first=True)
        self.dropout = nn.Dropout(cfg.dropout)

    def _embed(self, tokens: Tensor) -> Tensor:
        x = self.embed(tokens) * math.sqrt(self.cfg.d_model) + self.pos[: tokens.shape[1]]
        return self.dropout(x)

    def forward(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor) -> tuple[Tensor, Tensor]:
        pad = src == self.cfg.pad_id
        t = tgt_in.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=src.device)
        h = self.transformer(self._embed(src), self._embed(tgt_in), tgt_mask=causal,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True)
        logits = F.linear(h, self.embed.weight)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt_out.reshape(-1),
                               ignore_index=self.cfg.pad_id)
        return logits, loss


def make_step(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], device: str,
              dtype: torch.dtype) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = dtype != torch.float32

    def step() -> None:
        with torch.autocast(device_type=device, dtype=dtype, enabled=autocast):
            _, loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_interleaved(steps: dict[str, Callable[[], None]], repeats: int, warmup: int,
                     device: str) -> dict[str, dict[str, float]]:
    """Median wall-clock and process-CPU seconds per step for each callable, run round-robin (CPU
    time: on a shared machine the steadier of the two with few threads)."""
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    wall: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {"wall": {n: statistics.median(t) for n, t in wall.items()},
            "cpu": {n: statistics.median(t) for n, t in cpu.items()},
            "wall_all": wall}  # every repeat, for a spread beside the median


def make_batch(cfg: ModelConfig, batch: int, length: int, device: str,
               padded_fraction: float, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Random tokens; `padded_fraction` of the rows get a random shorter source and target."""
    src = torch.randint(4, cfg.vocab_size, (batch, length), generator=gen)
    tgt = torch.randint(4, cfg.vocab_size, (batch, length + 1), generator=gen)
    tgt[:, 0] = cfg.bos_id
    for row in range(int(batch * padded_fraction)):
        cut = int(torch.randint(length // 2, length, (1,), generator=gen))
        src[row, cut:] = cfg.pad_id
        tgt[row, cut + 1:] = cfg.pad_id
    return src.to(device), tgt[:, :-1].contiguous().to(device), tgt[:, 1:].contiguous().to(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--enc-layers", type=int, default=2)
    p.add_argument("--dec-layers", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--padded-fraction", type=float, default=0.25, help="rows with padding")
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)
    base = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads,
                       n_encoder_layers=args.enc_layers, n_decoder_layers=args.dec_layers,
                       d_ff=args.d_ff, dropout=0.1, max_len=max(512, args.length + 1))
    configs = {
        "ours_equal_work": dataclasses.replace(base, attention_dropout=base.dropout),
        "ours_default": base,
        "ours_default_manual": dataclasses.replace(base, attention_impl="manual"),
    }
    models: dict[str, nn.Module] = {name: build_model(cfg) for name, cfg in configs.items()}
    models["nn_transformer"] = ReferenceTransformer(dataclasses.replace(base, attention_dropout=base.dropout))
    batch = make_batch(base, args.batch, args.length, args.device, args.padded_fraction,
                       torch.Generator().manual_seed(0))
    steps = {name: make_step(m.to(args.device).train(), batch, args.device, dtype)
             for name, m in models.items()}
    times = time_interleaved(steps, args.repeats, args.warmup, args.device)
    tokens = int((batch[0] != base.pad_id).sum() + (batch[2] != base.pad_id).sum())

    def ratios(clock: str) -> dict[str, float]:
        t = times[clock]
        return {"ours_equal_work_over_nn_transformer": round(t["ours_equal_work"] / t["nn_transformer"], 4),
                "ours_default_over_nn_transformer": round(t["ours_default"] / t["nn_transformer"], 4),
                "manual_over_sdpa": round(t["ours_default_manual"] / t["ours_default"], 4)}

    result = {
        "config": {**vars(args), "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "machine": platform.machine()},
        "params": {"ours": models["ours_default"].param_counts()["total"],
                   "nn_transformer": sum(p.numel() for p in models["nn_transformer"].parameters())},
        "step_s_median_wall": {k: round(v, 5) for k, v in times["wall"].items()},
        "step_s_median_cpu": {k: round(v, 5) for k, v in times["cpu"].items()},
        "ratios_wall": ratios("wall"),
        "ratios_cpu": ratios("cpu"),
        "tokens_per_s_ours_default_wall": round(tokens / times["wall"]["ours_default"], 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
