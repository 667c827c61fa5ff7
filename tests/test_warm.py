"""Warm starts (pipeline/warm/): a stage's command served by a fork of a process that has
imported torch and the rest behaves as the command run in a new process would: its arguments,
directory, environment, streams and exit status; signals reach it, a killed command takes its
stage with it, atexit callbacks and threads finish; and it runs the ordinary way whenever it
cannot be served exactly."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.warm.server import start_server, stop_server
from pipeline.warm.shim import stage_command, write_shims
from tests.tiny_project import ROOT, make_project, tiny_params

# A stand-in for a stage (pipeline/report.py in a scratch copy of the package): what it was given,
# and ways to end.
FAKE_STAGE = '''
import atexit, json, os, signal, sys, threading, time

def main():
    mode = sys.argv[1]
    if mode == "echo":
        print(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv[1:],
                          "foo": os.environ.get("FOO"), "stdin": sys.stdin.readline().strip(),
                          "name": __name__, "path": os.environ["PATH"], "executable": sys.executable}))
        print("to stderr", file=sys.stderr)
        sys.exit(int(sys.argv[2]))
    if mode == "sleep":
        open(sys.argv[2], "w").write(str(os.getpid()))
        time.sleep(60)
    if mode == "raise":
        raise ValueError("boom in the stage")
    if mode == "finish":  # what Python's exit waits for
        atexit.register(lambda: open(sys.argv[2] + ".atexit", "w").write("ran"))
        threading.Thread(target=lambda: (time.sleep(0.3), open(sys.argv[2] + ".thread", "w").write("ran"))).start()
        half = open(sys.argv[2] + ".unclosed", "w")
        half.write("flushed at exit")
        del half
        return
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "state":  # what a fresh interpreter has, that the server's imports may have changed
        import logging, resource, warnings
        mask = os.umask(0)
        os.umask(mask)
        root = logging.getLogger()
        print(json.dumps({"filters": [repr(f) for f in warnings.filters], "handlers": [repr(h) for h in root.handlers],
                          "level": root.level, "path": sys.path, "umask": mask,
                          "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "pid": os.getpid()}))

if __name__ == "__main__":
    main()
'''


# A module the server imports (as it imports every stage) and a stage may not: what it changes of
# the interpreter's state must not reach a stage served warm.
SIDE_EFFECTS = '''
import logging, os, sys, warnings
warnings.filterwarnings("ignore", message="set by a module the server imported")
logging.getLogger().addHandler(logging.NullHandler())
logging.getLogger().setLevel(logging.DEBUG)
sys.path.append("/nowhere/added-by-an-import")
os.umask(0o077)
'''


def scratch_server(root: Path, stages: dict[str, str], env: dict):
    """A scratch package with `stages` (module name -> source) and a warm server started in it,
    its shims in root/bin: (server process, socket path, the commands' environment, log file)."""
    (root / "pipeline" / "warm").mkdir(parents=True)
    for name in ("pipeline/__init__.py", "pipeline/__main__.py", "pipeline/cpu_numerics.py",
                 *(str(p.relative_to(ROOT)) for p in (ROOT / "pipeline" / "warm").glob("*.py"))):
        shutil.copy(ROOT / name, root / name)
    for name, source in stages.items():
        (root / "pipeline" / f"{name}.py").write_text(source)
    path = str(root / "s")
    log = open(root / "warm.log", "w")
    proc = start_server(path, log, cwd=root, env=env, ready_s=120)  # the data stages' imports done
    (root / "bin").mkdir()
    stages_path = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    write_shims(str(root / "bin"), path, stages_path)
    return proc, path, {**env, "PATH": f"{root / 'bin'}{os.pathsep}{stages_path}"}, log


def wait_for_line(log: Path, text: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in {log}: {log.read_text()}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A scratch package whose report stage is FAKE_STAGE, and a warm server started in it, every
    import done (no command served early)."""
    root = tmp_path_factory.mktemp("warm")
    proc, path, env, log = scratch_server(root, {"report": FAKE_STAGE, "train": SIDE_EFFECTS},
                                          {**os.environ, "PYTHONPATH": ""})
    wait_for_line(root / "warm.log", "warm: ready")
    yield root, path, env
    stop_server(proc, path)
    log.close()


def command(server, *args, env=None, **kw):
    root, _, base = server
    return subprocess.Popen(["python", "-m", "pipeline", "report", *args], cwd=root,
                            env={**base, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True, **kw)


def echo(server, code=0, env=None):
    proc = command(server, "echo", str(code), env=env)
    out, err = proc.communicate("a line on stdin\n", timeout=60)
    return proc, json.loads(out), err


@pytest.mark.multiprocess
def test_a_stage_is_served_with_its_arguments_directory_environment_and_streams(server):
    proc, seen, err = echo(server, code=3, env={"FOO": "bar"})
    assert proc.returncode == 3
    assert seen["pid"] != proc.pid  # it ran in the server's fork, not in the command's process
    assert seen["cwd"] == str(server[0])
    assert seen["argv"] == ["echo", "3"] and seen["foo"] == "bar" and seen["stdin"] == "a line on stdin"
    assert seen["name"] == "__main__" and seen["executable"] == str(Path(sys.executable).absolute())
    assert str(server[0] / "bin") not in seen["path"]  # the stage sees PATH as it was
    assert err.strip() == "to stderr"
    assert "served pipeline.report" in (server[0] / "warm.log").read_text()


# A module the main server imports (as it imports every stage) whose import lasts until a file is
# there: the main server is still importing while the early one serves.
SLOW_IMPORT = '''
import os, time
while not os.path.exists(os.environ["WARM_TEST_RELEASE"]):
    time.sleep(0.02)
'''


@pytest.mark.multiprocess
def test_the_data_stages_are_served_while_the_rest_is_still_importing(tmp_path):
    """Once the data stages' imports are done, a fork of the server serves the data stages while
    the server imports the rest; another stage's command waits for the server to be ready (rather
    than import torch beside it), and the early server ends with its stages."""
    release, root = tmp_path / "release", tmp_path / "pkg"
    proc, path, env, log = scratch_server(root, {"download": FAKE_STAGE, "report": FAKE_STAGE, "train": SLOW_IMPORT},
                                          {**os.environ, "PYTHONPATH": "", "WARM_TEST_RELEASE": str(release)})
    try:
        def served(stage: str) -> str:
            run = subprocess.run(["python", "-m", "pipeline", stage, "echo", "0"], cwd=root, env=env, input="x\n",
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr
            assert json.loads(run.stdout)["name"] == "__main__"
            lines = [line for line in (root / "warm.log").read_text().splitlines()
                     if line.startswith(f"warm: served pipeline.{stage} ")]
            assert lines, (root / "warm.log").read_text()  # not run the ordinary way
            return lines[-1]

        waiting = subprocess.Popen(["python", "-m", "pipeline", "report", "echo", "0"], cwd=root, env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert served("download").endswith(", early")
        time.sleep(0.5)
        assert waiting.poll() is None and "warm: ready" not in (root / "warm.log").read_text()
        release.touch()
        out, err = waiting.communicate("x\n", timeout=120)
        assert waiting.returncode == 0 and json.loads(out)["pid"] != waiting.pid, err  # served, not cold
        log_text = (root / "warm.log").read_text()
        assert re.search(r"warm: served pipeline.report .*, exit 0\n", log_text), log_text  # by the main server
        wait_for_line(root / "warm.log", "warm: the early server took 2 command(s) and has ended")
    finally:
        release.touch()
        stop_server(proc, path)
        log.close()


@pytest.mark.multiprocess
def test_an_import_time_variable_set_differently_runs_it_the_ordinary_way(server):
    proc, seen, _ = echo(server, env={"OMP_NUM_THREADS": "7"})
    assert proc.returncode == 0 and seen["pid"] == proc.pid
    proc, seen, _ = echo(server, env={"LOCAL_RANK": "0"})  # under torchrun
    assert seen["pid"] == proc.pid


def _limited(mask: int, nofile: int | None = None, memory: int | None = None):
    """A preexec_fn: the command starts with this umask and these limits (`ulimit -n`, `ulimit -v`)."""
    import resource

    def apply():
        os.umask(mask)
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, resource.getrlimit(resource.RLIMIT_AS)[1]))
    return apply


def _state(server, served: bool, **kw) -> dict:
    root, _, env = server
    if served:
        proc = command(server, "state", **kw)
    else:  # the same stage in a new process: the reference
        plain = {**env, "PATH": os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(root / "bin"))}
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.report", "state"], cwd=root, env=plain,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, text=True, **kw)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    seen = json.loads(out)
    assert (seen.pop("pid") != proc.pid) == served  # served: it ran in a fork of the server
    return seen


@pytest.mark.multiprocess
def test_a_served_stage_has_a_fresh_interpreters_warnings_logging_and_sys_path(server):
    warm, cold = _state(server, True), _state(server, False)
    assert not any("set by a module the server imported" in f for f in warm["filters"])
    assert warm["handlers"] == [] and warm["level"] == 30  # logging.WARNING, no root handler
    assert "/nowhere/added-by-an-import" not in warm["path"]
    assert warm["filters"] == cold["filters"]
    assert (warm["handlers"], warm["level"]) == (cold["handlers"], cold["level"])
    assert warm["path"] == cold["path"]


@pytest.mark.multiprocess
def test_a_served_stage_takes_the_commands_umask_and_resource_limits(server):
    how = {"preexec_fn": _limited(0o027, nofile=200)}
    warm, cold = _state(server, True, **how), _state(server, False, **how)
    assert warm["umask"] == cold["umask"] == 0o027  # the server's import set 077: not the command's
    assert warm["nofile"][0] == cold["nofile"][0] == 200


@pytest.mark.multiprocess
def test_a_memory_limit_other_than_the_servers_runs_it_the_ordinary_way(server):
    _state(server, False, preexec_fn=_limited(0o022, memory=64 << 30))
    proc = command(server, "state", preexec_fn=_limited(0o022, memory=64 << 30))
    out, _ = proc.communicate(timeout=60)
    assert json.loads(out)["pid"] == proc.pid  # `ulimit -v`: a new process, not a fork


@pytest.mark.multiprocess
@pytest.mark.parametrize("name, value", [("TZ", "Asia/Tokyo"), ("LANG", "C"), ("LC_ALL", "C"), ("TMPDIR", "/var/tmp"),
                                         ("HOME", "/nonexistent"), ("MALLOC_ARENA_MAX", "2")])
def test_a_locale_time_zone_temp_dir_home_or_malloc_setting_of_its_own_runs_it_the_ordinary_way(server, name, value):
    proc, seen, _ = echo(server, env={name: value})
    assert proc.returncode == 0 and seen["pid"] == proc.pid


@pytest.mark.multiprocess
def test_a_native_thread_nobody_named_stops_the_server_serving():
    code = ("from pipeline.warm import fresh; import faulthandler; before = fresh.threads(); "
            "assert fresh.threads_not_forkable(before, set()) == ''; "
            "faulthandler.dump_traceback_later(600); print(fresh.threads_not_forkable(before, set()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 native thread(s) not known to survive a fork"), out.stdout


@pytest.mark.multiprocess
def test_without_a_server_it_runs_the_ordinary_way(server, tmp_path):
    write_shims(str(tmp_path), str(tmp_path / "no-such-socket"), str(Path(sys.executable).parent))
    proc, seen, _ = echo(server, env={"PATH": f"{tmp_path}{os.pathsep}{Path(sys.executable).parent}"})
    assert proc.returncode == 0 and seen["pid"] == proc.pid
    assert str(tmp_path) not in seen["path"] and seen["executable"] == str(Path(sys.executable).absolute())


@pytest.mark.multiprocess
def test_a_python_that_is_a_wrapper_of_the_servers_interpreter_is_served_and_another_is_not(server, tmp_path):
    """A GPU machine's `python` can be a script that execs the image's interpreter (scripts/gpu_env.sh):
    the same interpreter, served. One that runs another virtual environment's is not."""
    other = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True, timeout=120)
    for name, line, served in (("same", f'exec {sys.executable} "$@"', True),
                               ("other", f'exec {other / "bin" / "python"} "$@"', False)):
        wrapper, shims = tmp_path / name / "wrapper", tmp_path / name / "shims"
        wrapper.mkdir(parents=True)
        shims.mkdir()
        (wrapper / "python").write_text(f"#!/bin/sh\n{line}\n")
        (wrapper / "python").chmod(0o755)
        write_shims(str(shims), server[1], str(wrapper))
        proc, seen, _ = echo(server, env={"PATH": f"{shims}{os.pathsep}{wrapper}{os.pathsep}{server[2]['PATH']}"})
        assert proc.returncode == 0 and (seen["pid"] != proc.pid) == served, name


