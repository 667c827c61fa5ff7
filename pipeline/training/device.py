"""Device choice and the per-device settings of training (precision, autocast, TF32, peak FLOP/s
for MFU), and the process group when the stage runs under `torchrun`.

A process that wants a GPU takes one of the visible GPUs under a lock (gpu_lock), unless torchrun
placed it (LOCAL_RANK decides).

Distributed runs are data-parallel only (DistributedDataParallel): NCCL between GPUs, Gloo on CPU.
The collectives used by the loop are few and fixed (loss and NaN flag at logging points, per-rank
state at checkpoints), so every rank runs the same control flow and none can wait on another.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline import cpu_numerics
from pipeline.params import default_cache_dir
from pipeline.training.allocator import keep_freed_memory
from pipeline.training.gpu_lock import (Claim, claim_gpu, estimated_run_bytes, gpu_slots, torchrun_claim,
                                        torchrun_rank)

# Dense bf16 peak FLOP/s by GPU name, from the vendors' data sheets (no sparsity). The first key
# found in the device name wins, so the PCIe/NVL boards come before the SXM default.
GPU_PEAK_BF16 = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12,
                 "A10": 125e12, "L4": 121e12, "3090": 71e12}


@dataclass(frozen=True)
class Cluster:
    """Where this process stands in a (possibly single-process) data-parallel run."""
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0  # the one rank that logs, tracks, checkpoints and writes outputs


def resolve_device(choice: str, cluster: Cluster = Cluster(), slots=None) -> torch.device:
    """The device for `choice` (train.device); on CUDA a GPU slot taken under a lock (`slots`:
    runs per GPU, as gpu_lock.claim_gpu takes it)."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: cuda requested but no CUDA device is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(choice)
    if device.type == "cuda":
        device = torch.device("cuda", gpu_for(cluster, slots).index)  # one GPU slot per process
        torch.cuda.set_device(device)  # what a bare "cuda" means in this process from now on
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


def gpu_for(cluster: Cluster, slots=None) -> Claim:
    """torchrun's rank placement if started by torchrun, else a free GPU slot taken under a lock."""
    rank = cluster.local_rank if cluster.world > 1 else torchrun_rank()
    return claim_gpu(slots=slots) if rank is None else torchrun_claim(rank)


def run_slots(tcfg: dict, model, lm: bool):
    """train.runs_per_gpu for a training run of `model` (gpu_lock.gpu_slots), its memory estimated
    from its config and batch: batch_size x context windows (language model) or batch_tokens."""
    c = model.cfg
    layers = c.n_decoder_layers + (c.n_encoder_layers if c.arch == "encoder_decoder" else 0)
    batch = tcfg["batch_size"] * tcfg["context"] if lm else tcfg["batch_tokens"]
    n_params = sum(p.numel() for p in model.parameters())
    return gpu_slots(tcfg.get("runs_per_gpu", "auto"),
                     estimated_run_bytes(n_params, c.d_model, c.d_ff, layers, c.vocab_size, batch))


def recorded_slots(run_dir: Path) -> int:
    """The runs per GPU the run trained with (its train.json's gpu.slots): its evaluation shares a
    GPU as its training did. 1 for a run trained without a slot (CPU, torchrun, older runs)."""
    try:
        gpu = json.loads((run_dir / "train.json").read_text()).get("gpu") or {}
        return max(1, int(gpu.get("slots", 1)))
    except (OSError, ValueError, AttributeError, TypeError):
        return 1


def resolve_precision(choice: str, device: torch.device) -> str:
    """train.precision: `auto` is bf16 (autocast) on CUDA and fp32 on CPU, so the default CPU
    results stay bit-identical; `bf16` on CPU runs CPU autocast, `fp32` on CUDA turns autocast off."""
    if choice == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return choice


