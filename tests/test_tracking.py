"""MLflow mirroring never blocks training: dead stores cost a warning and bounded time, never the DVC files."""
from __future__ import annotations

import inspect
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from pipeline import tracking
from pipeline.tracking import Tracker, flatten
from pipeline.train import run
from test_trainer import resolved


def mlflow_tracking():
    """MLflow's client module, imported by the tests that use it: seconds of import that each of
    the quick tier's workers would otherwise pay while collecting this file."""
    import mlflow.tracking

    return mlflow.tracking


@pytest.fixture(autouse=True)
def tracking_on(monkeypatch):
    """These tests are about the live tracker: the train stage mirroring as it trains."""
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "1")
    monkeypatch.setenv("ABLATION_LAB_MLFLOW_LIVE", "1")


def test_without_live_tracking_the_train_stage_leaves_mlflow_to_the_report(tiny_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ABLATION_LAB_MLFLOW_LIVE", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    info = assert_dvc_outputs_complete(train_tiny(tiny_shards, tmp_path))
    assert info["mlflow_run_id"] is None and not (tmp_path / "mlflow.db").exists()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_tiny(tiny_shards: Path, tmp_path: Path) -> Path:
    run(tiny_shards / "shards", "v", 0, resolved(budget_tokens=800), "abl-test", tmp_path / "out", tmp_path / "ckpt")
    return tmp_path / "out"


def assert_dvc_outputs_complete(out: Path) -> dict:
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.pt", "train.json", "train_curve.csv", "val_curve.csv"]
    info = json.loads((out / "train.json").read_text())
    assert info["val_loss"] is not None and info["tokens_trained"] >= 800
    return info


def test_flatten_nested_params():
    tree = {"model": {"d_model": 64, "norm": {"eps": 1e-5}}, "seed": 0, "betas": [0.9, 0.98], "empty": {}}
    assert flatten(tree) == {"model.d_model": 64, "model.norm.eps": 1e-5, "seed": 0, "betas": [0.9, 0.98],
                             "empty": {}}


class FakeClient:
    def __init__(self, fail_on: str | None = None):
        self.calls: list[tuple[str, int]] = []
        self.fail_on = fail_on

    def log_batch(self, run_id, metrics=(), params=()):
        kind = "metrics" if metrics else "params"
        self.calls.append((kind, len(metrics) or len(params)))
        if kind == self.fail_on:
            raise ConnectionError("store went away")

    def set_terminated(self, run_id, status):
        self.calls.append((status, 0))


def fake_tracker(client: FakeClient, flush_every: int = 200) -> Tracker:
    tracker = Tracker(flush_every=flush_every)
    tracker._client, tracker.run_id = client, "r"
    return tracker


def test_metrics_are_buffered_and_sent_in_batches():
    client = FakeClient()
    tracker = fake_tracker(client, flush_every=300)
    for step in range(350):  # 700 metrics: a request each time 300 are buffered, the rest at the end
        tracker.log_metrics({"train_loss": 1.0, "lr": 0.1, "skipped": None}, step)
    assert client.calls == [("metrics", 300), ("metrics", 300)]
    tracker.end()
    assert client.calls[2:] == [("metrics", 100), ("FINISHED", 0)]


def test_large_buffers_and_params_are_split_into_bounded_requests():
    client = FakeClient()
    tracker = fake_tracker(client, flush_every=10_000)
    tracker.log_params({f"k{i}": {"v": i} for i in range(250)})
    for step in range(700):
        tracker.log_metrics({"train_loss": 1.0}, step)
    assert client.calls == [("params", 100), ("params", 100), ("params", 50)]  # nothing sent per step
    tracker.flush()
    assert client.calls[3:] == [("metrics", 500), ("metrics", 200)]


def test_first_failure_warns_once_then_tracking_is_off(capsys):
    client = FakeClient(fail_on="metrics")
    tracker = fake_tracker(client, flush_every=2)
    for step in range(10):
        tracker.log_metrics({"a": 1.0, "b": 2.0}, step)
    tracker.log_params({"x": 1})
    tracker.end()
    assert client.calls == [("metrics", 2)]  # nothing was sent after the failure
    assert capsys.readouterr().err.count("warning: MLflow") == 1
    assert not tracker.enabled


def test_unreachable_server_costs_a_warning_not_the_run(tiny_shards, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{closed_port()}")
    start = time.perf_counter()
    Tracker().start("abl-test", "probe", {})
    assert time.perf_counter() - start < 30  # refused connections are not retried for minutes (30 s: wide for load)
    info = assert_dvc_outputs_complete(train_tiny(tiny_shards, tmp_path))
    assert info["mlflow_run_id"] is None
    assert capsys.readouterr().err.count("warning: MLflow start failed") == 2  # the probe, then the stage


@pytest.mark.slow
def test_stalled_server_is_bounded_by_retries_times_timeout(monkeypatch, capsys):
    """A server that accepts connections but never answers: the worst case for a blocking client.
    Counted in connections (one a try), not read off a clock a loaded machine slows."""
    assert (tracking.HTTP_RETRIES + 1) * tracking.HTTP_TIMEOUT_S <= 10  # the shipped bound, in seconds
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # nobody ever reads or replies
        server.settimeout(0.05)
        accepted, done = [], threading.Event()

        def accept() -> None:
            while not done.is_set():
                try:
                    accepted.append(server.accept()[0])  # held open, unanswered
                except OSError:  # the timeout: look at `done` again
                    pass

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(tracking.HTTP_RETRIES))
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")  # scaled down from HTTP_TIMEOUT_S to keep it fast
        tracker = Tracker()
        start = time.perf_counter()
        tracker.start("abl-test", "stalled", {})
        elapsed = time.perf_counter() - start
        done.set()
        acceptor.join()
        for conn in accepted:
            conn.close()
    assert not tracker.enabled and "warning: MLflow start failed" in capsys.readouterr().err
    assert len(accepted) == tracking.HTTP_RETRIES + 1  # one request, retried as set, then tracking is off
    assert elapsed < 60  # timeouts and backoff, not MLflow's 7 x 120 s; wide for a loaded machine


@pytest.mark.slow
def test_unwritable_sqlite_store_costs_a_warning_not_the_run(tiny_shards, tmp_path, monkeypatch, capsys):
    (tmp_path / "in-the-way").write_text("a file where the store's directory should be")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'in-the-way' / 'mlflow.db'}")
    info = assert_dvc_outputs_complete(train_tiny(tiny_shards, tmp_path))
    assert info["mlflow_run_id"] is None
    assert capsys.readouterr().err.count("warning: MLflow") == 1


