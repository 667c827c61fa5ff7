"""What pinning the CPU kernels' code path (pipeline/cpu_numerics.py) costs a training step, and
the facts about torch's own kernels that the tests no longer assert.

Run: python -m benchmarks.cpu_numerics [--rounds 5] [--steps 30] [--threads 1 2]
Prints one JSON object. The settings are read when torch starts, so every measurement is a new
process (`--child`) that takes `--steps` AdamW steps of one shape after a warm-up and reports its
median step time; the parent runs pinned and native (ABLATION_LAB_PIN_CPU=0) alternately, `--rounds`
times, and `pinned_over_native` is the ratio of the medians over rounds (1.0 = free). Two shapes:
the default study's encoder-decoder (d 64, 2+2 layers, ~1,024 tokens a batch) and seed S1 at its
size (presets/tiny_shakespeare.yaml: decoder-only, d 128, 2 layers, relative bias, 32 x 128).
`facts` records, on this CPU, whether each library's setting changes the bits of its kernels and
whether torch's own LayerNorm and RMSNorm give other weight gradients at 1 and 2 threads.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shape(name: str):
    import torch

    from benchmarks.model_speed import make_batch
    from model import ModelConfig

    gen = torch.Generator().manual_seed(0)
    if name == "default_encoder_decoder":
        cfg = ModelConfig(vocab_size=2000, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2,
                          d_ff=256, dropout=0.0, max_len=512)
        return cfg, make_batch(cfg, 16, 64, "cpu", 0.25, gen)
    cfg = ModelConfig(vocab_size=65, d_model=128, n_heads=4, n_encoder_layers=0, n_decoder_layers=2, d_ff=512,
                      dropout=0.1, arch="decoder_only", relative_bias=True, max_len=512)
    tokens = torch.randint(4, 65, (32, 129), generator=gen)
    return cfg, (None, tokens[:, :-1], tokens[:, 1:])


SHAPES = ("default_encoder_decoder", "s1_tiny_shakespeare")


def child(name: str, steps: int, threads: int) -> None:
    import time

    import torch

    from benchmarks.model_speed import make_step
    from model import build_model
    from pipeline import cpu_numerics

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg, batch = shape(name)
    step = make_step(build_model(cfg).train(), batch, "cpu", torch.float32)
    for _ in range(5):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"step_ms": 1e3 * statistics.median(times), **cpu_numerics.describe()}))


def unpinned_env() -> dict:
    """This process's environment without the pinned settings, for a child to choose its own."""
    from pipeline.cpu_numerics import PINNED

    return {k: v for k, v in os.environ.items() if k not in PINNED}


def measure(name: str, pinned: bool, steps: int, threads: int) -> dict:
    env = unpinned_env()
    env["ABLATION_LAB_PIN_CPU"] = "1" if pinned else "0"
    out = subprocess.run([sys.executable, "-m", "benchmarks.cpu_numerics", "--child", name, "--steps", str(steps),
                          "--threads", str(threads)], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def facts() -> dict:
    """Which settings change which kernels' bits here, and torch's norms across thread counts."""
    import torch

    probe = ("import hashlib, numpy as np, torch\n"
             "rng = np.random.default_rng(0)\n"
             "a, b = (torch.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((512, 384), (384, 1536)))\n"
             "out = {'matmul': a @ b, 'softmax': torch.softmax(a, -1), 'gelu': torch.nn.functional.gelu(a)}\n"
             "print(' '.join(f'{k}={hashlib.sha256(v.numpy().tobytes()).hexdigest()[:12]}' for k, v in out.items()))")
    clean = unpinned_env()
    settings = {"native": {}, "MKL_CBWR=AVX2,STRICT": {"MKL_CBWR": "AVX2,STRICT"},
                "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
                "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
    digests = {}
    for label, extra in settings.items():
        line = subprocess.run([sys.executable, "-c", probe], env={**clean, **extra}, capture_output=True, text=True,
                              check=True).stdout.split()
        digests[label] = dict(item.split("=") for item in line)
    changed = {label: sorted(k for k in d if d[k] != digests["native"][k]) for label, d in digests.items()
               if label != "native"}

    def differs(make) -> bool:
        x, dy, seen = torch.randn(64, 256, 128), torch.randn(64, 256, 128), set()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            norm = make()
            norm(x).backward(dy)
            seen.add(norm.weight.grad.numpy().tobytes())
        return len(seen) > 1

    return {"kernels_changed_by_each_setting": changed,
            "torch_layernorm_weight_grad_differs_1_vs_2_threads": differs(lambda: torch.nn.LayerNorm(128)),
            "torch_rmsnorm_weight_grad_differs_1_vs_2_threads": differs(lambda: torch.nn.RMSNorm(128))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--child", choices=SHAPES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.steps, args.threads[0])
    import torch

    from pipeline.training.device import _cpu_model

    result = {"config": {"rounds": args.rounds, "steps": args.steps, "threads": args.threads, "torch": torch.__version__,
                         "machine": platform.machine(), "cpu": _cpu_model()}, "shapes": {}}
    for name in SHAPES:
        result["shapes"][name] = {}
        for threads in args.threads:
            runs = {"pinned": [], "native": []}
            for r in range(args.rounds):
                order = ("pinned", "native") if r % 2 == 0 else ("native", "pinned")
                for mode in order:
                    runs[mode].append(measure(name, mode == "pinned", args.steps, threads))
            ms = {mode: [round(m["step_ms"], 3) for m in got] for mode, got in runs.items()}
            result["shapes"][name][f"threads_{threads}"] = {
                "step_ms": ms, "aten_capability": {mode: got[0]["aten_capability"] for mode, got in runs.items()},
                "pinned_over_native": round(statistics.median(ms["pinned"]) / statistics.median(ms["native"]), 4),
                "per_round_ratio": [round(a / b, 4) for a, b in zip(ms["pinned"], ms["native"])]}
    result["facts"] = facts()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
