"""Experiments run elsewhere than the workspace: `dvc exp run --queue` with two workers, and a
fresh clone after `dvc pull`. Nothing finished is retrained, and every MLflow run lands in the
repository's own store (issue #14)."""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from tests.tiny_project import copy_project, ran_stages, sh, tiny_params, write_params


@pytest.fixture(scope="module")
def repo(tiny_repo, tmp_path_factory):
    """The committed tiny project, its data pushed to a local DVC remote; MLflow's default store."""
    root = tmp_path_factory.mktemp("queue")
    project = root / "project"
    env = copy_project(tiny_repo, project)
    del env["MLFLOW_TRACKING_URI"]  # the default: mlflow.db in the repository
    sh(["dvc", "remote", "add", "-d", "store", str(root / "remote")], project, env)
    sh(["dvc", "push", "-q"], project, env)
    sh(["git", "commit", "-qam", "remote"], project, env)
    return root, project, env


@pytest.mark.repro
@pytest.mark.slow
def test_a_fresh_clone_after_dvc_pull_reruns_only_the_edited_ablation(repo):
    root, project, env = repo
    clone = root / "clone"
    sh(["git", "clone", "-q", str(project), str(clone)], root, env)
    sh(["dvc", "pull", "-q"], clone, env)
    assert json.loads(sh(["dvc", "status", "--json"], clone, env).stdout) == {}
    params = tiny_params(seeds=[0])
    params["ablations"]["no_positional"]["model"]["n_heads"] = 1
    write_params(clone, params)
    ran = ran_stages(sh(["dvc", "repro"], clone, env).stdout)
    assert ran == {"check_params", "train@no_positional-0", "evaluate@no_positional-0", "report"}


@pytest.mark.repro
@pytest.mark.slow
def test_queued_experiments_retrain_only_their_change_and_land_in_the_repository_mlflow_store(repo):
    _, project, env = repo
    for name, change in (("e1", "n_heads=1"), ("e2", "d_ff=32")):
        sh(["dvc", "exp", "run", "--queue", "-n", name, "-S", f"+ablations.no_positional.model.{change}"],
           project, env)
    sh(["dvc", "queue", "start", "-j", "2"], project, env)
    deadline = time.monotonic() + 600
    while True:
        status = sh(["dvc", "queue", "status"], project, env).stdout
        if "Running" not in status and "Queued" not in status or time.monotonic() > deadline:
            break
        time.sleep(2)
    for name in ("e1", "e2"):
        assert status.count("Success") == 2, status
        log = sh(["dvc", "queue", "logs", name], project, env).stdout
        ran = ran_stages(log)  # the baseline and the data stages come from the cache
        assert ran == {"check_params", "train@no_positional-0", "evaluate@no_positional-0", "report"}, log
        said = [line for line in log.splitlines() if line.startswith("report: ") and "MLflow" in line]
        assert len(said) == 1 and said[0].startswith("report: MLflow experiment"), log  # not a warning
        assert "locked" not in log, log

    db = sqlite3.connect(project / "mlflow.db")
    rows = db.execute("SELECT r.name, r.artifact_uri, t.value FROM runs r LEFT JOIN tags t "
                      "ON t.run_uuid = r.run_uuid AND t.key = 'dvc.experiment'").fetchall()
    # One report per queued experiment, each with its own no_positional run; the baseline's files are
    # the same in both, so it is mirrored once, by whichever report stage took the store first.
    tags = {}
    for name, _, tag in rows:
        tags.setdefault(name, []).append(tag)
    assert sorted(tags["report"]) == sorted(tags["no_positional-0"]) == ["e1", "e2"], rows
    assert len(tags["baseline-0"]) == 1 and tags["baseline-0"][0] in ("e1", "e2") and len(rows) == 5, rows
    for _, uri, _ in rows:  # artifacts beside the store, not in the deleted queue workspace
        folder = Path(uri.removeprefix("file://"))
        assert folder.is_relative_to(project / "mlruns") and any(folder.rglob("*")), uri