def join_cluster(choice: str) -> Cluster:
    """Join the process group when started by torchrun (WORLD_SIZE > 1); a no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Cluster()
    cluster = Cluster(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    device = resolve_device(choice, cluster)
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return cluster


def leave_cluster() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Element-wise sum/min/max of `values` over all ranks (identity without a process group)."""
    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def all_gather(obj):
    """[obj of rank 0, obj of rank 1, ...] (picklable objects; [obj] without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's `obj` on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def check_replicas_identical(model: torch.nn.Module) -> None:
    """Raise unless every rank holds bit-identical parameters (DDP's invariant; checked once, at the end)."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    if len(set(all_gather(h.hexdigest()))) > 1:
        raise RuntimeError("DDP replicas ended with different parameters (gradient sync is broken)")


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on `device` (CUDA or CPU) when enabled; parameters and optimizer stay float32."""
    if enabled:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A batch tensor on `device`; on CUDA copied from pinned memory without waiting for the copy."""
    if t is None or device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """(peak FLOP/s of one device, where the number comes from) for MFU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_BF16.items():
            if key in name:
                return value, f"datasheet bf16 peak of {name}"
        return None, f"unknown GPU {name}: no stated peak"
    return cpu_peak_flops()


def cpu_peak_flops(cache_dir: Path | None = None) -> tuple[float, str]:
    """A CPU has no stated peak: measure a float32 matmul once per machine, torch and thread count.

    Measured afresh in every run, the denominator moved with whatever else the machine was doing,
    and two variants of equal FLOPs showed MFU 0.08 and 0.84. Cached, every run on this machine
    divides by the same number, so MFUs compare as tokens/s do.
    """
    from pipeline import cpu_numerics

    threads = torch.get_num_threads()
    # The pinned products (OpenBLAS's AVX2 kernel) and torch's own have different peaks; one
    # key for both let whichever process measured first (the cost plan, unpinned) set the other's.
    # (Before the pinned products were shared among threads, a pinned peak at 2 threads was 1's.)
    products = "pinned products shared by rows" if cpu_numerics.engaged() else "torch's products"
    key = f"{platform.machine()}|{_cpu_model()}|torch {torch.__version__}|{threads} threads|{products}"
    path = Path(cache_dir or default_cache_dir()) / "cpu_peak_flops.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        value = measured_matmul_flops()
        if _machine_busy():
            # Shared cores give a fraction of the peak; cached, it would inflate every later MFU
            # on this machine (a peak of 3e10 instead of 4e11 once gave MFUs above 1).
            return value, (f"float32 matmul peak measured now on this CPU ({threads} threads) while other "
                           "processes ran: not cached, so an underestimate for this run only")
        known[key] = value
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=2) + "\n")
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: the measurement still serves this run
    return known[key], f"float32 matmul peak measured once on this CPU ({threads} threads; cached in {path})"


def _machine_busy() -> bool:
    """Other work on the cores: the 1-minute load average at half the cores or more. (The
    instantaneous runnable count is no use right after a matmul: torch's own threads are in it.)"""
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1) / 2
    except OSError:
        return False


def _cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's name, with its family and model where Linux gives them: under a hypervisor the
    name can be as bare as "AMD EPYC", which names no model (and the peak cache is keyed by it)."""
    try:
        fields: dict[str, str] = {}
        for line in Path(cpuinfo).read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
        if "model name" in fields:
            numbers = f" (family {fields['cpu family']} model {fields['model']})" \
                if "cpu family" in fields and "model" in fields else ""
            return fields["model name"] + numbers
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def measured_matmul_flops(n: int = 1024, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


# Set by the grid launcher (python -m pipeline.grid) to the cores per concurrent stage: stages that
# start together each see the others' processes only once they run, and would take every core.
# An environment variable, not a param: how many stages run at once must not change dvc.lock.
THREADS_ENV = "ABLATION_LAB_THREADS"


def grid_share() -> int | None:
    """The cores the grid launcher gave each of the stages it runs side by side (None outside it)."""
    value = os.environ.get(THREADS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def set_up_cpu(requested: int) -> tuple[int, str]:
    """What a stage that runs the model does before its first forward: torch's CPU threads
    (choose_threads), freed memory kept for the next batch (allocator.py), the pinned kernels
    (pipeline/cpu_numerics.py), and denormal floats flushed to zero. (threads, why)

    Late in training, tiny gradients and Adam moments become denormal floats, which x86 CPUs
    process many times slower; flushing them to zero changes no result worth a bit of loss."""
    threads, why = choose_threads(requested)
    torch.set_num_threads(threads)
    keep_freed_memory()
    cpu_numerics.engage()
    torch.set_flush_denormal(True)
    return threads, why


def choose_threads(requested: int, cores: int | None = None, busy: int | None = None) -> tuple[int, str]:
    """CPU threads for torch, and why. `requested` > 0 is kept (at most the grid launcher's share,
    when it runs this stage beside others); 0 picks from what is free now.

    torch's default takes every core. On a 2-core machine where another process (a second DVC
    queue worker, a test run) holds one, two threads trained at 168 tokens/s against 3,200 with
    one: each step waits for the thread that shares a core. So auto = the cores this process may
    use, less the other processes running right now (at least one).
    """
    share = grid_share()
    if requested:
        if share is not None and share < requested:  # a set count is a ceiling: stages side by side
            return share, f"{share} (train.threads {requested}, capped at ${THREADS_ENV}: the grid launcher's share)"
        return requested, f"{requested} (train.threads)"
    if share is not None:
        return share, f"{share} (train.threads: 0 = auto: ${THREADS_ENV}, the grid launcher's share of the cores)"
    cores = cores if cores is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    busy = busy if busy is not None else _other_running_processes()
    n = max(1, cores - busy)
    return n, f"{n} (train.threads: 0 = auto: {cores} cores for this process, {busy} other processes running)"


def _other_running_processes() -> int:
    """Runnable processes besides this one, from /proc/loadavg's instantaneous count (Linux)."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - 1)
