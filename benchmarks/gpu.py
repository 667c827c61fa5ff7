"""The whole GPU path in one run, one JSON (`bash run.sh gpu`).

1. the `gpu`-marked tests (bf16 training eager and compiled, manual vs fused attention, KV cache);
2. a 124M decoder-only model (GPT-2 small: 12 layers, 12 heads, d 768, context 1024, vocab 50304)
   in bf16, eager and torch.compile'd: tokens/s and MFU, next to a reference built only from
   PyTorch's own modules at equal shape (nn.TransformerEncoderLayer stack, causal mask, norm
   first, GELU), interleaved in the same run so the ratios are fair;
3. the nanoGPT-matched Tiny Shakespeare preset end to end (`dvc repro`, 3 seeds x all variants),
   wall time per stage;
4. each target, met or not, and everything above in one JSON file, also printed.

Run: python -m benchmarks.gpu [--out gpu.json] [--skip tests,bench,preset]
Without CUDA it prints one line and exits 0. A part that fails is recorded with its error and
the others still run, so one call on a lent machine always brings back a whole picture.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.model_speed import time_interleaved
from model import ModelConfig, build_model
from pipeline.atomic import atomic_path
from pipeline.train import flops_per_target_token
from pipeline.training.device import autocast, peak_flops
from pipeline.training.optim import make_optimizer

ROOT = Path(__file__).resolve().parents[1]
GPT2_SMALL = dict(vocab_size=50304, d_model=768, n_heads=12, n_layers=12, d_ff=3072, context=1024)
PRESET = "nanogpt_shakespeare_char"
TARGETS = {  # (figure, comparison, threshold), as the GPU issue states them
    "mfu_compiled": (">=", 0.45),
    "ours_over_reference_step": ("<=", 0.9),
    "compiled_over_eager_step": ("<=", 0.8),
    "preset_wall_s": ("<=", 300),
}


def gpt_config(vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, context: int) -> ModelConfig:
    """Our decoder-only model in GPT-2's shape: pre-norm, GELU, learned positions, tied head, no biases,
    token embeddings not scaled by sqrt(d_model) (GPT-2 and both references do not scale them)."""
    return ModelConfig(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_encoder_layers=0,
                       n_decoder_layers=n_layers, d_ff=d_ff, dropout=0.0, max_len=context, arch="decoder_only",
                       positional="learned", norm="layernorm", norm_position="pre", ffn="gelu", bias=False,
                       tie_output=True, attention_impl="sdpa", scale_embeddings=False)


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


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token of the GPT shape, by the train stage's own formula (6N + attention)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return flops_per_target_token(model, cfg, 0.0, float(cfg.max_len))


def bench_gpt(shape: dict, device: torch.device, batch: int, steps: int, repeats: int, compile_models: bool) -> dict:
    """tokens/s and MFU of ours and the reference, eager (and compiled), interleaved step for step."""
    cfg = gpt_config(**shape)
    torch.manual_seed(0)
    models = {"ours": build_model(cfg).to(device).train(), "reference": ReferenceGPT(cfg).to(device).train()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    tokens = torch.randint(4, cfg.vocab_size, (batch, cfg.max_len + 1), device=device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def stepper(model: nn.Module, runner: Callable) -> Callable[[], None]:
        opt = make_optimizer(model, 6e-4, (0.9, 0.95), 1e-8, 0.1, device)

        def run() -> None:
            for _ in range(steps):
                with autocast(device, True):
                    _, loss = runner(None, x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        return run

    runs = {f"{name}_eager": stepper(m, m) for name, m in models.items()}
    if compile_models:
        runs.update({f"{name}_compiled": stepper(m, torch.compile(m)) for name, m in models.items()})
    warm = time.perf_counter()
    for run in runs.values():
        run()  # warm-up: compiles the compiled runners, fills the allocator's cache
    warm = time.perf_counter() - warm
    timed = time_interleaved(runs, repeats=repeats, warmup=0, device=device.type)["wall"]
    flops = flops_per_token(cfg)
    peak, peak_source = peak_flops(device)
    out = {"shape": shape, "batch": batch, "steps_per_timing": steps, "repeats": repeats,
           "params": params, "flops_per_token": flops, "peak_flops_per_s": peak, "peak_source": peak_source,
           "warmup_and_compile_s": round(warm, 1)}
    for name, seconds in timed.items():
        tps = batch * cfg.max_len * steps / seconds
        out[name] = {"step_ms": round(1000 * seconds / steps, 2), "tokens_per_s": round(tps),
                     "mfu": round(flops * tps / peak, 4) if peak else None}
    mode = "compiled" if compile_models else "eager"
    out["ours_over_reference_step"] = round(timed[f"ours_{mode}"] / timed[f"reference_{mode}"], 3)
    out["ours_over_reference_step_eager"] = round(timed["ours_eager"] / timed["reference_eager"], 3)
    if compile_models:
        out["compiled_over_eager_step"] = round(timed["ours_compiled"] / timed["ours_eager"], 3)
        out["mfu_compiled"] = out["ours_compiled"]["mfu"]
    return out


def run_gpu_tests(report: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}", "tests"], cwd=ROOT, capture_output=True, text=True)
    out = {"exit_code": proc.returncode, "wall_s": round(time.perf_counter() - start, 1),
           "summary": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]}
    if report.exists():
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        out.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        out["failed"] = [c.get("name") for c in suite.iter("testcase")
                         if c.find("failure") is not None or c.find("error") is not None]
    return out


def run_preset(scratch: Path) -> dict:
    """The nanoGPT-matched preset through `bash run.sh study` into a scratch folder (no commit)."""
    out = scratch / PRESET
    env = {**os.environ, "STUDY_OUT": str(out), "TMPDIR": str(scratch)}
    proc = subprocess.run(["bash", "scripts/study.sh", PRESET], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"study.sh {PRESET} exited {proc.returncode}: {proc.stdout[-800:]}{proc.stderr[-800:]}")
    run = json.loads((out / "run.json").read_text())
    metrics = json.loads((out / "metrics.json").read_text())
    return {"preset": PRESET, "preset_wall_s": run["wall_s"], "stage_s": run["stage_s"], "metrics": metrics}


def verdicts(figures: dict) -> dict:
    out = {}
    for key, (op, threshold) in TARGETS.items():
        value = figures.get(key)
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        out[key] = {"value": value, "target": f"{op} {threshold}", "met": met}
    return out


def environment() -> dict:
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "machine": platform.machine()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "gpu.json")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: tests, bench, preset")
    p.add_argument("--batch", type=int, default=16, help="sequences of 1024 tokens per step of the 124M model")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per timing")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu: no CUDA device visible to torch {torch.__version__}; nothing run")
        return
    skip = set(filter(None, args.skip.split(",")))
    result, figures = {"environment": environment()}, {}
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as scratch:
        parts = {"tests": lambda: run_gpu_tests(Path(scratch, "junit.xml")),
                 "bench": lambda: bench_gpt(GPT2_SMALL, torch.device("cuda"), args.batch, args.steps, args.repeats,
                                            compile_models=True),
                 "preset": lambda: run_preset(Path(scratch))}
        for name, part in parts.items():
            if name in skip:
                result[name] = {"skipped": "--skip"}
                continue
            start = time.perf_counter()
            try:
                result[name] = part()
                figures.update({k: v for k, v in result[name].items() if k in TARGETS})
            except Exception as exc:  # noqa: BLE001 - recorded, and the other parts still run
                result[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            result[name]["part_wall_s"] = round(time.perf_counter() - start, 1)
            torch.cuda.empty_cache()
    result["targets"] = verdicts(figures)
    text = json.dumps(result, indent=2)
    with atomic_path(args.out) as tmp:
        tmp.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
