"""What a forked stage must get back to be the new process it stands for (server.py).

A fork of the warm server carries what the server's imports did to the interpreter (warnings
filters, the logging root's handlers, sys.path) and the server's umask and resource limits:
`fresh_state` records the first before the imports, `restore` puts it back in each stage with the
command's umask and limits. A fork loses threads: `threads_not_forkable` says when not to serve.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

# Native threads an import starts, by the module that starts them: each known to survive a fork
# (the child has the forking thread alone; OpenBLAS re-creates its pool through pthread_atfork,
# jemalloc's background thread is re-created on demand). Imported first, one by one, so that each
# new thread is named; one that appears later, unnamed, stops the server serving.
NAMED_THREADS = {"numpy": "OpenBLAS's pool", "pyarrow": "jemalloc's background thread",
                 "scipy.linalg": "scipy's OpenBLAS pool"}


def threads() -> set[str]:
    """This process's native threads (ids), the main one included."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:  # not Linux: Python's own count stands in
        return {str(n) for n in range(threading.active_count())}


def thread_name(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "?"


def threads_not_forkable(main_thread: set[str], named: set[str]) -> str:
    """Why forking this process would not give a stage what a new process has ("" if it would): a
    Python thread, or a native one not in NAMED_THREADS, would not exist (or work) in the fork."""
    if threading.active_count() > 1:
        return "a Python thread is running: forking a threaded process is not safe"
    unnamed = sorted(threads() - main_thread - named)
    if unnamed:
        return (f"{len(unnamed)} native thread(s) not known to survive a fork "
                f"({', '.join(thread_name(t) for t in unnamed)})")
    return ""


def fresh_state() -> dict:
    """What a new interpreter has, before the imports change it (restored in each stage)."""
    import logging

    root = logging.getLogger()
    return {"filters": list(warnings.filters), "showwarning": warnings.showwarning,
            "formatwarning": warnings.formatwarning, "path": list(sys.path[1:]),
            "root": (list(root.handlers), root.level), "disable": logging.root.manager.disable}


def restore(fresh: dict, request: dict) -> None:
    """In a stage's child: undo what the server's imports changed of a new interpreter's state,
    and take the command's umask and resource limits."""
    import logging

    warnings.filters[:] = fresh["filters"]
    warnings._filters_mutated()  # the modules' "already warned" registries are stale now
    warnings.showwarning, warnings.formatwarning = fresh["showwarning"], fresh["formatwarning"]
    root = logging.getLogger()
    root.handlers[:] = fresh["root"][0]
    root.setLevel(fresh["root"][1])
    logging.disable(fresh["disable"])
    sys.path[:] = [request["cwd"], *fresh["path"]]
    os.umask(request["umask"])
    import resource

    for name, pair in request["limits"].items():
        if resource.getrlimit(getattr(resource, name)) != tuple(pair):
            resource.setrlimit(getattr(resource, name), tuple(pair))
