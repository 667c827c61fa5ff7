"""Stage `knockout`: parts of one trained baseline run removed at evaluation time, one at a time.

    python -m pipeline.knockout --shards data/shards --tokenizer data/tokenizer --seed 0 \
        --run data/runs/baseline-0 --out data/eval/knockout/baseline-0

dvc.yaml lays out one `knockout@<seed>` stage per entry of `seeds`, so `knockout.seeds` is never a
second list to keep in step: `all` (the default) knocks out every trained seed, a list only its
seeds, [] none. A stage whose seed is not selected writes only off.json (a DVC output must exist)
and exits before importing torch: a second or two, not a knock-out study. For every
knock-out of model.knockout.plan (each head, each attention and FFN sublayer, the positions, each
layer's skip connections, and the three counterparts of train-time ablations), in each mode (zero,
mean), it measures val_loss and, for seq2seq tasks, the task metric, next to the same numbers of
the un-knocked model on the same tokens: the Δ is what the trained model loses without the part.

Kept cheap, so it can be on in the default study:
- val_loss on the first validation examples holding `knockout.max_loss_tokens` target tokens
  (LM: exactly that many; the same tokens for every knock-out), not the whole split. A paired Δ
  on the same tokens needs far fewer of them than a loss of its own.
- The task metric (seq2seq) on the first `knockout.max_examples` test examples, decoded as the
  evaluate stage decodes, for the un-knocked model and the counterparts of train-time ablations
  only: decoding every knock-out would cost more than evaluating every run of the study.
- The model is loaded once and the knock-outs are hooks (model.knockout), no copies.
- Means for mean-ablation: over the tokens of the first `knockout.mean_examples` training
  examples (LM: as many context windows), fed one unpadded row at a time, so padding never enters.

Writes knockout.json (settings, the un-knocked numbers, one record per knock-out, the stage's
start and end times and wall time) and knockout.csv (the records) into --out, atomically.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import time
from pathlib import Path

# torch, the model and the data readers are imported where a knock-out runs (run_knockouts, main):
# a seed that knockout.seeds leaves out exits without them.
from pipeline.io.atomic import atomic_path
from pipeline.params import EvaluateParams, KnockoutParams, ParamsError, decided_run, knocks_out, load_params, stage_error

STARTED_AT = time.time()  # the stage's start, before the heavy imports: MLflow shows the stage's duration

IGNORE = -100  # target positions not scored (padding; LM window tails)
CSV_COLUMNS = ("name", "mode", "kind", "knocks", "val_loss", "delta_val_loss")
OFF = "off.json"  # the whole output of a seed knockout.seeds does not select


def loss_batches(split, manifest: dict, max_tokens: int, batch_size: int, context: int) -> list[tuple]:
    """(src or None, tgt_in, tgt_out) batches covering the first `max_tokens` scored target tokens."""
    import numpy as np
    import torch

    from pipeline.evaluate import lm_stream
    from pipeline.training.batching import collate

    ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
    if manifest["task"] == "language_modeling":
        stream = torch.from_numpy(lm_stream(split.tgt, ids["eos_id"])[:max_tokens + 1])
        windows = []
        for s in range(0, len(stream) - 1, context):
            piece = stream[s:s + context + 1]
            inp = torch.full((context,), ids["eos_id"], dtype=torch.long)
            out = torch.full((context,), IGNORE, dtype=torch.long)
            inp[:len(piece) - 1], out[:len(piece) - 1] = piece[:-1], piece[1:]
            windows.append((inp, out))
        return [(None, torch.stack([w[0] for w in windows[i:i + batch_size]]),
                 torch.stack([w[1] for w in windows[i:i + batch_size]])) for i in range(0, len(windows), batch_size)]
    n, tokens = 0, 0
    while n < len(split.tgt) and tokens < max_tokens:
        tokens += len(split.tgt[n]) + 1  # + eos
        n += 1
    batches = []
    for start in range(0, n, batch_size):
        src, tgt_in, tgt_out = collate(split, np.arange(start, min(n, start + batch_size)), **ids)
        batches.append((src, tgt_in, tgt_out.masked_fill(tgt_out == ids["pad_id"], IGNORE)))
    return batches


def mean_rows(split, manifest: dict, n: int, context: int) -> list[tuple]:
    """n unpadded (src or None, tgt_in) rows of held-out data for record_means."""
    import numpy as np
    import torch

    from pipeline.evaluate import lm_stream
    from pipeline.training.batching import collate

    ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
    if manifest["task"] == "language_modeling":
        stream = torch.from_numpy(lm_stream(split.tgt, ids["eos_id"])[:n * context])
        return [(None, stream[s:s + context][None]) for s in range(0, len(stream) - 1, context)]
    rows = []
    for i in range(min(n, len(split.tgt))):
        src, tgt_in, _ = collate(split, np.array([i]), **ids)
        rows.append((src, tgt_in))
    return rows


def val_loss(model, batches: list[tuple], device) -> float:
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad():
        for src, tgt_in, tgt_out in batches:
            logits, _ = model(None if src is None else src.to(device), tgt_in.to(device))
            tgt = tgt_out.to(device).flatten()
            total += float(F.cross_entropy(logits.flatten(0, 1).float(), tgt, ignore_index=IGNORE, reduction="sum"))
            count += int((tgt != IGNORE).sum())
    return total / max(count, 1)


def run_knockouts(shards: Path, tokenizer: Path, run_dir: Path, out: Path, cfg: KnockoutParams,
                  eval_cfg: EvaluateParams, context: int, batch_size: int, device=None,
                  started_at: float | None = None) -> dict:
    """Every planned knock-out of the run's model, measured against the un-knocked model; written
    to `out`. `started_at` (seconds since the epoch): the stage's start, recorded with its end."""
    import torch

    from model.knockout import COUNTERPARTS, knockout, plan, record_means
    from pipeline.evaluate import decode
    from pipeline.scoring.run_files import load_model, read_object
    from pipeline.io.progress import Progress
    from pipeline.scoring.metrics import task_metrics
    from pipeline.train_bpe import load_tokenizer
    from pipeline.training.batching import load_split, load_texts, read_manifest

    started_at = time.time() if started_at is None else started_at
    start = time.perf_counter()
    device = torch.device("cpu") if device is None else device
    manifest = read_manifest(shards)
    info = read_object(run_dir / "train.json", ("variant", "seed"))
    task = manifest["task"]
    model = load_model(run_dir, device)
    knockouts = plan(model.cfg, cfg.parts, cfg.attentions, cfg.heads, cfg.modes)
    batches = loss_batches(load_split(shards, manifest, "validation"), manifest, cfg.max_loss_tokens,
                           batch_size if task == "language_modeling" else eval_cfg.batch_size, context)
    n_tokens = sum(int((b[2] != IGNORE).sum()) for b in batches)
    with record_means(model) as means, torch.no_grad():
        for src, tgt_in in mean_rows(load_split(shards, manifest, "train", limit=cfg.mean_examples), manifest,
                                     cfg.mean_examples, context):
            model(None if src is None else src.to(device), tgt_in.to(device))
    scored = task != "language_modeling" and cfg.max_examples > 0
    if scored:
        ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
        test = load_split(shards, manifest, "test", limit=cfg.max_examples)
        texts = load_texts(shards, manifest, "test", limit=cfg.max_examples)
        sp = load_tokenizer(tokenizer)
        decode_cfg = eval_cfg.model_copy(update={"max_examples": cfg.max_examples})

    def measure(with_metric: bool = True) -> dict:
        result = {"val_loss": val_loss(model, batches, device)}
        if scored and with_metric:
            _, references, predictions = decode(model, test, texts, ids, decode_cfg, sp, device)
            result.update(task_metrics(task, references, predictions))
        return result

    records = []
    with Progress(f"knockout {run_dir.name}", total=len(knockouts) + 1, unit="knock-outs") as progress:
        base = measure()
        progress.update()
        for name, mode, knocks in knockouts:
            with knockout(model, *knocks, means=means):
                result = measure(with_metric=name in COUNTERPARTS)
            records.append({"name": name, "mode": mode, "kind": knocks[0].kind, "knocks": len(knocks),
                            **(where(knocks[0]) if len(knocks) == 1 else {}), **result,
                            **{f"delta_{k}": v - base[k] for k, v in result.items()}})
            progress.update()
    summary = {"variant": info["variant"], "seed": info["seed"], "task": task,
               "metrics": list(base), "n_loss_tokens": n_tokens, "n_examples": len(test.tgt) if scored else 0,
               "mean_examples": cfg.mean_examples, "modes": list(cfg.modes),
               "n_heads": model.cfg.n_heads, "layers": {s: n for s, n in _layers(model).items()},
               # The model switch each counterpart knock-out matches, for the report's side-by-side table.
               "counterparts": {name: list(switch) for name, switch in COUNTERPARTS.items()},
               "base": base, "knockouts": records, "wall_s": time.perf_counter() - start,
               "started_at": started_at, "finished_at": time.time()}
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "knockout.json").write_text(json.dumps(summary, indent=2) + "\n")
        (tmp / "knockout.csv").write_text(to_csv(records, list(base)))
    return summary


