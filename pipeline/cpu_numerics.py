"""The same bits on every x86-64 CPU with AVX2: torch's CPU kernels on one code path, and its matrix
products on a kernel whose bits do not depend on the processor's maker or model.

Each library picks its kernels by what the processor offers, and each level rounds differently in
the last bits; 400 training steps amplify that into other weights. Two steps:

1. `pin` (standard library only, before torch or numpy is imported) sets the code paths:
   - ATEN_CPU_CAPABILITY=avx2    ATen's vector code (softmax, exp, norms, sums, the optimizer)
   - ONEDNN_MAX_CPU_ISA=AVX2     oneDNN's kernels, were any to run (`engage` turns oneDNN off)
   - MKL_CBWR=AVX2,STRICT        MKL's reproducibility branch, for what of MKL is left (dropout's
                                 random bits, integer arithmetic)
   - OPENBLAS_CORETYPE=Haswell   the matrix products' kernel (step 2): OpenBLAS's AVX2 kernel, one
     OPENBLAS_NUM_THREADS=1      thread a call (its threaded split changes the sums' order; torch's
                                 threads share a product by whole rows instead: `shared_matmul`)
2. `engage` (after torch is imported: the stages, the tests and the benchmarks call it) routes
   torch's CPU matrix products (mm, addmm, bmm, baddbmm) to numpy's OpenBLAS on that kernel and
   its square roots to numpy's (IEEE 754 rounds those correctly: any implementation, the same
   bits), turns oneDNN off and sends CPU attention through the written-out formula.

Why not MKL: its reproducibility branches hold on Intel CPUs only ("on non-Intel CPUs the AUTO
branch is used"), and even on one Intel CPU the AVX2 branch gives other bits for small products
with STRICT than without. A study recorded on an AMD EPYC trained other bits on an Intel Xeon in
191 of 254 recorded models (issue #59): the products were the ops that parted ways. OpenBLAS's
Haswell kernel is chosen by name, its blocking is fixed in the library (not read from the cache
sizes), and it is the kernel OpenBLAS itself picks on AMD's Zen: measured on an Intel Xeon, its
bits do not move with OPENBLAS_L2_SIZE or when asked for as Zen (benchmarks/cpu_numerics facts).
torch's fused attention multiplies inside its own kernel, out of reach: on the CPU it runs the
written-out formula instead (model/exact.py).

A variable the user set is kept, except OPENBLAS_CORETYPE (the path this promise is made for);
ABLATION_LAB_PIN_CPU=0 turns all of it off (the machine's fastest kernels, its own numbers). On
other processors (aarch64, or x86-64 without AVX2) nothing is pinned and the report says the
numbers are that machine's.
"""
from __future__ import annotations

import os
import platform

SETTING = "ABLATION_LAB_PIN_CPU"
PINNED = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
          "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}
FORCED = ("OPENBLAS_CORETYPE",)
# Speed, not bits: a product's pieces (shared_matmul) run on Python threads beside torch's OpenMP
# threads, which after each parallel region spin for GNU OpenMP's default 300,000 turns and so hold
# the core the second piece needs (sharing then cost 1.2x at 2 threads instead of saving 0.75x).
SPEED = {"GOMP_SPINCOUNT": "10000"}
X86_64 = ("x86_64", "amd64")
KERNEL = "Haswell"  # threadpoolctl's name for OpenBLAS's kernel in use
ROUTED = ("mm", "addmm", "bmm", "baddbmm", "sqrt")  # torch's CPU kernels `engage` replaces (and their out=, sqrt_)
_state: dict = {}
# The CPU models a fresh clone's `bash run.sh` was checked on, identical to the committed study by
# `python -m pipeline.reproduced` and every recorded model bit for bit (tests/model_bits.py).
CHECKED_ON = ("Intel Xeon (family 6 model 207, AVX-512, under KVM)",
              "AMD EPYC (family 25 model 1, AVX2, under KVM)",
              "AMD EPYC (family 25 model 17, AVX-512, under KVM)")


