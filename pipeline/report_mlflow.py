"""The report stage's MLflow mirror: one parent run per report, each training run as its child.

Training runs reach MLflow in one of two ways:
- after the fact (the default): this stage creates each run from the files the train and evaluate
  stages wrote: params from config.json, the per-step curves, the scalars of train.json and
  eval.json, and the files themselves. One process for every run pays MLflow's ~2 s of import
  and store opening once, where each train and evaluate stage paid it before (a third of the
  default study's wall time was such start-up), and a killed run never leaves a RUNNING run.
  A run already mirrored from identical files (tag `ablation_lab.digest`) is reused, so a rerun
  of the report adds no copies.
- live (`ABLATION_LAB_MLFLOW_LIVE=1`): the train stage mirrors as it trains, to watch long runs
  in `mlflow ui`; its run id is in train.json, and this stage adds the evaluation and the link.
Every MLflow failure is a warning: the report is already on disk.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.tracking import flatten, tracking_enabled, tracking_uri

log = logging.getLogger("pipeline.report")
DIGEST_TAG = "ablation_lab.digest"
RUN_FILES = ("config.json", "train_curve.csv", "val_curve.csv", "train.json")
EVAL_FILES = ("eval.json", "samples.json")


@dataclass(frozen=True)
class RunFiles:
    variant: str
    seed: int
    run_dir: Path
    eval_dir: Path
    live_run_id: str | None = None  # set when the train stage mirrored live

    @property
    def name(self) -> str:
        return f"{self.variant}-{self.seed}"

    def digest(self) -> str:
        h = hashlib.sha256()
        for path in [self.run_dir / n for n in RUN_FILES] + [self.eval_dir / n for n in EVAL_FILES]:
            h.update(path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
        return h.hexdigest()


def mirror_runs(runs: list[RunFiles], report_dir: Path, experiment: str) -> str | None:
    """A parent run holding `report_dir` as artifacts, each of `runs` mirrored and made its child.

    Returns the parent run id, or None when MLflow failed (a warning, never an error).
    """
    if not tracking_enabled():
        return None
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=tracking_uri())
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
        # MLflow 3 opens an untagged experiment in its GenAI view; this is model training.
        client.set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")
        mirrored = {r.data.tags[DIGEST_TAG]: r.info.run_id
                    for r in client.search_runs([exp_id], filter_string="tags.stage = 'train'", max_results=50_000)
                    if DIGEST_TAG in r.data.tags}
        parent_id = client.create_run(exp_id, run_name="report", tags={"stage": "report"}).info.run_id
        client.log_artifacts(parent_id, str(report_dir))
    except Exception as exc:  # noqa: BLE001 - MLflow only mirrors; the report is already on disk
        log.warning("report: MLflow linking skipped (%s: %s)", type(exc).__name__, str(exc).splitlines()[0][:200])
        return None
    linked = 0
    for run in runs:
        run_id = run.live_run_id
        try:
            if run_id is None:
                digest = run.digest()
                run_id = mirrored.get(digest) or create_run(client, exp_id, run, digest)
            elif (run.eval_dir / "eval.json").is_file():
                log_evaluation(client, run_id, run.eval_dir)
            client.set_tag(run_id, "mlflow.parentRunId", parent_id)
            client.set_tag(run_id, "variant", run.variant)
            client.set_tag(run_id, "seed", str(run.seed))
            linked += 1
        except Exception as exc:  # noqa: BLE001 - e.g. a live run deleted or kept in another store
            log.warning("report: cannot link MLflow run %s of %s (%s)", run_id, run.name, type(exc).__name__)
    try:
        client.set_tag(parent_id, "linked_runs", str(linked))
        client.set_terminated(parent_id)
    except Exception as exc:  # noqa: BLE001
        log.warning("report: cannot close MLflow run %s (%s)", parent_id, type(exc).__name__)
    return parent_id


def create_run(client, exp_id: str, run: RunFiles, digest: str) -> str:
    """One finished MLflow run from a training run's files: what the live train stage would log."""
    from mlflow.entities import Metric, Param

    train_json = run.run_dir / "train.json"
    train = json.loads(train_json.read_text())
    stamp = int(train_json.stat().st_mtime * 1000)  # the curves carry steps, not times
    run_id = client.create_run(exp_id, run_name=run.name, tags={
        "variant": run.variant, "seed": str(run.seed), "stage": "train", DIGEST_TAG: digest,
        "mirrored": "from the stage's files, by the report stage"}).info.run_id
    config = json.loads((run.run_dir / "config.json").read_text())
    params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
    for i in range(0, len(params), 100):
        client.log_batch(run_id, params=params[i:i + 100])
    metrics = [Metric(key, float(row[key]), stamp, int(row["step"]))
               for name, keys in (("train_curve.csv", ("train_loss", "lr", "tokens")), ("val_curve.csv", ("val_loss",)))
               for row in _rows(run.run_dir / name) for key in keys]
    metrics += [Metric(k, float(train[k]), stamp, int(train.get("steps") or 0))
                for k in ("tokens_per_s", "mfu", "padding_ratio") if isinstance(train.get(k), (int, float))]
    for i in range(0, len(metrics), 500):
        client.log_batch(run_id, metrics=metrics[i:i + 500])
    for name in RUN_FILES:
        if (run.run_dir / name).is_file():
            client.log_artifact(run_id, str(run.run_dir / name))
    if (run.eval_dir / "eval.json").is_file():
        log_evaluation(client, run_id, run.eval_dir)
    client.set_terminated(run_id, "FINISHED")
    return run_id


def log_evaluation(client, run_id: str, eval_dir: Path) -> None:
    """The evaluate stage's numbers (step 0) and files, added to the training run.

    Timestamped with eval.json's modification time, so linking the same evaluation again adds
    nothing (MLflow drops a metric identical in key, value, step and timestamp).
    """
    from mlflow.entities import Metric

    path = eval_dir / "eval.json"
    metrics = json.loads(path.read_text())
    stamp = int(path.stat().st_mtime * 1000)
    values = {k: v for k, v in metrics.items() if isinstance(v, float)}
    values |= {f"outputs_{k}": v for k, v in (metrics.get("outputs") or {}).items() if isinstance(v, (int, float))}
    client.log_batch(run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in sorted(values.items())])
    client.set_tag(run_id, "evaluated", "true")
    for name in EVAL_FILES:
        if (eval_dir / name).is_file():
            client.log_artifact(run_id, str(eval_dir / name))


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
