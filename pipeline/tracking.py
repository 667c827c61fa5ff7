"""MLflow mirroring that never blocks a stage.

DVC's files (metrics JSON, curve CSVs) are the source of truth; MLflow mirrors them for browsing.
So every MLflow call here is wrapped: the first failure (server unreachable, sqlite locked, ...)
prints one warning and turns tracking off for the rest of the run, and the stage carries on.
Metrics are buffered and sent in batches (`log_batch`), not one request per step.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STORE = "mlflow.db"  # MLflow's own default store name, so a bare `mlflow ui` in the repository finds it
# An unreachable or stalled tracking server must cost seconds, not minutes of retries: at most
# (retries + 1) x timeout, once per stage, after which tracking is off for the run. (MLflow's
# defaults are 7 retries with exponential backoff and a 120 s timeout.) A locked sqlite store
# waits MLflow's fixed 20 s busy timeout, once, which lets concurrent writers take turns.
HTTP_RETRIES, HTTP_TIMEOUT_S = 1, 4
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))


def problem(exc: Exception) -> str:
    """One line saying why an MLflow call failed, in words a user acts on."""
    text = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"
    if "readonly database" in text or "Read-only file system" in text:
        text += f"; the store {tracking_uri()} is read-only (point MLFLOW_TRACKING_URI elsewhere, or set " \
                "ABLATION_LAB_TRACKING=0)"
    return text


def open_client():
    """An MlflowClient on the tracking store. MLflow's sqlite store logs each database error as a
    traceback of some 90 lines at ERROR level before raising it; the caller prints one line instead."""
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    return MlflowClient(tracking_uri=tracking_uri())


def tracking_root() -> Path:
    """The repository that holds mlflow.db and mlruns/. DVC sets DVC_ROOT to it for every stage,
    also in a queued experiment's temporary workspace (.dvc/tmp/exps/...), which is deleted after
    the run: a store resolved against the working directory would be deleted with it."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{tracking_root() / STORE}"


