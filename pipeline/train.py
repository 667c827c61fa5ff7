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
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline import cpu_numerics
from pipeline.io.atomic import atomic_path
from pipeline.params import ParamsError, decided_run, load_params, model_config, resolve_variant, stage_error
from pipeline.tracking import Tracker, git_revision, live_tracking, point_label
from pipeline.training import trainer
from pipeline.training.batching import lm_token_file, load_split, read_manifest
from pipeline.training.checkpoint import LAST_MODEL, config_hash, save_torch, source_hash
from pipeline.training.device import (
    _other_running_processes, grid_share, join_cluster, leave_cluster, peak_flops, resolve_device, set_up_cpu,
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


@dataclass(frozen=True)
class Job:
    """One run of the stage: what `run` was given, travelling together through its steps."""
    shards: Path
    variant: str
    seed: int
    resolved: dict  # the variant's model and train sections (params.resolve_variant)
    experiment: str  # MLflow's
    out: Path
    ckpt_dir: Path
    track: bool  # mirror to MLflow while training, if live tracking is on
    point: dict  # a sweep run's place ({"lr": 0.01}, {"scale": "wide"}): in its JSONs and MLflow tags

    @property
    def ident(self) -> dict:  # heads config.json and train.json
        return {"variant": self.variant, "seed": self.seed, **self.point}


def run(shards: Path, variant: str, seed: int, resolved: dict, experiment: str, out: Path, ckpt_dir: Path,
        track: bool = True, point: dict | None = None) -> dict:
    """Train one variant and write its outputs; under torchrun every rank calls this, rank 0 writes."""
    cluster = join_cluster(resolved["train"]["device"])
    try:
        return _run(Job(shards, variant, seed, resolved, experiment, out, ckpt_dir, track, point or {}), cluster)
    finally:
        leave_cluster()


def mean_lengths(train_split, tcfg: dict, lm: bool) -> tuple[float, float]:
    """Mean source and target tokens per example as trained (the FLOP count's sequence lengths)."""
    if lm:
        return 0.0, float(tcfg["context"])
    n = max(1, len(train_split.src))  # target side as trained: the tokens plus BOS (input) / EOS (label)
    return sum(map(len, train_split.src)) / n, sum(map(len, train_split.tgt)) / n + 1


def _run(job: Job, cluster) -> dict:
    # Wall-clock times of this stage (MLflow's runs table shows end - start as the run's Duration)
    # and the load around it; a resumed run's times are those of its last, finishing process.
    start = time.time(), machine_load(), cpu_seconds()
    manifest = read_manifest(job.shards)
    torch.manual_seed(job.seed)  # the initial weights are part of what the seed decides
    cfg, model = build(job.resolved["model"], manifest, f"ablations.{job.variant}")
    tcfg = dict(job.resolved["train"])
    threads = _set_up_cpu(job, tcfg["threads"], cluster)
    data = load_data(job, manifest, tcfg)
    flops_per_token = flops_per_target_token(model, cfg, *mean_lengths(data.train, tcfg, data.lm))
    if tcfg["budget_flops"] is not None:  # FLOP-matched: this variant's cost per token sets its tokens
        tcfg["budget_tokens"] = flops_budget_tokens(tcfg["budget_flops"], flops_per_token)
        if cluster.main:
            print(f"{job.variant}-{job.seed}: train.budget_flops {tcfg['budget_flops']:.3g} at {flops_per_token:,.0f} "
                  f"FLOPs per target token = {tcfg['budget_tokens']:,} target tokens", flush=True)
    run_hash = _run_hash(job, manifest, cluster)
    if cluster.main:  # a DVC output even when the run is too short to checkpoint
        job.ckpt_dir.mkdir(parents=True, exist_ok=True)
    tracker = _start_tracker(job, manifest, cluster)
    try:
        result = trainer.train(model, data, tcfg, job.ckpt_dir, run_hash, tracker=tracker, cluster=cluster)
    except trainer.NonFiniteLoss as exc:
        tracker.end("FAILED")
        if "lr" not in job.point:
            raise
        return _diverged(job, exc, cluster)
    except BaseException:
        tracker.end("FAILED")
        raise
    end = time.time(), machine_load(), cpu_seconds()
    # train.keep = best: `model` holds the kept weights; the last step's are saved beside them, so
    # evaluate can score both on the whole validation split.
    last_state = result.pop("last_state", None)
    counts = model.param_counts()
    metrics = {
        **job.ident, "params_total": counts["total"], "params_by_component": counts, "threads": threads[0],
        "threads_why": threads[1], "grid_share": grid_share(), "cpu_numerics": cpu_numerics.describe(),
        **{k: v for k, v in result.items() if not k.endswith("_rows")}, "mlflow_run_id": tracker.run_id,
        "flops_per_token": flops_per_token, "flops_trained": flops_per_token * result["tokens_trained"],
        "budget_flops": tcfg["budget_flops"], "started_at": start[0], "finished_at": end[0],
        "load": {"start": start[1], "end": end[1],
                 "others_cpu_share": others_cpu_share(start[2], end[2], end[0] - start[0])},
    }
    if not cluster.main:
        return metrics
    peak, peak_source = peak_flops(resolve_device(tcfg["device"], cluster))  # one device's peak
    achieved = flops_per_token * result["tokens_per_s"]
    metrics.update(achieved_flops_per_s=achieved, peak_flops_per_s=peak, peak_source=peak_source,
                   mfu=achieved / (peak * cluster.world) if peak else None)
    saved = {"model_config": cfg.__dict__.copy()}
    write_outputs(job, metrics, {
        "model.pt": {**saved, "state_dict": model.state_dict()},
        **({LAST_MODEL: {**saved, "state_dict": last_state}} if last_state is not None else {}),
        "train_curve.csv": csv_text(["step", "tokens", "train_loss", "lr"], result["train_rows"]),
        "val_curve.csv": csv_text(["step", "tokens", "val_loss"], result["val_rows"])})
    tracker.log_metrics({k: metrics[k] for k in ("tokens_per_s", "mfu", "padding_ratio", "val_estimate_best")
                         if metrics[k] is not None}, result["steps"])
    for name in ("config.json", "train_curve.csv", "val_curve.csv", "train.json"):
        tracker.log_artifact(job.out / name)
    tracker.end()
    return metrics


def _diverged(job: Job, exc: Exception, cluster) -> dict:
    """In a learning-rate sweep a rate that diverges is a finding, not a broken pipeline: the run's
    outputs say so (no model), and the report rules the rate out for this variant."""
    why = str(exc).splitlines()[0]
    if cluster.main:
        write_outputs(job, {**job.ident, "diverged": why})
        print(f"{run_name(job.variant, job.seed, job.point)}: diverged ({why}); recorded", flush=True)
    return {**job.ident, "diverged": str(exc)}


def _set_up_cpu(job: Job, threads: int, cluster) -> tuple[int, str]:
    """Set torch's CPU threads (train.threads) and kernels before the first forward; (threads, why)."""
    threads, why = set_up_cpu(threads)
    if cluster.main:
        print(f"{job.variant}-{job.seed}: torch CPU threads {why}", flush=True)
        if unpinned := cpu_numerics.unpinned_why():
            print(f"{job.variant}-{job.seed}: CPU products NOT pinned: {unpinned}", flush=True)
    return threads, why


def load_data(job: Job, manifest: dict, tcfg: dict) -> trainer.Data:
    """The run's training and validation data: memory-mapped token files for a language model
    (shared by every run next to the checkpoints, see batching), else the splits' examples."""
    lm = manifest["task"] == "language_modeling"
    cache = job.ckpt_dir.parent / ".token-cache"
    return trainer.Data(
        task=manifest["task"], ids={k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")},
        train=None if lm else load_split(job.shards, manifest, "train"),
        val=None if lm else load_split(job.shards, manifest, "validation", limit=tcfg["eval_examples"] * 64),
        batch_tokens=tcfg["batch_tokens"], batch_size=tcfg["batch_size"], context=tcfg["context"], seed=job.seed,
        train_stream=lm_token_file(job.shards, manifest, "train", cache) if lm else None,
        val_stream=lm_token_file(job.shards, manifest, "validation", cache) if lm else None,
        lm_windows=tcfg["lm_windows"])


def _run_hash(job: Job, manifest: dict, cluster) -> str:
    """The hash a checkpoint must carry to be resumed: these settings, data and training code."""
    key = {"resolved": job.resolved, "seed": job.seed, "tokenizer": manifest["tokenizer_sha256"],
           "splits": manifest["splits"], "code": source_hash(TRAINING_CODE)}
    if cluster.world > 1:
        key["world_size"] = cluster.world  # the plan per step depends on it; single-process hashes unchanged
    return config_hash(key)


def _start_tracker(job: Job, manifest: dict, cluster) -> Tracker:
    """Rank 0 alone mirrors to MLflow, and only when asked to live: by default the report stage
    mirrors every run from these files at the end, sparing each run MLflow's ~2 s start-up."""
    tracker = Tracker(enabled=job.track and cluster.main and live_tracking())
    if tracker.enabled:  # its tags cost a `git rev-parse`: only when they are sent
        tracker.start(job.experiment, run_name(job.variant, job.seed, job.point), {
            "variant": job.variant, "seed": job.seed, "stage": "train", "git_revision": git_revision() or "unknown",
            "tokenizer_sha256": manifest["tokenizer_sha256"], "data_hash": config_hash(manifest["splits"]),
            **({"point": point_label(job.point)} if job.point else {}),
        })
    tracker.log_params({**job.resolved, "seed": job.seed, "variant": job.variant, **job.point})
    return tracker


def write_outputs(job: Job, metrics: dict, files: dict | None = None) -> None:
    """The run's outputs as a whole: `files` (name: CSV text or a torch object), config.json and train.json."""
    with atomic_path(job.out) as tmp:
        tmp.mkdir(parents=True)
        for name, content in (files or {}).items():
            if isinstance(content, str):
                (tmp / name).write_text(content)
            else:
                save_torch(content, tmp / name)
        (tmp / "config.json").write_text(json.dumps({**job.ident, **job.resolved}, indent=2) + "\n")
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
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
