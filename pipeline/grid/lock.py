"""One launcher per workspace: .dvc/tmp/grid/lock, held (flock) for the launcher's life.

A second launcher would clear .dvc/tmp/grid under the first and run the same stages beside it, so
it stops at once, naming the first's pid. The kernel lets go of a flock however the holder ends,
so a stale file never blocks; the lifeline's guard holds it until it has ended what a killed
launcher left.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

NAME = "lock"


def hold(folder: Path) -> int:
    """Take the workspace's lock (its fd, to keep open); SystemExit naming the holder if taken."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise SystemExit(f"grid: another launcher (pid {holder}) is running in this workspace ({path}); "
                         "wait for it to end or stop it first") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def clear(folder: Path) -> None:
    """Empty the launcher's folder of the last study's logs, keeping the lock."""
    import shutil

    for entry in folder.iterdir():
        if entry.name == NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def repair_dvc_rwlock(dvc_tmp: Path = Path(".dvc/tmp")) -> bool:
    """DVC rewrites .dvc/tmp/rwlock in place: a DVC process killed mid-write leaves it cut short,
    and every later dvc command fails ("Unable to read RWLock-file") until it is deleted. Under
    DVC's own guard for it, one that is not JSON is removed (DVC reads a missing one as no locks
    held). True if it was."""
    import json

    path = dvc_tmp / "rwlock"
    if not path.is_file():
        return False
    import zc.lockfile  # DVC's own lock file library (DVC's rwlock guard is one)

    try:
        guard = zc.lockfile.LockFile(str(dvc_tmp / "rwlock.lock"))
    except zc.lockfile.LockError:  # a DVC process is editing it now: it is not a dead one's
        return False
    try:
        json.loads(path.read_text(encoding="utf-8"))
        return False
    except ValueError:
        path.unlink()
        return True
    finally:
        guard.close()
