"""How a stage's process ends, run cold or served warm (server.py): what it wrote
flushed and closed, then `os._exit`, without Python's teardown of the modules it imported.

That teardown is ~1.2 s of a stage's fixed cost (benchmarks/stage_overhead.py); exit_now does the
parts of the exit that matter instead (docs/scaling-out-and-cost-plan.md#warm-starts, "Fast exit").
run_main is the last line of every stage module and ends every stage the warm server serves, so
both end alike. How a stage ends, not what it computes: no stage's dvc.yaml deps list it
(tests/test_layout.py). Only the standard library here.
"""
from __future__ import annotations

import atexit
import gc
import io
import itertools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

# Exact types, matched in C (itertools.compress): isinstance against the io.IOBase ABC costs ~1 s
# over a torch process's half a million objects, a Python loop ~0.2 s, this ~0.1 s.
_WRITERS = frozenset((io.BufferedWriter, io.BufferedRandom, io.TextIOWrapper))


def run_main(main: Callable[[], object]) -> NoReturn:
    """Run a stage's main() as `python -m` would (an uncaught exception printed, sys.exit's code
    or message, Ctrl-C ending the process by SIGINT), then exit at once."""
    code: object = 0
    interrupted = False
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:  # noqa: BLE001 - reported as Python reports an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    exit_now(code, interrupted)


def exit_now(code: object = 0, interrupted: bool = False) -> NoReturn:
    """Python's exit with status `code` (an int, None, or a message for stderr), less the modules'
    teardown; `interrupted`: by SIGINT, as after a KeyboardInterrupt, so DVC sees a Ctrl-C."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # what Py_FinalizeEx does first: wait for non-daemon threads
    atexit._run_exitfuncs()
    gc.collect()  # unreferenced files are closed (and so flushed) here
    flush_open_files()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def flush_open_files() -> int:
    """Flush every file object still open for writing (one held by a module or a cache would
    otherwise lose its buffer: teardown is what flushed it). Objects frozen by gc.freeze (the
    warm server's own) are not visited. Returns how many were flushed."""
    objects = gc.get_objects()
    flushed = 0
    for obj in itertools.compress(objects, map(_WRITERS.__contains__, map(type, objects))):
        try:
            if not obj.closed and obj.writable():
                obj.flush()
                flushed += 1
        except (OSError, ValueError, AttributeError):  # a closed pipe, a detached wrapper
            pass
    return flushed
