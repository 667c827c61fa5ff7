"""The same bits on every x86-64 CPU with AVX2 (pipeline/cpu_numerics.py).

One machine cannot be two CPU models, but it can play what differs between them: each library's
choice of code path. MKL's reproducibility branch (on a non-Intel CPU MKL takes its AUTO branch
whatever MKL_CBWR says), MKL's and ATen's instruction sets, oneDNN's. A training run must give the
same weights under each of them once the products are routed, and other weights without the
routing (so that the test can tell). And no op a model runs may be one whose kernel is MKL's or
oneDNN's: the list below is what torch 2.13 sends there on the CPU (measured: the bits of each
move with MKL_CBWR; benchmarks/cpu_numerics facts)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline import cpu_numerics

ROOT = Path(__file__).resolve().parents[1]
CAPPED = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# Other code paths a CPU of another maker or model takes: each is a "machine" below.
MACHINES = {"mkl-auto": {"MKL_CBWR": "AUTO"}, "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
            "capped": CAPPED, "onednn-avx512": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
X86 = cpu_numerics.wanted({})
# torch's CPU ops whose kernels are MKL's (vector maths, products, the fused attention's insides)
# or oneDNN's: a model's training or evaluation must not run one (sqrt is routed: see ROUTED).
VARYING = {"exp", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "erf", "erfc", "erfinv", "acos",
           "asin", "atan", "trunc", "_scaled_dot_product_flash_attention_for_cpu",
           "_scaled_dot_product_flash_attention_for_cpu_backward", "addmv", "addmv_", "mv", "dot", "addbmm", "addbmm_",
           "addmm_", "baddbmm_", "addr", "_addmm_activation", "mkldnn_linear", "mkldnn_convolution"}
# A tiny run in a new process (the settings are read when torch starts), gelu and dropout so that
# oneDNN's and MKL's other kernels would be in it; prints a digest of the weights and the curve.
TRAIN = """
import hashlib, sys
from pathlib import Path
import pipeline, torch
from pipeline import cpu_numerics
from tests.test_trainer import resolved
from pipeline.train import run
base, arch = Path(sys.argv[1]), sys.argv[2]
out = base / sys.argv[3]
if sys.argv[5] == "0":  # the negative control: torch's own kernels
    cpu_numerics.engage = lambda: False
run(base / "shards", "v", 0, resolved({"arch": arch, "ffn": "gelu", "dropout": 0.1}, threads=int(sys.argv[4])), "x",
    out, base / ("c-" + sys.argv[3]))
digest = hashlib.sha256((out / "train_curve.csv").read_bytes())
for t in torch.load(out / "model.pt", weights_only=True)["state_dict"].values():
    digest.update(t.numpy().tobytes())
