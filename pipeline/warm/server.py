"""Warm starts: a stage's process forked from one that has already imported torch and the rest.

    python -m pipeline.warm.server --serve SOCKET [--lifeline FD] [--parent PID] [--folder DIR]
                                   [--watch PID --idle S]

What it serves, how, and what runs cold instead: docs/scaling-out-and-cost-plan.md#warm-starts.
Started by the grid launcher (pipeline/grid/warm.py) or a plain `dvc repro`'s first stage
(auto.py); commands come through shim.py, and each forked stage gets back what a new interpreter
has (fresh.py). It ends with whoever started it (a lifeline pipe, a parent-death signal, a watched
pid), removing its socket and folder; a command's handler dies with the server, a stage with its
handler.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import random
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from pipeline.warm.exit import run_main
from pipeline.warm.fresh import NAMED_THREADS, fresh_state, restore, threads, threads_not_forkable
from pipeline.warm.shim import STAGES, fingerprint, limits, recv, send

# What the stages import later, inside functions (benchmarks/stage_overhead.py lists it per stage),
# imported after the stage modules; MLflow's database store is the report's and every mirror's
# ~1.3 s (an sqlite URI is the default). Our own modules are then forgotten.
LATER = ("mlflow", "mlflow.tracking", "mlflow.entities", "mlflow.store.tracking.sqlalchemy_store", "sacrebleu",
         "sqlalchemy")
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # where a GPU machine's driver lists its GPUs
# The shared data stages' imports (none of them torch's), imported first: a server forked from
# here serves those stages while the rest loads (_serve_early), so that a study's first ~5 s of
# stages do not run cold beside a server still importing torch and MLflow.
EARLY = ("numpy", "pyarrow", "pipeline.check_params", "pipeline.download", "pipeline.filter", "pipeline.train_bpe",
         "pipeline.encode", "pipeline.sources", "pipeline.io.progress", "pandas", "tqdm")
# What the early server serves: another stage (torch's) would import torch beside the server's own
# import of it, on the same cores, and start later than served by the server once it is ready.
EARLY_STAGES = tuple(n for n in EARLY if n.startswith("pipeline.") and n.split(".")[1] in STAGES)
# -- the server ---------------------------------------------------------------------------------

def _warm_imports(names) -> set[str]:
    """Import `names`; return the native threads that NAMED_THREADS' imports among them started
    (those imported first, one by one, so that each new thread is known)."""
    # Should an import ask torch whether CUDA is there, NVML answers: the CUDA driver's own answer
    # would start it in this process, and a forked child could then not use CUDA.
    before = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    named, seen = set(), threads()
    for name in [n for n in NAMED_THREADS if n in names]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed: nothing started
            pass
        now = threads()
        named |= now - seen
        seen = now
    for name in [n for n in names if n not in NAMED_THREADS]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - broken or missing: the stage imports it itself and says so
            pass
    if before is None:
        del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
    else:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = before
    return named


def _stage_imports() -> list[str]:
    """What the stages use, after EARLY and before LATER: scipy's pool first, then every stage."""
    return [n for n in NAMED_THREADS if n not in EARLY] + [f"pipeline.{stage}" for stage in sorted(STAGES)]


def _forget_our_modules() -> None:
    """Our own code is imported afresh by each stage (an edit made during a study is seen)."""
    try:  # rouge_score the way evaluate imports it (without nltk's package __init__)
        sys.modules["pipeline.scoring.metrics"].rouge_scorer_module()
    except Exception:  # noqa: BLE001
        pass
    for name in [n for n in sys.modules if n.split(".")[0] in ("pipeline", "model")]:
        if name not in ("pipeline", "pipeline.warm", "pipeline.warm.server"):
            del sys.modules[name]


def _cuda_kernel_runs() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.ones(1, device="cuda").sum().item() == 1
    except Exception:  # noqa: BLE001 - any failure means: do not serve
        return False


def _cuda_check() -> int | None:
    """On a GPU machine, a child forked now that runs a CUDA kernel (a fork cannot once this process
    has started CUDA): its pid, for _cuda_check_passed; None elsewhere. Started before any import
    (from a process of one thread), so that the child's own import of torch and CUDA's start there
    (seconds on an H200) overlap all of this process's imports, on another core."""
    if not os.path.isdir(NVIDIA_GPUS):
        return None
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _cuda_kernel_runs() else 1)
    return pid