def has_avx2() -> bool:
    """AVX2 and FMA where /proc/cpuinfo says (Linux); assumed elsewhere on x86-64."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return True
    return flags is None or {"avx2", "fma"} <= set(flags)


def wanted(env=os.environ) -> bool:
    return env.get(SETTING, "1") != "0" and platform.machine().lower() in X86_64 and has_avx2()


def pin(env=os.environ) -> None:
    """Set the pinned code paths in `env` (before torch or numpy is imported), unless turned off."""
    if wanted(env):
        for key, value in PINNED.items():
            if key in FORCED:
                env[key] = value
            else:
                env.setdefault(key, value)
        for key, value in SPEED.items():
            env.setdefault(key, value)


def engage() -> bool:
    """Route torch's CPU matrix products to OpenBLAS's pinned kernel, oneDNN off, CPU attention
    written out. Once per process; False (and nothing changed) where not pinned, or where numpy's
    OpenBLAS did not load that kernel (numpy imported before `pin`): describe() then says so."""
    if "engaged" in _state:
        return _state["engaged"]
    _state["engaged"] = False
    if not wanted():
        return False
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    import model.exact

    import numpy  # loads its OpenBLAS, which reads OPENBLAS_CORETYPE now

    blas = numpy_openblas(threadpool_info(), numpy.__file__)
    _state["kernel"] = blas.get("architecture") if blas else None
    _state["openblas"] = blas.get("version") if blas else None
    if _state["kernel"] != KERNEL:
        return False
    threadpool_limits(1, user_api="blas")
    _state["library"] = _register(torch)
    torch.backends.mkldnn.enabled = False  # gelu and friends on ATen's pinned code instead
    model.exact.WRITTEN_OUT_ON.add("cpu")
    _state["engaged"] = True
    return True


def numpy_openblas(libraries: list[dict], numpy_file: str) -> dict | None:
    """numpy's own OpenBLAS among threadpoolctl's `libraries` (scipy, once imported, brings another,
    which numpy's matmul does not use). Paths are compared resolved: in a virtual environment
    reached through a link, numpy is named by the link and its library by the loader's real path."""
    home = os.path.realpath(os.path.dirname(os.path.dirname(numpy_file))) + os.sep
    for lib in libraries:
        path = os.path.realpath(lib.get("filepath") or "?")
        if (lib.get("internal_api") == "openblas" and path.startswith(home)
                and os.path.basename(os.path.dirname(path)).startswith("numpy")):
            return lib
    return None


def unpinned_why() -> str | None:
    """Why `engage` left a process that wanted pinning on torch's own products; None otherwise."""
    if not wanted() or _state.get("engaged", True):
        return None
    return (f"numpy's OpenBLAS kernel is {_state.get('kernel') or 'not found'}, not {KERNEL} (numpy imported "
            "before pipeline?): this run's bits are this machine's")


def engaged() -> bool:
    """Whether `engage` routed this process's products (without engaging them)."""
    return _state.get("engaged", False)


def _register(torch):
    """torch's CPU kernels of ROUTED replaced by numpy's matmul (OpenBLAS, pinned above). Below
    autograd, so the backward's products take it too. Returns the registration (kept alive)."""
    import warnings

    import numpy as np

    half = (torch.float16, torch.bfloat16)  # multiplied in float32, as torch's CPU kernels accumulate

    def as_blas(t):
        # a view BLAS takes as it is (one unit stride in the matrix, no zero stride), else a copy
        if t.requires_grad:  # (detach only where numpy() needs it: each call is paid per product)
            t = t.detach()
        if t.dtype in half:
            t = t.float()
        s = t.stride()
        if t.dim() >= 2 and (0 in s or 1 not in s[-2:]):
            t = t.contiguous()
        return t.numpy()

    def product(a, b):
        x, y = as_blas(a), as_blas(b)
        wide = a.dtype in half
        shape = (*a.shape[:-1], b.shape[-1])  # mm and bmm: no broadcasting (their batches are equal)
        out = torch.empty(shape, dtype=torch.float32 if wide else a.dtype)
        shared_matmul(x, y, out.numpy(), torch.get_num_threads())
        return out.to(a.dtype) if wide else out

    def scaled(self, a, b, beta, alpha):
        out = product(a, b)
        if alpha != 1:
            out.mul_(alpha)
        return out if beta == 0 else out.add_(self, alpha=beta)

    def mm(self, mat2):
        return product(self, mat2)

    def addmm(self, mat1, mat2, *, beta=1, alpha=1):
        return scaled(self, mat1, mat2, beta, alpha)

    def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
        return scaled(self, batch1, batch2, beta, alpha)

    def sqrt(self):
        # IEEE 754 rounds a square root correctly, so every implementation gives these bits
        x = self.detach()
        x = x.float() if x.dtype in half or not (x.is_floating_point() or x.is_complex()) else x
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        np.sqrt(x.contiguous().numpy(), out=out.numpy())
        return out.to(self.dtype) if self.dtype in half else out

    def sqrt_(self):
        return self.copy_(sqrt(self))

    def into(fn):  # the out= overload of fn (torch.compile's generated code calls these)
        def out_variant(*args, out, **kwargs):
            result = fn(*args, **kwargs)
            return out.resize_(result.shape).copy_(result)
        return out_variant

    kernels = {"mm": mm, "addmm": addmm, "bmm": mm, "baddbmm": baddbmm, "sqrt": sqrt}
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": meant
        warnings.simplefilter("ignore")
        for name, fn in kernels.items():
            library.impl(name, fn, "CPU")
            library.impl(f"{name}.out", into(fn), "CPU")
        library.impl("sqrt_", sqrt_, "CPU")
    return library


# A product is shared among torch's threads in pieces of whole batches or of rows, each piece one
# OpenBLAS call on one thread, so that two threads are not one (issue #59's 2.36x at 2 threads).
# OpenBLAS's own threads would split the sums; rows do not: each element of C is still one dot
# product over K, blocked in K by the library's fixed Q. But a row's bits move with its place in
# the kernel's tiles (sgemm's are 24 rows: rows 60-63 of a 64-row call differ from a 128-row
# call's), so pieces of rows start on multiples of ROWS and each is tiled as the whole call is
# (tests/test_cpu_numerics.py checks the bits equal, shape by shape, and 64 as the control).
ROWS = 48
# Multiply-adds a product must hold to be shared: below, the hand-over to a thread costs what it
# saves: the default study's small products, shared, made its train stage ~1.3x slower than whole.
SHARE = 1 << 23
_pool: dict = {}


def piece_count(batch: int, m: int, k: int, n: int, threads: int) -> int:
    """How many pieces `pieces` cuts a (batch x) m x k @ k x n product into at `threads` threads,
    by its shape alone (1: whole; the cost plan reads it too, pipeline/planning/estimate.py)."""
    want = min(threads, batch * m * k * n // SHARE)
    if want < 2 or min(m, k, n) < 2:
        return 1
    # the last piece takes the rows left over: a piece of one row would be gemv
    return min(want, batch) if batch > 1 else max(1, min(want, m // ROWS))


def pieces(x, y, threads: int) -> list[tuple[tuple, bool]]:
    """How `x @ y` is shared: (index, batched) per piece, [] to run it whole in this thread. Whole
    batches where there are enough; else blocks of ROWS rows, never a piece numpy would multiply
    otherwise (a vector: gemv; x and y one array: syrk)."""
    m, k, n = x.shape[-2], x.shape[-1], y.shape[-1]
    batch = x.shape[0] if x.ndim == 3 else 1
    want = piece_count(batch, m, k, n, threads)
    if want < 2:
        return []
    if batch > 1:
        cuts = [batch * i // want for i in range(want + 1)]
        return [((slice(a, b),), True) for a, b in zip(cuts, cuts[1:])]
    if x.__array_interface__["data"][0] == y.__array_interface__["data"][0]:
        return []
    blocks = m // ROWS
    cuts = [ROWS * (blocks * i // want) for i in range(want)] + [m]
    return [((..., slice(a, b), slice(None)), False) for a, b in zip(cuts, cuts[1:])]


def shared_matmul(x, y, out, threads: int) -> None:
    """numpy.matmul(x, y, out=out) (2-d, or 3-d of equal batches) shared among `threads`: the bits
    of one call whatever `threads` is."""
    import numpy as np

    shares = pieces(x, y, threads)
    if not shares:  # most products: one call here, without a piece's views
        with np.errstate(all="ignore"):  # an overflow is torch's to report (a non-finite loss), as its own kernel
            np.matmul(x, y, out=out)
        return

    def one(index: tuple, batched: bool) -> None:
        with np.errstate(all="ignore"):
            np.matmul(x[index], y[index] if batched else y, out=out[index])

    futures = [_workers(len(shares) - 1).submit(one, *share) for share in shares[1:]]
    try:
        one(*shares[0])
    finally:
        for future in futures:
            future.result()


def _workers(n: int):
    """A pool of n threads for the pieces: one per process (a forked child gets its own) and size."""
    from concurrent.futures import ThreadPoolExecutor

    key = (os.getpid(), n)
    if _pool.get("key") != key:
        if _pool.get("key", (None,))[0] == os.getpid():
            _pool["executor"].shutdown(wait=False)
        _pool.update(key=key, executor=ThreadPoolExecutor(n, thread_name_prefix="pinned-products"))
    return _pool["executor"]


def describe() -> dict:
    """What this process's CPU kernels ran with, for train.json and the report. Imports torch."""
    import torch

    settings = {key: os.environ.get(key) for key in PINNED}
    engaged = _state.get("engaged", False)
    pinned = wanted() and settings == PINNED and engaged
    matmul = f"openblas {_state.get('openblas')} {_state.get('kernel')}, 1 thread" if engaged else "torch's own (MKL)"
    why = {} if pinned else {"why": _why_not(settings)}  # the report names it (a lost pinning is not a choice)
    return {"pinned": pinned, "machine": platform.machine(), "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "matmul": matmul, **{key.lower(): value for key, value in settings.items()}, **why}


def _why_not(settings: dict) -> str:
    """Why this process is not pinned, in words a user acts on."""
    if os.environ.get(SETTING, "1") == "0":
        return f"{SETTING}=0"
    if platform.machine().lower() not in X86_64:
        return f"{platform.machine()}: not x86-64"
    if not has_avx2():
        return "no AVX2 and FMA"
    if not _state.get("engaged", False):
        return unpinned_why() or "not engaged (pipeline.cpu_numerics.engage was not called)"
    return "set otherwise: " + ", ".join(f"{k}={v}" for k, v in settings.items() if v != PINNED[k])
