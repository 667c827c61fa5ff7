"""One GPU per process on a machine with several: the first free one, under an exclusive file lock.

`dvc queue start --jobs N` runs N workers, each a `dvc repro` whose train and evaluate stages are
plain processes; left alone, every one of them would take `cuda` = device 0. Instead a process
that wants a GPU (train.device `auto` or `cuda`) tries the visible GPUs in order and keeps the
first whose lock it gets, for as long as it lives:

- one lock file per GPU, `gpu-<id>.lock`, under `gpu-locks/<host>/` in the cache folder
  (`$ABLATION_LAB_GPU_LOCKS` overrides the folder, e.g. one in /tmp that every user shares);
  the host is in the path because a home folder is often shared by the machines of a cluster;
- `<id>` is the GPU as CUDA_VISIBLE_DEVICES names it, so processes with different masks over the
  same GPUs still exclude each other; the device this process uses is its position in the mask;
- `flock(LOCK_EX | LOCK_NB)`: the kernel drops the lock when the process ends however it ends
  (exit, exception, SIGKILL, OOM killer), so a crashed run never leaves a GPU claimed;
- all taken: it says so, names the holders, waits, and logs a line every `log_every_s` seconds;
- under torchrun (LOCAL_RANK or WORLD_SIZE set) torchrun decides: cuda:LOCAL_RANK, no lock.

Only processes of this project take these locks; a foreign job on a GPU is not seen.
`$ABLATION_LAB_GPU_COUNT` stands in for the number of GPUs in the machine (tests, no GPU needed).
"""
from __future__ import annotations

import fcntl
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from pipeline.params import default_cache_dir


@dataclass(frozen=True)
class Claim:
    """The GPU this process uses and why; recorded in train.json (and eval.json)."""
    index: int  # torch's cuda:<index>
    id: str  # the GPU as CUDA_VISIBLE_DEVICES names it ("5", or a UUID)
    lock: str | None  # the lock file held; None under torchrun
    waited_s: float
    why: str

    def record(self) -> dict:
        return asdict(self)


_held: dict = {}  # the claim of this process and the open lock file that keeps it


def torchrun_rank() -> int | None:
    """LOCAL_RANK when started by torchrun (which sets it and WORLD_SIZE), else None."""
    if "LOCAL_RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return int(os.environ.get("LOCAL_RANK", "0"))
    return None


def visible_gpus(env: dict | None = None) -> list[str]:
    """The ids of the GPUs this process may use; position i is torch's cuda:i.

    With $ABLATION_LAB_GPU_COUNT = n the machine has GPUs 0..n-1 and CUDA_VISIBLE_DEVICES is applied
    as CUDA applies it (in its order, up to the first entry that names no GPU). Otherwise torch
    counts the visible GPUs and the mask, if any, names them.
    """
    env = os.environ if env is None else env
    mask = env.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in mask.split(",")] if mask is not None else None
    fake = env.get("ABLATION_LAB_GPU_COUNT")
    if fake is not None:
        if not fake.isdigit():
            raise ValueError(f"$ABLATION_LAB_GPU_COUNT: {fake!r} is not a number of GPUs")
        machine = [str(i) for i in range(int(fake))]
        if entries is None:
            return machine
        visible = []
        for e in entries:
            if e not in machine or e in visible:
                break
            visible.append(e)
        return visible
    count = torch.cuda.device_count()
    return entries[:count] if entries is not None else [str(i) for i in range(count)]


def lock_dir(env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("ABLATION_LAB_GPU_LOCKS")
    return Path(base).expanduser() if base else default_cache_dir() / "gpu-locks" / socket.gethostname()


def _file_name(gpu_id: str) -> str:
    return "gpu-" + re.sub(r"[^A-Za-z0-9._-]", "_", gpu_id) + ".lock"


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding `path`'s exclusive lock, or None if another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # not inherited by exec'd children (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def claim_gpu(gpus: list[str] | None = None, folder: Path | None = None, poll_s: float = 0.5,
              log_every_s: float = 60.0, log=None) -> Claim:
    """Lock the first free GPU of `gpus` (default: the visible ones) for the rest of this process.

    Waits while all are taken. A second call in the same process returns the first claim.
    """
    if "claim" in _held:
        return _held["claim"]
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus:
        raise ValueError("train.device: a GPU was requested but none is visible (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    folder = lock_dir() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / _file_name(g) for g in gpus]
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"{len(gpus)} visible" + (f" (CUDA_VISIBLE_DEVICES={mask})" if mask is not None else "")
    start, last_log = time.monotonic(), None
    while True:
        for index, (gpu, path) in enumerate(zip(gpus, paths)):
            fd = _try_lock(path)
            if fd is None:
                continue
            os.ftruncate(fd, 0)  # who holds it, for the message of a process that waits
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:300]}\n".encode())
            waited = time.monotonic() - start
            why = (f"GPU {gpu} (cuda:{index}), the first free of {seen} GPUs; lock {path}"
                   + (f"; waited {waited:.1f} s for it" if waited >= poll_s else ""))
            claim = Claim(index, gpu, str(path), round(waited, 3), why)
            _held.update(claim=claim, fd=fd)
            log(f"gpu: took {why}")
            return claim
        now = time.monotonic()
        if last_log is None or now - last_log >= log_every_s:
            holders = "; ".join(f"GPU {g}: {_holder(p)}" for g, p in zip(gpus, paths))
            log(f"gpu: all {seen} GPUs are taken ({holders}); waiting for one to free "
                f"({now - start:.0f} s so far; locks in {folder})")
            last_log = now
        time.sleep(poll_s)


def claimed() -> Claim | None:
    """This process's GPU claim (None if it took none)."""
    return _held.get("claim")


def release() -> None:
    """Give the GPU back before the process ends (tests; a stage simply exits)."""
    fd = _held.pop("fd", None)
    _held.pop("claim", None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor drops the flock


def torchrun_claim(local_rank: int) -> Claim:
    """Record the GPU torchrun gave this rank (no lock: torchrun already gives each rank its own)."""
    gpus = visible_gpus()
    claim = Claim(local_rank, gpus[local_rank] if local_rank < len(gpus) else str(local_rank), None, 0.0,
                  f"cuda:{local_rank} from torchrun's LOCAL_RANK; no lock (torchrun places the ranks)")
    _held["claim"] = claim
    return claim
