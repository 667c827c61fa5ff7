"""The report stage's MLflow mirror: each training run as a top-level run, plus one `report` run.

The training runs are not children of the report run: with its default sort, MLflow's runs table
(3.x, as 2.x) folds children under their parent, collapsed, so the page showed one `report` row
and hid every variant x seed. So each training run is a top-level row (run name `<variant>-<seed>`,
tags `variant` and `seed` for "Group by"), tagged `report_run` with the newest report run that
showed it; the report run holds the report files as artifacts. The folding is used for history
instead: an earlier version of a run (or of the report) becomes a child of the current one.

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
  A live run that is not in this stage's store (trained on another machine into another store)
  is mirrored from its files instead.
A mirrored run carries the train stage's own start and end times (train.json), so the runs table's
Duration is the training time, and every run names its data (`log_inputs`: the Dataset column):
the data source from params.yaml and the DVC hash of the shards it trained on (RunData).
Every MLflow failure is a warning: the report is already on disk.
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.reporting.mlflow_view import VIEW_QUERY, save_comparison_view
from pipeline.tracking import (dvc_experiment, experiment_id, flatten, open_client, problem, store_lock,
                               tracking_enabled, tracking_uri)

log = logging.getLogger("pipeline.report")
DIGEST_TAG = "ablation_lab.digest"
REPORT_TAG = "report_run"  # on a training run: the newest report run that included it
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI folds a run under this parent
POINT_TAG = "point"  # on a sweep run: "lr=0.01" or "scale=wide" (pipeline.tracking.point_label)
RUN_FILES = ("config.json", "train_curve.csv", "val_curve.csv", "train.json")
EVAL_FILES = ("eval.json", "samples.json")
CURVES = {"train_curve.csv": ("train_loss", "lr", "tokens"), "val_curve.csv": ("val_loss",)}  # logged per step


@dataclass(frozen=True)
class RunData:
    """The data every run of a report trained on, as MLflow's Dataset column shows it: `name (digest)`."""

    name: str  # params.yaml data.source, e.g. tiny_shakespeare
    digest: str  # the DVC hash of the shards (dvc.lock), else a hash of their manifest
    source: str  # JSON: data.source and its options from params.yaml

    def entity(self, context: str = "train"):
        """MLflow's record of the data; `context` says what the run did with it (train, evaluation)."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        return DatasetInput(Dataset(self.name, self.digest, "ablation_lab", self.source),
                            [InputTag("mlflow.data.context", context)])


def import_ahead() -> None:
    """MLflow's client (and its database store, for a database URI) imported before the mirror
    needs them: ~2-3 s that the report overlaps with drawing its figures. Nothing where tracking
    is off; a failure here is left for the mirror to report."""
    if not tracking_enabled():
        return
    import contextlib

    with contextlib.suppress(Exception):
        import mlflow.tracking  # noqa: F401
        if tracking_uri().split(":", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "mysql", "mssql"):
            import mlflow.store.tracking.sqlalchemy_store  # noqa: F401


def run_data(data: Mapping, shards: Path, lock: Path) -> RunData:
    """The RunData of params.yaml's `data` section (the keys it states): digest = the md5 dvc.lock
    records for `shards` (a DVC output, so the same data gives the same hash on every machine), or
    where no dvc.lock lists it (a stage run by hand) sha256 of the shards' manifest, which names
    every shard's hash."""
    name = str(data.get("source") or "synthetic")
    digest = _lock_hash(lock, shards)
    if digest is None:
        manifest = shards / "manifest.json"
        digest = hashlib.sha256(manifest.read_bytes()).hexdigest()[:32] if manifest.is_file() else "unknown"
    source = json.dumps({"data.source": name, name: data.get(name)}, sort_keys=True, default=str)
    return RunData(name, digest, source[:MAX_SOURCE_CHARS])


MAX_SOURCE_CHARS = 60_000  # under MLflow's limit on a dataset's source (65,535)


