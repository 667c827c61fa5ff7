"""A GPU slot per process on a machine with GPUs: the first free one, under an exclusive file lock.

`dvc queue start --jobs N` runs N workers, each a `dvc repro` whose train and evaluate stages are
plain processes; left alone, every one of them would take `cuda` = device 0. Instead a process
that wants a GPU (train.device `auto` or `cuda`) tries the visible GPUs in order and keeps the
first whose lock it gets, for as long as it lives:

- k slots per GPU (train.runs_per_gpu; small runs leave most of a GPU idle, so several share one):
  one lock file per slot, `gpu-<id>.lock` for the first and `gpu-<id>.<j>.lock` for slot j >= 1,
  under `gpu-locks/<host>/` in the cache folder
  (`$ABLATION_LAB_GPU_LOCKS` overrides the folder, e.g. one in /tmp that every user shares);
  the host is in the path because a home folder is often shared by the machines of a cluster;
- `<id>` is the GPU as CUDA_VISIBLE_DEVICES names it, so processes with different masks over the
  same GPUs still exclude each other; the device this process uses is its position in the mask;
- `flock(LOCK_EX | LOCK_NB)`: the kernel drops the lock when the process ends however it ends
  (exit, exception, SIGKILL, OOM killer), so a crashed run never leaves a GPU claimed;
- slots are tried breadth first (slot 0 of every GPU, then slot 1 of every GPU, ...), so runs
  spread over the GPUs before any GPU takes a second one;
- a process with k slots only tries slots 0..k-1: a GPU holds at most the largest k of the
  processes on it, and a run that asked for fewer waits while its first k are taken;
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
    slot: int = 0  # which of the GPU's slots this process holds
    slots: int = 1  # how many runs this process lets share the GPU (train.runs_per_gpu)

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


def _file_name(gpu_id: str, slot: int = 0) -> str:
    # Slot 0 keeps the one-run-per-GPU name, so processes asking for 1 and for k slots exclude each other.
    return "gpu-" + re.sub(r"[^A-Za-z0-9._-]", "_", gpu_id) + (f".{slot}" if slot else "") + ".lock"


# train.runs_per_gpu `auto`: a run's memory plus this for its own CUDA context and the caching
# allocator's slack (a context alone is some 300-500 MB on an H100), against this share of the
# GPU's memory; at most one run per CPU core of the GPU's share (each run's Python loop needs a
# core to keep its kernels coming) and at most MAX_RUNS_PER_GPU (beyond that, the GPU's time is
# cut so thin that each run crawls).
RUN_OVERHEAD_BYTES = 1 << 30
MEMORY_SHARE = 0.9
MAX_RUNS_PER_GPU = 16


def runs_per_gpu(setting: int | str, run_bytes: float, gpu_bytes: float, cores: int, gpus: int) -> tuple[int, str]:
    """(k, why): how many runs share one GPU. `setting` is train.runs_per_gpu (`auto` or a number)."""
    if setting != "auto":
        return int(setting), f"{setting} (train.runs_per_gpu)"
    by_memory = int(MEMORY_SHARE * gpu_bytes // (run_bytes + RUN_OVERHEAD_BYTES))
    by_cores = max(1, cores // max(1, gpus))
    k = max(1, min(by_memory, by_cores, MAX_RUNS_PER_GPU))
    return k, (f"{k} (train.runs_per_gpu auto: the fewest of {by_memory} by memory ({MEMORY_SHARE:.0%} of "
               f"{gpu_bytes / 2**30:.1f} GiB / ({run_bytes / 2**20:.0f} MiB estimated per run + "
               f"{RUN_OVERHEAD_BYTES / 2**20:.0f} MiB context)), {by_cores} CPU cores per GPU, at most {MAX_RUNS_PER_GPU})")


def estimated_run_bytes(n_params: int, d_model: int, d_ff: int, layers: int, vocab: int, batch_tokens: int) -> int:
    """A training run's peak GPU memory from its config, without tracing the model (the planner's
    `pipeline.plan` traces it; a stage that only needs a slot count makes do with this): fp32
    weights, gradients and AdamW's two moments, bf16 copies (18 bytes a parameter), and per token
    of the batch each layer's saved bf16 activations (about 10 x d_model + 2 x d_ff values) and the
    logits (bf16, their fp32 softmax and gradient: 10 bytes a vocabulary entry)."""
    per_token = layers * 2 * (10 * d_model + 2 * d_ff) + 10 * vocab
    return 18 * n_params + batch_tokens * per_token


def gpu_memory_bytes(gpus: list[str]) -> int:
    """The smallest total memory of the visible GPUs (read without making a CUDA context).

    Total, not free: a free figure read while our other runs start counts them twice (their slots
    already count them); a foreign job's memory is not seen, as a foreign job is not seen by the
    locks. `$ABLATION_LAB_GPU_MEMORY` (bytes) stands in for it with fake GPUs."""
    fake = os.environ.get("ABLATION_LAB_GPU_MEMORY")
    if fake is not None:
        return int(fake)
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(len(gpus)))


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


def gpu_slots(setting: int | str, run_bytes: int):
    """train.runs_per_gpu as claim_gpu takes it: a number, or for `auto` a function that works it
    out from `run_bytes` and the GPUs' memory when a slot is about to be taken."""
    if setting != "auto":
        return int(setting)

    def decide(gpus: list[str]) -> tuple[int, str]:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return runs_per_gpu("auto", run_bytes, gpu_memory_bytes(gpus), cores, len(gpus))
    return decide


