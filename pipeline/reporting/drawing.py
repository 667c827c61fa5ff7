"""The report's PNGs drawn side by side, each in a forked child, while the report goes on.

Rendering (matplotlib's layout and Agg drawing at savefig) is most of a figure's cost: one after
another the default study's five figures took 3.7 of the report stage's 11 s on 2 cores. A figure
is built in memory before it is saved, so a fork inherits it whole, nothing pickled.

The stage's command turns it on (`forking()`, around the report); a library call of the report
(the tests') draws in its own process. Inside `side_by_side()` with forking on, `save(fig, path)`
forks a child that writes the PNG and returns at once (at most as many children at once as this
process may use cores). `finish(meanwhile)` calls `meanwhile` (the parent's own work that needs no
figure), then waits for every child: a figure that failed raises DrawingError naming it (its
traceback is on stderr above), a full disk the OSError it was. Leaving the block waits for any
child still drawing (after an error, before the build folder goes). Otherwise `save` draws here
and now, and `finish` does nothing.
"""
from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

DPI = 110
_on: list[bool] = []  # forking() turns it on for its block
_running: dict[int, Path] | None = None  # child pid -> its PNG, inside side_by_side()
_failed: list[tuple[Path, int]] = []


@contextmanager
def forking() -> Iterator[None]:
    _on.append(hasattr(os, "fork"))
    try:
        yield
    finally:
        _on.pop()


class DrawingError(RuntimeError):
    """A figure could not be drawn; the message names it."""


def save(fig, path: Path) -> None:
    if _running is None:
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
        return
    while len(_running) >= _cores():
        _reap(next(iter(_running)))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: this figure, then out without running the parent's exit handlers
        code = 1
        try:
            fig.savefig(path, dpi=DPI, bbox_inches="tight")
            code = 0
        except OSError as exc:
            code = errno.ENOSPC if exc.errno == errno.ENOSPC else 1
            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - whatever it was, the parent names the figure
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _running[pid] = Path(path)


@contextmanager
def side_by_side() -> Iterator[None]:
    global _running
    if _running is not None or not (_on and _on[-1]):  # nested (the outer block waits), or drawn here
        yield
        return
    _running, _failed[:] = {}, []
    try:
        yield
    finally:
        while _running:
            _reap(next(iter(_running)))
        _running = None


def finish(meanwhile: Callable[[], None] | None = None) -> None:
    if _running is None:
        return
    if meanwhile is not None:
        meanwhile()
    while _running:
        _reap(next(iter(_running)))
    failed, _failed[:] = list(_failed), []
    for path, code in failed:
        if code == errno.ENOSPC:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    if failed:
        raise DrawingError("could not draw " + ", ".join(p.name for p, _ in failed) + " (the traceback above)")


def _reap(pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    path = _running.pop(pid)
    code = os.waitstatus_to_exitcode(status)
    if code:
        _failed.append((path, code))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