@pytest.mark.multiprocess
@pytest.mark.kill
def test_an_exception_and_a_kill_end_the_command_as_they_end_the_stage(server):
    proc = command(server, "raise")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "ValueError: boom in the stage" in err
    proc = command(server, "kill")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.multiprocess
def test_python_exit_work_is_done_atexit_threads_and_unclosed_files(server, tmp_path):
    stem = str(tmp_path / "f")
    proc = command(server, "finish", stem)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    for suffix in (".atexit", ".thread"):
        assert Path(stem + suffix).read_text() == "ran"
    assert Path(stem + ".unclosed").read_text() == "flushed at exit"


def _wait_for(path: Path, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int, timeout: float = 30) -> bool:  # a poll: wide for a loaded machine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.multiprocess
@pytest.mark.kill
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_the_command_reaches_its_stage(server, tmp_path, how):
    pidfile = tmp_path / "pid"
    proc = command(server, "sleep", str(pidfile))
    stage = _wait_for(pidfile)
    assert stage != proc.pid
    proc.send_signal(how)
    proc.communicate(timeout=30)
    assert _gone(stage), "the stage outlived its command"
    assert proc.returncode != 0


@pytest.mark.multiprocess
@pytest.mark.kill
def test_ctrl_z_stops_the_stage_with_its_command_and_fg_continues_it(server, tmp_path):
    import psutil

    pidfile = tmp_path / "pid"
    proc = command(server, "sleep", str(pidfile))
    stage = psutil.Process(_wait_for(pidfile))
    try:
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 30  # a poll: wide for a loaded machine
        while stage.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stage.status() == psutil.STATUS_STOPPED
        proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 30  # a poll: wide for a loaded machine
        while stage.status() == psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stage.status() != psutil.STATUS_STOPPED
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert _gone(stage.pid)


