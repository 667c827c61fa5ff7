"""The spread part of `bash run.sh gpu` on CPU (benchmarks/gpu_spread.py): the statistics on known
numbers, the study it generates from the two recipes' presets, and its figures read from a scratch
project, finished runs and one cut short."""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from benchmarks import gpu, gpu_spread
from benchmarks.gpu_spread import ARMS, SEEDS, interval_stats, position, spread_figures
from tests.conftest import ROOT

# Student's t, 0.975 quantile, 4 and 2 degrees of freedom (tables).
T4, T2 = 2.7764451051977987, 4.302652729911275


def test_interval_stats_on_known_numbers():
    s = interval_stats([1.0, 2.0, 3.0, 4.0, 5.0], reference=9.0)
    sd = math.sqrt(2.5)  # squares of deviations 4 + 1 + 0 + 1 + 4 = 10, over n - 1 = 4
    assert (s["n"], s["mean"]) == (5, 3.0) and s["sd"] == pytest.approx(sd)
    assert s["t"] == pytest.approx(T4, rel=1e-9)
    assert s["ci_half_width"] == pytest.approx(T4 * sd / math.sqrt(5)) == pytest.approx(1.963243161)
    assert s["ci"] == pytest.approx([3 - 1.963243161, 3 + 1.963243161])
    assert s["pi_half_width"] == pytest.approx(T4 * sd * math.sqrt(1 + 1 / 5)) == pytest.approx(4.808943987)
    assert s["pi"] == pytest.approx([-1.808943987, 7.808943987])
    # 9.0 lies above the prediction interval, by 9 - 7.8089...
    assert s["reference"]["where"] == "above" and s["reference"]["gap"] == pytest.approx(1.191056013)


def test_interval_stats_of_a_recipe_like_spread_and_the_reference_inside_and_below():
    runs = [1.4716, 1.4750, 1.4690, 1.4731, 1.4705]
    s = interval_stats(runs, reference=1.4697)
    mean, sd = float(np.mean(runs)), float(np.std(runs, ddof=1))
    assert s["mean"] == pytest.approx(1.47184) and s["sd"] == pytest.approx(sd)
    assert s["pi"] == pytest.approx([mean - T4 * sd * math.sqrt(1.2), mean + T4 * sd * math.sqrt(1.2)])
    assert s["reference"] == {"value": 1.4697, "where": "inside", "gap": None}
    high = interval_stats([1.52, 1.53, 1.54], reference=1.4697)  # mean 1.53, sd 0.01, t(0.975, 2)
    assert high["pi"][0] == pytest.approx(1.53 - T2 * 0.01 * math.sqrt(4 / 3)) == pytest.approx(1.4803173)
    # 1.4697 below the interval: the gap to its lower bound, negative
    assert high["reference"]["where"] == "below" and high["reference"]["gap"] == pytest.approx(-0.0106173, abs=1e-7)


def test_fewer_than_two_runs_give_no_interval_and_say_so():
    one, none = interval_stats([1.47], reference=1.4697), interval_stats([], reference=1.4697)
    assert (one["n"], one["mean"], one["ci"], one["pi"], one["note"]) == (1, 1.47, None, None, "n=1: no interval")
    assert (none["n"], none["mean"], none["note"]) == (0, None, "no runs")
    assert one["reference"] == {"value": 1.4697, "where": None, "gap": None}
    assert position(2.0, [1.0, 2.0])["where"] == "inside"  # the bounds belong to the interval


def test_the_arm_is_exactly_what_the_23a8e701_preset_sets_differently():
    assert gpu_spread.arm_overrides() == {"model": {"ffn": "gelu_tanh"},
                                          "train": {"weight_decay": 0.01, "decay_embeddings": False,
                                                    "warmup_start": "zero"}}


def test_the_spread_study_is_both_recipes_at_five_seeds(tmp_path):
    from pipeline.params import resolve_variant
    from pipeline.preset import validate

    path = tmp_path / f"{gpu_spread.NAME}.yaml"
    path.write_text(gpu_spread.spread_preset())
    params = validate(path)  # what pipeline.preset checks before writing params.yaml
    assert params.seeds == [0, 1, 2, 3, 4] == list(SEEDS) and list(params.ablations) == list(ARMS)
    for variant, preset in ARMS.items():
        want = resolve_variant(validate(ROOT / "presets" / f"{preset}.yaml"), "baseline")
        assert resolve_variant(params, variant) == want, variant
    assert params.train.runs_per_gpu == "auto"  # the planner's memory estimate and the cores decide