def _lock_hash(lock: Path, path: Path) -> str | None:
    """The md5 dvc.lock records for the output `path` (".dir" dropped: MLflow digests are <= 36 chars)."""
    import yaml

    try:
        # libyaml's parser where PyYAML has it: a study's dvc.lock took ~1 s in the pure-Python one
        stages = (yaml.load(lock.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
                  or {}).get("stages") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    want = Path(path).as_posix().rstrip("/")
    for stage in stages.values():
        for out in (stage or {}).get("outs") or []:
            if isinstance(out, dict) and out.get("path") == want and out.get("md5"):
                return str(out["md5"]).removesuffix(".dir")
    return None


@dataclass(frozen=True)
class RunFiles:
    variant: str
    seed: int
    run_dir: Path
    eval_dir: Path
    live_run_id: str | None = None  # set when the train stage mirrored live
    point: str = ""  # a sweep run's place, "lr=0.01" or "scale=wide"; "" for the main runs
    round: int | None = None  # seeds until decided: the look that added the run (1: every variant's seeds)

    def tags(self) -> dict[str, str]:
        """What `mlflow ui` groups and filters its runs by."""
        return {"variant": self.variant, "seed": str(self.seed), **({POINT_TAG: self.point} if self.point else {}),
                **({"round": str(self.round)} if self.round is not None else {})}

    @property
    def name(self) -> str:
        return f"{self.variant}-{self.seed}" + (f" {self.point}" if self.point else "")

    def eval_step(self) -> int:
        """One past the last training step: where the evaluation's value of a curve's metric (val_loss)
        is logged, so that it is the metric's latest value, the one `mlflow ui`'s column shows (as the
        report does), and the curve ends with it instead of starting with a point at step 0."""
        steps = json.loads((self.run_dir / "train.json").read_text()).get("steps")
        return steps + 1 if isinstance(steps, int) else 0

    def digest(self, data: RunData | None = None) -> str:
        """Identifies what a mirror of this run shows: its files, its data, how it is mirrored."""
        h = hashlib.sha256(f"mirror v2 {data}".encode())
        for path in [self.run_dir / n for n in RUN_FILES] + [self.eval_dir / n for n in EVAL_FILES]:
            h.update(path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"-") + b"\0")
        return h.hexdigest()


def mirror_runs(runs: list[RunFiles], report_dir: Path, experiment: str, data: RunData | None = None,
                columns: tuple[str, ...] = ("val_loss",)) -> str | None:
    """Each of `runs` mirrored (or reused), then a report run holding `report_dir` as artifacts, and
    the experiment's saved view "Compare variants" (`columns` as metric columns, grouped by variant).

    Returns the report run id, or None when MLflow failed (a warning, never an error). Two report
    stages (queued experiments) take turns, so neither loses its runs to a locked sqlite store.
    """
    if not tracking_enabled():
        return None
    with store_lock():
        return _mirror(runs, report_dir, experiment, data, columns)


def _mirror(runs: list[RunFiles], report_dir: Path, experiment: str, data: RunData | None,
            columns: tuple[str, ...]) -> str | None:
    try:
        client = open_client()
        exp_id = experiment_id(client, experiment)
        known = client.search_runs([exp_id], max_results=50_000)  # training runs and earlier reports
        mirrored = {r.data.tags[DIGEST_TAG]: r.info.run_id for r in known if DIGEST_TAG in r.data.tags}
    except Exception as exc:  # noqa: BLE001 - MLflow only mirrors; the report is already on disk
        log.warning("report: MLflow linking skipped (%s)", problem(exc))
        return None
    current = {}  # (variant, seed, point) -> the run this report shows for it
    for run in runs:
        run_id = run.live_run_id
        try:
            if run_id is not None and not run_exists(client, run_id):
                # Mirrored live into another store: on another machine, its own mlflow.db before
                # MLFLOW_TRACKING_URI named the shared server. This store gets it from the files.
                log.warning("report: MLflow run %s of %s is not in %s; mirrored from its files", run_id,
                            run.name, tracking_uri())
                run_id = None
            created = False
            if run_id is None:
                digest = run.digest(data)
                if (run_id := mirrored.get(digest)) is None:
                    run_id, created = create_run(client, exp_id, run, digest, data), True
            else:
                if (run.eval_dir / "eval.json").is_file():
                    log_evaluation(client, run_id, run.eval_dir, run.eval_step())
                if data is not None:  # logging the same dataset again adds nothing
                    client.log_inputs(run_id, [data.entity()])
            if not created:  # a run made here has them from its start
                from mlflow.entities import RunTag

                client.log_batch(run_id, tags=[RunTag(k, v) for k, v in run.tags().items()])
            current[(run.variant, str(run.seed), run.point)] = run_id
        except Exception as exc:  # noqa: BLE001 - e.g. a live run deleted or kept in another store
            log.warning("report: cannot link MLflow run %s of %s (%s)", run_id, run.name, type(exc).__name__)
    try:
        # Created last, so it is the newest run: the runs table's top row, the runs it reports below.
        report_id = client.create_run(exp_id, run_name="report", tags={
            "stage": "report", "linked_runs": str(len(current)), **dvc_experiment()}).info.run_id
        client.log_artifacts(report_id, str(report_dir))
        for run_id in current.values():
            client.set_tag(run_id, REPORT_TAG, report_id)
        nest_history(client, known, {**current, "report": report_id})
        client.set_terminated(report_id)
        save_comparison_view(client, exp_id, columns)
        log.info("report: MLflow experiment %r: the report run and %d training runs; the comparison view: "
                 "`mlflow ui`, then #/experiments/%s/runs?%s", experiment, len(current),
                 exp_id, VIEW_QUERY)
    except Exception as exc:  # noqa: BLE001
        log.warning("report: MLflow report run not completed (%s)", problem(exc))
        return None
    return report_id