def test_only_a_plain_python_m_pipeline_stage_is_served():
    assert stage_command(["python", "-m", "pipeline", "train", "--seed", "0"]) == ("pipeline.train", ["--seed", "0"])
    assert stage_command(["python", "-X", "importtime", "-m", "pipeline", "train"]) is None
    assert stage_command(["python", "-m", "pipeline.train", "--seed", "0"]) is None  # always a new process
    assert stage_command(["python", "-m", "pipeline", "grid"]) is None
    assert stage_command(["python", "-m", "pipeline"]) is None
    assert stage_command(["python", "-m", "pytest"]) is None


# Output files that hold clocks (train.json's times and throughput, and the report's training cost
# table, which shows them): their hashes differ between any two runs, warm or cold; every other
# output must hash the same.
CLOCKS = {"train.json", "knockout.json", "report.md", "report.html"}  # each records its wall time
TIMING = re.compile(r"\d+(\.\d+)?\s*(s|ms|min|tok/s|it/s|examples/s)\b|\d+:\d\d(:\d\d)?|\d+(\.\d+)?%")


def output_hashes(project: Path) -> dict[str, str]:
    """Every output's hash as dvc.lock records it; an output that holds a file with clocks
    (CLOCKS) file by file instead, those files left out: {path: md5}."""
    import hashlib

    hashes = {}
    for stage in yaml.safe_load((project / "dvc.lock").read_text())["stages"].values():
        for out in stage.get("outs", []):
            path = project / out["path"]
            files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
            if not any(f.name in CLOCKS for f in files):
                hashes[out["path"]] = out["md5"]
                continue
            for f in files:
                if f.name not in CLOCKS and f.name != ".gitignore":
                    hashes[str(f.relative_to(project))] = hashlib.md5(f.read_bytes()).hexdigest()
    return hashes


