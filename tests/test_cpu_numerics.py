"""The same bits on every x86-64 CPU (pipeline/cpu_numerics.py): a training run started with the
AVX-512 code paths available and one capped to AVX2 (the way a test can play another CPU:
MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA) train the same weights when
pinned, and different ones when not (so the test can tell)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import cpu_numerics

ROOT = Path(__file__).resolve().parents[1]
CAPPED = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
X86 = platform.machine().lower() in cpu_numerics.X86_64
# A tiny run in a new process (the settings are read when torch starts), gelu so that oneDNN's
# kernels are in it as well as MKL's and ATen's; prints a digest of the weights and the curve.
TRAIN = """
import hashlib, sys
from pathlib import Path
import pipeline, torch
from tests.test_trainer import resolved
from pipeline.train import run
base, arch = Path(sys.argv[1]), sys.argv[2]
out = base / sys.argv[3]
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


def trained(shards: Path, arch: str, tag: str, env: dict, threads: int = 1) -> tuple[str, str]:
    """(ATen's capability, digest) of a tiny run in a process started with `env` on top of a clean one."""
    clean = {k: v for k, v in os.environ.items() if k not in cpu_numerics.PINNED and k not in CAPPED}
    done = subprocess.run([sys.executable, "-c", TRAIN, str(shards), arch, f"{arch}-{tag}", str(threads)],
                          cwd=ROOT, env={**clean, "ABLATION_LAB_TRACKING": "0", "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    capability, digest = done.stdout.split()[-2:]
    return capability, digest


def test_pin_sets_each_library_unless_turned_off_or_set_by_the_user():
    env = {"MKL_CBWR": "COMPATIBLE"}
    cpu_numerics.pin(env)
    assert env == ({**cpu_numerics.PINNED, "MKL_CBWR": "COMPATIBLE"} if X86 else {"MKL_CBWR": "COMPATIBLE"})
    off = {cpu_numerics.SETTING: "0"}
    cpu_numerics.pin(off)
    assert off == {cpu_numerics.SETTING: "0"}


@pytest.mark.skipif(not X86, reason="the pinning is for x86-64 (elsewhere a report says its numbers are the machine's)")
def test_this_process_runs_the_pinned_code_path():
    import torch  # noqa: F401  (conftest imported pipeline first, as every stage does)

    described = cpu_numerics.describe()
    assert described["pinned"] and described["aten_capability"] == "AVX2"


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(not X86, reason="x86-64 only")
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_pinned_training_is_the_same_bits_with_avx512_available_or_capped_to_avx2(tiny_shards, arch):
    native = trained(tiny_shards, arch, "pinned-native", {})
    capped = trained(tiny_shards, arch, "pinned-capped", CAPPED)
    assert native[0] == capped[0] == "AVX2"
    assert native[1] == capped[1]
    # and at another thread count (MKL's STRICT mode: its sums in one order whatever the threads)
    assert trained(tiny_shards, arch, "pinned-capped-2", CAPPED, threads=2)[1] == native[1]


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
