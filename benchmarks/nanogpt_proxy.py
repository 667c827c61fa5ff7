"""A CPU proxy of nanoGPT's GPU recipe: our engine and a nanoGPT-faithful GPT, side by side.

Run: python -m benchmarks.nanogpt_proxy [--text PATH] [--seeds 0 1 2] [--steps 1500] [--out FILE]
Prints one JSON object (and writes it to --out, atomically).

The recipe's regime at a CPU size (its preset's settings at a smaller shape): dropout 0.2, GPT-2
init, and many passes over a cut training text, so the model overfits and the best in-loop estimate
comes before the last step, as on the GPU. The defaults make 77 passes (the GPU recipe 81), about
1.5 minutes a run on one core. Per seed, on the same training and validation windows: ours
(pipeline.training.trainer.train, keep best) and benchmarks.nanogpt_reference.GPT trained by a loop
written as nanoGPT's train.py's. The check: for each of the best and last in-loop estimates and the
whole-split loss of the kept and the last model, the two seed means differ by no more than the
larger of their seed ranges (docs/gpu.md#nanogpts-recipe-one-seed).
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks.nanogpt_reference import GPT, GPTShape, lr_at, optimizer
from model import ModelConfig, build_model
from pipeline import cpu_numerics
from pipeline.io.atomic import atomic_path
from pipeline.params import TrainParams, load_params, resolve_variant
from pipeline.training import trainer

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "presets" / "nanogpt_shakespeare_char_gpu.yaml"
DEFAULT_TEXT = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
QUANTITIES = ("best_estimate", "last_estimate", "whole_split_kept", "whole_split_last")


class AsOurs(nn.Module):
    """The reference GPT behind our model's call signature, so trainer.evaluate_loss scores both."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, src, tgt_in, tgt_out):
        return None, self.gpt(tgt_in, tgt_out)


def char_data(text: str, train_chars: int, seed: int, args) -> tuple[trainer.Data, int]:
    """nanoGPT's prepare.py cut (first 90% train, last 10% validation), the training part cut to
    `train_chars`; ids 0.. over the text's characters (no special tokens are drawn)."""
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((lookup[c] for c in text), dtype=np.int64, count=len(text))
    cut = int(0.9 * len(ids))
    data = trainer.Data(task="language_modeling", train=None, val=None, ids={"pad_id": -1, "bos_id": 0, "eos_id": 0},
                        batch_tokens=0, batch_size=args.batch, context=args.context, seed=seed,
                        train_stream=ids[:cut][:train_chars], val_stream=ids[cut:], lm_windows="random")
    return data, len(chars)


def recipe_model(vocab: int, args) -> ModelConfig:
    """The GPU preset's model section (every recipe switch) at the proxy's shape."""
    section = resolve_variant(load_params(PRESET), "baseline")["model"]
    shape = {"d_model": args.d_model, "n_heads": args.heads, "n_decoder_layers": args.layers,
             "d_ff": 4 * args.d_model, "max_len": args.context}
    # pad_id = vocab: no window holds it, so it is never a target.
    return ModelConfig(**{**section, **shape, "vocab_size": vocab + 1, "pad_id": vocab, "bos_id": 0, "eos_id": 1})


def train_cfg(args) -> dict:
    t = resolve_variant(load_params(PRESET), "baseline")["train"]
    return TrainParams(**{**t, "device": "cpu", "budget_steps": args.steps, "budget_tokens": args.steps * args.batch
                          * args.context, "batch_size": args.batch, "context": args.context, "precision": "fp32",
                          "compile": False, "warmup_steps": args.warmup, "eval_every": args.eval_every,
                          "eval_examples": args.eval_batches * args.batch, "log_every": args.eval_every,
                          "checkpoint_every": 10 * args.steps, "threads": args.threads}).model_dump()


def whole_split(model: nn.Module, data: trainer.Data) -> float:
    windows = (len(data.val_stream) - 1) // data.context
    return trainer.evaluate_loss(model, data, data.val_batches(windows, "first"), torch.device("cpu"), False)


def run_ours(data: trainer.Data, vocab: int, seed: int, args) -> dict:
    torch.manual_seed(seed)
    model = build_model(recipe_model(vocab, args))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as ckpt:
        result = trainer.train(model, data, train_cfg(args), Path(ckpt), f"proxy-{seed}", log=lambda *a: None)
    wall = time.perf_counter() - start
    last = copy.deepcopy(model)
    if result["last_state"] is not None:
        last.load_state_dict(result["last_state"])
    return {"curve": [[r[0], r[2]] for r in result["val_rows"]], "kept_step": result["kept_step"],
            "best_estimate": result["val_estimate_best"], "last_estimate": result["val_estimate_last"],
            "whole_split_kept": whole_split(model, data), "whole_split_last": whole_split(last, data),
            "wall_s": round(wall, 1)}