def test_a_difference_outside_model_and_train_is_refused(tmp_path):
    (tmp_path / "presets").mkdir()
    for name in (gpu_spread.TODAY, gpu_spread.THEN):
        raw = yaml.safe_load((ROOT / "presets" / f"{name}.yaml").read_text())
        if name == gpu_spread.THEN:
            raw["evaluate"]["temperature"] = 1.0
        (tmp_path / "presets" / f"{name}.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match="differs from .* in evaluate, which an ablation arm cannot hold"):
        gpu_spread.arm_overrides(tmp_path)


def write_run(project: Path, run: str, best: float, val_loss: float | None) -> None:
    (project / "data" / "runs" / run).mkdir(parents=True)
    (project / "data" / "runs" / run / "train.json").write_text(json.dumps({
        "val_estimate_best": best, "val_estimate_best_step": 2000, "wall_time_s": 300.0,
        "gpu": {"slots": 16, "slot": 0, "why": "16 (train.runs_per_gpu auto: ...)"}}))
    if val_loss is not None:
        (project / "data" / "eval" / run).mkdir(parents=True)
        (project / "data" / "eval" / run / "eval.json").write_text(json.dumps({"val_loss": val_loss}))


def test_the_figures_of_finished_runs_and_of_a_run_cut_short(tmp_path):
    project = tmp_path / "study-x.abc"
    base = [1.470, 1.472, 1.468, 1.474, 1.471]
    for seed, best in zip(SEEDS, base):
        write_run(project, f"baseline-{seed}", best, best - 0.006)
    for seed, best in zip(SEEDS[:3], [1.480, 1.482, 1.479]):
        write_run(project, f"nanogpt_23a8e701-{seed}", best, None if seed == 2 else best - 0.005)
    logs = project / ".dvc" / "tmp" / "grid"
    logs.mkdir(parents=True)
    (logs / "train@nanogpt_23a8e701-3.log").write_text(
        "step 100/5000 loss 2.1 lr 1.00e-03 tokens/s 1 ETA 0:01:00\nval estimate 1.9000 at step 250/5000\n"
        "val estimate 1.4850 at step 2000/5000\nval estimate 1.4900 at step 2250/5000\n")
    found = spread_figures(project, 1.4697)
    arms = found["spread"]["arms"]
    assert arms["baseline"]["finished_seeds"] == [0, 1, 2, 3, 4] and arms["baseline"]["unfinished"] == {}
    assert arms["baseline"]["best_estimate"] == interval_stats(base, 1.4697)
    assert arms["baseline"]["whole_split_val_loss"]["values"] == pytest.approx([b - 0.006 for b in base])
    then = arms["nanogpt_23a8e701"]
    assert then["finished_seeds"] == [0, 1, 2] and then["best_estimate"]["n"] == 3
    assert then["whole_split_val_loss"]["n"] == 2  # seed 2 trained but was not evaluated
    assert then["unfinished"] == {"3": {"best_estimate_so_far": 1.485, "at_step": 2000, "last_step": 2250,
                                        "steps": 5000},
                                  "4": {"note": "no estimate yet"}}
    assert found["spread_baseline_best_estimate_mean"] == pytest.approx(np.mean(base))
    assert found["spread"]["runs_per_gpu"] == [{"slots": 16, "why": "16 (train.runs_per_gpu auto: ...)"}]
    assert {k for k in found if k != "spread"} <= gpu.REPORTED
    lines = gpu_spread.summary_lines(found)
    assert len(lines) == 2 and "1.4697" in lines[0] and "5 runs" in lines[0]
    assert spread_figures(None)["spread"]["note"]  # cut before the scratch project existed


def test_the_trainer_logs_each_estimate_in_the_line_the_spread_reads(tmp_path):
    from pipeline.training import trainer
    from model import ModelConfig, build_model

    rng = np.random.default_rng(0)
    data = trainer.Data(task="language_modeling", train=None, val=None, ids={"pad_id": 0, "bos_id": 2, "eos_id": 3},
                        batch_tokens=0, batch_size=4, context=8, seed=0,
                        train_stream=rng.integers(4, 20, 2000), val_stream=rng.integers(4, 20, 500))
    cfg = ModelConfig(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=0, n_decoder_layers=1, d_ff=32,
                      max_len=8, arch="decoder_only", dropout=0.0)
    from pipeline.params import TrainParams

    tcfg = TrainParams(device="cpu", budget_steps=6, batch_size=4, context=8, warmup_steps=2, warmup_start="zero",
                       eval_every=3, eval_examples=8, log_every=3, checkpoint_every=100, threads=1).model_dump()
    lines: list[str] = []
    torch.manual_seed(0)
    result = trainer.train(build_model(cfg), data, tcfg, tmp_path / "ckpt", "h",
                           log=lambda *a: lines.append(" ".join(map(str, a))))
    found = gpu_spread.estimates_so_far("\n".join(lines))
    assert found == {"best_estimate_so_far": round(result["val_estimate_best"], 4), "at_step":
                     result["val_estimate_best_step"], "last_step": 6, "steps": 6}


def test_the_gpu_command_runs_the_generated_study_through_study_sh(tmp_path):
    parts = {p.name: p for p in gpu.gpu_parts(tmp_path, argparse.Namespace(batch=16, large_batch=32, steps=10,
                                                                            repeats=5))}
    spread = parts["spread"]
    assert spread.argv == ["bash", "scripts/study.sh", gpu_spread.NAME] and spread.env["STUDY_GRID_ARGS"] == ""
    assert Path(spread.env["STUDY_PRESET_FILE"]).read_text() == gpu_spread.spread_preset()
    assert gpu.NANOGPT_VAL_LOSS == gpu_spread.NANOGPT_VAL_LOSS
    figures = spread.figures("")  # nothing run yet: the JSON still gets its (empty) spread
    assert figures["spread"]["note"] and "spread_launch_to_report_s" not in figures


@pytest.mark.multiprocess
def test_study_sh_names_a_missing_generated_preset():
    proc = subprocess.run(["bash", "scripts/study.sh", "x"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "STUDY_PRESET_FILE": "/nonexistent/x.yaml"})
    assert proc.returncode == 2 and proc.stderr.strip() == "study: no preset '/nonexistent/x.yaml'"


def spread_of(today: list[float], then: list[float]) -> dict:
    arms = {}
    for arm, values in zip(ARMS, (today, then)):
        arms[arm] = {"best_estimate": {"values": values},
                     "per_seed": {str(s): {"best_estimate": v, "val_loss": v} for s, v in enumerate(values)}}
    return {"seeds": list(range(len(today))), "arms": arms}


def test_the_two_readings_are_compared_by_welch_and_by_seed():
    """Welch's t-test against scipy's own and a hand-made interval; equal arms do not differ."""
    from scipy import stats as sps

    today, then = [1.4666, 1.4603, 1.4629, 1.4632, 1.4627], [1.4774, 1.4652, 1.4746, 1.4771, 1.4720]
    got = gpu_spread.compare_arms(spread_of(today, then))
    assert got["welch_p"] == pytest.approx(sps.ttest_ind(then, today, equal_var=False).pvalue)
    assert got["paired_p"] == pytest.approx(sps.ttest_rel(then, today).pvalue)
    assert got["difference"] == pytest.approx(np.mean(then) - np.mean(today))
    lo, hi = got["ci"]
    assert lo < got["difference"] < hi and (lo > 0) == got["differ"] is True
    # the Welch interval excludes 0 exactly when Welch's p is below alpha
    same = gpu_spread.compare_arms(spread_of(today, [v + 0.0001 * (-1) ** i for i, v in enumerate(today)]))
    assert not same["differ"] and same["ci"][0] < 0 < same["ci"][1]


def test_the_committed_comparison_is_what_the_committed_spread_gives():
    """reports/gpu/h200_run8_spread_readings.json, which docs/gpu.md cites, recomputed from run 8."""
    committed = json.loads((ROOT / "reports/gpu/h200_run8_spread_readings.json").read_text())
    spread = json.loads((ROOT / "reports/gpu" / committed["from"]).read_text())["parts"]["spread"]["spread"]
    for quantity in ("best_estimate", "whole_split_val_loss"):
        again = json.loads(json.dumps(gpu_spread.compare_arms(spread, quantity)))
        assert set(again) == set(committed[quantity])
        for key, value in again.items():
            assert committed[quantity][key] == (pytest.approx(value) if isinstance(value, (float, list)) else value), key
