"""Atomic file writes: a stage that fails never leaves a half-written output behind.

Everything is written to a temporary file in the destination's directory (same filesystem, so the
final `os.replace` is atomic) and renamed only once the write has succeeded.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds.

    Works for files and directories: whatever the block creates at the temporary path replaces
    `path` as a whole. On error the temporary file or directory is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A write killed mid-way (SIGKILL skips the cleanup below) left its temporary: one writer per
    # output path, so whatever is there now is stale.
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp*"):
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
    finally:
        _remove(tmp)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