def run_exists(client, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def nest_history(client, known: list, heads: dict) -> None:
    """Each earlier version becomes a child of the current one, which is made top level.

    `heads` maps (variant, seed, point) to the run this report shows, and "report" to its report run. An
    earlier mirror of a variant x seed (its files changed since) goes under that run, an earlier
    report under this report's run: `mlflow ui`'s default table, which folds children under their
    parent, then lists one row per variant x seed and one report, with the history behind each
    row's expander (grouping ignores the folding: search `tags.mlflow.parentRunId IS NULL` to group
    the current runs alone). Nothing is deleted.
    """
    for r in known:
        tags = r.data.tags
        head = heads.get("report" if tags.get("stage") == "report"
                         else (tags.get("variant"), tags.get("seed"), tags.get(POINT_TAG, "")))
        if head == r.info.run_id:
            if PARENT_TAG in tags:  # e.g. a child of an earlier report, as earlier versions linked runs
                client.delete_tag(head, PARENT_TAG)
        elif head is not None and tags.get(PARENT_TAG) != head:
            client.set_tag(r.info.run_id, PARENT_TAG, head)


def stage_times(path: Path, record: dict, wall_key: str = "wall_time_s") -> tuple[int, int]:
    """(start, end) of the stage that wrote `path` (train.json, knockout.json), in ms since the epoch:
    the file's started_at and finished_at; for a file written before they were recorded, its
    modification time and its wall time (`wall_key`)."""
    def number(key: str) -> float | None:
        value = record.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    end = number("finished_at") or path.stat().st_mtime
    start = number("started_at") or end - (number(wall_key) or 0.0)
    return int(start * 1000), int(end * 1000)


def create_run(client, exp_id: str, run: RunFiles, digest: str, data: RunData | None = None) -> str:
    """One finished MLflow run from a training run's files: what the live train stage would log."""
    from mlflow.entities import Metric, Param

    train_json = run.run_dir / "train.json"
    train = json.loads(train_json.read_text())
    stamp = int(train_json.stat().st_mtime * 1000)  # the curves carry steps, not times
    start, end = stage_times(train_json, train)
    run_id = client.create_run(exp_id, start_time=start, run_name=run.name, tags={
        **run.tags(), "stage": "train", DIGEST_TAG: digest,
        "mirrored": "from the stage's files, by the report stage", **dvc_experiment()}).info.run_id
    config = json.loads((run.run_dir / "config.json").read_text())
    params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
    metrics = [Metric(key, float(row[key]), stamp, int(row["step"]))
               for name, keys in CURVES.items()
               for row in _rows(run.run_dir / name) for key in keys]
    metrics += [Metric(k, float(train[k]), stamp, int(train.get("steps") or 0))
                for k in ("tokens_per_s", "mfu", "padding_ratio", "kept_step", "val_estimate_best")
                if isinstance(train.get(k), (int, float))]
    for some_params, some_metrics in batches(params, metrics):
        client.log_batch(run_id, metrics=some_metrics, params=some_params)
    for name in RUN_FILES:
        if (run.run_dir / name).is_file():
            client.log_artifact(run_id, str(run.run_dir / name))
    if (run.eval_dir / "eval.json").is_file():
        log_evaluation(client, run_id, run.eval_dir, run.eval_step())
    if data is not None:
        client.log_inputs(run_id, [data.entity()])
    client.set_terminated(run_id, "FINISHED", end_time=end)
    return run_id


def batches(params: list, metrics: list) -> Iterator[tuple[list, list]]:
    """`params` and `metrics` in as few `log_batch` requests as MLflow takes (at most 100 params
    and 1,000 values in all per request): each request is a database transaction."""
    while params or metrics:
        some_params, params = params[:100], params[100:]
        room = 1000 - len(some_params)
        yield some_params, metrics[:room]
        metrics = metrics[room:]


def log_evaluation(client, run_id: str, eval_dir: Path, step: int) -> None:
    """The evaluate stage's numbers and files, added to the training run.

    A metric that is also a curve is logged at `step` (RunFiles.eval_step); the others at step 0,
    which `mlflow ui` draws as bars.

    Timestamped with eval.json's modification time, so linking the same evaluation again adds
    nothing (MLflow drops a metric identical in key, value, step and timestamp).
    """
    from mlflow.entities import Metric, RunTag

    path = eval_dir / "eval.json"
    metrics = json.loads(path.read_text())
    stamp = int(path.stat().st_mtime * 1000)
    values = {k: v for k, v in metrics.items() if isinstance(v, float)}
    values |= {f"outputs_{k}": v for k, v in (metrics.get("outputs") or {}).items() if isinstance(v, (int, float))}
    curves = {k for keys in CURVES.values() for k in keys}
    client.log_batch(run_id, metrics=[Metric(k, float(v), stamp, step if k in curves else 0)
                                      for k, v in sorted(values.items())], tags=[RunTag("evaluated", "true")])
    for name in EVAL_FILES:
        if (eval_dir / name).is_file():
            client.log_artifact(run_id, str(eval_dir / name))


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
