"""Warm starts under a plain `dvc repro` (and `dvc exp run`): no launcher, no shim on PATH.

dvc.yaml's `python -m pipeline <stage> ARGS` calls `engage` before it imports the stage (a few ms,
before torch): the stage is handed to its DVC process's server, or starts that server and runs
cold (docs/scaling-out-and-cost-plan.md#warm-starts, "Under a plain dvc repro"). ABLATION_LAB_WARM=0
turns it off; the grid launcher sets it for its own DVC processes. Standard library only.
"""
from __future__ import annotations

import hashlib
import os
import sys

from pipeline.warm.shim import TORCHRUN, hand_over, stage_command

SETTING = "ABLATION_LAB_WARM"
IDLE_S = 600  # a stage that trains for hours runs without it; the next one starts a new server
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish"}
LAST_STAGES = {"pipeline.report"}
PREFIX = "ablation-warm-auto-"
MAX_SOCKET_PATH = 100


def wanted(env=os.environ) -> bool:
    return env.get(SETTING, "") != "0" and "DVC_STAGE" in env


def engage() -> None:
    """Serve this stage from its DVC process's server, or start that server; return to run it cold."""
    if not wanted():
        return
    command = stage_command(list(getattr(sys, "orig_argv", [])))
    if command is None or any(k in os.environ for k in TORCHRUN):
        return
    dvc = dvc_process()
    if dvc is None:
        return
    folder = folder_for(dvc)
    path = os.path.join(folder, "socket")
    if os.path.exists(path):
        hand_over(path, command, dict(os.environ), sys.executable)  # exits as the stage did, if served
        return
    if command[0] in LAST_STAGES:
        return
    try:
        os.mkdir(folder, 0o700)
    except OSError:  # another stage is starting it, or a server is still importing: run cold
        return
    start(folder, path, dvc[0])


def dvc_process() -> tuple[int, str] | None:
    """(pid, start time) of the DVC process this stage runs under: the parent, or the parent's
    parent where DVC's shell did not exec the command; None if it is not DVC."""
    pid = os.getppid()
    for _ in range(2):
        comm = _read(f"/proc/{pid}/comm")
        if comm is None:
            return None
        if comm.strip() in SHELLS:
            pid = _parent(pid)
            continue
        cmdline = (_read(f"/proc/{pid}/cmdline") or "").split("\0")
        if not any(os.path.basename(word) == "dvc" for word in cmdline):
            return None
        return pid, _start_time(pid)
    return None


def folder_for(dvc: tuple[int, str]) -> str:
    """One folder per DVC process (its pid and start time) and interpreter: a stage of another
    venv or another user never reaches this server."""
    key = "\0".join([str(dvc[0]), dvc[1], sys.executable, sys.prefix, os.path.realpath(os.getcwd())])
    name = f"{PREFIX}{os.getuid()}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    temp = next((os.environ[k] for k in ("TMPDIR", "TEMP", "TMP") if os.environ.get(k)), "/tmp")
    if len(os.path.join(temp, name, "socket.new").encode()) > MAX_SOCKET_PATH:
        temp = "/tmp"  # a socket's path must fit the kernel's 108 bytes
    return os.path.join(temp, name)


def start(folder: str, path: str, dvc: int) -> None:
    """The server, in a session of its own, its output in .dvc/tmp/warm.log; not waited for."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    log_dir = os.path.join(os.environ.get("DVC_ROOT", os.getcwd()), ".dvc", "tmp")
    try:
        log = open(os.path.join(log_dir, "warm.log"), "w", encoding="utf-8")
    except OSError:
        log = subprocess.DEVNULL
    with open(os.path.join(folder, "dvc"), "w", encoding="utf-8") as f:
        f.write(str(dvc))
    subprocess.Popen([sys.executable, "-m", "pipeline.warm.server", "--serve", path, "--folder", folder,
                      "--watch", str(dvc), "--idle", str(IDLE_S)],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                     start_new_session=True, close_fds=True)


def sweep(temp: str) -> None:
    """Remove the folders of servers that were killed outright (SIGKILL, the OOM killer) and could
    not remove their own: those whose DVC process has ended. The server calls it at its start."""
    import shutil

    mine = f"{PREFIX}{os.getuid()}-"
    try:
        names = [n for n in os.listdir(temp) if n.startswith(mine)]
    except OSError:
        return
    for name in names:
        pid = _read(os.path.join(temp, name, "dvc"))
        if pid and pid.strip().isdigit() and not os.path.exists(f"/proc/{pid.strip()}"):
            shutil.rmtree(os.path.join(temp, name), ignore_errors=True)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int) -> list[str]:
    text = _read(f"/proc/{pid}/stat") or ""
    return text[text.rfind(")") + 2:].split()  # after the command name, which may hold spaces


def _parent(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else -1


def _start_time(pid: int) -> str:
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""
