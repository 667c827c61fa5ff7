"""The command's side of warm starts: the hand-over to a server (server.py), and the `python` the
grid launcher puts first on the stages' PATH (write_shims); what is served and what is exec'd to
the real `python` instead: docs/scaling-out-and-cost-plan.md#warm-starts. Standard library only:
it starts with `-SE`, loaded by path without site-packages, in a few ms.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

STAGES = {"check_params", "download", "filter", "train_bpe", "encode", "train", "evaluate", "knockout", "report"}
# Read by torch, numpy, MLflow and the rest when imported, not when a function runs: set otherwise
# than in the server that imported them, a served stage would not be the stage a new process runs.
IMPORT_TIME_ENV = ("OMP_", "MKL_", "ATEN_", "ONEDNN_", "DNNL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "LD_",
                   "PYTHON", "MPL", "MATPLOTLIB", "MLFLOW_", "NUMEXPR_", "SQLALCHEMY",
                   # read once and kept: the locale (C library and Python's), time zone, temp dir
                   # (tempfile.gettempdir caches it), home (caches found from it), malloc's tuning
                   "LC_", "LANG", "TZ", "TMPDIR", "TEMP", "TMP", "HOME", "MALLOC_")
# Resource limits a fork cannot take on exactly: memory the server has already mapped (address
# space, data, stack) is over a lower limit from the start. The others are set in the stage.
MEMORY_LIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK")
TORCHRUN = ("LOCAL_RANK", "TORCHELASTIC_RUN_ID")


def fingerprint(env) -> dict:
    """What must match between the command and the server (the same interpreter, shim checks) for a
    fork to run what a new process would: the variables read at import time (PYTHONPATH among them)."""
    return {"env": sorted((k, v) for k, v in env.items() if k.startswith(IMPORT_TIME_ENV))}


def limits() -> dict[str, list[int]]:
    """This process's resource limits, {RLIMIT_name: [soft, hard]} (`ulimit -a`)."""
    import resource

    return {name: list(resource.getrlimit(getattr(resource, name)))
            for name in sorted(dir(resource)) if name.startswith("RLIMIT_")}


def limits_fit(mine: dict, server: dict) -> bool:
    """Whether a fork of the server can take the command's limits exactly: the memory ones equal,
    no hard limit above the server's (only a privileged process could raise it)."""
    infinity = -1  # resource.RLIM_INFINITY

    def above(a: int, b: int) -> bool:
        return b != infinity and (a == infinity or a > b)

    for name, (soft, hard) in mine.items():
        theirs = server.get(name)
        if theirs is None or (name in MEMORY_LIMITS and [soft, hard] != list(theirs)) or above(hard, theirs[1]):
            return False
    return True


def umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask

# -- messages: 4-byte length + JSON --------------------------------------------------------------

def send(sock: socket.socket, obj) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("warm: the other side closed the socket")
        buf += chunk
    return buf


def recv(sock: socket.socket):
    (n,) = struct.unpack("!I", recv_exact(sock, 4))
    return json.loads(recv_exact(sock, n))


# -- the command's side: a `python` first on the stages' PATH --------------------------------------

SHIM = """#!{python} -SE
# Written by pipeline/warm/shim.py for one study: serves `python -m pipeline <stage>` warm.
import importlib.util
spec = importlib.util.spec_from_file_location("ablation_lab_shim", {shim!r})
shim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shim)
shim.shim({socket!r}, {same!r}, {python!r})
"""


def write_shims(folder: str, socket_path: str, path: str | None = None) -> None:
    """`python` and `python3` in `folder`, to go first on PATH (`path`, default this process's).
    Served only where PATH's `python` is this interpreter, asked once here: a wrapper script that
    execs it (as scripts/gpu_env.sh makes) counts, another venv does not."""
    import subprocess

    for name in ("python", "python3"):
        found, same = _which(name, os.environ.get("PATH", "") if path is None else path), None
        if found:
            try:
                ran = subprocess.run([found, "-c", "import sys; print(sys.executable); print(sys.prefix)"],
                                     capture_output=True, text=True, timeout=60)
                same = found if ran.stdout.split("\n")[:2] == [sys.executable, sys.prefix] else None
            except (OSError, subprocess.SubprocessError):
                pass
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(SHIM.format(python=sys.executable, shim=os.path.abspath(__file__), socket=socket_path, same=same))
        os.chmod(path, 0o755)


