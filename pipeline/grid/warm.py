"""The launcher's side of warm starts (pipeline/warm/): a server for the length of a study, and its
`python` shims first on PATH, so that every stage DVC starts is served by it.

    python -m pipeline.grid.warm [--] CMD [ARGS..]   # run CMD (say `dvc repro`) with warm starts
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

from pipeline.grid.signals import held
from pipeline.warm.auto import SETTING
from pipeline.warm.server import start_server, stop_server
from pipeline.warm.shim import write_shims


@contextlib.contextmanager
def warm_starts(log=None, lifeline=None):
    """For the block: a server, and its `python` shims first on this process's PATH, so that DVC's
    stages are served warm; the server and its folder named and tied to `lifeline`."""
    folder = tempfile.mkdtemp(prefix="ablation-warm-")  # short: a socket's path is < 108 bytes
    path = os.path.join(folder, "socket")
    with held():  # a Ctrl-C now waits until the server is known to the lifeline (ended with the rest)
        if lifeline is not None:
            lifeline.folder(folder)
        tie = lifeline.tie() if lifeline is not None else None
        server = start_server(path, log, tie=tie, folder=folder)
        if tie is not None:
            os.close(tie)  # the server's now
            lifeline.group(server.pid)
    old, setting = os.environ.get("PATH", ""), os.environ.get(SETTING)
    try:
        write_shims(folder, path)
        os.environ["PATH"] = folder + os.pathsep + old
        os.environ[SETTING] = "0"  # this server serves them: no stage starts one of its own (auto.py)
        yield
    finally:
        os.environ["PATH"] = old
        if setting is None:
            os.environ.pop(SETTING, None)
        else:
            os.environ[SETTING] = setting
        stop_server(server, path)
        shutil.rmtree(folder, ignore_errors=True)
        if lifeline is not None:
            lifeline.ended(server.pid)


if __name__ == "__main__":
    command = sys.argv[2:] if sys.argv[1:2] == ["--"] else sys.argv[1:]
    if not command:
        raise SystemExit("warm: usage: python -m pipeline.grid.warm [--] CMD [ARGS..]")
    with warm_starts():
        sys.exit(subprocess.run(command).returncode)