print(torch.backends.cpu.get_cpu_capability(), digest.hexdigest())
"""


def avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def trained(shards: Path, arch: str, tag: str, env: dict, threads: int = 1, route: bool = True) -> tuple[str, str]:
    """(ATen's capability, digest) of a tiny run in a process started with `env` on top of a clean one."""
    clean = {k: v for k, v in os.environ.items() if k not in cpu_numerics.PINNED and k not in CAPPED}
    done = subprocess.run([sys.executable, "-c", TRAIN, str(shards), arch, f"{arch}-{tag}", str(threads),
                           "1" if route else "0"],
                          cwd=ROOT, env={**clean, "ABLATION_LAB_TRACKING": "0", "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    capability, digest = done.stdout.split()[-2:]
    return capability, digest


def test_pin_sets_each_library_unless_turned_off_or_set_by_the_user():
    env = {"MKL_CBWR": "COMPATIBLE", "OPENBLAS_CORETYPE": "SkylakeX"}
    cpu_numerics.pin(env)
    assert env == ({**cpu_numerics.PINNED, **cpu_numerics.SPEED, "MKL_CBWR": "COMPATIBLE"} if X86
                   else {"MKL_CBWR": "COMPATIBLE", "OPENBLAS_CORETYPE": "SkylakeX"})
    off = {cpu_numerics.SETTING: "0"}
    cpu_numerics.pin(off)
    assert off == {cpu_numerics.SETTING: "0"}


@pytest.mark.skipif(not X86, reason="the pinning is for x86-64 with AVX2 (elsewhere a report says its numbers are the machine's)")
def test_this_process_runs_the_pinned_code_path():
    described = cpu_numerics.describe()  # conftest engaged it, as every stage does
    assert described["pinned"] and described["aten_capability"] == "AVX2"
    assert described["matmul"].startswith("openblas ") and described["matmul"].endswith(" Haswell, 1 thread")


@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_the_routed_kernels_are_numpys_openblas_and_ieee_square_roots():
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(s, generator=g) for s in ((37, 19), (19, 23), (37, 23)))
    assert torch.equal(a @ b, torch.from_numpy(a.numpy() @ b.numpy()))
    assert torch.equal(torch.addmm(c, a, b, beta=0.5, alpha=2.0),
                       torch.from_numpy(a.numpy() @ b.numpy()).mul_(2.0).add_(c, alpha=0.5))
    w, bias = torch.randn(8, 19, generator=g), torch.randn(8, generator=g)
    assert torch.equal(F.linear(a, w, bias), torch.from_numpy(a.numpy() @ w.numpy().T) + bias)
    q, k = torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 6, 4, generator=g)
    assert torch.equal(q @ k.transpose(-2, -1), torch.from_numpy(q.numpy() @ k.transpose(-2, -1).numpy()))
    assert torch.equal(torch.baddbmm(c[None], a[None], b[None], beta=0), torch.from_numpy(a.numpy() @ b.numpy())[None])
    half = torch.mm(a.bfloat16(), b.bfloat16())
    assert half.dtype == torch.bfloat16 and torch.equal(half, torch.from_numpy(
        a.bfloat16().float().numpy() @ b.bfloat16().float().numpy()).bfloat16())
    x = torch.rand(10_001, generator=g)
    assert torch.equal(torch.sqrt(x), torch.from_numpy(np.sqrt(x.numpy())))
    assert torch.equal(torch._foreach_sqrt([x])[0], torch.sqrt(x)) and torch.equal(x.clone().sqrt_(), torch.sqrt(x))
    # and the gradients go through the same kernel
    a.requires_grad_()
    (a @ b).sum().backward()
    assert torch.equal(a.grad, torch.from_numpy(np.ones((37, 23), np.float32) @ b.numpy().T))


@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_a_product_shared_among_threads_has_the_bits_of_one_call(monkeypatch):
    """Serial runs train at 2 threads, the grid's at 1: pieces of rows or batches, one OpenBLAS call
    each (cpu_numerics.shared_matmul), must give what one call gives, for every row count about the
    pieces' edges, sums over one K block and several, transposed operands (as autograd passes them)
    and the default study's and S1's products; SHARE lowered so that the small ones are shared too."""
    monkeypatch.setattr(cpu_numerics, "SHARE", 1)
    rng = np.random.default_rng(0)

    def check(x, y, threads):
        one = np.matmul(x, y)
        shared = np.empty_like(one)
        cpu_numerics.shared_matmul(x, y, shared, threads)
        return one.tobytes() == shared.tobytes()

    def mat(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    rows = [*range(126, 131), 191, 192, 193, 255, 257, 1000, 1024, 4096]
    split = 0
    for m in rows:
        for k, n in ((3, 2), (64, 256), (256, 64), (800, 33), (1537, 17)):
            x, y = mat(m, k), mat(k, n)
            assert check(x, y, 2) and check(x, y, 3) and check(x, y, 8), (m, k, n)
            assert check(mat(k, m).T, mat(n, k).T, 2), ("transposed", m, k, n)
            split += len(cpu_numerics.pieces(x, y, 3)) > 1
    assert split == len(rows) * 5  # every one of them was shared
    for b, m, k, n in ((64, 64, 16, 64), (64, 64, 64, 16), (128, 128, 32, 128), (3, 200, 40, 50), (1, 300, 20, 30)):
        x, y = mat(b, m, k), mat(b, k, n)
        assert check(x, y, 2) and check(x, y, 5), (b, m, k, n)
    # what is not shared: a vector (numpy's gemv), one array times itself (syrk), one thread
    x = mat(1024, 64)
    assert cpu_numerics.pieces(x, mat(64, 1), 2) == [] and cpu_numerics.pieces(x, x.T, 2) == []
    assert cpu_numerics.pieces(x, mat(64, 64), 1) == []
    # and torch's products, routed, give the same at 1 and 2 threads
    a, w = torch.randn(1024, 256), torch.randn(256, 1152)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = a @ w
        torch.set_num_threads(2)
        assert torch.equal(a @ w, alone)
    finally:
        torch.set_num_threads(before)
    # the control: pieces cut off the kernel's 24-row tiles give other bits
    monkeypatch.setattr(cpu_numerics, "ROWS", 64)
    assert not check(mat(128, 64), mat(64, 256), 2)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.slow  # every recorded model trained a step under a dispatch mode: ~25 s
@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_no_model_runs_an_op_whose_cpu_kernel_varies_between_cpus():
    """Every recorded model (tests/model_bits.py: every switch, the study, every preset's variants):
    built, a training step with the stages' optimizer, an evaluation forward and a greedy decode."""
    from model.generate import _greedy_pick, decode_loop
    from pipeline.training.optim import make_optimizer
    from tests.model_bits import FIXTURE, ModelConfig, batch, build_model

    with _Ops() as control:  # the detector sees what it is meant to
        torch.exp(torch.ones(3))
        q = torch.ones(1, 2, 3, 4)
        F.scaled_dot_product_attention(q, q, q)
    assert {"exp", "_scaled_dot_product_flash_attention_for_cpu"} <= control.seen
    found = {}
    for name, record in json.loads(FIXTURE.read_text()).items():
        with _Ops() as ops:
            cfg = ModelConfig(**record["config"])
            model = build_model(cfg).train()
            src, tgt_in, tgt_out = batch(cfg.vocab_size)
            _, loss = model(src, tgt_in, tgt_out)
            loss.backward()
            make_optimizer(model, 1e-3, (0.9, 0.95), 1e-8, 0.1, torch.device("cpu")).step()
            model.eval()
            with torch.no_grad():
                model(src, tgt_in, tgt_out)
                decode_loop(model, src, 4, _greedy_pick)
        if ops.seen & VARYING:
            found[name] = sorted(ops.seen & VARYING)
    assert not found, f"ops whose CPU kernel is MKL's or oneDNN's: {found}"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(not X86, reason="x86-64 only")
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_pinned_training_is_the_same_bits_on_every_code_path_another_cpu_would_take(tiny_shards, arch):
    native = trained(tiny_shards, arch, "pinned-native", {})
    assert native[0] == "AVX2"
    for tag, env in MACHINES.items():
        assert trained(tiny_shards, arch, f"pinned-{tag}", env) == native, tag
    # and at another thread count
    assert trained(tiny_shards, arch, "pinned-capped-2", CAPPED, threads=2)[1] == native[1]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(not X86, reason="x86-64 only")
def test_without_the_routing_another_mkl_branch_trains_other_bits(tiny_shards):
    """The control: torch's own products and vector maths, pinned as before issue #59, still move
    with MKL's branch, which is what a CPU of another maker changes."""
    own = trained(tiny_shards, "decoder_only", "own-strict", {}, route=False)
    other = trained(tiny_shards, "decoder_only", "own-compatible", {"MKL_CBWR": "COMPATIBLE"}, route=False)
    assert own[1] != other[1]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(not avx512(), reason="needs an AVX-512 CPU to play a machine without it by capping")
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_without_the_pinning_the_same_runs_differ(tiny_shards, arch):
    off = {cpu_numerics.SETTING: "0"}
    native = trained(tiny_shards, arch, "off-native", off)
    capped = trained(tiny_shards, arch, "off-capped", {**off, **CAPPED})
    assert (native[0], capped[0]) == ("AVX512", "AVX2")
    assert native[1] != capped[1]


def test_numpy_s_openblas_is_found_through_a_linked_environment(tmp_path):
    """A checkout whose .venv is a link to another (a worktree sharing one environment): numpy's
    path names the link, the loader's the target; the kernel must still be found, not scipy's."""
    real = tmp_path / "real" / "site-packages"
    for folder in ("numpy", "numpy.libs", "scipy.libs"):
        (real / folder).mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    numpy_file = str(tmp_path / "link" / "site-packages" / "numpy" / "__init__.py")
    scipy = {"internal_api": "openblas", "filepath": str(real / "scipy.libs" / "libscipy_openblas.so")}
    ours = {"internal_api": "openblas", "filepath": str(real / "numpy.libs" / "libscipy_openblas64_.so"),
            "architecture": "Haswell"}
    assert cpu_numerics.numpy_openblas([scipy, ours], numpy_file) is ours
    # Compared as the paths are named, the library is not under numpy's folder: the kernel is lost.
    assert not ours["filepath"].startswith(str(tmp_path / "link"))
    assert cpu_numerics.numpy_openblas([scipy], numpy_file) is None
    assert cpu_numerics.numpy_openblas([{"internal_api": "mkl", "filepath": ours["filepath"]}], numpy_file) is None


def test_a_run_that_wanted_pinning_and_lost_it_is_told_why(monkeypatch):
    monkeypatch.setattr(cpu_numerics, "wanted", lambda env=None: True)
    monkeypatch.setattr(cpu_numerics, "_state", {"engaged": False, "kernel": "SkylakeX"})
    assert "SkylakeX, not Haswell" in cpu_numerics.unpinned_why()
    monkeypatch.setattr(cpu_numerics, "_state", {"engaged": True, "kernel": "Haswell"})
    assert cpu_numerics.unpinned_why() is None
    monkeypatch.setattr(cpu_numerics, "wanted", lambda env=None: False)  # ABLATION_LAB_PIN_CPU=0
    monkeypatch.setattr(cpu_numerics, "_state", {"engaged": False})
    assert cpu_numerics.unpinned_why() is None


def test_the_report_names_why_a_run_was_not_pinned(monkeypatch):
    """train.json records why a run was not pinned and the report's line names it: a run that lost
    its pinning unasked (multi30k_cpu's, through a linked venv) once read as if ABLATION_LAB_PIN_CPU=0."""
    from pipeline.reporting.cost import numerics_note

    monkeypatch.setattr(cpu_numerics, "wanted", lambda env=None: True)
    monkeypatch.setattr(cpu_numerics, "_state", {"engaged": False, "kernel": "SkylakeX"})
    lost = cpu_numerics.describe()
    assert not lost["pinned"] and "SkylakeX, not Haswell" in lost["why"]
    note = numerics_note([{"device": "cpu", "cpu_numerics": lost}])
    assert "not pinned in 1 of 1" in note and "SkylakeX, not Haswell" in note
    monkeypatch.setenv(cpu_numerics.SETTING, "0")
    assert cpu_numerics.describe()["why"] == f"{cpu_numerics.SETTING}=0"
    older = {k: v for k, v in lost.items() if k != "why"}  # a train.json from before the reason
    assert "not recorded" in numerics_note([{"device": "cpu", "cpu_numerics": older}])
    if X86:
        monkeypatch.delenv(cpu_numerics.SETTING)
        monkeypatch.setattr(cpu_numerics, "_state", {"engaged": True, "kernel": "Haswell"})
        assert cpu_numerics.describe()["pinned"] and "why" not in cpu_numerics.describe()
