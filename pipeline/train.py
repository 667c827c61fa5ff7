"""Stage `train`: one variant (baseline or ablation) with one seed, to the shared token budget.

    python -m pipeline.train --shards data/shards --variant no_positional --seed 0 \
        --out data/runs/no_positional-0 --checkpoints data/checkpoints/no_positional-0

Writes model.pt, train_curve.csv, val_curve.csv, config.json and train.json (the metrics) into
--out as a whole. Checkpoints go to --checkpoints (a DVC `persist` output), so rerunning the stage
after a crash, SIGKILL or Ctrl-C resumes where it stopped. Under `torchrun` the same command trains
with DistributedDataParallel (docs/training-engine.md).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import resource
import time
from pathlib import Path

import torch

from pipeline import cpu_numerics
from pipeline.atomic import atomic_path
from pipeline.params import ParamsError, decided_run, load_params, model_config, resolve_variant, stage_error
from pipeline.tracking import Tracker, git_revision, live_tracking, point_label
from pipeline.training import trainer
from pipeline.training.batching import lm_token_file, load_split, read_manifest
from pipeline.training.checkpoint import LAST_MODEL, config_hash, save_torch, source_hash
from pipeline.training.device import (
    _other_running_processes, choose_threads, grid_share, join_cluster, leave_cluster, peak_flops, resolve_device,
)

# The code a checkpoint is only valid for: the model and the train stage's own modules (its DVC deps).
_HERE = Path(__file__).resolve().parent
TRAINING_CODE = sorted((_HERE.parent / "model").glob("*.py")) + [_HERE / "train.py"] + sorted(
    (_HERE / "training").glob("*.py"))


def build(model_section: dict, manifest: dict, where: str = "model"):
    """The model of one variant; `where` names its params in an error (ablations.<variant>)."""
    from model import build_model

    cfg = model_config(model_section, manifest, where)
    return cfg, build_model(cfg)


def run_name(variant: str, seed: int, point: dict | None = None) -> str:
    """`no_positional-0`, or with a sweep point `no_positional-0 lr=0.01` (MLflow's run name)."""
    return f"{variant}-{seed}" + (f" {point_label(point)}" if point else "")


def csv_text(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def machine_load() -> dict:
    """The machine's load now: /proc/loadavg's 1-minute average and the runnable processes besides
    this one. Recorded at the start and end of training, so a timing taken while other work shared
    the cores can be told from a quiet one (the report marks it). None where /proc is absent."""
    try:
        load = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        load = None
    return {"loadavg_1m": load, "other_running": _other_running_processes() if load is not None else None}


def cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine since boot, CPU seconds of this process and all its
    threads): /proc/stat's user + nice + system + irq + softirq, and getrusage. None without /proc."""
    try:
        user, nice, system, _idle, _iowait, irq, softirq = (
            int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8])
    except (OSError, ValueError):
        return None
    own = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), own.ru_utime + own.ru_stime


def others_cpu_share(start: tuple[float, float] | None, end: tuple[float, float] | None, wall: float) -> float | None:
    """The share of the machine's CPU time that other processes used while this run trained: 0 on a
    quiet machine, 0.5 when another job kept one of two cores busy. A load average cannot tell a
    run's own threads from other work; this can (the report marks a timing above 10% contended)."""
    if start is None or end is None or wall <= 0:
        return None
    others = (end[0] - start[0]) - (end[1] - start[1])
    return round(min(1.0, max(0.0, others / (wall * (os.cpu_count() or 1)))), 4)


