"""The 124M benchmark of `bash run.sh gpu`: one training step of a GPT-2-small-shaped model in bf16.

Three models of equal shape, each eager and torch.compile'd, timed interleaved step for step in one
process so the ratios are fair: ours (model/), a nanoGPT-style GPT (benchmarks/gpt_step.py's
MinimalGPT) and a reference built only from torch.nn's Transformer modules; `ours_loss_only` and
`ours_fused_ce` (benchmarks/fused_ce.py: the logits never whole) test docs/gpu.md#the-124m-model-mfu's
logits hypothesis. tokens/s and MFU are the median of --repeats timings, the repeats' MFU range
beside it (`mfu_range`). A runner that fails to compile or run is dropped, its error in the JSON.

Run: python -m benchmarks.gpu_bench --result bench.json [--batch 16 --large-batch 32 --steps 10 --repeats 5]
The result file is rewritten after each phase, so a run stopped at a time limit keeps its figures.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.fused_ce import FusedHead
from benchmarks.gpt_step import MinimalGPT, gpt_config
from benchmarks.model_speed import time_interleaved
from model import ModelConfig, build_model
from pipeline.io.atomic import atomic_path
from pipeline.train import flops_per_target_token
from pipeline.training.device import autocast, peak_flops
from pipeline.training.optim import make_optimizer

GPT2_SMALL = dict(vocab_size=50304, d_model=768, n_heads=12, n_layers=12, d_ff=3072, context=1024)
MODELS = ("ours", "nanogpt_style", "reference")


class ReferenceGPT(nn.Module):
    """The same model written only with torch.nn's own Transformer modules."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.pos = nn.Embedding(cfg.max_len, d)
        layer = nn.TransformerEncoderLayer(d, cfg.n_heads, cfg.d_ff, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True, bias=False)
        self.blocks = nn.TransformerEncoder(layer, cfg.n_decoder_layers, norm=nn.LayerNorm(d, bias=False),
                                            enable_nested_tensor=False)

    def forward(self, src, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        t = x.shape[1]
        h = self.embed(x) + self.pos(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        logits = F.linear(h, self.embed.weight)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


class LossOnly(nn.Module):
    """A model whose step returns the loss alone: compiled, its graph need not hand the logits out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args) -> tuple[None, Tensor]:
        return None, self.model(*args)[1]


class NanoGPTStyle(MinimalGPT):
    """MinimalGPT called the way our models are: (src, tgt_in, tgt_out) -> (logits or None, loss)."""

    def forward(self, src, x: Tensor, y: Tensor) -> tuple[None, Tensor]:  # type: ignore[override]
        return None, super().forward(x, y)


def build(cfg: ModelConfig, name: str) -> nn.Module:
    if name == "ours":
        return build_model(cfg)
    if name == "reference":
        return ReferenceGPT(cfg)
    return NanoGPTStyle(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.n_decoder_layers, cfg.d_ff, cfg.max_len)


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token of the GPT shape, by the train stage's own formula (6N + attention)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return flops_per_target_token(model, cfg, 0.0, float(cfg.max_len))


def attention_kernels(run: Callable[[], None]) -> list[str]:
    """The GPU kernels of `run` whose names say attention (flash, cuDNN, memory-efficient): which
    path of scaled_dot_product_attention the compiled step took."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    marks = ("flash", "fmha", "cudnn", "attention", "efficient", "sdpa")
    return sorted({e.key[:120] for e in prof.key_averages() if any(m in e.key.lower() for m in marks)})


def bench_gpt(shape: dict, device: torch.device, batch: int, steps: int, repeats: int, compile_models: bool,
              write: Callable[[dict], None] | None = None, large_batch: int | None = None) -> dict:
    """tokens/s and MFU of the three models, eager (and compiled), interleaved step for step: phase 1
    at `large_batch` (the micro-batch nanoGPT and llm.c use at this size), phase 2 at `batch`
    (_runners); `write(out)` is called after each."""
    cfg = gpt_config(**shape)
    torch.manual_seed(0)
    models = {name: build(cfg, name).to(device).train() for name in MODELS}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    windows = _windows(cfg, device)

    def stepper(model: nn.Module, runner: Callable, b: int) -> Callable[[], None]:
        return _stepper(model, runner, windows, b, steps, device)

    runs, large, phases = _runners(models, stepper, batch, large_batch, compile_models)
    flops = flops_per_token(cfg)
    peak, peak_source = peak_flops(device)
    out = {"shape": shape, "batch": batch, "large_batch": large_batch if compile_models else None,
           "steps_per_timing": steps, "repeats": repeats, "params": params,
           "flops_per_token": flops, "peak_flops_per_s": peak, "peak_source": peak_source,
           "warmup_and_compile_s": 0.0, "phases_done": 0}
    if device.type == "cuda":
        out["sdpa_enabled"] = {"flash": torch.backends.cuda.flash_sdp_enabled(),
                               "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                               "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                               "math": torch.backends.cuda.math_sdp_enabled()}
    warmed: set[str] = set()
    ratios = _ratios("compiled" if compile_models else "eager", compile_models, large_batch)
    for phase in phases:
        if not _warm_up(phase, runs, warmed, out):
            continue
        timing = time_interleaved({n: runs[n] for n in phase if n in runs}, repeats=repeats, warmup=0,
                                  device=device.type)
        timed = timing["wall"]
        for name, seconds in timed.items():
            b = large_batch if name in large else batch
            out[name] = _speed(b, b * cfg.max_len * steps, steps, seconds, timing["wall_all"][name], flops, peak)
        for key, (num, den) in ratios.items():
            if num in timed and den in timed:
                out[key] = round(timed[num] / timed[den], 3)
        _best_compiled(out, runs)
        out["phases_done"] += 1
        profiled = next((n for n in ("ours_compiled", f"ours_compiled_b{large_batch}") if n in timed), None)
        if device.type == "cuda" and profiled and "attention_kernels" not in out:
            try:
                out["attention_kernels"] = attention_kernels(runs[profiled])
            except Exception as exc:  # noqa: BLE001 - the profiler is a diagnostic; the timings stand
                out["attention_kernels"] = f"not read: {type(exc).__name__}: {exc}"
        if write is not None:
            write(out)
    return out


def _windows(cfg: ModelConfig, device: torch.device) -> Callable[[int], tuple[Tensor, Tensor]]:
    """(inputs, targets) of b random windows, made at a batch size's first use and shared by every runner."""
    data: dict[int, tuple[Tensor, Tensor]] = {}

    def windows(b: int) -> tuple[Tensor, Tensor]:
        if b not in data:
            tokens = torch.randint(4, cfg.vocab_size, (b, cfg.max_len + 1), device=device)
            data[b] = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        return data[b]
    return windows


def _stepper(model: nn.Module, runner: Callable, windows: Callable, b: int, steps: int,
             device: torch.device) -> Callable[[], None]:
    """One timing's work: `steps` training steps of `runner` (the model, or it compiled) at b sequences."""
    opt = make_optimizer(model, 6e-4, (0.9, 0.95), 1e-8, 0.1, device)

    def run() -> None:
        x, y = windows(b)
        for _ in range(steps):
            with autocast(device, True):
                _, loss = runner(None, x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return run


def _runners(models: dict[str, nn.Module], stepper: Callable, batch: int, large_batch: int | None,
             compile_models: bool) -> tuple[dict[str, Callable[[], None]], dict, list[list[str]]]:
    """Every runner by name, those at large_batch (every other runs at `batch`), and each phase's names."""
    runs = {f"{name}_eager": stepper(m, m, batch) for name, m in models.items()}
    large: dict[str, Callable[[], None]] = {}
    if not compile_models:
        return runs, large, [list(runs)]
    # dynamic=False: the second batch size compiles its own static graph, as a run at that
    # batch would, instead of turning the first into a dynamic-shape one.
    compiled = {name: torch.compile(m, dynamic=False) for name, m in models.items()}
    compiled["ours_loss_only"] = torch.compile(LossOnly(models["ours"]), dynamic=False)
    compiled["ours_fused_ce"] = torch.compile(FusedHead(models["ours"]), dynamic=False)
    owner = {**{n: n for n in models}, "ours_loss_only": "ours", "ours_fused_ce": "ours"}  # whose parameters
    first = ["ours", "ours_loss_only", "ours_fused_ce", "nanogpt_style"]  # the MFU question, at large_batch
    at_batch = list(models) if large_batch and large_batch != batch else list(compiled)
    runs.update({f"{name}_compiled": stepper(models[owner[name]], compiled[name], batch) for name in at_batch})
    if large_batch and large_batch != batch:
        large = {f"{name}_compiled_b{large_batch}": stepper(models[owner[name]], compiled[name], large_batch)
                 for name in first}
        phases = [list(large), list(runs)]
    else:
        phases = [[f"{name}_compiled" for name in first], list(runs)]
    runs.update(large)
    return runs, large, phases


def _warm_up(phase: list[str], runs: dict, warmed: set[str], out: dict) -> bool:
    """Run each new runner of the phase once (compiling the compiled ones, filling the allocator's
    cache); False when the device ran out of memory: the phase's runners dropped, `out` says so. A
    runner that fails otherwise (a compiler's error) is dropped alone, its error at `NAME_error`."""
    start = time.perf_counter()
    try:
        for name in [n for n in phase if n in runs and n not in warmed]:
            try:
                runs[name]()
            except torch.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - one runner's failure leaves the others' timings
                out[f"{name}_error"] = f"{type(exc).__name__}: {next(iter(str(exc).splitlines()), '')}"
                del runs[name]
                continue
            warmed.add(name)
        if not any(name in runs for name in phase):
            return False
    except torch.OutOfMemoryError as exc:  # a larger micro-batch than the device holds: say so, go on
        out[f"phase_{out['phases_done'] + 1}_error"] = f"out of memory: {str(exc).splitlines()[0]}"
        for name in phase:
            runs.pop(name, None)
        torch.cuda.empty_cache()
        return False
    finally:
        out["warmup_and_compile_s"] = round(out["warmup_and_compile_s"] + time.perf_counter() - start, 1)
    return True


def _speed(b: int, tokens: int, steps: int, seconds: float, repeats: list[float], flops: float,
           peak: float | None) -> dict:
    """One runner's timing: step time, tokens/s and MFU (the median repeat's), the repeats' MFU range."""
    out = {"batch": b, "step_ms": round(1000 * seconds / steps, 2), "tokens_per_s": round(tokens / seconds),
           "mfu": round(flops * tokens / seconds / peak, 4) if peak else None, "repeats": len(repeats)}
    if peak:
        every = [flops * tokens / s / peak for s in repeats]
        out["mfu_range"] = [round(min(every), 4), round(max(every), 4)]
    return out


def _ratios(mode: str, compile_models: bool, large_batch: int | None) -> dict[str, tuple[str, str]]:
    """Each step-time ratio the result gives: its key -> (numerator, denominator) runner names."""
    ratios = {"ours_over_nanogpt_style_step": (f"ours_{mode}", f"nanogpt_style_{mode}"),
              "ours_over_reference_step": (f"ours_{mode}", f"reference_{mode}"),
              "ours_over_nanogpt_style_step_eager": ("ours_eager", "nanogpt_style_eager"),
              "ours_over_reference_step_eager": ("ours_eager", "reference_eager"),
              "compiled_over_eager_step": ("ours_compiled", "ours_eager")}
    if compile_models:
        ratios["loss_only_over_ours_step"] = ("ours_loss_only_compiled", "ours_compiled")
        ratios["fused_ce_over_loss_only_step"] = ("ours_fused_ce_compiled", "ours_loss_only_compiled")
    if large_batch:
        big = f"compiled_b{large_batch}"
        ratios["ours_over_nanogpt_style_step_large_batch"] = (f"ours_{big}", f"nanogpt_style_{big}")
        ratios["loss_only_over_ours_step_large_batch"] = (f"ours_loss_only_{big}", f"ours_{big}")
        ratios["loss_only_over_nanogpt_style_step_large_batch"] = (f"ours_loss_only_{big}", f"nanogpt_style_{big}")
        ratios["fused_ce_over_loss_only_step_large_batch"] = (f"ours_fused_ce_{big}", f"ours_loss_only_{big}")
        ratios["fused_ce_over_nanogpt_style_step_large_batch"] = (f"ours_fused_ce_{big}", f"nanogpt_style_{big}")
    return ratios


def _best_compiled(out: dict, runs: dict) -> None:
    """mfu_compiled and its runner, batch and range: the best of ours' compiled runners timed so far."""
    ours = [n for n in runs if n.startswith(("ours_compiled", "ours_loss_only_compiled", "ours_fused_ce_compiled"))
            and n in out]
    if ours:
        best = max(ours, key=lambda n: out[n]["mfu"] or 0.0)
        out["mfu_compiled"], out["mfu_compiled_batch"] = out[best]["mfu"], out[best]["batch"]
        out["mfu_compiled_runner"], out["mfu_compiled_range"] = best, out[best].get("mfu_range")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--result", type=Path, required=True, help="JSON file, rewritten after each phase")
    p.add_argument("--batch", type=int, default=16, help="sequences of 1024 tokens per step")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--large-batch", type=int, default=32, help="compiled again at this batch (0: not)")
    args = p.parse_args()

    def write(out: dict) -> None:
        with atomic_path(args.result) as tmp:
            tmp.write_text(json.dumps(out, indent=2) + "\n")
        print(f"bench: phase {out['phases_done']} done: " + json.dumps(
            {k: v for k, v in out.items() if k.endswith(("_step", "_compiled", "_eager", "_s"))}), flush=True)

    bench_gpt(GPT2_SMALL, torch.device("cuda"), args.batch, args.steps, args.repeats, compile_models=True, write=write,
              large_batch=args.large_batch or None)


if __name__ == "__main__":
    main()
