"""Device choice and the per-device settings of training (autocast, TF32, peak FLOP/s for MFU)."""
from __future__ import annotations

import contextlib
import time

import torch

# Dense bf16 peak FLOP/s by GPU name, from the vendors' data sheets (no sparsity).
GPU_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "4090": 165e12,
                 "A10": 125e12, "L4": 121e12, "3090": 71e12}


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: cuda requested but no CUDA device is available")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(choice)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return device


def autocast(device: torch.device, enabled: bool):
    if enabled and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """(peak FLOP/s, where the number comes from) for MFU."""
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