def _cuda_check_passed(pid: int, timeout_s: float = 120) -> bool:
    """Whether `_cuda_check`'s child ran its kernel, and this process has not started CUDA since
    (then a fork of it can still use CUDA)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            torch = sys.modules.get("torch")
            started = torch is not None and torch.cuda.is_initialized()
            return os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0 and not started
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


def serve(path: str, tie: int | None = None, on_term=None, watch: int | None = None,
          idle_s: float | None = None) -> None:
    """Serve commands on `path` until SIGTERM (`on_term`, else SystemExit) or, given `tie`
    (lifeline.py), until it ends. Given `watch` (the pid of the `dvc repro` whose stage started
    it, auto.py): until that process ends, or no stage has been served or is running for `idle_s`."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pidfd = _pidfd(watch) if watch is not None else None
    if watch is not None and not _alive(watch):
        print(f"warm: dvc (pid {watch}) has already ended; stopping", flush=True)
        return
    # Bound under another name now (a path the kernel refuses fails before the imports), renamed
    # into place once the data stages' imports are done (a stage that comes sooner runs cold
    # rather than wait): from then on a fork of this process serves while the rest loads.
    listener.bind(path + ".new")
    listener.listen(64)
    me = fingerprint(os.environ)  # before the imports, as a command sees it before its own
    me["limits"] = limits()
    fresh = fresh_state()
    main_thread = threads()
    t0 = time.monotonic()
    check = _cuda_check()
    named = _warm_imports(EARLY)
    early = _serve_early(listener, path, me, fresh, threads_not_forkable(main_thread, named),
                         [fd for fd in (tie, pidfd) if fd is not None], t0)
    named |= _warm_imports(_stage_imports())
    named |= _warm_imports(LATER)
    _forget_our_modules()
    gc.collect()
    gc.freeze()  # the imports' objects: never collected in a stage (fast collections, pages stay shared)
    rng = None
    if "torch" in sys.modules:  # the generator state a fresh process starts with
        rng = sys.modules["torch"].random.get_rng_state()
    why_not = threads_not_forkable(main_thread, named)
    if check is not None and not _cuda_check_passed(check) and not why_not:
        why_not = "a process forked from this one cannot use CUDA"
    serving = not why_not
    if early is not None:
        os.close(early[0])  # the early server stops taking stages: this one takes them from here
    if watch is not None and why_not:  # stages come by themselves: they run cold without asking
        if early is not None:  # the stages it serves end with it: let them finish first
            os.waitpid(early[1], 0)
        print(f"warm: not serving ({why_not}); stopping", flush=True)
        return
    if early is None:
        os.rename(path + ".new", path)
    print(f"warm: ready, {len(sys.modules)} modules imported in {time.monotonic() - t0:.1f} s, "
          f"{len(threads())} native thread(s) "
          f"({len(named)} named), {threading.active_count()} Python thread(s)"
          + (f": not serving ({why_not})" if why_not else ""), flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers reap themselves
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the commands, which forward it
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a session of its own: only the launcher ends it
    signal.signal(signal.SIGTERM, on_term or (lambda *_: sys.exit(0)))
    server = os.getpid()
    if tie is not None:
        os.set_inheritable(tie, False)  # the server's alone, not a stage's subprocesses'
    _serve_loop(listener, tie, pidfd, watch, idle_s, lambda conn: _handle(conn, me, serving, rng, fresh, server))


def _serve_loop(listener: socket.socket, tie: int | None, pidfd: int | None, watch: int | None,
                idle_s: float | None, handle) -> None:
    """Accept commands, each handled (`handle`, never returning) in a child of its own, until `tie`
    reads end of file, or the watched `dvc repro` ends, or nothing ran for `idle_s` (serve)."""
    waits = [listener] + [fd for fd in (tie, pidfd) if fd is not None]
    handlers: set[int] = set()
    last = time.monotonic()
    while True:
        wait = 1.0 if watch is not None else None  # the idle clock; a watched pid without a pidfd
        ready, _, _ = select.select(waits, [], [], wait)
        if tie is not None and tie in ready:  # end of file: the launcher is gone, however it went
            print("warm: the launcher is gone; stopping", flush=True)
            return
        if watch is not None:
            if (pidfd in ready) if pidfd is not None else not _alive(watch):
                print(f"warm: dvc (pid {watch}) has ended; stopping", flush=True)
                return
            handlers = {pid for pid in handlers if _alive(pid)}
            if handlers:
                last = time.monotonic()
            elif idle_s is not None and time.monotonic() - last > idle_s:
                print(f"warm: no stage for {idle_s:.0f} s; stopping", flush=True)
                return
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        pid = os.fork()
        if pid == 0:
            listener.close()
            handle(conn)  # never returns: the handler and the stage exit
        handlers.add(pid)
        last = time.monotonic()
        conn.close()


def _serve_early(listener: socket.socket, path: str, me: dict, fresh: dict, why_not: str, close: list[int],
                 t0: float) -> tuple[int, int] | None:
    """Fork a server that serves commands from what is imported now (the data stages' modules)
    on the shared listener, and put the socket in place. It stops taking commands when the
    returned descriptor is closed (this process ready) and exits when the stages it started have
    ended; if this process dies first, it dies too, and its stages with it, as this one's would.
    A stage that needs more (torch) imports it itself, as a new process would. (descriptor, pid);
    None, and nothing forked, where forking now would not give a stage a new process's state."""
    if why_not:
        print(f"warm: no early serving ({why_not})", flush=True)
        return None
    gc.collect()
    stop, keep = os.pipe()
    server = os.getpid()
    sys.stdout.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(stop)
        os.close(keep)
        return None
    if pid == 0:
        try:
            os.close(keep)
            die_with_parent(signal.SIGKILL, server)
            for fd in close:  # the launcher's lifeline and the watched pid are the main server's
                os.close(fd)
            _early_loop(listener, stop, me, fresh)
        finally:
            os._exit(0)
    os.close(stop)
    os.rename(path + ".new", path)
    print(f"warm: serving early (pid {pid}), {len(sys.modules)} modules imported in "
          f"{time.monotonic() - t0:.1f} s; importing the rest", flush=True)
    return keep, pid


def _early_loop(listener: socket.socket, stop: int, me: dict, fresh: dict) -> None:
    """The early server: each command served as the main server serves it, until `stop` reads
    end of file; then wait for the handlers it started (each tied to its command) and return."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the main server: only the commands get a Ctrl-C
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    gc.freeze()
    me_pid, taken = os.getpid(), 0
    while True:
        ready, _, _ = select.select([listener, stop], [], [])
        if stop in ready:
            break
        # Should the main server, ready in between, take this command first, accept waits for the
        # next one and serves it (as any early command: correctly, if with fewer imports).
        conn, _ = listener.accept()
        pid = os.fork()
        if pid == 0:
            listener.close()
            _handle(conn, me, True, None, fresh, me_pid, "early", stop)  # never returns
        taken += 1
        conn.close()
    listener.close()
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    print(f"warm: the early server took {taken} command(s) and has ended", flush=True)


PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Ask the kernel to send `signum` to this process when its parent ends (Linux; elsewhere
    nothing). `parent`: the pid this process was forked from; if it is already gone, die now."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # it ended before the call above
        os.kill(os.getpid(), signum)


def _pidfd(pid: int) -> int | None:
    """A descriptor that reads ready when `pid` ends (Linux >= 5.3); None: poll it with _alive."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    os.set_inheritable(fd, False)
    return fd


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _handle(conn: socket.socket, me: dict, serving: bool, rng, fresh: dict, server: int, by: str = "",
            stop: int | None = None) -> None:
    """In a child per command: start the stage's process, pass on signals, report how it ended
    (`by`: which server, in the log line). Of the early server (`stop`: its stop pipe), only
    EARLY_STAGES: a command for another waits here until the main server is ready, then asks it."""
    die_with_parent(signal.SIGKILL, server)  # a server killed takes its commands' stages with it
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        send(conn, {"serving": serving, "fingerprint": me, **({"only": EARLY_STAGES} if stop is not None else {})})
        message, fds, _, _ = socket.recv_fds(conn, 1, 3)
        if message == b"W" and stop is not None:
            select.select([stop], [], [])  # end of file: the main server ready (or gone)
            os._exit(0)
        request = recv(conn)
    except (OSError, EOFError, ValueError):
        os._exit(0)  # the command runs itself
    t0 = time.monotonic()
    handler = os.getpid()
    pid = os.fork()
    if pid == 0:
        conn.close()
        die_with_parent(signal.SIGKILL, handler)
        _become_stage(request, fds, rng, fresh)  # ends with os._exit
    try:  # also here, so that a signal sent at once finds the group
        os.setpgid(pid, pid)
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    conn.setblocking(False)
    try:  # wakes the wait below the moment the stage ends (Linux); else it polls
        ended = [os.pidfd_open(pid)]
    except (AttributeError, OSError):
        ended = []
    status, pending = None, b""
    while status is None:
        try:
            data = conn.recv(64)
            if not data:  # the command was killed: so is its stage
                os.killpg(pid, signal.SIGKILL)
            pending += data
            while len(pending) >= 2:  # b"S" + the signal's number, per signal the command got
                os.killpg(pid, pending[1])
                pending = pending[2:]
        except (BlockingIOError, InterruptedError, ProcessLookupError):
            pass
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = {"signal": os.WTERMSIG(code)} if os.WIFSIGNALED(code) else {"exit": os.WEXITSTATUS(code)}
        else:
            select.select([conn, *ended], [], [], None if ended else 0.05)
    ended_as = f"signal {status['signal']}" if "signal" in status else f"exit {status['exit']}"
    # Logged before the command hears: once it exits, its line is in warm.log.
    print(f"warm: served {request['module']} (pid {pid}) in {time.monotonic() - t0:.2f} s, {ended_as}"
          + (f", {by}" if by else ""), flush=True)
    try:
        conn.setblocking(True)
        send(conn, status)
    except OSError:
        pass
    os._exit(0)


def _become_stage(request: dict, fds: list[int], rng, fresh: dict) -> None:
    """Turn this forked child into `python -m MODULE ARGS` run in the command's directory, with
    its environment and streams; exit as it ends."""
    os.setpgid(0, 0)
    for signum, handler in ((signal.SIGCHLD, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                            (signal.SIGINT, signal.default_int_handler)):
        signal.signal(signum, handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=os.isatty(1),
                                  write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace")
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin
    # Our own code is imported afresh, as a new process would (an edit made during a study is seen).
    for name in [n for n in sys.modules if n.split(".")[0] in ("pipeline", "model")]:
        del sys.modules[name]
    restore(fresh, request)
    sys.argv = ["-m", *request["args"]]
    sys.executable = request["executable"]
    random.seed()  # a fresh process seeds these from the OS; forked ones would share the server's
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if rng is not None:
        sys.modules["torch"].random.set_rng_state(rng)
    # Ends as a stage run cold ends (exit.py), also a module without run_main of its own.
    run_main(lambda: runpy.run_module(request["module"], run_name="__main__", alter_sys=True))


def start_server(path: str, log=None, tie: int | None = None, folder: str | None = None, ready_s: float = 0.0,
                 **popen):
    """The server in a session of its own (a Ctrl-C reaches the stages' commands, which forward it),
    waited for up to `ready_s`. It ends when this process does (SIGTERM from the kernel) or `tie`
    reads end of file, removing `path` and `folder`."""
    command = [sys.executable, "-m", "pipeline.warm.server", "--serve", path, "--parent", str(os.getpid())]
    if tie is not None:
        command += ["--lifeline", str(tie)]
        popen["pass_fds"] = (*popen.get("pass_fds", ()), tie)
    if folder is not None:
        command += ["--folder", folder]
    server = subprocess.Popen(command, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                              start_new_session=True, **popen)
    deadline = time.monotonic() + ready_s
    while not os.path.exists(path) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return server


def stop_server(server, path: str) -> None:
    server.terminate()
    try:
        server.wait(timeout=3)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _serve_main(argv: list[str]) -> None:
    """--serve SOCKET [--lifeline FD] [--parent PID] [--folder DIR] [--watch PID --idle S]"""
    path, options = argv[1], dict(zip(argv[2::2], argv[3::2]))
    if set(options) - {"--lifeline", "--parent", "--folder", "--watch", "--idle"} or len(argv) % 2:
        raise SystemExit(f"warm: --serve takes SOCKET [--lifeline FD] [--parent PID] [--folder DIR] "
                         f"[--watch PID --idle S], got {argv[1:]}")
    pid = os.getpid()

    def quit_now(*_):  # not SystemExit: an import's bare `except:` would swallow it
        if os.getpid() == pid:  # not a child just forked, before it set its own handler
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            if "--folder" in options:
                shutil.rmtree(options["--folder"], ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, quit_now)  # during the imports too
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if "--parent" in options:  # the launcher gone before this line: stop at once
        die_with_parent(signal.SIGTERM, int(options["--parent"]))
    if "--watch" in options and "--folder" in options:  # started by a stage under `dvc repro` (auto.py)
        from pipeline.warm.auto import sweep

        sweep(os.path.dirname(options["--folder"]))
    try:
        serve(path, int(options["--lifeline"]) if "--lifeline" in options else None, quit_now,
              watch=int(options["--watch"]) if "--watch" in options else None,
              idle_s=float(options["--idle"]) if "--idle" in options else None)
    except BaseException:
        if os.getpid() == pid:  # into the log: quit_now below leaves without Python's own report
            traceback.print_exc()
        raise
    finally:
        if os.getpid() == pid:  # not in a forked stage unwinding through here
            quit_now()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) < 3:
        raise SystemExit("warm: usage: python -m pipeline.warm.server --serve SOCKET [OPTIONS]")
    _serve_main(sys.argv[1:])