def flops_per_target_token(model, cfg, mean_src: float, mean_tgt: float) -> float:
    """Training FLOPs (forward + backward) per target token, the unit of the token budget.

    6 x weights a token passes through (PaLM, App. B) + 12 x d_model x keys attended per layer.
    Encoder weights see the source tokens, decoder weights and the output projection the target
    tokens; a decoder-only model runs source and target through one stack, target_lm the target
    alone (its batches carry sources it never reads). Approximations: the cross-attention key/value
    projections are counted per target token; norms count as weights; embedding tables (tokens,
    learned positions) do not.
    """
    def weights(stack) -> int:  # a learned position table inside a stack is a lookup, not a matmul
        tables = {id(p) for m in stack.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        return sum(p.numel() for p in stack.parameters() if id(p) not in tables)

    if cfg.arch == "target_lm":
        mean_src = 0.0  # the source is never fed
    d, src_per_tgt = cfg.d_model, mean_src / max(mean_tgt, 1.0)
    head = 6 * d * cfg.vocab_size  # logits are computed for target positions only
    if cfg.arch == "encoder_decoder":
        encoder = (6 * weights(model.encoder) + 12 * cfg.n_encoder_layers * d * mean_src) * src_per_tgt
        decoder = 6 * weights(model.decoder) + 12 * cfg.n_decoder_layers * d * (mean_tgt + mean_src)
        return encoder + decoder + head
    length = mean_src + mean_tgt  # one sequence: source then target
    per_token = 6 * weights(model.decoder) + 12 * cfg.n_decoder_layers * d * length
    return per_token * (1 + src_per_tgt) + head


def flops_budget_tokens(budget_flops: float, per_token: float) -> int:
    """The target tokens `budget_flops` buys at `per_token` FLOPs each (train.budget_flops)."""
    return max(1, int(budget_flops // per_token))


def run(shards: Path, variant: str, seed: int, resolved: dict, experiment: str, out: Path, ckpt_dir: Path,
        track: bool = True, point: dict | None = None) -> dict:
    """Train one variant and write its outputs; under torchrun every rank calls this, rank 0 writes.

    `point` names a sweep run's place ({"lr": 0.01} or {"scale": "wide"}); it is recorded in
    train.json and config.json and tags the MLflow run.
    """
    cluster = join_cluster(resolved["train"]["device"])
    try:
        return _run(shards, variant, seed, resolved, experiment, out, ckpt_dir, track, cluster, point or {})
    finally:
        leave_cluster()


def mean_lengths(train_split, tcfg: dict, lm: bool) -> tuple[float, float]:
    """Mean source and target tokens per example as trained (the FLOP count's sequence lengths)."""
    if lm:
        return 0.0, float(tcfg["context"])
    n = max(1, len(train_split.src))  # target side as trained: the tokens plus BOS (input) / EOS (label)
    return sum(map(len, train_split.src)) / n, sum(map(len, train_split.tgt)) / n + 1


def _run(shards: Path, variant: str, seed: int, resolved: dict, experiment: str, out: Path, ckpt_dir: Path,
         track: bool, cluster, point: dict) -> dict:
    # Wall-clock times of this stage (MLflow's runs table shows end - start as the run's Duration)
    # and the load around it; a resumed run's times are those of its last, finishing process.
    started_at, load_start, cpu_start = time.time(), machine_load(), cpu_seconds()
    manifest = read_manifest(shards)
    torch.manual_seed(seed)  # the initial weights are part of what the seed decides
    cfg, model = build(resolved["model"], manifest, f"ablations.{variant}")
    tcfg = dict(resolved["train"])
    threads, why = choose_threads(tcfg["threads"])
    torch.set_num_threads(threads)
    cpu_numerics.engage()  # before the first forward: the CPU's matrix products on the pinned kernel
    if cluster.main:
        print(f"{variant}-{seed}: torch CPU threads {why}", flush=True)
    # Late in training, tiny gradients and Adam moments become denormal floats, which x86 CPUs
    # process many times slower; flushing them to zero changes no result worth a bit of loss.
    torch.set_flush_denormal(True)
    ids = {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}
    if manifest["task"] == "language_modeling":
        # Memory-mapped token files, shared by every run next to the checkpoints (see batching).
        cache = ckpt_dir.parent / ".token-cache"
        train_split = None
        data = trainer.Data(task=manifest["task"], train=None, val=None, ids=ids, batch_tokens=tcfg["batch_tokens"],
                            batch_size=tcfg["batch_size"], context=tcfg["context"], seed=seed,
                            train_stream=lm_token_file(shards, manifest, "train", cache),
                            val_stream=lm_token_file(shards, manifest, "validation", cache),
                            lm_windows=tcfg["lm_windows"])
    else:
        train_split = load_split(shards, manifest, "train")
        data = trainer.Data(task=manifest["task"], train=train_split,
                            val=load_split(shards, manifest, "validation", limit=tcfg["eval_examples"] * 64),
                            ids=ids, batch_tokens=tcfg["batch_tokens"], batch_size=tcfg["batch_size"],
                            context=tcfg["context"], seed=seed)
    mean_src, mean_tgt = mean_lengths(train_split, tcfg, data.lm)
    flops_per_token = flops_per_target_token(model, cfg, mean_src, mean_tgt)
    if tcfg["budget_flops"] is not None:  # FLOP-matched: this variant's cost per token sets its tokens
        tcfg["budget_tokens"] = flops_budget_tokens(tcfg["budget_flops"], flops_per_token)
        if cluster.main:
            print(f"{variant}-{seed}: train.budget_flops {tcfg['budget_flops']:.3g} at {flops_per_token:,.0f} "
                  f"FLOPs per target token = {tcfg['budget_tokens']:,} target tokens", flush=True)
    key = {"resolved": resolved, "seed": seed, "tokenizer": manifest["tokenizer_sha256"], "splits": manifest["splits"],
           "code": source_hash(TRAINING_CODE)}
    if cluster.world > 1:
        key["world_size"] = cluster.world  # the plan per step depends on it; single-process hashes unchanged
    run_hash = config_hash(key)
    if cluster.main:  # a DVC output even when the run is too short to checkpoint
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    # Rank 0 alone mirrors to MLflow, and only when asked to live: by default the report stage
    # mirrors every run from these files at the end, sparing each run MLflow's ~2 s start-up.
    tracker = Tracker(enabled=track and cluster.main and live_tracking())
    if tracker.enabled:  # its tags cost a `git rev-parse`: only when they are sent
        tracker.start(experiment, run_name(variant, seed, point), {
            "variant": variant, "seed": seed, "stage": "train", "git_revision": git_revision() or "unknown",
            "tokenizer_sha256": manifest["tokenizer_sha256"], "data_hash": config_hash(manifest["splits"]),
            **({"point": point_label(point)} if point else {}),
        })
    tracker.log_params({**resolved, "seed": seed, "variant": variant, **point})
    ident = {"variant": variant, "seed": seed, **point}  # heads config.json and train.json
    config = {**ident, **resolved}
    try:
        result = trainer.train(model, data, tcfg, ckpt_dir, run_hash, tracker=tracker, cluster=cluster)
    except trainer.NonFiniteLoss as exc:
        tracker.end("FAILED")
        if "lr" not in point:
            raise
        # In a learning-rate sweep a rate that diverges is a finding, not a broken pipeline: the
        # run's outputs say so (no model), and the report rules the rate out for this variant.
        why = str(exc).splitlines()[0]
        if cluster.main:
            write_diverged(out, config, {**ident, "diverged": why})
            print(f"{run_name(variant, seed, point)}: diverged ({why}); recorded", flush=True)
        return {**ident, "diverged": str(exc)}
    except BaseException:
        tracker.end("FAILED")
        raise
    finished_at, load_end, cpu_end = time.time(), machine_load(), cpu_seconds()
    # train.keep = best: `model` holds the kept weights; the last step's are saved beside them, so
    # evaluate can score both on the whole validation split.
    last_state = result.pop("last_state", None)
    counts = model.param_counts()
    metrics = {
        **ident, "params_total": counts["total"], "params_by_component": counts,
        "threads": threads, "threads_why": why, "grid_share": grid_share(), "cpu_numerics": cpu_numerics.describe(),
        **{k: v for k, v in result.items() if not k.endswith("_rows")}, "mlflow_run_id": tracker.run_id,
        "flops_per_token": flops_per_token, "flops_trained": flops_per_token * result["tokens_trained"],
        "budget_flops": tcfg["budget_flops"],
        "started_at": started_at, "finished_at": finished_at, "load": {"start": load_start, "end": load_end,
                                                                   "others_cpu_share": others_cpu_share(
                                                                       cpu_start, cpu_end, finished_at - started_at)},
    }
    if not cluster.main:
        return metrics
    peak, peak_source = peak_flops(resolve_device(tcfg["device"], cluster))  # one device's peak
    achieved = flops_per_token * result["tokens_per_s"]
    metrics.update(achieved_flops_per_s=achieved, peak_flops_per_s=peak, peak_source=peak_source,
                   mfu=achieved / (peak * cluster.world) if peak else None)
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        save_torch({"model_config": cfg.__dict__.copy(), "state_dict": model.state_dict()}, tmp / "model.pt")
        if last_state is not None:
            save_torch({"model_config": cfg.__dict__.copy(), "state_dict": last_state}, tmp / LAST_MODEL)
        (tmp / "train_curve.csv").write_text(csv_text(["step", "tokens", "train_loss", "lr"], result["train_rows"]))
        (tmp / "val_curve.csv").write_text(csv_text(["step", "tokens", "val_loss"], result["val_rows"]))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "train.json").write_text(json.dumps(metrics, indent=2) + "\n")
    tracker.log_metrics({k: metrics[k] for k in ("tokens_per_s", "mfu", "padding_ratio", "val_estimate_best")
                         if metrics[k] is not None}, result["steps"])
    for name in ("config.json", "train_curve.csv", "val_curve.csv", "train.json"):
        tracker.log_artifact(out / name)
    tracker.end()
    return metrics


def write_diverged(out: Path, config: dict, metrics: dict) -> None:
    """A diverged sweep run's outputs: its config and a train.json that says why, no model."""
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "train.json").write_text(json.dumps(metrics, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--shards", required=True)
    parser.add_argument("--variant")
    parser.add_argument("--seed", type=int)
    # train_more (seeds until decided): a key of decide.runs, which names the variant and the seed.
    parser.add_argument("--decided", help="a run of decide.runs instead of --variant and --seed")
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--lr", type=float, help="a point of lr_sweep: train at this learning rate")
    parser.add_argument("--scale", help="a key of scales: the baseline at that size, then the variant's diff")
    args = parser.parse_args(argv)
    point = {k: v for k, v in (("lr", args.lr), ("scale", args.scale)) if v is not None}
    if (args.decided is None) == (args.variant is None or args.seed is None):
        parser.error("give --variant and --seed, or --decided")
    try:
        params = load_params(args.params)
        if args.decided is not None:
            args.variant, args.seed = decided_run(params, args.decided)
        resolved = resolve_variant(params, args.variant, args.scale, args.lr)
        metrics = run(Path(args.shards), args.variant, args.seed, resolved, params.report.experiment,
                      Path(args.out), Path(args.checkpoints), point=point)
    except (ParamsError, ValueError, OSError, trainer.NonFiniteLoss) as exc:
        raise stage_error("train", exc) from None
    if int(os.environ.get("RANK", "0")) == 0 and "diverged" not in metrics:  # torchrun: one line, not one per rank
        kept = (f"; kept step {metrics['kept_step']} (best in-loop estimate {metrics['val_estimate_best']:.4f})"
                if metrics["keep"] == "best" else "")
        print(f"{run_name(args.variant, args.seed, point)}: val_loss {metrics['val_loss']:.4f}, "
              f"{metrics['tokens_trained']} target tokens in {metrics['wall_time_s']:.1f} s{kept}")


if __name__ == "__main__":
    from pipeline.grid.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/grid/exit.py)