@pytest.mark.slow
def test_working_store_mirrors_params_curves_and_files(tiny_shards, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default artifact root ./mlruns lands in tmp_path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    info = assert_dvc_outputs_complete(train_tiny(tiny_shards, tmp_path))
    client = mlflow_tracking().MlflowClient()
    mirrored = client.get_run(info["mlflow_run_id"])
    assert mirrored.info.status == "FINISHED"
    assert mirrored.data.params["model.d_model"] == "32" and mirrored.data.tags["variant"] == "v"
    curve = (tmp_path / "out" / "train_curve.csv").read_text().splitlines()[1:]
    history = client.get_metric_history(info["mlflow_run_id"], "train_loss")
    assert [(m.step, m.value) for m in history] == [(int(r.split(",")[0]), float(r.split(",")[2])) for r in curve]
    assert {a.path for a in client.list_artifacts(info["mlflow_run_id"])} >= {"train.json", "train_curve.csv"}


BUSY_S = 2  # the busy timeout in the test below (MLflow's own is 20 s)


@pytest.mark.slow
def test_locked_sqlite_store_costs_one_wait_and_a_warning_not_the_run(tiny_shards, tmp_path, monkeypatch, capsys,
                                                                      request):
    """Another process holding the store's write lock (e.g. a long `mlflow gc`): the stage waits
    the busy timeout once, warns, and writes complete DVC outputs."""
    import sqlite3

    import sqlalchemy
    from mlflow.store.db import utils as db_utils

    class ShortBusyTimeout:
        """MLflow's sqlalchemy `sql`, with its fixed 20 s busy timeout cut to BUSY_S (test time)."""
        def __getattr__(self, name):
            return getattr(db_utils.sqlalchemy.sql, name)

        def text(self, query, *args, **kwargs):
            return db_utils.sqlalchemy.sql.text(query.replace("busy_timeout = 20000", f"busy_timeout = {BUSY_S * 1000}"),
                                                *args, **kwargs)

    assert "busy_timeout = 20000" in inspect.getsource(db_utils)  # else the patch below does nothing
    monkeypatch.setattr(db_utils, "sql", ShortBusyTimeout())
    waits = []  # each statement that waited out the busy timeout and failed: "database is locked"

    def locked(context):
        if "database is locked" in str(context.original_exception):
            waits.append(str(context.statement)[:80])

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "handle_error", locked)
    request.addfinalizer(lambda: sqlalchemy.event.remove(sqlalchemy.engine.Engine, "handle_error", locked))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    Tracker().start("abl-test", "creates-the-store", {})  # tables exist before the lock is taken
    holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        start = time.perf_counter()
        info = assert_dvc_outputs_complete(train_tiny(tiny_shards, tmp_path))
        elapsed = time.perf_counter() - start
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert info["mlflow_run_id"] is None
    assert capsys.readouterr().err.count("warning: MLflow") == 1
    # One busy timeout, not a wait per call (the run makes more than three calls after the first one
    # fails): counted as the store's own errors, not read off a clock a loaded machine slows.
    assert len(waits) == 1, waits
    assert elapsed >= BUSY_S  # it did wait, once


