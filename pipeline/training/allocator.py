"""Memory a training step frees kept in the process for the next step (glibc's malloc).

Every step allocates and frees the same tensors. glibc serves a block above its mmap threshold
(128 KiB at first, raised as such blocks are freed, never above 32 MiB) with a new mapping,
unmapped again on free, and hands the heap's top back to the kernel once more than twice that
threshold lies free there: at the end of a step's backward, when the activations go. So a step's
large tensors start on fresh pages, and the first touch of every 4 KiB page is a page fault:
thousands a step at the default study's shape, dear under a hypervisor (benchmarks/cpu_numerics,
its `side_by_side`: ~20% of a step there). With both thresholds raised, freed blocks stay in the
heap and the next step reuses them. The peak is not raised (benchmarks/plan_memory): what the
process keeps between steps is what a step held at once. Bits are not touched: torch aligns every
tensor to 64 bytes wherever it lives, and a default study trained with it was identical to one
without.
"""
from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
KEEP = 1 << 30  # blocks up to 1 GiB from the heap, and up to 1 GiB free at its top kept
FALLBACK = 32 << 20  # glibc versions that cap the mmap threshold take their cap, 32 MiB
SETTING = "ABLATION_LAB_KEEP_FREED"  # 0: glibc's own behaviour (to measure what this saves)


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where not glibc, or turned off."""
    if os.environ.get(SETTING, "1") == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, KEEP) or libc.mallopt(M_MMAP_THRESHOLD, FALLBACK)
    return bool(mmap_ok and libc.mallopt(M_TRIM_THRESHOLD, KEEP))


def _glibc():
    try:
        libc = ctypes.CDLL(None)  # the symbols this process has loaded: the C library's among them
        libc.gnu_get_libc_version  # glibc's alone (musl and macOS lack mallopt's parameters, or mallopt)
        return libc
    except (OSError, AttributeError):
        return None
