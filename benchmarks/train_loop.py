"""What the training loop costs on top of the model, and whether data loading keeps up.

Run: python -m benchmarks.train_loop [--device cuda] [--repeats 5] [--steps 30]
Prints one JSON object to stdout.

- loop: `trainer.train`, the real loop, a fixed number of steps on synthetic data encoded by the
  real stages; bare: the same model's forward + backward + AdamW step on the same batches, collated
  and moved beforehand. loop_overhead = bare tokens/s / loop tokens/s (1.0: the loop is free).
- loader: the seq2seq batch plan + collate alone, and LM windows from the memory-mapped token file.
  Loading runs on the training thread, so it must be >= 20x what training consumes to cost under 5%.
Each figure is the median over repeats, interleaved after a warm-up round in alternating order.
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

from pipeline import cpu_numerics
from pipeline.params import FilterParams, TrainBpeParams, TrainParams
from pipeline.training import trainer
from pipeline.training.batching import lm_batches, lm_collate, lm_token_file, load_split, read_manifest, seq2seq_batches
from pipeline.training.device import autocast, resolve_device
from pipeline.training.optim import make_optimizer

LOADER_TARGET = 20  # loader tokens/s over training tokens/s


def build_shards(base: Path, n_examples: int, vocab: int) -> Path:
    """raw -> filtered -> tokenizer -> shards, exactly as the pipeline (and tests/conftest.py) do."""
    from pipeline.download import write_synthetic
    from pipeline.encode import encode
    from pipeline.filter import filter_files
    from pipeline.train_bpe import train_tokenizer

    write_synthetic(base / "raw", n_examples=n_examples, seed=7)
    filter_files(base / "raw", base / "filtered", FilterParams(max_source_tokens=128, max_target_tokens=48))
    train_tokenizer(base / "filtered" / "train.parquet", base / "tokenizer", TrainBpeParams(vocab_size=vocab))
    encode(base / "filtered", base / "tokenizer", base / "shards", shard_examples=1000)
    return base / "shards"


def new_model(args, manifest: dict):
    from model import ModelConfig, build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(
        vocab_size=manifest["vocab_size"], d_model=args.d_model, n_heads=args.heads, n_encoder_layers=args.layers,
        n_decoder_layers=args.layers, d_ff=4 * args.d_model, dropout=0.1,
        pad_id=manifest["pad_id"], bos_id=manifest["bos_id"], eos_id=manifest["eos_id"]))


def time_loop(args, data: trainer.Data, manifest: dict, cfg: dict, scratch: Path) -> float:
    """Target tokens/s of trainer.train over `args.steps` steps (no checkpoint is written)."""
    ckpt = Path(tempfile.mkdtemp(dir=scratch))
    result = trainer.train(new_model(args, manifest), data, cfg, ckpt, "bench", log=lambda *a: None)
    return result["tokens_per_s"]


def time_bare(args, batches: list, tokens: int, manifest: dict, device: torch.device) -> float:
    """Target tokens/s of forward + backward + optimizer step alone, on pre-collated batches."""
    model = new_model(args, manifest).to(device).train()
    opt = make_optimizer(model, 1e-3, (0.9, 0.98), 1e-9, 0.01, device)
    _sync(device)
    start = time.perf_counter()
    for src, tgt_in, tgt_out in batches:
        with autocast(device, device.type == "cuda"):
            _, loss = model(src, tgt_in, tgt_out)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)
    return tokens / (time.perf_counter() - start)


def time_loader(data: trainer.Data, epochs: int, seed: int) -> tuple[float, float]:
    """(batches/s, target tokens/s) of planning and collating whole epochs."""
    n = tokens = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        for idx in seq2seq_batches(data.train, data.batch_tokens, seed, epoch):
            data.batch(idx)
            n += 1
            tokens += data.target_tokens(idx)
    elapsed = time.perf_counter() - start
    return n / elapsed, tokens / elapsed


def time_lm_loader(stream, context: int, batch_size: int, epochs: int) -> tuple[float, float]:
    n = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        for starts in lm_batches(len(stream), context, batch_size, 0, epoch):
            lm_collate(stream, starts, context)
            n += 1
    elapsed = time.perf_counter() - start
    return n / elapsed, n * batch_size * context / elapsed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda trains in bf16 autocast")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per loop/bare measurement")
    p.add_argument("--examples", type=int, default=3000, help="synthetic articles before filtering")
    p.add_argument("--vocab", type=int, default=400)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (params.yaml's train.threads)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
        cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
    device = resolve_device(args.device)
    scratch = Path(tempfile.mkdtemp(prefix="bench-train-loop-"))
    try:
        built = time.perf_counter()
        shards = build_shards(scratch / "data", args.examples, args.vocab)
        built = time.perf_counter() - built
        manifest = read_manifest(shards)
        ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
        data = trainer.Data(task=manifest["task"], train=load_split(shards, manifest, "train"),
                            val=load_split(shards, manifest, "validation"), ids=ids,
                            batch_tokens=args.batch_tokens, batch_size=32, context=256, seed=0)
        cfg = TrainParams(device=args.device, budget_steps=args.steps, batch_tokens=args.batch_tokens, warmup_steps=5,
                          eval_every=10 ** 9, eval_examples=16, log_every=10, checkpoint_every=10 ** 9,
                          threads=args.threads).model_dump()
        plan = data.epoch(0)[:args.steps]  # the loop's first steps (grad_accum 1), for the bare step
        if len(plan) < args.steps:
            raise SystemExit(f"--examples {args.examples} gives {len(plan)} batches per epoch; need --steps")
        batches = [tuple(t.to(device) for t in data.batch(idx)) for idx in plan]
        tokens = sum(data.target_tokens(idx) for idx in plan)
        lm_manifest = {**manifest, "task": "language_modeling"}  # the same targets, read as documents
        stream = lm_token_file(shards, lm_manifest, "train", scratch / "token-cache")
        epochs = max(1, round(3 * args.steps / len(data.epoch(0))))
        results = {"loop": [], "bare": [], "loader": [], "lm_loader": []}
        for r in range(args.repeats + 1):  # the first round is warm-up and is dropped
            timers = {"loop": lambda: time_loop(args, data, manifest, cfg, scratch),
                      "bare": lambda: time_bare(args, batches, tokens, manifest, device),
                      "loader": lambda: time_loader(data, epochs, seed=r),
                      "lm_loader": lambda: time_lm_loader(stream, 256, 32, epochs=5)}
            order = list(timers) if r % 2 else list(reversed(timers))  # neither side always goes first
            measured = {k: timers[k]() for k in order}
            if r:
                for k, v in measured.items():
                    results[k].append(v)
        loop = statistics.median(results["loop"])
        bare = statistics.median(results["bare"])
        # Paired per round: the machine's drift hits both sides of a ratio alike.
        overhead = statistics.median(b / lp for b, lp in zip(results["bare"], results["loop"]))
        loader_bps = statistics.median(b for b, _ in results["loader"])
        loader_tps = statistics.median(t for _, t in results["loader"])
        out = {
            "config": {**vars(args), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                       "machine": platform.machine(), "train_examples": len(data.train.src),
                       "batches_per_epoch": len(data.epoch(0)), "lm_stream_tokens": len(stream),
                       "data_build_s": round(built, 1)},
            "loop_tokens_per_s": round(loop), "bare_tokens_per_s": round(bare),
            "loop_overhead": round(overhead, 3),
            "loop_tokens_per_s_all": [round(x) for x in results["loop"]],
            "bare_tokens_per_s_all": [round(x) for x in results["bare"]],
            "loader_batches_per_s": round(loader_bps, 1), "loader_tokens_per_s": round(loader_tps),
            "loader_over_training": round(loader_tps / loop, 1),
            "loader_target_met": loader_tps / loop >= LOADER_TARGET,
            "lm_loader_batches_per_s": round(statistics.median(b for b, _ in results["lm_loader"]), 1),
            "lm_loader_tokens_per_s": round(statistics.median(t for _, t in results["lm_loader"])),
        }
        print(json.dumps(out, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