def stage_stderr(text: str) -> list[str]:
    """A run's stderr (its stages' own, DVC passes it through), timings masked."""
    return [TIMING.sub("#", line) for line in text.splitlines() if line.strip()]


@pytest.mark.repro
@pytest.mark.slow
def test_the_study_warm_is_the_study_cold(tmp_path):
    """The tiny study, serial, warm and cold: the same stages run, the same output hashes in
    dvc.lock (but for the files that hold clocks), the same stderr from every stage (but for its
    timings), the same results, and the warm one's later stages were served."""
    results, stderr = {}, {}
    for mode in ("warm", "cold"):
        project = tmp_path / mode
        env = make_project(project, tiny_params(seeds=[0]))
        args = ["--cold"] if mode == "cold" else []  # -j 1: `bash run.sh repro -j 1`, a serial `dvc repro`
        run = subprocess.run([sys.executable, "-m", "pipeline.grid", "-j", "1", *args], cwd=project, env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        results[mode], stderr[mode] = project, run.stderr
    warm, cold = (output_hashes(results[m]) for m in ("warm", "cold"))
    assert set(warm) == set(cold)
    assert sorted(path for path in warm if warm[path] != cold[path]) == []
    assert stage_stderr(stderr["warm"]) == stage_stderr(stderr["cold"])
    log = (results["warm"] / ".dvc/tmp/grid/warm.log").read_text()
    # Stages that came before the server's imports were done ran cold (they never wait for it);
    # those after were served: the last two train stages, their evaluates, the knock-out, the report.
    assert log.count("served pipeline.evaluate (") >= 1 and "served pipeline.report (" in log, log
    for run in ("baseline-0", "no_positional-0"):
        warm, cold = (json.loads((results[m] / "data/runs" / run / "train.json").read_text()) for m in results)
        timing = {k for k in warm if k.endswith(("_s", "_at", "per_s")) or k in ("load", "mfu")}
        assert {k: v for k, v in warm.items() if k not in timing} == {k: v for k, v in cold.items() if k not in timing}
        warm, cold = (json.loads((results[m] / "data/eval" / run / "eval.json").read_text()) for m in results)
        assert warm == cold


@pytest.mark.gpu
def test_on_a_gpu_a_stage_forked_from_the_warm_imports_can_use_cuda():
    """The server serves on a GPU machine only if a fork of it can run a CUDA kernel: its imports
    must not have started CUDA (torch cannot start it again in a forked child)."""
    code = ("import sys; from pipeline.warm import server; check = server._cuda_check(); "
            "server._warm_imports(server.EARLY); server._warm_imports(server._stage_imports()); "
            "server._warm_imports(server.LATER); sys.exit(0 if server._cuda_check_passed(check) else 1)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=300)


@pytest.mark.multiprocess
@pytest.mark.parametrize("kernel_runs, started_since, passed", [
    (True, False, True), (False, False, False), (True, True, False)])
def test_the_cuda_check_runs_in_a_child_and_reads_this_process_after(monkeypatch, tmp_path, kernel_runs,
                                                                      started_since, passed):
    """The server forks its CUDA check before its imports and reads it after them: it passes only
    if the child ran its kernel and this process has not started CUDA meanwhile. Off a GPU
    machine there is no check. (The kernel itself: the `gpu` test above.)"""
    import torch

    from pipeline.warm import server

    monkeypatch.setattr(server, "NVIDIA_GPUS", str(tmp_path / "none"))
    assert server._cuda_check() is None
    monkeypatch.setattr(server, "NVIDIA_GPUS", str(tmp_path))
    monkeypatch.setattr(server, "_cuda_kernel_runs", lambda: kernel_runs)
    pid = server._cuda_check()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: started_since)
    assert server._cuda_check_passed(pid, timeout_s=60) is passed


def test_warm_starts_are_on_by_default_on_a_gpu_machine_too(monkeypatch):
    """Measured on an H200, cold and warm in one call, twice (reports/gpu/h200_run12_seed_study_tests.json,
    h200_run14_study.json): the nanoGPT study 65.0 and 65.9 s cold, 60.4 and 59.6 s warm, in either
    order. So warm unless --cold, a GPU machine or not, under the launcher and
    under a plain `dvc repro` (auto.py); shell stages are never served."""
    from pipeline.grid.repro import warm_wanted
    from pipeline.warm import auto

    ours = "cmd: python -m pipeline train --seed 0"
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "1")
    assert warm_wanted(False, False, ours) and warm_wanted(False, True, ours)
    assert not warm_wanted(True, False, ours)
    assert not warm_wanted(False, True, "cmd: sh check.sh")
    assert auto.wanted({"DVC_STAGE": "train@b-0", "ABLATION_LAB_GPU_COUNT": "1"})
    assert not auto.wanted({"DVC_STAGE": "train@b-0", "ABLATION_LAB_GPU_COUNT": "1", auto.SETTING: "0"})