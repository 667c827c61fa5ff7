"""The grid launcher (python -m pipeline.grid): stages side by side leave DVC's files as a serial
`dvc repro` does, a process that loses DVC's lock is started again, and a failing stage fails the
command with its own message while the independent stages finish."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from pipeline.grid.dag import Pipeline, Task, plan_tasks, shared_stages, stale_stages
from pipeline.grid.eta import read_prior
from pipeline.grid.launch import Launcher
from tests.tiny_project import TINY, ROOT, copy_project, make_project, project_env, ran_stages, sh, tiny_params

ITEMS = [f"i{n}" for n in range(8)]
# Quick shell stages in the shape of a study: one shared stage, a train and an evaluate per item,
# a report over all. Each DVC process takes the repository's lock several times in a second or two.
SYNTHETIC = {
    "stages": {
        "prepare": {"cmd": "echo shared > shared.txt", "outs": ["shared.txt"]},
        "train": {"matrix": {"item": ITEMS}, "cmd": "mkdir -p runs && sleep 0.3 && cat shared.txt > runs/${item.item}.txt"
                  " && echo ${item.item} >> runs/${item.item}.txt",
                  "deps": ["shared.txt"], "outs": ["runs/${item.item}.txt"]},
        "evaluate": {"matrix": {"item": ITEMS}, "cmd": "sh check.sh ${item.item}",
                     "deps": ["check.sh", "runs/${item.item}.txt"], "outs": ["evals/${item.item}.txt"]},
        "report": {"cmd": "cat evals/*.txt > report.txt", "deps": ["evals"], "outs": ["report.txt"]},
    }
}
CHECK = 'mkdir -p evals && wc -l < runs/$1.txt > evals/$1.txt\n'
BROKEN = 'if [ "$1" = i3 ]; then echo "evaluate: item i3 has no score" >&2; exit 3; fi\n' + CHECK


def synthetic_project(path: Path, check: str = CHECK) -> dict[str, str]:
    path.mkdir(parents=True)
    (path / "dvc.yaml").write_text(yaml.safe_dump(SYNTHETIC, sort_keys=False))
    (path / "check.sh").write_text(check)
    env = project_env(path)
    env["PYTHONPATH"] = str(ROOT)  # pipeline.grid from this checkout; the stages are shell
    sh(["git", "init", "-q"], path, env)
    sh(["dvc", "init", "-q"], path, env)
    sh(["dvc", "config", "core.analytics", "false"], path, env)
    return env


def grid(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.grid", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)


def lock_shape(project: Path, hashes: bool = True) -> dict:
    """dvc.lock as a mapping (stage order aside); without the outputs' hashes if not `hashes`.

    A folder dep that holds other stages' outputs (the report's data/runs, data/eval) holds the
    .gitignore DVC writes there too, one line per output in the order the stages finished: its
    hash differs from a serial run's whenever the order does, so it is left out."""
    stages = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    for stage in stages.values():
        if not hashes:
            stage["outs"] = sorted(o["path"] for o in stage.get("outs", []))
        for dep in stage.get("deps", []):
            if dep.get("md5", "").endswith(".dir") and not hashes or dep["path"] == "evals":
                for key in ("md5", "size", "nfiles"):
                    dep.pop(key, None)
    return stages


def gitignores(project: Path) -> dict[str, list[str]]:
    return {str(p.relative_to(project)): sorted(p.read_text().split()) for p in project.rglob(".gitignore")
            if ".dvc" not in p.parts and ".git" not in p.parts}


def assert_clean(project: Path, env: dict) -> None:
    assert json.loads(sh(["dvc", "status", "--json"], project, env).stdout) == {}
    assert ran_stages(sh(["dvc", "repro"], project, env).stdout) == set()


def test_tasks_chain_a_runs_evaluation_and_wait_for_what_they_read():
    up = {"check_params": set(), "encode": {"check_params"}, "train@b-0": {"encode"}, "train@n-0": {"encode"},
          "evaluate@b-0": {"train@b-0", "encode"}, "evaluate@n-0": {"train@n-0", "encode"},
          "knockout@0": {"train@b-0", "encode"}, "report": {"train@b-0", "train@n-0", "evaluate@b-0",
                                                           "evaluate@n-0", "knockout@0", "encode"}}
    pipeline = Pipeline(list(up), up)
    assert shared_stages(pipeline, set(up)) == {"check_params", "encode"}
    tasks = plan_tasks(pipeline, set(up) - {"check_params", "encode"})
    assert [(t.stages, t.needs) for t in tasks] == [
        (["train@b-0", "evaluate@b-0"], set()), (["train@n-0", "evaluate@n-0"], set()),
        (["knockout@0"], {"train@b-0"}),
        (["report"], {"train@b-0", "train@n-0", "evaluate@b-0", "evaluate@n-0", "knockout@0"})]
    # Only some stages out of date: a stage not needed is not waited for.
    tasks = plan_tasks(pipeline, {"evaluate@n-0", "report"})
    assert [(t.stages, t.needs) for t in tasks] == [(["evaluate@n-0", "report"], set())]