def run_nanogpt(data: trainer.Data, vocab: int, seed: int, args) -> dict:
    """train.py's loop: lr set per iteration, forward, backward, clip, step; every eval_every steps
    the estimate, the best one's weights kept. Batches: our plan's, so both see the same windows."""
    cfg = train_cfg(args)
    torch.manual_seed(seed)
    gpt = GPT(GPTShape(vocab_size=vocab + 1, block_size=args.context, n_layer=args.layers, n_head=args.heads,
                       n_embd=args.d_model, dropout=0.2))
    opt = optimizer(gpt, cfg["lr"], tuple(cfg["betas"]), cfg["weight_decay"])
    model = AsOurs(gpt)
    torch.manual_seed(seed)  # as trainer.train seeds before its loop: the same dropout stream's start
    min_lr = cfg["lr"] * cfg["min_lr_ratio"]
    curve, best, epoch, index = [], None, 0, 0
    start = time.perf_counter()
    model.train()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg["lr"], cfg["warmup_steps"], args.steps, min_lr)
        batches = data.epoch(epoch)
        _, x, y = data.batch(batches[index])
        index += 1
        if index == len(batches):
            epoch, index = epoch + 1, 0
        loss = gpt(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), cfg["clip_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = step + 1
        if done % cfg["eval_every"] == 0 or done == args.steps:
            estimate = trainer.evaluate_loss(model, data, data.val_batches(cfg["eval_examples"], "random", done),
                                             torch.device("cpu"), False)
            curve.append([done, estimate])
            if best is None or estimate < best[1]:
                best = (done, estimate, copy.deepcopy(gpt.state_dict()))
    wall = time.perf_counter() - start
    last = whole_split(model, data)
    gpt.load_state_dict(best[2])
    return {"curve": curve, "kept_step": best[0], "best_estimate": best[1], "last_estimate": curve[-1][1],
            "whole_split_kept": whole_split(model, data), "whole_split_last": last, "wall_s": round(wall, 1)}


def compare(runs: dict[str, list[dict]]) -> dict:
    """Per quantity: each model's seed mean, sd and range; the difference of means; agreement."""
    out = {}
    for q in QUANTITIES:
        stats = {}
        for name, rs in runs.items():
            xs = [r[q] for r in rs]
            stats[name] = {"mean": statistics.mean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else None,
                           "range": max(xs) - min(xs), "values": xs}
        diff = stats["ours"]["mean"] - stats["nanogpt"]["mean"]
        spread = max(stats["ours"]["range"], stats["nanogpt"]["range"])
        out[q] = {**stats, "ours_minus_nanogpt": diff, "seed_spread": spread, "within_spread": abs(diff) <= spread}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="Tiny Shakespeare's input.txt")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--train-chars", type=int, default=10_000, help="training text kept: fewer = more passes")
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=20, help="batches of the in-loop estimate (nanoGPT: 200)")
    p.add_argument("--threads", type=int, default=1, help="1: runs stay comparable on a shared machine")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    if not args.text.is_file():
        sys.exit(f"nanogpt_proxy: {args.text}: no such file (Tiny Shakespeare's input.txt; pass --text)")
    torch.set_num_threads(args.threads)
    cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
    torch.set_flush_denormal(True)  # as the train stage does
    text = args.text.read_text(encoding="utf-8")
    runs: dict[str, list[dict]] = {"ours": [], "nanogpt": []}
    start = time.perf_counter()
    for seed in args.seeds:
        for name, fn in (("ours", run_ours), ("nanogpt", run_nanogpt)):
            data, vocab = char_data(text, args.train_chars, seed, args)
            runs[name].append({"seed": seed, **fn(data, vocab, seed, args)})
            r = runs[name][-1]
            print(f"{name} seed {seed}: best {r['best_estimate']:.4f} at {r['kept_step']}, last "
                  f"{r['last_estimate']:.4f}, whole split kept {r['whole_split_kept']:.4f} / last "
                  f"{r['whole_split_last']:.4f}, {r['wall_s']} s", file=sys.stderr, flush=True)
    passes = args.steps * args.batch * args.context / min(args.train_chars, int(0.9 * len(text)))
    comparison = compare(runs)
    out = {"benchmark": "nanogpt_proxy", "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "passes_over_training_text": round(passes, 1), "torch": torch.__version__,
           "machine": f"{platform.machine()}, {torch.get_num_threads()} threads", "wall_s": round(time.perf_counter() - start),
           "agree": all(c["within_spread"] for c in comparison.values()), "comparison": comparison, "runs": runs}
    text_out = json.dumps(out, indent=2)
    if args.out:
        with atomic_path(args.out) as tmp:
            tmp.write_text(text_out + "\n")
    print(text_out)


if __name__ == "__main__":
    main()