def claim_gpu(gpus: list[str] | None = None, folder: Path | None = None, poll_s: float = 0.5,
              log_every_s: float = 60.0, log=None, slots=None) -> Claim:
    """Lock the first free slot of `gpus` (default: the visible ones) for the rest of this process.

    `slots`: runs per GPU, a number or a function of the GPUs returning (k, why) (called only here,
    so no GPU is asked about its memory unless a lock is taken); default 1. Waits while all are
    taken. A second call in the same process returns the first claim.
    """
    if "claim" in _held:
        return _held["claim"]
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus:
        raise ValueError("train.device: a GPU was requested but none is visible (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    k, k_why = slots(gpus) if callable(slots) else (slots or 1, "")
    if k < 1:
        raise ValueError(f"train.runs_per_gpu: {k} runs per GPU (must be at least 1)")
    folder = lock_dir() if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    # Breadth first: slot 0 of every GPU, then slot 1, ...; (slot, cuda index, id, lock file).
    order = [(slot, index, gpu, folder / _file_name(gpu, slot)) for slot in range(k) for index, gpu in enumerate(gpus)]
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"{len(gpus)} visible" + (f" (CUDA_VISIBLE_DEVICES={mask})" if mask is not None else "")
    per_gpu = f", {k} runs per GPU" + (f": {k_why}" if k_why else "") if k > 1 or k_why else ""
    start, last_log = time.monotonic(), None
    while True:
        for slot, index, gpu, path in order:
            fd = _try_lock(path)
            if fd is None:
                continue
            os.ftruncate(fd, 0)  # who holds it, for the message of a process that waits
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:300]}\n".encode())
            waited = time.monotonic() - start
            why = (f"GPU {gpu} (cuda:{index}) slot {slot}, the first free of {seen} GPUs{per_gpu}; lock {path}"
                   + (f"; waited {waited:.1f} s for it" if waited >= poll_s else ""))
            claim = Claim(index, gpu, str(path), round(waited, 3), why, slot, k)
            _held.update(claim=claim, fd=fd)
            log(f"gpu: took {why}")
            return claim
        now = time.monotonic()
        if last_log is None or now - last_log >= log_every_s:
            holders = "; ".join(f"GPU {g} slot {s}: {_holder(p)}" for s, _, g, p in order)
            log(f"gpu: all {seen} GPUs are taken ({f'{k} runs per GPU; ' if k > 1 else ''}{holders}); waiting for one to free "
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