def test_a_stale_shared_stage_spares_the_whole_pipelines_status():
    """Seeds until decided's later rounds: the new seeds make check_params stale, and everything is below it."""
    up = {"check_params": set(), "encode": {"check_params"}, "train@b-0": {"encode"}, "evaluate@b-0": {"train@b-0"},
          "docs": set()}  # a stage outside the shared stages' reach
    pipeline = Pipeline(list(up), up)
    shared = shared_stages(pipeline, set(up))
    asked = []

    def status(stale):
        return lambda names: asked.append(set(names)) or set(names) & stale

    assert stale_stages(pipeline, set(up), shared, status({"check_params", "docs"})) == {"check_params", "docs"}
    assert asked == [{"check_params", "encode"}, {"docs"}]  # never the stages below check_params
    asked.clear()  # nothing shared is stale: the whole pipeline is asked, once more
    assert stale_stages(pipeline, set(up), shared, status({"evaluate@b-0"})) == {"evaluate@b-0"}
    assert asked == [{"check_params", "encode"}, set(up)]


@pytest.mark.repro
def test_side_by_side_leaves_dvc_lock_as_a_serial_repro_does(tmp_path):
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    env = synthetic_project(serial)
    synthetic_project(parallel)
    sh(["dvc", "repro"], serial, env)
    result = grid(parallel, env, "-j", "4", "--times", str(tmp_path / "times.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert lock_shape(parallel) == lock_shape(serial)  # deterministic outputs: the hashes too
    assert gitignores(parallel) == gitignores(serial)
    assert_clean(parallel, env)
    times = json.loads((tmp_path / "times.json").read_text())
    assert set(times["stages"]) == set(lock_shape(serial)) and times["jobs"] == 4
    assert times["families"]["train"] > 0 and times["total_s"] > 0
    assert (parallel / ".dvc/tmp/grid/train@i0.log").read_text().count("Running stage") == 2  # train, evaluate
    prior = read_prior(parallel / ".dvc/tmp/grid_times.json")  # the next study's ETA starts from these
    assert {("train", "evaluate"), ("report",)} <= set(prior) and all(s > 0 for s in prior.values())


def _hold_rwlock_guard(project: Path, out: Path, held: threading.Event, ended: threading.Event) -> None:
    """Take the lock guarding DVC's rwlock file once the launcher has started its first stages, and
    hold it until the launcher says it retries one that lost it (DVC tries for 3 s): the test waits
    on the launcher's own lines, not on a time window a loaded machine can miss."""
    import zc.lockfile

    def said(line: str) -> bool:
        return out.exists() and line in out.read_text(errors="replace")

    if not wait_for(lambda: said("grid: start") or ended.is_set(), 300) or ended.is_set():
        return
    def take() -> zc.lockfile.LockFile | None:
        try:
            return zc.lockfile.LockFile(str(project / ".dvc/tmp/rwlock.lock"))
        except zc.lockfile.LockError:  # a DVC process holds it this instant
            return None

    while (lock := take()) is None:
        if ended.is_set():
            return
        time.sleep(0.01)
    held.set()
    try:
        wait_for(lambda: said("grid: retry") or ended.is_set(), 300)
    finally:
        lock.close()


def wait_for(what, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.repro
def test_a_process_that_loses_dvcs_lock_is_started_again(tmp_path):
    project, reference = tmp_path / "project", tmp_path / "reference"
    env = synthetic_project(project)
    synthetic_project(reference)
    sh(["dvc", "repro", "prepare"], project, env)  # the shared stage: straight to the grid stages
    held, ended, log = threading.Event(), threading.Event(), tmp_path / "grid.out"
    holder = threading.Thread(target=_hold_rwlock_guard, args=(project, log, held, ended))
    holder.start()
    with log.open("w") as sink:
        proc = subprocess.run([sys.executable, "-m", "pipeline.grid", "-j", "4"], cwd=project, env=env,
                              stdout=sink, stderr=subprocess.STDOUT, timeout=600)
    ended.set()
    holder.join()
    out = log.read_text(errors="replace")
    assert held.is_set(), out
    assert proc.returncode == 0, out
    assert "grid: retry" in out and "DVC's lock was taken" in out, out
    sh(["dvc", "repro"], reference, env)
    assert lock_shape(project) == lock_shape(reference)
    assert_clean(project, env)


@pytest.mark.repro
def test_a_failing_stage_fails_the_command_with_its_own_message_and_the_others_finish(tmp_path):
    project = tmp_path / "project"
    env = synthetic_project(project, BROKEN)
    result = grid(project, env, "-j", "3")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "grid: FAILED evaluate@i3" in out and "evaluate: item i3 has no score" in out, out
    assert "not run, downstream of a failed stage: report" in out, out
    stages = lock_shape(project)
    assert set(stages) == {"prepare", *(f"train@{i}" for i in ITEMS), *(f"evaluate@{i}" for i in ITEMS if i != "i3")}
    assert set(json.loads(sh(["dvc", "status", "--json"], project, env).stdout)) == {"evaluate@i3", "report"}


@pytest.mark.repro
def test_the_launcher_runs_again_in_the_same_process(tmp_path):
    """The rounds loop calls it once a round (pipeline/grid/decide.py): a run lets go of the workspace
    lock and its guard before the next takes them, and returns its status and times."""
    project = tmp_path / "project"
    env = synthetic_project(project)
    code = ("import json; from pipeline.grid.repro import repro; "
            "runs = [repro(['-j', '3'], timed=True) for _ in range(2)]; "
            "print(json.dumps([[status, sorted(times['stages'])] for status, times in runs]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    first, second = json.loads(done.stdout.splitlines()[-1])
    assert first == [0, sorted(["prepare", "report", *(f"{s}@{i}" for s in ("train", "evaluate") for i in ITEMS)])]
    assert second == [0, []] and "grid: every stage is up to date" in done.stdout
    assert_clean(project, env)


@pytest.mark.multiprocess
def test_bad_jobs_is_a_one_line_error(tmp_path):
    project = tmp_path / "project"
    env = synthetic_project(project)
    result = grid(project, env, "-j", "0")
    assert result.returncode != 0 and result.stderr.strip() == "grid: -j must be a number of stages (at least 1) or auto, got '0'"


@pytest.mark.repro
@pytest.mark.slow
def test_the_study_side_by_side_ends_as_a_serial_dvc_repro(tmp_path):
    """The same dvc.lock and the same outputs, bit for bit (wall times aside), though the serial
    runs train with 2 threads and the grid's with 1 each (model/exact.py)."""
    from tests.test_warm import output_hashes

    params = tiny_params(seeds=[0, 1], knockout={"seeds": [0]}, train={**TINY["train"], "threads": 2})
    serial = tmp_path / "serial"
    env = make_project(serial, params)
    parallel = tmp_path / "parallel"
    copy_project(serial, parallel)
    penv = project_env(parallel)
    ran = sh(["dvc", "repro"], serial, env)
    assert "threads 2 (train.threads)" in ran.stdout + ran.stderr
    result = grid(parallel, penv, "-j", "2")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert lock_shape(parallel, hashes=False) == lock_shape(serial, hashes=False)
    assert output_hashes(parallel) == output_hashes(serial)
    def knockout(project: Path) -> dict:  # its wall times aside
        run = json.loads((project / "data/eval/knockout/baseline-0/knockout.json").read_text())
        return {k: v for k, v in run.items() if k not in ("wall_s", "started_at", "finished_at")}
    assert knockout(parallel) == knockout(serial)
    assert gitignores(parallel) == gitignores(serial)
    assert_clean(parallel, penv)
    logs = "".join(p.read_text() for p in (parallel / ".dvc/tmp/grid").glob("*.log"))
    assert "database is locked" not in logs and "MLflow" in logs  # the report mirrored to the sqlite store
    assert "threads 1 (train.threads 2, capped" in logs
    import sqlite3

    names = {r[0] for r in sqlite3.connect(parallel / "mlflow.db").execute("SELECT name FROM runs")}
    assert names >= {"baseline-0", "baseline-1", "no_positional-0", "no_positional-1", "report"}, names


@pytest.mark.multiprocess
def test_a_stage_that_follows_a_finished_one_starts_before_a_new_run(tmp_path):
    """One slot: after train@baseline-0, its knock-out goes before the next run's train (dvc.yaml
    lists every train first), so knock-outs overlap the grid instead of lengthening its tail."""
    said: list[str] = []
    tasks = [Task(["train@baseline-0"]), Task(["train@baseline-1"]), Task(["knockout@0"], needs={"train@baseline-0"})]
    launcher = Launcher(1, tmp_path, 1, None, say=said.append)
    assert launcher.run(tasks, lambda task: [sys.executable, "-c", "pass"])
    started = [line.split()[2] for line in said if line.startswith("grid: start")]
    assert started == ["train@baseline-0", "knockout@0", "train@baseline-1"]
