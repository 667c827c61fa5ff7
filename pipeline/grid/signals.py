"""The launcher's signals, installed before it does anything else.

Ctrl-C, SIGTERM and SIGHUP raise `Stopped` where the launcher is, so that its `finally` blocks end
the running DVC processes, the warm server and the lifeline's guard, in that order; then the
launcher ends by the signal itself, as the shell expects. A second signal during that bounded
clean-up is ignored. Ctrl-Z stops every running group with the launcher, and `fg` continues them.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time

STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_held = 0
_pending: list[int] = []
_forward = []  # callables taking a signal number: pass it to the processes running


class Stopped(BaseException):
    """A stop signal arrived (BaseException: no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def install(forward=None) -> None:
    """Stop signals raise Stopped here, Ctrl-Z is passed to `forward` (a callable taking a signal
    number: the processes running get it); a call again replaces the last one's `forward`."""
    for signum in STOP:
        signal.signal(signum, _stop)
    signal.signal(signal.SIGTSTP, _pause)
    _forward.clear()
    if forward is not None:
        _forward.append(forward)


def children_signal(signum: int) -> int:
    """What the running processes get when the launcher gets `signum`."""
    return signal.SIGTERM if signum == signal.SIGHUP else signum


def _stop(signum, _frame) -> None:
    if _held:  # a process is being started: stop once it is known to the launcher
        _pending.append(signum)
        return
    for s in STOP:
        signal.signal(s, signal.SIG_IGN)
    raise Stopped(signum)


def _pause(signum, _frame) -> None:
    # Each DVC process is a session of its own, so its group is orphaned and the kernel drops a
    # SIGTSTP whose action is to stop: SIGTSTP first (a warm stage's command catches it and stops
    # its stage), then SIGSTOP for the rest (DVC, the shell, a stage run cold).
    for forward in _forward:
        forward(signal.SIGTSTP)
    time.sleep(0.2)
    for forward in _forward:
        forward(signal.SIGSTOP)
    # SIGSTOP, not SIGTSTP: this group may be orphaned too (started by a script, nohup, CI).
    os.kill(os.getpid(), signal.SIGSTOP)
    for forward in _forward:
        forward(signal.SIGCONT)


@contextlib.contextmanager
def held():
    """A stop signal that arrives in the block takes effect at its end."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending:
            signal.raise_signal(_pending.pop(0))


def end_by(signum: int) -> None:
    """End this process by `signum`, as the shell expects of a process a signal stopped."""
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached
