"""Nothing outlives the grid launcher (pipeline/grid/lifeline.py, signals.py, lock.py): killed in
any way (SIGKILL, SIGHUP, SIGTERM, SIGINT; -j 1 and -j N), no process of the study is left within
GONE_S, no folder of it in the temp dir, and a rerun finishes with `dvc status` clean. A second
launcher in the same workspace stops at once with one line."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pipeline.grid import lock
from pipeline.grid.lifeline import end_groups
from tests.tiny_project import ROOT, TINY, copy_project, make_project, project_env, sh, tiny_params

MARK = "ABLATION_LAB_TEST_STUDY"  # every process of a study inherits it (a warm stage gets the command's env)
# Seconds after the signal by which nothing of the study may run: the launcher's 3 s grace before its
# SIGKILL, and room for a loaded 2-core machine to schedule it. Polls for what must happen wait 30 s.
GONE_S = 15


def study_processes(mark: str) -> list[tuple[int, str]]:
    """(pid, command) of every process whose environment carries `mark`."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append((proc.pid, " ".join(proc.cmdline())[:120]))
        except (psutil.Error, OSError):
            pass
    return found


def wait_until(what, timeout: float, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(step)
    return what()


def kill_all(mark: str) -> None:
    """Whatever a failed test left: SIGKILL, so the next tests find a quiet machine."""
    for pid, _ in study_processes(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- the pieces, quick ------------------------------------------------------------------------------

@pytest.mark.multiprocess
def test_a_second_launcher_in_the_workspace_stops_at_once_naming_the_first(tmp_path):
    folder = tmp_path / ".dvc" / "tmp" / "grid"
    fd = lock.hold(folder)
    try:
        code = f"from pathlib import Path; from pipeline.grid import lock; lock.hold(Path({str(folder)!r}))"
        second = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert second.stderr.count("\n") == 1, second.stderr
        assert second.stderr.startswith(f"grid: another launcher (pid {os.getpid()}) is running in this workspace")
    finally:
        os.close(fd)
    os.close(lock.hold(folder))  # free once the first has gone


def test_a_dvc_rwlock_left_half_written_is_removed_and_a_whole_one_kept(tmp_path):
    rwlock = tmp_path / "rwlock"
    rwlock.write_text("")  # DVC killed between truncating and writing it
    assert lock.repair_dvc_rwlock(tmp_path) and not rwlock.exists()
    rwlock.write_text('{"read": {}, "write": {}}')
    assert not lock.repair_dvc_rwlock(tmp_path) and rwlock.exists()


@pytest.mark.multiprocess
@pytest.mark.kill
def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                             "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    start = time.monotonic()
    end_groups({proc.pid}, grace_s=0.5, reap=proc.poll)
    assert proc.poll() == -signal.SIGKILL and time.monotonic() - start < 10  # 0.5 s grace; wide for load


LAUNCHER = """
import os, subprocess, sys, tempfile, time
from pipeline.grid.lifeline import Lifeline
life = Lifeline()
child = subprocess.Popen(["sleep", "60"], start_new_session=True)
life.group(child.pid)
folder = tempfile.mkdtemp(prefix="ablation-warm-")
life.folder(folder)
print(child.pid, life.guard.pid, folder, flush=True)
time.sleep(60)
"""


@pytest.mark.multiprocess
@pytest.mark.kill
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_the_guard_ends_what_a_dead_launcher_started_and_removes_its_folder(tmp_path, how):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        child, guard, folder = launcher.stdout.readline().split()
        assert Path(folder).is_dir()
        launcher.send_signal(how)
        launcher.wait(timeout=10)
        assert wait_until(lambda: not psutil.pid_exists(int(child)) or
                          psutil.Process(int(child)).status() == psutil.STATUS_ZOMBIE, 30), "the launcher's child outlived it"
        assert wait_until(lambda: not psutil.pid_exists(int(guard)) or
                          psutil.Process(int(guard)).status() == psutil.STATUS_ZOMBIE, 30), "the guard did not exit"
        assert not Path(folder).exists()
    finally:
        launcher.kill()
        for pid in (child, guard):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError, NameError):
                pass


# -- the study, killed --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The tiny study with its shared data stages done: a launcher goes straight to the runs."""
    project = tmp_path_factory.mktemp("kill") / "template"
    # Long enough a training loop (~5-10 s) that the signal finds it running.
    env = make_project(project, tiny_params(seeds=[0], train={**TINY["train"], "budget_tokens": 12000}))
    sh(["dvc", "repro", "encode"], project, env)
    return project


STAGE_STARTED = ("Running stage 'train@", "grid: start train@")  # -j 1 (DVC's own line), -j N


def lines_of(proc) -> queue.Queue:
    """The process's output lines, read as they come (a thread), for waits with a timeout."""
    lines: queue.Queue = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue, starts: tuple[str, ...], timeout: float) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if line.startswith(starts):
            return seen
    raise AssertionError("no stage started: " + "".join(seen[-30:]))


