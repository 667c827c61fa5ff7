"""`bash run.sh gpu` on CPU: the no-CUDA path, the 124M benchmark's FLOP count against a hand count,
and the benchmarks and the stage timer run end to end at tiny shapes."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu import GPT2_SMALL, TARGETS, ReferenceGPT, bench_gpt, flops_per_token, gpt_config, verdicts
from benchmarks.stage_times import run as run_timed
from benchmarks.stage_times import stage_times
from model import build_model
from tests.conftest import ROOT

TINY = dict(vocab_size=97, d_model=32, n_heads=4, n_layers=2, d_ff=128, context=16)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU driver")
def test_without_cuda_the_command_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(["bash", "run.sh", "gpu", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines() == ["gpu: no CUDA device on this machine (nvidia-smi finds none); nothing run"]
    assert not out.exists() and not (ROOT / ".venv-gpu").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available")
def test_the_benchmark_without_cuda_prints_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and len(proc.stdout.strip().splitlines()) == 1 and "no CUDA" in proc.stdout
    assert not out.exists()


def test_flops_of_the_124m_model_match_a_hand_count():
    d, layers, vocab, context = 768, 12, 50304, 1024
    per_layer = 4 * d * d + 2 * d * 4 * d + 2 * d  # q, k, v, o; two FFN matrices; two LayerNorm gains
    weights = layers * per_layer + d  # + the final LayerNorm; token and position tables are lookups
    hand = 6 * weights + 12 * layers * d * context + 6 * d * vocab  # 6N + attention + tied output layer
    assert weights == 84_953_856  # GPT-2 small's ~85M non-embedding weights (without biases)
    assert flops_per_token(gpt_config(**GPT2_SMALL)) == hand


def test_the_reference_has_our_models_parameters_and_computes_a_causal_loss():
    cfg = gpt_config(**TINY)
    ours, ref = build_model(cfg), ReferenceGPT(cfg)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    x = torch.randint(4, 97, (2, 16))
    logits, loss = ref(None, x, x)
    changed = x.clone()
    changed[:, 10:] = 5
    later, _ = ref(None, changed, changed)
    assert torch.isfinite(loss)
    torch.testing.assert_close(logits[:, :10], later[:, :10])  # no position sees a later one


def test_the_benchmark_runs_end_to_end_at_a_tiny_shape_on_cpu():
    out = bench_gpt(TINY, torch.device("cpu"), batch=2, steps=1, repeats=1, compile_models=False)
    assert out["params"]["ours"] == out["params"]["reference"]
    for name in ("ours_eager", "reference_eager"):
        assert out[name]["tokens_per_s"] > 0 and 0 < out[name]["mfu"]
    assert out["ours_over_reference_step"] == out["ours_over_reference_step_eager"] > 0
    assert "mfu_compiled" not in out  # nothing compiled: no compiled figure is made up


def test_verdicts_compare_each_figure_with_its_target_and_leave_missing_ones_open():
    result = verdicts({"mfu_compiled": 0.5, "ours_over_reference_step": 0.95, "preset_wall_s": 300})
    assert result["mfu_compiled"]["met"] is True
    assert result["ours_over_reference_step"]["met"] is False
    assert result["preset_wall_s"]["met"] is True  # <= 300
    assert result["compiled_over_eager_step"] == {"value": None, "target": "<= 0.8", "met": None}
    assert set(result) == set(TARGETS)


def test_stage_times_sum_each_stage_to_the_next_and_group_families():
    lines = [(1.0, "Running stage 'download':"), (2.0, "noise"), (3.0, "Running stage 'train@a-0':"),
             (7.0, "Running stage 'train@a-1':"), (8.0, "Stage 'x' didn't change, skipping")]
    times = stage_times(lines, start=0.0, end=10.0)
    assert times["stages"] == {"download": 2.0, "train@a-0": 4.0, "train@a-1": 3.0}
    assert times["families"] == {"download": 2.0, "train": 7.0}
    assert times["total_s"] == 10.0 and times["before_first_stage_s"] == 1.0


def test_stage_times_passes_the_commands_exit_code_through():
    rc, times = run_timed([sys.executable, "-c", "print(\"Running stage 'a':\"); raise SystemExit(3)"])
    assert rc == 3 and list(times["stages"]) == ["a"]


def test_the_minimal_gpt_of_the_step_benchmark_has_our_shape_and_both_steps_run():
    import argparse

    from benchmarks.gpt_step import steps

    built = steps(argparse.Namespace(vocab=65, d_model=32, heads=4, layers=2, context=16, batch=2))
    assert built["params"]["ours"] == built["params"]["minimal"]
    built["step"]("ours")
    built["step"]("minimal")