@pytest.mark.slow
def test_a_killed_live_run_ends_as_killed_when_its_stage_reruns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    killed = Tracker()
    killed.start("abl-test", "baseline-0", {})  # the process dies here: never ended
    other = Tracker()
    other.start("abl-test", "baseline-1", {})  # another run, still going
    monkeypatch.setenv("DVC_EXP_NAME", "e1")
    queued = Tracker()
    queued.start("abl-test", "baseline-0", {})  # the same run name in a queued experiment
    monkeypatch.delenv("DVC_EXP_NAME")
    rerun = Tracker()
    rerun.start("abl-test", "baseline-0", {})
    client = mlflow_tracking().MlflowClient()
    status = {t.run_id: client.get_run(t.run_id).info.status for t in (killed, other, queued, rerun)}
    assert status == {killed.run_id: "KILLED", other.run_id: "RUNNING", queued.run_id: "RUNNING",
                      rerun.run_id: "RUNNING"}
    assert client.get_run(queued.run_id).data.tags["dvc.experiment"] == "e1"


def test_the_default_store_is_the_repository_dvc_names_not_the_working_directory(tmp_path, monkeypatch):
    # A queued experiment runs in .dvc/tmp/exps/<tmp>/, deleted afterwards; DVC_ROOT names the repository.
    from pipeline.tracking import tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    workspace = tmp_path / ".dvc" / "tmp" / "exps" / "tmpabc"
    workspace.mkdir(parents=True)
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert tracking_uri() == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.delenv("DVC_ROOT")
    assert tracking_uri() == f"sqlite:///{workspace.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri() == "http://127.0.0.1:5000"


def test_train_json_records_the_stage_times_and_the_machine_load(tiny_shards, tmp_path, monkeypatch):
    import os

    from pipeline.train import machine_load

    monkeypatch.setenv("ABLATION_LAB_MLFLOW_LIVE", "0")
    before = time.time()
    info = assert_dvc_outputs_complete(train_tiny(tiny_shards, tmp_path))
    assert before <= info["started_at"] <= info["finished_at"] <= time.time()
    assert info["finished_at"] - info["started_at"] >= info["wall_time_s"]  # the stage holds the training loop
    for when in ("start", "end"):
        load = info["load"][when]
        assert load["loadavg_1m"] >= 0 and isinstance(load["other_running"], int) and load["other_running"] >= 0
    now = machine_load()
    assert now["loadavg_1m"] == pytest.approx(os.getloadavg()[0], abs=0.5)  # the kernel's own figure


@pytest.mark.slow
def test_the_store_is_made_aside_and_linked_whole(tmp_path, monkeypatch):
    # What the grid launcher runs beside the first stages: MLflow's tables made, and nothing left
    # beside the store; the report stage then opens it without making tables again.
    monkeypatch.setenv("ABLATION_LAB_MLFLOW_LIVE", "0")
    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    assert tracking.store_to_make() == store
    assert tracking.make_store(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    assert tracking.store_to_make() is None  # there now: nothing to make
    client = tracking.open_client()
    run = client.create_run(tracking.experiment_id(client, "x")).info.run_id
    assert client.get_run(run).info.status == "RUNNING"


@pytest.mark.slow
def test_the_store_maker_never_replaces_a_store_and_cleans_up_after_a_failure(tmp_path, monkeypatch):
    store = tmp_path / "mlflow.db"
    store.write_bytes(b"a store that came first")
    assert not tracking.make_store(store)  # linked only where there is none
    assert store.read_bytes() == b"a store that came first" and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    monkeypatch.setattr(mlflow_tracking(), "MlflowClient", lambda **_: 1 / 0)
    assert not tracking.make_store(tmp_path / "other.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


@pytest.mark.parametrize("setting", ["off", "live", "server"])
def test_no_store_is_made_where_the_report_would_not_make_one(tmp_path, monkeypatch, setting):
    monkeypatch.setenv("ABLATION_LAB_MLFLOW_LIVE", "1" if setting == "live" else "0")
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0" if setting == "off" else "1")
    uri = "http://127.0.0.1:5000" if setting == "server" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert tracking.store_to_make() is None


@pytest.mark.multiprocess
@pytest.mark.kill
def test_a_store_maker_ended_midway_leaves_no_file(tmp_path, monkeypatch):
    # The launcher ends it when a study stops early: ended while it makes the tables (its file
    # there), it leaves neither that file nor a store.
    import os
    import subprocess
    import sys

    monkeypatch.setenv("ABLATION_LAB_MLFLOW_LIVE", "0")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    root = Path(tracking.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.tracking", "--make-store"], cwd=tmp_path, env=env)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".mlflow.db.*.tmp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "it ended before making its file"
    proc.terminate()
    assert proc.wait(timeout=30) != 0
    assert list(tmp_path.iterdir()) == []