@pytest.mark.repro
@pytest.mark.kill
@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP, signal.SIGTERM, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_killed_launcher_leaves_nothing_and_a_rerun_finishes_clean(prepared, tmp_path, how, jobs):
    project = tmp_path / "project"
    copy_project(prepared, project)
    temp = tmp_path / "temp"
    temp.mkdir()
    mark = uuid.uuid4().hex
    env = {**project_env(project), "TMPDIR": str(temp), MARK: mark}
    launcher = subprocess.Popen([sys.executable, "-m", "pipeline.grid", "-j", jobs], cwd=project, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # A train stage started (waiting on the warm server's imports, or training), then 2 s more.
        lines = lines_of(launcher)
        wait_for_line(lines, STAGE_STARTED, 300)
        time.sleep(2)
        if how == signal.SIGTERM and jobs == "2":  # and while it runs, a second launcher is refused
            second = subprocess.run([sys.executable, "-m", "pipeline.grid", "-j", jobs], cwd=project, env=env,
                                    capture_output=True, text=True, timeout=120)
            assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
            assert second.stderr.startswith(f"grid: another launcher (pid {launcher.pid}) is running"), second.stderr
        launcher.send_signal(how)
        signalled = time.monotonic()
        launcher.wait(timeout=30)
        assert launcher.returncode == -how
        left = wait_until(lambda: not study_processes(mark), max(0.1, GONE_S - (time.monotonic() - signalled)))
        assert left, f"still running {GONE_S} s after {signal.Signals(how).name}: {study_processes(mark)}"
        # torch's own compile cache (torchinductor_<user>) is made by a plain run too; nothing of ours.
        assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []
    finally:
        launcher.kill()
        kill_all(mark)
    rerun = subprocess.run([sys.executable, "-m", "pipeline.grid", "-j", jobs], cwd=project, env=env,
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert json.loads(sh(["dvc", "status", "--json"], project, env).stdout) == {}
    assert wait_until(lambda: not study_processes(mark), 30), study_processes(mark)


@pytest.mark.repro
@pytest.mark.kill
def test_ctrl_z_stops_the_running_stage_with_the_launcher_and_fg_continues_it(tmp_path):
    """SIGTSTP (Ctrl-Z) to the launcher stops DVC and its stage, though each DVC process is a
    session of its own; SIGCONT (`fg`) continues them and the study finishes."""
    import yaml

    project = tmp_path / "project"
    project.mkdir()
    (project / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"wait": {"cmd": "sleep 6 && echo done > out.txt", "outs": ["out.txt"]}}}))
    env = {**project_env(project), "PYTHONPATH": str(ROOT)}  # pipeline.grid from this checkout
    for args in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        sh(args, project, env)
    launcher = subprocess.Popen([sys.executable, "-m", "pipeline.grid", "-j", "1"], cwd=project, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def stage():
            kids = psutil.Process(launcher.pid).children(recursive=True)
            return next((k for k in kids if k.name() == "sleep"), None)
        sleeper = wait_until(stage, 120)
        assert sleeper, "the stage never started"
        launcher.send_signal(signal.SIGTSTP)
        assert wait_until(lambda: sleeper.status() == psutil.STATUS_STOPPED, 30), sleeper.status()
        time.sleep(7)  # longer than the stage: stopped, it has not finished
        assert not (project / "out.txt").exists()
        launcher.send_signal(signal.SIGCONT)
        assert launcher.wait(timeout=120) == 0
        assert (project / "out.txt").read_text().strip() == "done"
    finally:
        launcher.kill()
        launcher.wait()