def where(knock) -> dict:
    """The located part of a single knock-out (what the report's heatmap is indexed by)."""
    if knock.kind == "positional":
        return {}
    out = {"stack": knock.stack, "layer": knock.layer}
    if knock.kind in ("head", "attention"):
        out["attn"] = knock.attn
    if knock.kind == "head":
        out["head"] = knock.head
    return out


def _layers(model) -> dict[str, int]:
    return {s: len(getattr(model, s).layers) for s in ("encoder", "decoder") if getattr(model, s, None) is not None}


def to_csv(records: list[dict], metrics: list[str]) -> str:
    columns = [*CSV_COLUMNS, *(c for m in metrics if m != "val_loss" for c in (m, f"delta_{m}"))]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


def write_off(out: Path, seed: int, why: str) -> None:
    """The output of a stage that knocks nothing out: off.json alone, which the report ignores."""
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        (tmp / OFF).write_text(json.dumps({"seed": seed, "off": why}) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--shards", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--seed", type=int, help="the seed of --run: knocked out if knockout.seeds selects it")
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", required=True)
    # knockout_more (seeds until decided) has a stage per added run; only the baseline's knock out.
    parser.add_argument("--decided", help="a run of decide.runs instead of --seed (a variant's writes off.json)")
    args = parser.parse_args(argv)
    if (args.decided is None) == (args.seed is None):
        parser.error("give --seed or --decided")
    try:
        params = load_params(args.params)
        if args.decided is not None:
            args.variant, args.seed = decided_run(params, args.decided)
        else:
            args.variant = params.report.baseline
        if args.variant != params.report.baseline:
            write_off(Path(args.out), args.seed, f"{args.variant} is not report.baseline: nothing to knock out")
            print(f"knockout: off ({args.variant} is not the baseline)")
            return
        if not knocks_out(params.knockout.seeds, args.seed):
            write_off(Path(args.out), args.seed, f"knockout.seeds is {params.knockout.seeds!r}: not this seed")
            print(f"knockout@{args.seed}: off (knockout.seeds: {params.knockout.seeds})")
            return
        from pipeline.scoring.run_files import run_settings
        from pipeline.training.device import recorded_slots, resolve_device, set_up_cpu

        t = run_settings(Path(args.run))  # the shapes and device the run trained with, as evaluate
        set_up_cpu(t.threads)  # the threads, kernels and allocator training ran with
        summary = run_knockouts(Path(args.shards), Path(args.tokenizer), Path(args.run), Path(args.out),
                                params.knockout, params.evaluate, t.context, t.batch_size,
                                resolve_device(t.device, slots=recorded_slots(Path(args.run))), started_at=STARTED_AT)
    except (ParamsError, ValueError, OSError, KeyError) as exc:
        raise stage_error("knockout", exc) from None
    print(json.dumps({k: summary[k] for k in ("variant", "seed", "base", "n_loss_tokens", "wall_s")}))


if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
