"""The same bits on every x86-64 CPU: the instruction-set level of torch's CPU kernels, pinned.

PyTorch picks each CPU kernel by what the processor offers: MKL's matrix products (AVX-512 on an
Intel AVX-512 machine, AVX2 on AMD's), ATen's vectorised element-wise and reduction code (softmax,
exp, sums: AVX-512 where present) and oneDNN's (gelu). Each level rounds differently in the last
bits, 400 training steps amplify that, and a study made on one CPU model moved every number on
another. Pinned here, each library runs the AVX2 code path that every current x86-64 CPU has:

- MKL_CBWR=AVX2,STRICT     MKL's conditional numerical reproducibility; STRICT also fixes the
                           order of its sums whatever the thread count (without it the thread
                           test failed on an Intel AVX-512 machine)
- ATEN_CPU_CAPABILITY=avx2 ATen's vector code
- ONEDNN_MAX_CPU_ISA=AVX2  oneDNN's kernels

They are read when each library first runs, so `pin` must run before torch is imported:
pipeline/__init__.py calls it, and with it every stage, the warm server that serves them and
everything that imports the package. A variable the user set is kept. ABLATION_LAB_PIN_CPU=0 turns
it off (the machine's fastest kernels, its own numbers); on other processors (aarch64) nothing is
pinned and the report says the numbers are that machine's. Standard library only.
"""
from __future__ import annotations

import os
import platform

SETTING = "ABLATION_LAB_PIN_CPU"
PINNED = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
X86_64 = ("x86_64", "amd64")


def wanted(env=os.environ) -> bool:
    return env.get(SETTING, "1") != "0" and platform.machine().lower() in X86_64


def pin(env=os.environ) -> None:
    """Set the pinned code paths in `env` (before torch is imported), unless turned off or not x86-64."""
    if wanted(env):
        for key, value in PINNED.items():
            env.setdefault(key, value)


def describe() -> dict:
    """What this process's CPU kernels ran with, for train.json and the report. Imports torch."""
    import torch

    settings = {key: os.environ.get(key) for key in PINNED}
    pinned = wanted() and settings == PINNED
    return {"pinned": pinned, "machine": platform.machine(), "aten_capability": torch.backends.cpu.get_cpu_capability(),
            **{key.lower(): value for key, value in settings.items()}}
