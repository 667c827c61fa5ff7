"""What ties a study's processes to the launcher's life, however the launcher ends.

    python -m pipeline.grid.lifeline     # the guard (what Lifeline starts); reads its stdin

Nothing runs in a launcher killed by SIGKILL or the OOM killer, and its DVC processes are
sessions of their own, so the launcher first starts a guard: a standard-library process in a
session of its own, whose stdin is a pipe only the launcher writes to, naming each process group
and folder it starts. When the pipe ends, however the launcher died, the guard ends the groups
still named (SIGTERM, SIGCONT, SIGKILL after GRACE_S) and removes the folders. It holds the
workspace lock (lock.py) until then, so that a new launcher cannot start among the old one's
processes. `tie()` gives a child (the warm server) a pipe of its own that ends with the launcher.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

GRACE_S = 2.0  # a stage's own SIGTERM handling (atexit, MLflow) before SIGKILL


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a group id reused by someone else's processes: not ours
        return False


def end_groups(groups: set[int], grace_s: float = GRACE_S, first: int = signal.SIGTERM, reap=None) -> None:
    """Send `first` (and SIGCONT, so a stopped process gets it) to each group, SIGKILL to what is
    left after `grace_s`; return once none is left (at most ~1 s after the SIGKILL). `reap`: called
    before each look, to wait for the caller's own children (a zombie still counts as a member)."""
    reap = reap or (lambda: None)
    for group in groups:
        for signum in (first, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)
    deadline = time.monotonic() + grace_s
    reap()
    left = {g for g in groups if alive(g)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        reap()
        left = {g for g in left if alive(g)}
    for group in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    deadline = time.monotonic() + 1
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        reap()
        left = {g for g in left if alive(g)}


class Lifeline:
    """The launcher's side: the guard started, groups and folders named to it."""

    def __init__(self, keep_fds: tuple[int, ...] = ()):
        read, self._write = os.pipe()  # both ends close on exec: only the guard gets `read`
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.guard = subprocess.Popen([sys.executable, "-m", "pipeline.grid.lifeline"], stdin=read,
                                      stdout=subprocess.DEVNULL, start_new_session=True, pass_fds=keep_fds,
                                      cwd=here)
        os.close(read)
        self._ties: list[int] = []

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError):  # a guard gone (killed by hand): the launcher goes on
            os.write(self._write, (line + "\n").encode())

    def group(self, pgid: int) -> None:
        self._say(f"group {pgid}")

    def ended(self, pgid: int) -> None:
        self._say(f"ended {pgid}")

    def folder(self, path: str) -> None:
        self._say(f"folder {path}")

    def workspace(self, path: str) -> None:
        """The project: its DVC rwlock is mended once the groups are gone (lock.repair_dvc_rwlock)."""
        self._say(f"workspace {path}")

    def tie(self) -> int:
        """A new pipe's read end for a child (pass_fds, then close it here): EOF once we are gone."""
        read, write = os.pipe()
        self._ties.append(write)
        return read

    def close(self, wait_s: float = 5.0) -> None:
        """The launcher's normal end: the guard finds nothing left (or ends what is) and exits."""
        for fd in [self._write, *self._ties]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ties = []
        try:
            self.guard.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.guard.kill()
            self.guard.wait()


def guard(stream) -> None:
    """Read the launcher's lines until its end; then end what it left."""
    groups: set[int] = set()
    folders: list[str] = []
    workspace = None
    for line in stream:
        verb, _, arg = line.decode(errors="replace").rstrip("\n").partition(" ")
        if verb == "group":
            groups.add(int(arg))
        elif verb == "ended":
            groups.discard(int(arg))
        elif verb == "folder":
            folders.append(arg)
        elif verb == "workspace":
            workspace = arg
    left = {g for g in groups if alive(g)}
    end_groups(left)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    if left and workspace:  # a DVC process killed mid-write leaves DVC's rwlock unreadable
        from pathlib import Path

        from pipeline.grid.lock import repair_dvc_rwlock

        with contextlib.suppress(Exception):  # noqa: BLE001 - the next launcher mends it too
            repair_dvc_rwlock(Path(workspace) / ".dvc" / "tmp")


if __name__ == "__main__":
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # a terminal's signals are the launcher's to handle
    guard(sys.stdin.buffer)
    sys.stdout.flush()
    os._exit(0)  # nothing to tear down worth waiting for
