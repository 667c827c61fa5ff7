"""The grid across machines (issue #26, part 2): DVC's remote and run-cache carry finished runs from
machine to machine, one `mlflow server` holds every run, and scripts/slurm_grid.sh maps array
tasks to train stages."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.tiny_project import ROOT, make_project, ran_stages, sh, tiny_params, write_params

SLURM_GRID = ROOT / "scripts" / "slurm_grid.sh"
GITIGNORE = "mlflow.db\nmlflow.db.lock\nmlruns/\ndata/checkpoints/\n"


def committed_project(path: Path, params: dict, remote: Path) -> dict[str, str]:
    """A tiny project as a user commits it before spreading the grid: code, params, a DVC remote."""
    env = make_project(path, params, extra=("scripts",))
    (path / ".gitignore").write_text(GITIGNORE)
    sh(["dvc", "remote", "add", "-d", "shared", str(remote)], path, env)
    sh(["git", "add", "-A"], path, env)
    sh(["git", "commit", "-qm", "study"], path, env)
    return env


@pytest.fixture(scope="module")
def grid_repo(tmp_path_factory):
    """A committed tiny project with a learning-rate sweep: 2 variants x 2 seeds x (1 + 1 rate)."""
    root = tmp_path_factory.mktemp("grid")
    env = committed_project(root / "project", tiny_params(lr_sweep=[0.01]), root / "remote")
    return root / "project", env


@pytest.mark.multiprocess
def test_grid_stages_pairs_each_train_stage_with_its_evaluation_in_dvc_order(grid_repo, monkeypatch, capsys):
    from scripts import grid_stages

    project, env = grid_repo
    out = sh([sys.executable, "-m", "scripts.grid_stages"], project, env).stdout.splitlines()
    runs = [f"{v}-{s}" for v in ("baseline", "no_positional") for s in (0, 1)]
    assert out == [f"train@{r} evaluate@{r}" for r in runs] + [f"train_lr@{r}-0.01 evaluate_lr@{r}-0.01" for r in runs]
    monkeypatch.setattr(grid_stages, "dvc_stage_names", lambda: " ".join(out).split() + ["report"])
    grid_stages.main(["--count"])
    grid_stages.main(["--index", "5"])
    assert capsys.readouterr().out == "8\ntrain_lr@baseline-1-0.01 evaluate_lr@baseline-1-0.01\n"
    with pytest.raises(SystemExit, match=r"^grid_stages: task 8 is out of range: the grid has 8 tasks \(0..7\)$"):
        grid_stages.main(["--index", "8"])
    parts = []
    for k in (1, 2, 3):  # three machines share the 8 tasks: each once, none twice
        grid_stages.main(["--part", f"{k}/3"])
        parts.append(capsys.readouterr().out.split())
    assert parts[1] == out[1].split() + out[4].split() + out[7].split()  # tasks 1, 4, 7
    assert sorted(sum(parts, [])) == sorted(" ".join(out).split())
    with pytest.raises(SystemExit, match=r"^grid_stages: --part must be K/N with 1 <= K <= N \(machine K of N\), got '4/3'$"):
        grid_stages.main(["--part", "4/3"])


FAKE_SBATCH = """#!/usr/bin/env bash
# Records each submission (the grid's environment, then the arguments) and answers like --parsable.
echo "$GRID_REPO $GRID_REV | $*" >> "$SBATCH_LOG"
echo "$((100 + $(wc -l < "$SBATCH_LOG")));cluster"
"""


def fake_sbatch(tmp_path: Path, env: dict[str, str]) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    log = tmp_path / "sbatch.log"
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "SBATCH_LOG": str(log)}, log


@pytest.mark.multiprocess
def test_slurm_grid_submits_data_then_one_array_task_per_train_stage_then_the_report(grid_repo, tmp_path):
    project, env = grid_repo
    env, log = fake_sbatch(tmp_path, env)
    env.update(SLURM_GRID_CPU_OPTS="--partition cpu", SLURM_GRID_PARALLEL="3")
    out = sh(["bash", str(SLURM_GRID), "--gres", "gpu:1", "--time", "1:00:00"], project, env).stdout
    rev = sh(["git", "rev-parse", "HEAD"], project, env).stdout.strip()
    script, logs = project / "scripts" / "slurm_grid.sh", project / ".dvc" / "tmp" / "slurm"
    assert log.read_text().splitlines() == [
        f"{project} {rev} | --parsable --export=ALL --job-name ablation-data --output {logs}/%x-%j.out "
        f"--partition cpu {script} data",
        f"{project} {rev} | --parsable --export=ALL --job-name ablation-train --output {logs}/%x-%A_%a.out "
        f"--dependency afterok:101 --array 0-7%3 --gres gpu:1 --time 1:00:00 {script} task",
        f"{project} {rev} | --parsable --export=ALL --job-name ablation-report --output {logs}/%x-%j.out "
        f"--dependency afterok:102 --partition cpu {script} report",
    ]
    assert out.strip().endswith(f"data job 101, 8 train tasks in array 102, report job 103; logs in {logs}")


@pytest.mark.multiprocess
def test_slurm_grid_refuses_uncommitted_params(grid_repo, tmp_path):
    project, env = grid_repo
    env, log = fake_sbatch(tmp_path, env)
    write_params(project, tiny_params(seeds=[0]))
    try:
        bad = sh(["bash", str(SLURM_GRID)], project, env, ok=False)
    finally:
        sh(["git", "checkout", "params.yaml"], project, env)
    assert bad.returncode == 2 and not log.exists()
    assert bad.stderr.startswith("slurm_grid: params.yaml, dvc.yaml, pipeline/, model/ or .dvc/config has "
                                 "uncommitted changes")


@pytest.mark.multiprocess
def test_slurm_grid_report_refuses_a_checkout_that_moved_since_submission(grid_repo):
    project, env = grid_repo
    other = "0" * 40
    bad = sh(["bash", str(SLURM_GRID), "report"], project, {**env, "GRID_REPO": str(project), "GRID_REV": other},
             ok=False)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == f"slurm_grid: report: {project} is no longer at {other}; run `dvc repro --pull` in a checkout of it\n"


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on 127.0.0.1 with its own sqlite store and artifact folder; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tmp_path / "server"
    folder.mkdir()
    proc = subprocess.Popen(
        [Path(sys.executable).parent / "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts")],
        cwd=folder, stdout=open(folder / "server.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True)  # its own process group: the uvicorn worker it starts ends with it
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # uvicorn's graceful shutdown lags on a loaded machine
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def rest(url: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(f"{url}/api/2.0/mlflow/{path}", method="POST" if body else "GET",
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.repro
@pytest.mark.slow
def test_two_machines_train_halves_of_the_grid_and_a_third_writes_the_report_training_nothing(
        tmp_path, mlflow_server):
    """Three clones of one repository as three machines, a local-folder DVC remote, one MLflow server.
    Machine A trains its half of the grid by hand, mirroring live to the server; machine B is a
    cluster running the other half through scripts/slurm_grid.sh (the data job, then an array task).
    Both push the run-cache; C pulls it and `dvc repro` writes the report restoring every train and
    evaluate stage, running none, so the data stages of A and B must have made identical files."""
    origin = tmp_path / "origin"
    env = {**committed_project(origin, tiny_params(seeds=[0]), tmp_path / "remote"), "MLFLOW_TRACKING_URI": mlflow_server}
    clones = {}
    for name in "abc":
        clones[name] = tmp_path / name
        sh(["git", "clone", "-q", str(origin), str(clones[name])], tmp_path, env)
    tasks = ["train@baseline-0 evaluate@baseline-0", "train@no_positional-0 evaluate@no_positional-0"]  # grid_stages
    rev = sh(["git", "rev-parse", "HEAD"], origin, env).stdout.strip()

    # B first, as a cluster: the data job computes the data stages (the remote is empty), the array
    # task restores them from the run-cache in its own clone.
    (tmp_path / "scratch").mkdir()
    cluster = {**env, "GRID_REPO": str(clones["b"]), "GRID_REV": rev, "SLURM_GRID_SCRATCH": str(tmp_path / "scratch")}
    sh(["bash", str(SLURM_GRID), "data"], clones["b"], cluster)
    log = sh(["bash", str(SLURM_GRID), "task"], clones["b"], {**cluster, "SLURM_ARRAY_TASK_ID": "1"}).stdout
    assert ran_stages(log) >= set(tasks[1].split()) and not ran_stages(log) & {"download", "filter", "train_bpe",
                                                                               "encode"}, log
    assert not any((tmp_path / "scratch").iterdir())  # the jobs' clones are gone

    # A by hand, live to the server, computing its own data stages (no --pull: nothing restored).
    a_env = {**env, "ABLATION_LAB_MLFLOW_LIVE": "1"}
    mine = sh([sys.executable, "-m", "scripts.grid_stages", "--part", "1/2"], clones["a"], a_env).stdout.split()
    assert mine == tasks[0].split()
    sh(["dvc", "repro", *mine], clones["a"], a_env)
    sh(["dvc", "push", "--run-cache"], clones["a"], a_env)
    live = json.loads((clones["a"] / "data" / "runs" / "baseline-0" / "train.json").read_text())["mlflow_run_id"]

    # C writes the report, as the array's dependent job does.
    log = sh(["bash", str(SLURM_GRID), "report"], clones["c"], {**env, "GRID_REPO": str(clones["c"]),
                                                                "GRID_REV": rev}).stdout
    ran = ran_stages(log)
    assert "report" in ran and not {s for s in ran if s.startswith(("train", "evaluate"))}, log
    for stage in " ".join(tasks).split():
        assert f"Stage '{stage}' is cached - skipping run, checking out outputs" in log, log
    metrics = json.loads((clones["c"] / "reports" / "metrics.json").read_text())
    assert metrics  # written from the restored runs

    exp_id = rest(mlflow_server, "experiments/get-by-name?experiment_name=ablation-lab")["experiment"]["experiment_id"]
    runs = rest(mlflow_server, "runs/search", {"experiment_ids": [exp_id], "max_results": 1000})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    report_ids = [r["info"]["run_id"] for r, t in zip(runs, tags) if t.get("stage") == "report"]
    train = {r["info"]["run_name"]: (r["info"]["run_id"], t) for r, t in zip(runs, tags) if t.get("stage") == "train"}
    assert len(report_ids) == 1 and len(runs) == 3, [r["info"]["run_name"] for r in runs]  # no run twice
    assert sorted(train) == ["baseline-0", "no_positional-0"]
    assert train["baseline-0"][0] == live  # A's live run, completed by C's report, not copied
    assert all(t["report_run"] == report_ids[0] and t.get("evaluated") == "true" for _, t in train.values())
    files = rest(mlflow_server, f"artifacts/list?run_id={report_ids[0]}")["files"]
    assert "report.md" in {f["path"] for f in files}  # uploaded through the server


@pytest.mark.slow
def test_a_run_tracked_live_into_another_store_is_mirrored_from_its_files(tmp_path, monkeypatch, caplog):
    """A machine trained live into its own mlflow.db (before MLFLOW_TRACKING_URI named the server):
    the report elsewhere finds no such run in its store and mirrors the run's files, not nothing."""
    from mlflow.tracking import MlflowClient

    from pipeline.reporting.mlflow_mirror import DIGEST_TAG, RunFiles, mirror_runs
    from tests.fixtures.report.fake_runs import make_project as fake_project

    monkeypatch.chdir(tmp_path)  # the default artifact root ./mlruns lands in tmp_path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "1")
    p = fake_project(tmp_path, seeds=(0,), missing_runs=())
    (p.runs / "baseline-0" / "config.json").write_text(json.dumps({"model": {"d_model": 32}}))
    elsewhere = "f" * 32
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "report.md").write_text("# report\n")
    with caplog.at_level("WARNING", logger="pipeline.report"):
        report_id = mirror_runs([RunFiles("baseline", 0, p.runs / "baseline-0", p.evals / "baseline-0",
                                          live_run_id=elsewhere)], tmp_path / "reports", "abl-test")
    client = MlflowClient()
    exp_id = client.get_experiment_by_name("abl-test").experiment_id
    [run] = client.search_runs([exp_id], filter_string="tags.stage = 'train'")
    assert run.info.run_name == "baseline-0" and run.info.run_id != elsewhere
    assert run.data.tags["report_run"] == report_id and DIGEST_TAG in run.data.tags
    assert run.data.params["model.d_model"] == "32" and run.data.tags["evaluated"] == "true"
    assert [r.getMessage() for r in caplog.records] == [
        f"report: MLflow run {elsewhere} of baseline-0 is not in sqlite:///{tmp_path / 'mlflow.db'}; mirrored from its files"]
