"""Atomic file writes: a stage that fails never leaves a half-written output behind.

Everything is written to a temporary file in the destination's directory (same filesystem, so the
final `os.replace` is atomic) and renamed only once the write has succeeded.

A full disk is the failure a long run meets most, so it is recognised here, where every output is
written: a write that fails for want of space becomes DiskFull, whose message is the one line the
stage exits with (pipeline.params.stage_error): the file, the bytes it needed where known, the
space free at that moment, and what to do.

How a stage's process ends (run_main) is pipeline/warm/exit.py's.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, needed: int | None = None,
                stale_after_s: float | None = None) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds.

    Works for files and directories: whatever the block creates at the temporary path replaces
    `path` as a whole. On error the temporary file or directory is removed; an error caused by a
    full disk is raised as DiskFull naming the output (`needed`: its size in bytes, if known).
    `stale_after_s`: for an output several processes may write at once (a cache every run
    builds), only temporaries untouched that long are stale; another writer's live one is kept.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A write killed mid-way (SIGKILL skips the cleanup below) left its temporary: with one writer
    # per output path, whatever is there now is stale.
    now = time.time()
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp*"):
        with contextlib.suppress(OSError):  # another writer may rename or remove it meanwhile
            if stale_after_s is None or now - stale.lstat().st_mtime > stale_after_s:
                _remove(stale)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()  # the caller decides whether a file or a directory goes here
    try:
        yield tmp
        old = None
        if path.is_dir() and not path.is_symlink():
            # A directory cannot be replaced by one rename: move the old one aside first, so `path` is
            # always the whole old output or the whole new one (or, for an instant, absent).
            old = tmp.with_name(tmp.name + ".old")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        full = disk_full(exc, path, needed, tmp)  # before the cleanup frees the temporary's space
        if full is None:
            raise
        raise full from exc
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    data = text.encode("utf-8")
    with atomic_path(path, needed=len(data)) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


# -- a full disk ----------------------------------------------------------------------------------
FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left; disk quota exceeded
# torch.save given a path writes through its own C++ stream, which drops errno: a full disk reads
# "[enforce fail at inline_container.cc:672] . unexpected pos 268800 vs 268688" (or, for a small
# file, "basic_ios::clear: iostream error"). pipeline.training.checkpoint.save_torch writes through
# a Python file instead, so the OSError survives; these are recognised for any other torch.save.
TORCH_WRITE_FAILED = ("inline_container.cc", "basic_ios::clear", "PytorchStreamWriter failed")
WHAT_TO_DO = ("free space on it (finished runs' data/checkpoints/ folders; `dvc gc` for cached versions no "
              "longer needed), or checkpoint less: lower train.keep_checkpoints or raise train.checkpoint_every")


class DiskFull(OSError):
    """An output that did not fit on its disk; str() is the whole one-line explanation."""

    def __init__(self, path: str | os.PathLike, needed: int | None = None, free: int | None = None,
                 why: str = "no space left on the device", atomic: bool = True):
        super().__init__(errno.ENOSPC, why, str(path))
        self.path, self.needed, self.free, self.why, self.atomic = Path(path), needed, free, why, atomic

    def __str__(self) -> str:
        sizes = ([f"needs {size(self.needed)}"] if self.needed is not None else []) + [
            "free space unknown" if self.free is None else f"{size(self.free)} free there"]
        kept = "; nothing half-written is left and earlier outputs are intact" if self.atomic else ""
        return f"{self.path}: {self.why} ({', '.join(sizes)}){kept}. To go on: {WHAT_TO_DO}"

    def moved(self, tmp: Path, path: Path) -> "DiskFull":
        """The same error naming the output instead of its temporary (`tmp` -> `path`)."""
        name = self.path
        if name == tmp or tmp in name.parents:
            name = path / name.relative_to(tmp)
        return DiskFull(name, self.needed, self.free, self.why, self.atomic)


@contextlib.contextmanager
def explain_full_disk(path: str | os.PathLike, tmp: Path | None = None) -> Iterator[None]:
    """Inside the block, an error caused by a full disk is raised as DiskFull naming `path` (and a
    file under `tmp`, a scratch folder, as the same file under `path`): for outputs built elsewhere
    first, as the report stage builds its folder."""
    try:
        yield
    except BaseException as exc:
        full = disk_full(exc, path, None, tmp)
        if full is None:
            raise
        raise full from exc


def size(n: int) -> str:
    """Bytes as people read them: 268,800 B, 1.2 MB, 3.4 GB (decimal units, as `df -H`)."""
    if n < 10_000:
        return f"{n:,} B"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:,} B"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Space free to this user on the filesystem that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    for where in (path, *path.parents):
        if where.exists():
            try:
                return shutil.disk_usage(where).free
            except OSError:
                return None
    return None


def disk_full(exc: BaseException, path: str | os.PathLike | None = None, needed: int | None = None,
              tmp: Path | None = None, atomic: bool = True) -> DiskFull | None:
    """`exc` as a DiskFull if a full disk caused it (anywhere in its chain), else None. `path` is
    the output being written where the error itself names no file; `tmp` its temporary, mapped
    back to `path` in the message."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, DiskFull):
            found = cause
            break
        if isinstance(cause, OSError) and cause.errno in FULL:
            where = getattr(cause, "filename", None) or path
            found = DiskFull(where or "(a file the system did not name)", needed, free_bytes(where or "."),
                             atomic=atomic)
            break
        text = str(cause)
        if isinstance(cause, RuntimeError) and path is not None and any(m in text for m in TORCH_WRITE_FAILED):
            why = f"torch could not write it ({text.splitlines()[0].strip()}), as on a full disk"
            found = DiskFull(path, needed, free_bytes(path), why, atomic)
            break
        cause = cause.__cause__ or cause.__context__
    else:
        return None
    return found.moved(Path(tmp), Path(path)) if tmp is not None and path is not None else found
