"""Warm starts under a plain `dvc repro` (pipeline/warm/auto.py): the first stage starts a server
for its DVC process, the next stages are served by it; the study is the study run cold, and the
server ends with DVC however DVC ends, leaving no process and no folder. Off where asked
(ABLATION_LAB_WARM=0), on a GPU machine, under the grid launcher, and outside DVC."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from pipeline.warm import auto
from tests.test_grid_lifetime import GONE_S, MARK, kill_all, lines_of, study_processes, wait_for_line, wait_until
from tests.test_warm import output_hashes, stage_stderr
from tests.tiny_project import ROOT, TINY, copy_project, make_project, project_env, sh, tiny_params


def plain_env(project: Path, temp: Path, mark: str = "", **extra) -> dict[str, str]:
    """The environment a user's shell gives `dvc repro`: no ABLATION_LAB_WARM (the suite sets 0)."""
    env = {**project_env(project), "TMPDIR": str(temp), MARK: mark or uuid.uuid4().hex}
    env.pop(auto.SETTING, None)
    env.pop("ABLATION_LAB_GPU_COUNT", None)
    return {**env, **extra}


@pytest.fixture
def short_temp():
    """A temp dir of its own, its path short (pytest's are too long for a socket: auto.folder_for
    would fall back to /tmp, where this test could not tell the server's folder from others')."""
    made = []

    def make() -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="aw-", dir="/tmp")))
        return made[-1]
    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def ours(temp: Path) -> list[str]:
    return [p.name for p in temp.iterdir() if p.name.startswith(auto.PREFIX)]


def hold_until_served(dvc: subprocess.Popen, temp: Path, project: Path) -> None:
    """Once a stage has started the server (its folder is there), DVC is held (SIGSTOP) until the
    server is ready, so that the stages after it are served however slow this machine's imports
    are (without the hold a stage that comes sooner rightly runs cold rather than wait for them)."""
    assert wait_until(lambda: ours(temp), 300), "no stage started a server"
    os.kill(dvc.pid, signal.SIGSTOP)
    try:
        log = project / ".dvc/tmp/warm.log"
        ready = wait_until(lambda: any((temp / name / "socket").exists() for name in ours(temp)), 180)
        assert ready, log.read_text() if log.exists() else ours(temp)
    finally:
        os.kill(dvc.pid, signal.SIGCONT)


def test_it_is_on_under_dvc_on_any_machine_and_off_where_asked():
    assert auto.wanted({"DVC_STAGE": "train@baseline-0"})
    assert not auto.wanted({})  # a stage run by hand
    assert not auto.wanted({"DVC_STAGE": "x", auto.SETTING: "0"})
    assert auto.wanted({"DVC_STAGE": "x", "ABLATION_LAB_GPU_COUNT": "1"})  # a GPU machine too (docs/gpu.md)


def test_a_temp_dir_too_long_for_a_socket_falls_back_to_tmp(monkeypatch):
    monkeypatch.setenv("TMPDIR", "/tmp/" + "x" * 90)
    assert os.path.dirname(auto.folder_for((123, "456"))) == "/tmp"
    monkeypatch.setenv("TMPDIR", "/var/tmp")
    assert os.path.dirname(auto.folder_for((123, "456"))) == "/var/tmp"