def stage_command(argv: list[str]) -> tuple[str, list[str]] | None:
    """(pipeline.<stage>, args) for a plain `python -m pipeline <stage> ARGS`; None for anything
    else (an interpreter option before -m, another module, `python -m pipeline.<stage>`)."""
    if argv[1:3] != ["-m", "pipeline"] or len(argv) < 4 or argv[3] not in STAGES:
        return None
    return f"pipeline.{argv[3]}", argv[4:]


def _which(name: str, path: str) -> str | None:
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def shim(socket_path: str, same: str | None, server_python: str) -> None:
    """The `python` of write_shims: served where PATH's `python` is `same` (the server's), else that
    `python` exec'd with the same arguments; either way the stage sees PATH without the shims."""
    name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if os.path.abspath(p or ".") != here)
    real = _which(name, env["PATH"])
    if real is None:
        print(f"{name}: command not found", file=sys.stderr)
        os._exit(127)
    command = stage_command([name, *args])
    if command and real == same and not any(k in env for k in TORCHRUN):
        hand_over(socket_path, command, env, server_python)  # returns when it cannot be served exactly
    os.execve(real, [real, *args], env)


def hand_over(path: str, command: tuple[str, list[str]], env: dict, executable: str) -> None:
    """Run the command in the server and exit as it did; return when it cannot be served exactly."""
    for _ in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            hello = recv(sock)
            if command[0] in hello.get("only", command[:1]):
                break
            # The early server (server.py), while the server imports torch and the rest, serves the
            # data stages only: the others wait until it is ready, then ask again.
            sock.sendall(b"W")
            sock.recv(1)  # end of file: the server ready, or gone
        except (OSError, EOFError, ValueError):
            sock.close()
            return
        sock.close()
    else:
        return
    mine = limits()
    theirs = hello.get("fingerprint", {})
    if (not hello.get("serving") or theirs.get("env") != json.loads(json.dumps(fingerprint(env)))["env"]
            or not limits_fit(mine, theirs.get("limits", {}))):
        sock.close()
        return
    try:
        streams = [fd if _is_open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
        socket.send_fds(sock, [b"F"], streams)
        send(sock, {"module": command[0], "args": command[1], "cwd": os.getcwd(), "env": env,
                     "executable": executable, "umask": umask(), "limits": mine})
    except OSError:  # nothing has started: run it the ordinary way
        sock.close()
        return

    def forward(signum, _frame):
        try:
            sock.sendall(b"S" + bytes([signum]))
        except OSError:
            pass

    def pause(_signum, _frame):  # Ctrl-Z: the stage stops with this command, and goes on with it
        # SIGSTOP, not SIGTSTP: under the grid launcher this process's group is orphaned (DVC's
        # own session), and the kernel drops a SIGTSTP whose action is to stop.
        forward(signal.SIGSTOP, None)
        os.kill(os.getpid(), signal.SIGSTOP)
        forward(signal.SIGCONT, None)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCONT):
        signal.signal(signum, forward)
    signal.signal(signal.SIGTSTP, pause)
    try:
        status = recv(sock)
    except (OSError, EOFError, ValueError):
        status = {"exit": 1}
        print("warm: the server went away while the stage ran (its own output is above)", file=sys.stderr)
    if "signal" in status:  # die as the stage did: DVC and the shell see the same status
        try:
            signal.signal(status["signal"], signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL's cannot be set, nor needs to be
            pass
        os.kill(os.getpid(), status["signal"])
    os._exit(status["exit"])


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