def experiment_id(client, name: str) -> str:
    """The id of experiment `name`, created if missing (artifacts beside the repository's store)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        exp_id = exp.experiment_id
    else:
        # MLflow would put artifacts under the working directory, a queue workspace's temporary one.
        location = None if os.environ.get("MLFLOW_TRACKING_URI") else (tracking_root() / "mlruns" / name).as_uri()
        exp_id = client.create_experiment(name, artifact_location=location)
    # Marks the experiment as model training for MLflow 3 UIs that read this tag (3.17's UI goes by
    # its sidebar switch instead, "GenAI" until the user picks "Model training").
    client.set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")
    return exp_id


def dvc_experiment() -> dict[str, str]:
    """The tag naming the DVC experiment a run belongs to (`dvc exp run` sets DVC_EXP_NAME)."""
    name = os.environ.get("DVC_EXP_NAME")
    return {"dvc.experiment": name} if name else {}


@contextlib.contextmanager
def store_lock(wait_s: float = 300.0) -> Iterator[None]:
    """Writers to the repository's sqlite store take turns: two queue workers mirroring at once
    otherwise lose runs to "database is locked". Other stores (a server) need no lock."""
    uri = tracking_uri()
    if not uri.startswith("sqlite:///"):
        yield
        return
    path = Path(uri.removeprefix("sqlite:///") + ".lock")
    try:
        handle = open(path, "a")  # noqa: SIM115 - held for the whole block
    except OSError:  # a read-only repository: MLflow itself will say so
        yield
        return
    with handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:  # a stuck writer: go on and let MLflow's own wait decide
                    break
                time.sleep(0.2)
        yield


def store_to_make() -> Path | None:
    """The sqlite file the report stage's mirror would create, where there is none yet; None where
    tracking is off or live (the train stages open the store as they start) or the store is a server."""
    uri = tracking_uri()
    if not tracking_enabled() or live_tracking() or not uri.startswith("sqlite:///"):
        return None
    path = Path(uri.removeprefix("sqlite:///"))
    return None if path.exists() else path


def make_store(path: Path) -> bool:
    """MLflow's tables made in a new sqlite file beside `path`, then linked to `path` unless a store
    got there first: a new store runs MLflow's table migrations (1-2 s), which the grid launcher
    (`python -m pipeline.tracking --make-store`) lets run beside the first stages instead of in the
    report stage at the study's end. Built aside and linked whole, so that a kill midway leaves no
    half-made store and a stage that opens the store meanwhile makes its own. False if it failed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
        os.link(tmp, path)  # never over a store that is there
        return True
    except Exception:  # noqa: BLE001 - the report stage makes the store then, as without this
        return False
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"d_model": 64}} -> {"model.d_model": 64}."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def point_label(point: dict | None) -> str:
    """A sweep run's place as one word per axis, `lr=0.01` or `scale=wide`; "" for a main run."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in (point or {}).items())


def live_tracking() -> bool:
    """ABLATION_LAB_MLFLOW_LIVE=1: the train stage mirrors to MLflow as it trains (watch long runs in
    `mlflow ui`). Otherwise the report stage mirrors every run from its files, once, at the end."""
    return os.environ.get("ABLATION_LAB_MLFLOW_LIVE", "0").lower() in ("1", "true", "yes")


def tracking_enabled() -> bool:
    """ABLATION_LAB_TRACKING=0 turns MLflow off (the DVC files are complete without it)."""
    return os.environ.get("ABLATION_LAB_TRACKING", "1").lower() not in ("0", "false", "off", "no")


class Tracker:
    """One MLflow run; every method is a no-op after the first MLflow failure."""

    def __init__(self, enabled: bool = True, flush_every: int = 200):
        self.enabled = enabled and tracking_enabled()
        self.run_id: str | None = None
        self._client = None
        self._buffer: list = []
        self._flush_every = flush_every

    def _fail(self, what: str, exc: Exception) -> None:
        print(f"warning: MLflow {what} failed ({problem(exc)}); tracking is off for this run, DVC files "
              "are complete", file=sys.stderr)
        self.enabled = False

    def start(self, experiment: str, run_name: str, tags: dict[str, str]) -> None:
        """Start a new run in `experiment` (created if missing)."""
        if not self.enabled:
            return
        try:
            self._client = open_client()
            exp_id = experiment_id(self._client, experiment)
            self._close_killed(exp_id, run_name)
            self.run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
            for key, value in {**tags, **dvc_experiment()}.items():
                self._client.set_tag(self.run_id, key, str(value))
        except Exception as exc:  # noqa: BLE001 - any MLflow failure must not stop training
            self._fail("start", exc)

    def _close_killed(self, exp_id: str, run_name: str) -> None:
        """A run of this name still RUNNING in this workspace (or DVC experiment) belongs to a stage
        that was killed (one stage per run name at a time): it ends as KILLED, not RUNNING forever."""
        mine = dvc_experiment().get("dvc.experiment")
        for run in self._client.search_runs([exp_id], filter_string=f"attributes.run_name = '{run_name}' "
                                            "and attributes.status = 'RUNNING'"):
            if run.data.tags.get("dvc.experiment") == mine:
                self._client.set_terminated(run.info.run_id, status="KILLED")

    def log_params(self, params: dict[str, Any]) -> None:
        if not self.enabled or self.run_id is None:
            return
        try:
            from mlflow.entities import Param

            items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
            for i in range(0, len(items), 100):
                self._client.log_batch(self.run_id, params=items[i:i + 100])
        except Exception as exc:  # noqa: BLE001
            self._fail("log_params", exc)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled or self.run_id is None:
            return
        try:
            from mlflow.entities import Metric

            stamp = int(time.time() * 1000)
            self._buffer.extend(Metric(k, float(v), stamp, step) for k, v in metrics.items() if v is not None)
        except Exception as exc:  # noqa: BLE001 - a bad value must not stop training either
            self._fail("log_metrics", exc)
            return
        if len(self._buffer) >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.enabled or self.run_id is None or not self._buffer:
            return
        try:
            for i in range(0, len(self._buffer), 500):
                self._client.log_batch(self.run_id, metrics=self._buffer[i:i + 500])
        except Exception as exc:  # noqa: BLE001
            self._fail("log_metrics", exc)
        self._buffer = []

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if not self.enabled or self.run_id is None:
            return
        try:
            self._client.log_artifact(self.run_id, str(path), artifact_path)
        except Exception as exc:  # noqa: BLE001
            self._fail("log_artifact", exc)

    def end(self, status: str = "FINISHED") -> None:
        self.flush()
        if not self.enabled or self.run_id is None:
            return
        try:
            self._client.set_terminated(self.run_id, status=status)
        except Exception as exc:  # noqa: BLE001
            self._fail("end", exc)


if __name__ == "__main__":
    if sys.argv[1:] != ["--make-store"]:
        raise SystemExit("usage: python -m pipeline.tracking --make-store")
    os.nice(19)  # beside the stages, never before them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # make_store's clean-up runs
    store = store_to_make()
    sys.exit(0 if store is None or make_store(store) else 1)