@pytest.mark.multiprocess
def test_a_stage_not_started_by_dvc_starts_no_server(tmp_path):
    """DVC_STAGE set, but the parent is not DVC (here: this test): the stage runs cold, alone."""
    env = {**os.environ, "DVC_STAGE": "check_params", "TMPDIR": str(tmp_path)}
    env.pop(auto.SETTING, None)
    run = subprocess.run([sys.executable, "-m", "pipeline", "check_params", "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "usage" in run.stdout
    assert ours(tmp_path) == []


@pytest.mark.multiprocess
def test_the_entry_point_engages_warm_starts_and_importing_the_package_does_not():
    """`python -m pipeline <stage>` is where a stage may be served; `import pipeline` (what `python -m
    pipeline.<stage>` and every tool does) only pins the CPU's code path."""
    code = "import json, sys, pipeline; print(json.dumps(sorted(m for m in sys.modules if m.startswith('pipeline'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout) == ["pipeline", "pipeline.cpu_numerics"], out.stderr
    bad = subprocess.run([sys.executable, "-m", "pipeline", "nope"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("usage: python -m pipeline STAGE") and not bad.stdout
    assert len(bad.stderr.splitlines()) == 1


@pytest.mark.multiprocess
def test_the_launcher_tells_its_dvc_processes_not_to_start_one(tmp_path):
    from pipeline.grid.dag import Task
    from pipeline.grid.launch import Launcher

    out = tmp_path / "setting"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ.get('ABLATION_LAB_WARM', 'unset'))"
    launcher = Launcher(1, tmp_path, 1, None)
    launcher.start(Task(["x"]), [sys.executable, "-c", code], None, direct=True).proc.wait(timeout=60)
    assert out.read_text() == "0"


@pytest.mark.repro
@pytest.mark.slow
def test_a_plain_dvc_repro_is_the_study_cold_and_leaves_nothing(tmp_path, short_temp):
    """The tiny study by `dvc repro`, warm by itself and cold (ABLATION_LAB_WARM=0): the same
    output hashes (but for files holding clocks) and stage stderr; the warm one's stages after the
    first were served; once DVC returns, no process of it and no folder are left (polled 30 s)."""
    results, stderr = {}, {}
    for mode in ("warm", "cold"):
        project, temp = tmp_path / mode, short_temp()
        make_project(project, tiny_params(seeds=[0]))
        mark = uuid.uuid4().hex
        env = plain_env(project, temp, mark, **({auto.SETTING: "0"} if mode == "cold" else {}))
        with open(tmp_path / f"{mode}.out", "w") as out, open(tmp_path / f"{mode}.err", "w") as err:
            dvc = subprocess.Popen(["dvc", "repro"], cwd=project, env=env, stdout=out, stderr=err, text=True)
            try:
                if mode == "warm":
                    hold_until_served(dvc, temp, project)
                code = dvc.wait(timeout=600)
            finally:
                dvc.kill()
        run_out, run_err = ((tmp_path / f"{mode}.{what}").read_text() for what in ("out", "err"))
        assert code == 0, run_out[-2000:] + run_err[-2000:]
        assert wait_until(lambda: not study_processes(mark), 30), study_processes(mark)
        assert wait_until(lambda: not ours(temp), 30), ours(temp)
        results[mode], stderr[mode] = project, run_err
    warm, cold = (output_hashes(results[m]) for m in ("warm", "cold"))
    assert set(warm) == set(cold)
    assert sorted(path for path in warm if warm[path] != cold[path]) == []
    assert stage_stderr(stderr["warm"]) == stage_stderr(stderr["cold"])
    log = (results["warm"] / ".dvc/tmp/warm.log").read_text()
    assert log.count("served pipeline.evaluate (") == 2 and "served pipeline.report (" in log, log + stderr["warm"][-3000:]
    assert "dvc (pid" in log and "has ended; stopping" in log
    assert not (results["cold"] / ".dvc/tmp/warm.log").exists()
    for run in ("baseline-0", "no_positional-0"):
        warm, cold = (json.loads((results[m] / "data/eval" / run / "eval.json").read_text()) for m in results)
        assert warm == cold


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The tiny study with its data stages done, the training loops long enough (~5 s served)
    that a signal finds the second one running."""
    project = tmp_path_factory.mktemp("auto-kill") / "template"
    env = make_project(project, tiny_params(seeds=[0], train={**TINY["train"], "budget_tokens": 40000}))
    sh(["dvc", "repro", "encode"], project, env)
    return project


@pytest.mark.repro
@pytest.mark.kill
@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP, "ctrl-c"],
                         ids=lambda s: s if isinstance(s, str) else signal.Signals(s).name)
def test_a_killed_dvc_repro_takes_its_server_and_served_stage_with_it(prepared, tmp_path, short_temp, how):
    """DVC killed (SIGKILL; SIGHUP, a closed terminal; Ctrl-C, SIGINT to DVC's whole process group
    as a terminal sends it) while a served stage trains: within GONE_S no process of the study and no
    folder of it are left, and a rerun finishes with `dvc status` clean."""
    project, temp = tmp_path / "project", short_temp()
    copy_project(prepared, project)
    mark = uuid.uuid4().hex
    env = plain_env(project, temp, mark)
    dvc = subprocess.Popen(["dvc", "repro"], cwd=project, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=how == "ctrl-c")
    try:
        lines = lines_of(dvc)
        wait_for_line(lines, ("Running stage 'train@",), 300)  # the first: cold, starts the server
        hold_until_served(dvc, temp, project)
        wait_for_line(lines, ("Running stage 'train@",), 300)  # the second: served
        # Its training under way: a Ctrl-C between stages can land while DVC rewrites its own
        # .dvc/tmp/rwlock, which DVC then leaves half written (cold too; the launcher repairs it).
        wait_for_line(lines, ("step ",), 120)
        # The server, its handler of this command and the stage (forks keep the server's command line).
        served = [p for p, cmd in study_processes(mark) if "pipeline.warm.server --serve" in cmd]
        assert len(served) >= 3, study_processes(mark)
        if how == "ctrl-c":
            os.killpg(dvc.pid, signal.SIGINT)
        else:
            dvc.send_signal(how)
        signalled = time.monotonic()
        dvc.wait(timeout=30)
        left = wait_until(lambda: not study_processes(mark), max(0.1, GONE_S - (time.monotonic() - signalled)))
        assert left, f"still running {GONE_S} s after {how}: {study_processes(mark)}"
        assert wait_until(lambda: not ours(temp), 30), ours(temp)
    finally:
        dvc.kill()
        kill_all(mark)
    rerun = subprocess.run(["dvc", "repro"], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert json.loads(sh(["dvc", "status", "--json"], project, env).stdout) == {}
    assert wait_until(lambda: not study_processes(mark), 30), study_processes(mark)


@pytest.mark.multiprocess
def test_a_server_stops_after_its_idle_time_and_removes_its_folder(tmp_path):
    """Nothing to serve for IDLE_S (here 1 s) after its imports: it stops and removes its folder."""
    folder = tmp_path / f"{auto.PREFIX}test"
    folder.mkdir()
    keeper = subprocess.Popen(["sleep", "120"])
    try:
        server = subprocess.Popen([sys.executable, "-m", "pipeline.warm.server", "--serve", str(folder / "socket"),
                                   "--folder", str(folder), "--watch", str(keeper.pid), "--idle", "1"],
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = server.communicate(timeout=120)
        assert server.returncode == 0 and "no stage for 1 s; stopping" in out, out
        assert not folder.exists()
        assert keeper.poll() is None
    finally:
        keeper.kill()


@pytest.mark.multiprocess
@pytest.mark.kill
def test_a_server_whose_dvc_has_ended_removes_the_folders_of_killed_ones(tmp_path):
    """A server sweeps the folders whose DVC process has ended (their server was SIGKILLed), and
    stops at once when its own DVC process has ended."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{auto.PREFIX}{os.getuid()}-stale"
    stale.mkdir()
    (stale / "dvc").write_text(str(dead.pid))
    (stale / "socket").write_text("")
    folder = tmp_path / f"{auto.PREFIX}{os.getuid()}-new"
    folder.mkdir()
    server = subprocess.run([sys.executable, "-m", "pipeline.warm.server", "--serve", str(folder / "socket"),
                             "--folder", str(folder), "--watch", str(dead.pid), "--idle", "600"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert server.returncode == 0 and "has already ended; stopping" in server.stdout, server.stdout + server.stderr
    assert not stale.exists() and not folder.exists()
