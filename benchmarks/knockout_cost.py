"""What turning on `knockout` adds to a language-modelling preset's study, before running it.

Run: python -m benchmarks.knockout_cost [--preset nanogpt_shakespeare_char] [--repeats 3]
Prints one JSON object to stdout.

The preset's baseline model (random weights: time does not depend on them) on random tokens of its
training shape, on the CPU: knockout_s is the knockout stage's model work for one seed (the
mean-ablation pass, then the un-knocked model and every knock-out scoring knockout.max_loss_tokens
tokens), train_s one run's training (the median step time x the run's steps); study_share is what
the knock-outs add over the study's training. Process start-up (~2 s per stage) and the evaluate
stages are in neither figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from model.knockout import knockout, plan, record_means
from pipeline import cpu_numerics
from pipeline.params import knockout_seeds, load_params, model_config, resolve_variant
from pipeline.training.optim import make_optimizer

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="nanogpt_shakespeare_char")
    parser.add_argument("--repeats", type=int, default=3)
    # Both figures scale alike with threads; 1 keeps a busy shared machine from oversubscribing.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    params = load_params(ROOT / "presets" / f"{args.preset}.yaml")
    settings = resolve_variant(params, params.report.baseline)
    t, k = settings["train"], params.knockout
    tok = params.train_bpe.model_dump()
    cfg = model_config(settings["model"], tok, "model")
    if cfg.arch == "encoder_decoder":
        raise SystemExit("knockout_cost: language-modelling presets only (the default study's cost is measured "
                         "by running it: docs/fair-comparisons-and-knockouts.md, Knock-outs)")
    torch.set_num_threads(args.threads)
    cpu_numerics.engage()  # the kernels the stages run (pipeline/cpu_numerics.py)
    torch.manual_seed(0)
    from model import build_model

    model = build_model(cfg)
    rows, ctx = t["batch_size"], t["context"]
    batch = torch.randint(4, cfg.vocab_size, (rows, ctx + 1))
    optimizer = make_optimizer(model, t["lr"], t["betas"], t["eps"], t["weight_decay"], torch.device("cpu"), False)

    def train_step() -> None:
        logits, _ = model(None, batch[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    windows = -(-k.max_loss_tokens // ctx)
    loss_batches = [torch.randint(4, cfg.vocab_size, (min(rows, windows - i), ctx)) for i in range(0, windows, rows)]
    knocks = plan(cfg, k.parts, k.attentions, k.heads, k.modes)

    @torch.no_grad()
    def knockout_pass() -> None:
        model.eval()
        with record_means(model) as means:
            for _ in range(k.mean_examples):
                model(None, batch[:1, :ctx])
        for name, mode, ks in [("none", "zero", ())] + knocks:
            with knockout(model, *ks, means=means):
                for b in loss_batches:
                    model(None, b)
        model.train()

    train_step()  # warm-up
    step_s, knock_s = [], []
    for _ in range(args.repeats):  # interleaved, so load on a shared machine hits both alike
        start = time.perf_counter()
        for _ in range(5):
            train_step()
        step_s.append((time.perf_counter() - start) / 5)
        start = time.perf_counter()
        knockout_pass()
        knock_s.append(time.perf_counter() - start)
    steps = t["budget_steps"] or -(-t["budget_tokens"] // (rows * ctx))
    train_s = statistics.median(step_s) * steps
    knockout_s = statistics.median(knock_s)
    n_seeds = len(knockout_seeds(k.seeds, params.seeds)) or len(params.seeds)
    print(json.dumps({
        "preset": args.preset, "knockouts_per_seed": len(knocks), "loss_tokens": k.max_loss_tokens,
        "knockout_s": round(knockout_s, 2), "train_step_s": round(statistics.median(step_s), 4), "steps": steps,
        "train_s": round(train_s, 1), "ratio_per_run": round(knockout_s / train_s, 4),
        "study_share": round(n_seeds * knockout_s / (len(params.ablations) * len(params.seeds) * train_s), 4),
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
