"""Device choice and the per-device settings of training (autocast, TF32, peak FLOP/s for MFU), and
the process group when the stage runs under `torchrun`.

Distributed runs are data-parallel only (DistributedDataParallel): NCCL between GPUs, Gloo on CPU.
The collectives used by the loop are few and fixed (loss and NaN flag at logging points, per-rank
state at checkpoints), so every rank runs the same control flow and none can wait on another.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

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


def resolve_device(choice: str, cluster: Cluster = Cluster()) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: cuda requested but no CUDA device is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(choice)
    if device.type == "cuda":
        if cluster.world > 1:
            device = torch.device("cuda", cluster.local_rank)  # one GPU per process
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


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
    if enabled and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """(peak FLOP/s of one device, where the number comes from) for MFU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAK_BF16.items():
            if key in name:
                return value, f"datasheet bf16 peak of {name}"
        return None, f"unknown GPU {name}: no stated peak"
    return measured_matmul_flops(), "measured float32 matmul peak on this CPU"


def measured_matmul_flops(n: int = 512, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best
