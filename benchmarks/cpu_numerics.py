"""What pinning the CPU kernels' code path (pipeline/cpu_numerics.py) costs a training step, and
the facts about torch's own kernels that the tests no longer assert.

Run: python -m benchmarks.cpu_numerics [--rounds 5] [--steps 30] [--threads 1 2] [--parts 60]
                                       [--side-by-side 4]
Prints one JSON object. The settings are read when torch starts, so every measurement is a new
process (`--child`): its median AdamW step time at the default study's shape or seed S1's, in four
modes run in a rotating order: pinned (what the stages run), pinned_whole (pinned, each product one
call on one thread: not shared among torch's threads), pinned_mkl (pinned but torch's own MKL
products and vector maths) and native (ABLATION_LAB_PIN_CPU=0). `parts` splits the pinned step's
cost by what pinning changes (the routed products, the written-out attention, oneDNN off): one
pinned process turns each off in turn, alternating step by step (PARTS). `side_by_side` times what
`bash run.sh` runs: two processes at once, one thread each, both pinned or both native, and each
of those with glibc's own allocator thresholds (what pipeline/training/allocator.py saves), the
ways taking turns round by round. Every child keeps freed memory as the train stage does unless
told otherwise. `facts` records, on this CPU, which settings change the bits of which kernels,
torch's own and routed, and whether torch's norms give other weight gradients at 1 and 2 threads
(docs/training-engine.md#the-same-bits-on-every-cpu).
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


MODES = ("pinned", "pinned_whole", "pinned_mkl", "native")


def child(name: str, steps: int, threads: int, mode: str) -> None:
    import resource
    import time

    import torch

    from benchmarks.model_speed import make_step
    from model import build_model
    from pipeline import cpu_numerics
    from pipeline.training.allocator import keep_freed_memory

    torch.set_num_threads(threads)
    keep_freed_memory()  # as the train stage does (unless ABLATION_LAB_KEEP_FREED=0)
    if mode != "pinned_mkl":
        cpu_numerics.engage()  # as the stages do; nothing where ABLATION_LAB_PIN_CPU=0
    if mode == "pinned_whole":  # each product one OpenBLAS call on one thread (before they were shared)
        cpu_numerics.SHARE = 1 << 62
    torch.manual_seed(0)
    cfg, batch = shape(name)
    step = make_step(build_model(cfg).train(), batch, "cpu", torch.float32)
    for _ in range(5):
        step()
    times = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    print(json.dumps({"step_ms": 1e3 * statistics.median(times), "page_faults_per_step": round(faults),
                      **cpu_numerics.describe()}))


# What each part of the pinning costs, in one pinned process, the parts turned off and on between
# steps (the machines' noise drifts over seconds: alternating step by step pairs the configurations).
PARTS = {"pinned": (), "products_own": ("products",), "attention_fused": ("attention",),
         "onednn_on": ("onednn",), "none": ("products", "attention", "onednn")}


def parts_child(name: str, rounds: int, threads: int) -> None:
    """Median step ms of each PARTS configuration: `none` is torch's own kernels with ATen at AVX2
    (native, where the CPU's own ATen level is AVX2)."""
    import time

    import torch

    import model.exact
    from benchmarks.model_speed import make_step
    from model import build_model
    from pipeline import cpu_numerics
    from pipeline.training.allocator import keep_freed_memory

    torch.set_num_threads(threads)
    keep_freed_memory()  # as the train stage does
    if not cpu_numerics.engage():
        raise SystemExit("cpu_numerics: --parts needs the pinned kernels (an x86-64 CPU with AVX2)")
    torch.manual_seed(0)
    cfg, batch = shape(name)
    step = make_step(build_model(cfg).train(), batch, "cpu", torch.float32)

    def configure(off: tuple) -> None:
        library = cpu_numerics._state.pop("library", None)
        if library is not None:
            library._destroy()
        if "products" not in off:
            cpu_numerics._state["library"] = cpu_numerics._register(torch)
        (model.exact.WRITTEN_OUT_ON.discard if "attention" in off else model.exact.WRITTEN_OUT_ON.add)("cpu")
        torch.backends.mkldnn.enabled = "onednn" in off

    times = {part: [] for part in PARTS}
    for _ in range(rounds):
        for part, off in PARTS.items():
            configure(off)
            step()  # the first step after a switch pays it
            start = time.perf_counter()
            step()
            times[part].append(time.perf_counter() - start)
    configure(())
    print(json.dumps({part: round(1e3 * statistics.median(t), 3) for part, t in times.items()}))


def parts(name: str, rounds: int, threads: int) -> dict:
    env = {**unpinned_env(), "ABLATION_LAB_PIN_CPU": "1"}
    out = subprocess.run([sys.executable, "-m", "benchmarks.cpu_numerics", "--child", name, "--mode", "parts",
                          "--parts", str(rounds), "--threads", str(threads)], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True)
    ms = json.loads(out.stdout.splitlines()[-1])
    return {"step_ms": ms, "over_none": {part: round(v / ms["none"], 4) for part, v in ms.items()},
            # each part's share of the pinned step: what turning it alone off saves
            "saved_by_turning_off": {part: round(1 - ms[part] / ms["pinned"], 4) for part in PARTS
                                     if part not in ("pinned", "none")}}


# Side by side, each mode also with glibc's own allocator behaviour (ABLATION_LAB_KEEP_FREED=0):
# what keeping freed memory (pipeline/training/allocator.py) saves each.
PAIRS = ("pinned", "native", "pinned_returned", "native_returned")


def side_by_side(name: str, rounds: int, steps: int) -> dict:
    """Two runs at once, one thread each, as `bash run.sh` trains (-j 2), in each of PAIRS, the
    order turned round by round. Each round's two step times (ms) and page faults a step per
    configuration, and the median ratios."""
    ms = {mode: [] for mode in PAIRS}
    faults = {mode: [] for mode in PAIRS}
    for r in range(rounds):
        for mode in PAIRS[r % len(PAIRS):] + PAIRS[:r % len(PAIRS)]:
            got = _pair(name, mode, steps)
            ms[mode].append([g["step_ms"] for g in got])
            faults[mode].append([g["page_faults_per_step"] for g in got])
    median = {mode: statistics.median(x for pair in got for x in pair) for mode, got in ms.items()}
    return {"step_ms": ms, "page_faults_per_step": faults,
            "pinned_over_native": round(median["pinned"] / median["native"], 4),
            "allocator": {f"{mode}_kept_over_returned": round(median[mode] / median[f"{mode}_returned"], 4)
                          for mode in ("pinned", "native")}}


def _pair(name: str, mode: str, steps: int) -> list[dict]:
    kernels = mode.removesuffix("_returned")
    command, env = _child(name, kernels, steps, 1)
    env["ABLATION_LAB_KEEP_FREED"] = "0" if mode.endswith("_returned") else "1"
    children = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    out = [child.communicate()[0] for child in children]
    if any(child.returncode for child in children):
        raise SystemExit(f"cpu_numerics: a side-by-side {mode} child at {name} failed")
    got = [json.loads(text.splitlines()[-1]) for text in out]
    return [{"step_ms": round(g["step_ms"], 3), "page_faults_per_step": g["page_faults_per_step"]} for g in got]


def unpinned_env() -> dict:
    """This process's environment without the pinned settings, for a child to choose its own."""
    from pipeline.cpu_numerics import PINNED

    return {k: v for k, v in os.environ.items() if k not in PINNED}


def _child(name: str, mode: str, steps: int, threads: int) -> tuple[list[str], dict]:
    """The command and environment of one timed child process (`--child`) in `mode`."""
    env = {**unpinned_env(), "ABLATION_LAB_PIN_CPU": "0" if mode == "native" else "1"}
    return ([sys.executable, "-m", "benchmarks.cpu_numerics", "--child", name, "--steps", str(steps),
             "--threads", str(threads), "--mode", mode], env)


def measure(name: str, mode: str, steps: int, threads: int) -> dict:
    command, env = _child(name, mode, steps, threads)
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


PROBE = """
import hashlib, sys, numpy as np
import pipeline, torch
from pipeline import cpu_numerics
if sys.argv[1] == "1":
    assert cpu_numerics.engage()
rng = np.random.default_rng(0)
a, b = (torch.from_numpy(rng.standard_normal(s, dtype=np.float32)) for s in ((512, 384), (384, 1536)))
q = torch.from_numpy(rng.standard_normal((4, 4, 64, 16), dtype=np.float32))
out = {"matmul": a @ b, "small_matmul": a[:39, :16] @ b[:16, :48], "softmax": torch.softmax(a, -1),
       "gelu": torch.nn.functional.gelu(a), "exp": torch.exp(a), "log": torch.log(a.abs() + 0.1),
       "sqrt": torch.sqrt(a.abs()), "torch_fused_attention": torch.nn.functional.scaled_dot_product_attention(q, q, q)}
print(" ".join(f"{k}={hashlib.sha256(v.numpy().tobytes()).hexdigest()[:12]}" for k, v in out.items()))
"""
SETTINGS = {"native": {}, "MKL_CBWR=AVX2,STRICT": {"MKL_CBWR": "AVX2,STRICT"}, "MKL_CBWR=AUTO": {"MKL_CBWR": "AUTO"},
            "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"}, "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
            "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}
OPENBLAS = {"OPENBLAS_CORETYPE=Zen (AMD's)": {"OPENBLAS_CORETYPE": "Zen"},
            "OPENBLAS_L2_SIZE=128 KiB": {"OPENBLAS_L2_SIZE": "131072"},
            "OPENBLAS_NUM_THREADS=2": {"OPENBLAS_NUM_THREADS": "2"}}


def _digests(env: dict, routed: bool) -> dict:
    line = subprocess.run([sys.executable, "-c", PROBE, "1" if routed else "0"], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True).stdout.split()
    return dict(item.split("=") for item in line)


def facts() -> dict:
    """Which settings change which kernels' bits here, torch's own and routed (cpu_numerics.engage);
    what moves OpenBLAS's pinned kernel; torch's norms across thread counts."""
    import torch

    from pipeline.cpu_numerics import PINNED

    clean = unpinned_env()
    own = {label: _digests({**clean, "ABLATION_LAB_PIN_CPU": "0", **extra}, False) for label, extra in SETTINGS.items()}
    changed = {label: sorted(k for k in d if d[k] != own["native"][k]) for label, d in own.items() if label != "native"}
    pinned = {**clean, **PINNED}
    routed = {label: _digests({**pinned, **extra}, True) for label, extra in {**SETTINGS, **OPENBLAS}.items()
              if label != "native"}
    base = routed["MKL_CBWR=AVX2,STRICT"]
    routed_changed = {label: sorted(k for k in d if d[k] != base[k]) for label, d in routed.items()}

    def differs(make) -> bool:
        x, dy, seen = torch.randn(64, 256, 128), torch.randn(64, 256, 128), set()
        for threads in (1, 2):
            torch.set_num_threads(threads)
            norm = make()
            norm(x).backward(dy)
            seen.add(norm.weight.grad.numpy().tobytes())
        return len(seen) > 1

    return {"kernels_changed_by_each_setting": changed,
            "routed_kernels_changed_by_each_setting_from_the_pinned_one": routed_changed,
            "torch_layernorm_weight_grad_differs_1_vs_2_threads": differs(lambda: torch.nn.LayerNorm(128)),
            "torch_rmsnorm_weight_grad_differs_1_vs_2_threads": differs(lambda: torch.nn.RMSNorm(128))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--child", choices=SHAPES, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=(*MODES, "parts"), default="pinned", help=argparse.SUPPRESS)
    p.add_argument("--parts", type=int, default=60, metavar="ROUNDS",
                   help="rounds of the in-process parts comparison (PARTS), a step each; 0: skip it")
    p.add_argument("--side-by-side", type=int, default=4, metavar="ROUNDS",
                   help="rounds of two runs at once, one thread each, pinned then native; 0: skip it")
    args = p.parse_args()
    if args.child:
        if args.mode == "parts":
            return parts_child(args.child, args.parts, args.threads[0])
        return child(args.child, args.steps, args.threads[0], args.mode)
    import torch

    from pipeline.training.device import _cpu_model

    result = {"config": {"rounds": args.rounds, "steps": args.steps, "threads": args.threads, "torch": torch.__version__,
                         "machine": platform.machine(), "cpu": _cpu_model()}, "shapes": {}}
    for name in SHAPES:
        result["shapes"][name] = {}
        for threads in args.threads:
            runs = {mode: [] for mode in MODES}
            for r in range(args.rounds):
                for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                    runs[mode].append(measure(name, mode, args.steps, threads))
            ms = {mode: [round(m["step_ms"], 3) for m in got] for mode, got in runs.items()}
            median = {mode: statistics.median(v) for mode, v in ms.items()}
            result["shapes"][name][f"threads_{threads}"] = {
                "step_ms": ms, "aten_capability": {mode: got[0]["aten_capability"] for mode, got in runs.items()},
                "matmul": {mode: got[0]["matmul"] for mode, got in runs.items()},
                "pinned_over_native": round(median["pinned"] / median["native"], 4),
                "pinned_over_pinned_mkl": round(median["pinned"] / median["pinned_mkl"], 4),
                "pinned_over_pinned_whole": round(median["pinned"] / median["pinned_whole"], 4),
                "pinned_mkl_over_native": round(median["pinned_mkl"] / median["native"], 4),
                "per_round_ratio": [round(a / b, 4) for a, b in zip(ms["pinned"], ms["native"])]}
            if args.parts:
                result["shapes"][name][f"threads_{threads}"]["parts"] = parts(name, args.parts, threads)
        if args.side_by_side:
            result["shapes"][name]["side_by_side"] = side_by_side(name, args.side_by_side, args.steps)
    result["facts"] = facts()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
