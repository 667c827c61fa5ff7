"""train.precision, fused AdamW and train.compile on CPU: the training step's speed against float32 eager.

Run: python -m benchmarks.cpu_precision [--compile] [--repeats 5] [--steps 20]
Prints one JSON object to stdout.

The default model's training step on the same pre-collated batches, as the train stage runs it:
fp32 (foreach AdamW, the CPU default and the reference), fp32_fused (the fused CPU AdamW kernel:
not the default, it changes the last bits), bf16 (autocast, fused AdamW) and with --compile
fp32_compiled and bf16_compiled, their compile time reported apart. Ratios are medians of per-round
ratios to fp32 (> 1 = faster); what these settings are for on CPU: docs/training-engine.md.
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.train_loop import build_shards, new_model
from pipeline import cpu_numerics
from pipeline.training import trainer
from pipeline.training.batching import load_split, read_manifest
from pipeline.training.device import autocast
from pipeline.training.optim import param_groups


def stepper(args, manifest: dict, precision: str, fused: bool, compile_model: bool):
    model = new_model(args, manifest).train()
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, fused=fused,
                            foreach=not fused)  # optim.make_optimizer's, with the kernel chosen here
    step_model = trainer.compiled(model, torch.device("cpu"), dynamic=True) if compile_model else model

    def run(batches) -> float:
        start = time.perf_counter()
        for src, tgt_in, tgt_out in batches:
            with autocast(torch.device("cpu"), precision == "bf16"):
                _, loss = step_model(src, tgt_in, tgt_out)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.perf_counter() - start
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd steps (minutes to compile)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--examples", type=int, default=3000)
    p.add_argument("--vocab", type=int, default=400)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
    scratch = Path(tempfile.mkdtemp(prefix="bench-cpu-precision-"))
    try:
        shards = build_shards(scratch / "data", args.examples, args.vocab)
        manifest = read_manifest(shards)
        data = trainer.Data(task=manifest["task"], train=load_split(shards, manifest, "train"), val=None,
                            ids={k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")},
                            batch_tokens=args.batch_tokens, batch_size=32, context=256, seed=0)
        plan = data.epoch(0)[:args.steps]
        batches = [data.batch(idx) for idx in plan]
        tokens = sum(data.target_tokens(idx) for idx in plan)
        kinds = {"fp32": ("fp32", False, False), "fp32_fused": ("fp32", True, False), "bf16": ("bf16", True, False)}
        if args.compile:
            kinds |= {"fp32_compiled": ("fp32", False, True), "bf16_compiled": ("bf16", True, True)}
        steppers, compile_s = {}, {}
        for name, kind in kinds.items():
            steppers[name] = stepper(args, manifest, *kind)
            compile_s[name] = steppers[name](batches)  # warm-up: compiles every shape it will see
        times = {k: [] for k in kinds}
        for r in range(args.repeats):
            for name in (list(kinds) if r % 2 else list(reversed(kinds))):
                times[name].append(steppers[name](batches))
        out = {
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "torch": torch.__version__, "threads": args.threads, "steps": args.steps, "repeats": args.repeats,
            "tokens_per_s": {k: round(tokens / statistics.median(v), 1) for k, v in times.items()},
            "ratio_to_fp32": {k: round(statistics.median(a / b for a, b in zip(times["fp32"], v)), 3)
                              for k, v in times.items() if k != "fp32"},
            "warmup_s": {k: round(v, 2) for k, v in compile_s.items()},
        }
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
