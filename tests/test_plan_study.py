"""pipeline.plan's study wall (pipeline/planning/study.py): every stage dvc.yaml lays out, timed as the
committed studies measured their stages, scheduled on --jobs slots; checked against each committed
study's run.json wall, leaving that study out of every fit (no timing here: the walls are committed)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline import plan
from pipeline.params import knockout_seeds, load_params
from pipeline.planning import calibration, estimate, study
from tests.committed import DEFAULT_PARAMS
from tests.test_plan import REPORTS, ROOT, STUDY_TOLERANCE, fitted_without, known_gaps, write
from tests.tiny_project import tiny_params


# The CPU studies: a study run on a GPU (reports/studies/*_h200, *_gpu) is not what the CPU time
# model and the CPU stage costs describe.
STUDIES = sorted(p.parent for p in (ROOT / "reports" / "studies").glob("*/run.json")
                 if json.loads(p.read_text())["device"].startswith("cpu"))


def variant_walls(report: Path) -> dict[str, float]:
    """Each variant's mean measured training loop (report.md's per-run table)."""
    walls: dict[str, list[float]] = {}
    for r in calibration.markdown_table(report.read_text(encoding="utf-8"), "Per-run values"):
        walls.setdefault(r["variant"], []).append(calibration.number(r["wall time (s)"].replace("⚠", "")))
    return {v: sum(w) / len(w) for v, w in walls.items()}


def planned_loops(folder: Path, cal: calibration.Calibration, peak: float) -> tuple[dict, dict]:
    """{(variant, scale): one run's training loop} for a committed study, under the time model `cal`,
    and by the same keys the share of it the loop's threads split (Row.parallel_share).
    A language model's whole plan needs only its params. A seq2seq study's steps and batches need
    its data, which the tests do not have: a variant takes the time model on the steps, FLOPs and
    mean batch its report recorded (as test_translation_preset_wall_within_tolerance), and where
    an older report has no such columns (cnn_dailymail_cpu, multi30k_cpu) its measured loops, so
    those two check the stage model alone; scale points keep the plan's guess without data."""
    params = load_params(folder / "params.yaml")
    rows = estimate.plan(params, None, "cpu", peak, cal, estimate.ram_bytes())[0]
    loops = {(r.variant, r.scale): r.seconds_per_run for r in rows}
    if estimate.task_of(params) != "language_modeling":
        report = folder / "report.md"
        recorded = {p.variant: cal.cpu_seconds(p.steps, p.sublayers, p.act_bytes, p.flops, peak, p.split, p.threads)
                    for p in calibration.study_points(report, cal.peak)}
        measured = variant_walls(report)
        for variant in params.ablations:
            loops[(variant, None)] = recorded.get(variant, measured[variant])
    return loops, {(r.variant, r.scale): r.parallel_share for r in rows}


# Issue #33: each committed study's wall (run.json, on 2 cores) within ±30% of the plan's, every
# figure fitted to the other studies (the training time model of the study's own products, pinned or
# torch's, and the stage costs, warm or cold as the study ran; seeds until decided's rounds one after
# another; side by side, each loop slowed by the part of it its threads split). Errors as of
# 2026-11-30, with the pinned runs fitted apart: cnn_dailymail_cpu -14%, multi30k_comparisons_cpu +18%,
# multi30k_cpu -16%, synthetic_decide +13%, synthetic_decide_obf -19%, tiny_shakespeare +1% and
# tiny_shakespeare_cpu -9% (both -j 2, each loop x1.22-1.24), tinystories_cpu -12%. Known gaps:
# cnn_dailymail_leak_cpu -30%: its evaluation decodes (45.7 s a stage, the others' median 4 s), which
# the stage costs do not model; nanogpt_shakespeare_char +47%: one of the two studies on torch's own
# products, so the other alone (multi30k_comparisons_cpu, 3 variants, its runs' peak 2.1x
# nanogpt's) fits the time model it is planned by.
PLAN_GAPS = {"cnn_dailymail_leak_cpu": "-30%: its evaluation's decoding (45.7 s a stage, the others' median 4 s) not modelled",
             "nanogpt_shakespeare_char": "+47%: torch's own products' time model fitted to the one other such study "
                                         "(3 variants, its runs' peak 2.1x this study's)"}


@pytest.mark.slow
@pytest.mark.parametrize("folder", known_gaps(STUDIES, PLAN_GAPS, lambda f: f.name), ids=[f.name for f in STUDIES])
def test_study_wall_within_tolerance(folder):
    cal, peak = fitted_without(folder / "report.md")
    # The machine the study ran on: its runs' own peak (calibration.day_speed); a pinned study's
    # runs are fitted as they ran, unscaled.
    peak *= calibration.day_speed(folder / "report.md", peak)
    params, run = load_params(folder / "params.yaml"), json.loads((folder / "run.json").read_text())
    costs = study.fit_costs([f for f in STUDIES if f != folder], warm=run.get("warm", False))
    assert folder.name not in costs.studies
    jobs = run.get("jobs", 1)
    loops, shares = planned_loops(folder, cal, peak)
    slowdown = {key: study.loop_slowdown(jobs, params.train.threads, run["cpu_count"], share)
                for key, share in shares.items()}
    predicted = study.rounds_wall(study.study_stages(params, loops, costs, slowdown), params, jobs)
    assert abs(predicted / run["wall_s"] - 1) <= STUDY_TOLERANCE, f"study wall {predicted:.0f} s, measured {run['wall_s']} s"


def test_stage_costs_are_the_measured_ones():
    """The default fit's figures are the committed run.json's own: nanoGPT's knock-outs per seed,
    and a train stage's cost besides its loop (stage_s less the per-run table's walls)."""
    folder = ROOT / "reports" / "studies" / "nanogpt_shakespeare_char"
    run = json.loads((folder / "run.json").read_text())
    measured = study.measured_study(folder)
    assert measured["knockout"] == pytest.approx(run["stage_s"]["knockout"] / 3)
    assert measured["train_fixed"] == pytest.approx(
        (run["stage_s"]["train"] - sum(study.measured_loops(folder / "report.md"))) / 12)
    assert 0 < measured["train_fixed"] < 10  # seconds: process start, imports, data, save, DVC
    costs = study.fit_costs(STUDIES)
    assert costs.per_stage["knockout"] == pytest.approx(measured["knockout"])  # the one study with knock-outs


def toy_stages(loop: float = 10.0):
    params = load_params(DEFAULT_PARAMS)  # the default study as committed
    costs = study.StageCosts({f: 1.0 for f in study.FIXED}, 2.0, ["toy"])
    return params, study.study_stages(params, {(v, None): loop for v in params.ablations}, costs)


def test_one_job_is_the_sum_and_many_are_the_critical_path():
    params, stages = toy_stages()
    runs = len(params.ablations) * len(params.seeds)
    assert len(stages) == 5 + 2 * runs + len(knockout_seeds(params.knockout.seeds, params.seeds)) + 1
    assert study.schedule(stages, 1) == pytest.approx(sum(s.seconds for s in stages))
    # Unlimited slots: data chain (5 x 1) + train (2 + 10) + its evaluate or knock-out (1) + report (1).
    assert study.schedule(stages, 1000) == pytest.approx(5 + 12 + 1 + 1)
    walls = [study.schedule(stages, j) for j in (1, 2, 3, 4, 8)]
    assert walls == sorted(walls, reverse=True)
    # Two slots can at best halve the work after the data chain.
    assert study.schedule(stages, 2) >= 5 + (sum(s.seconds for s in stages) - 5) / 2 - 1e-9


def test_seeds_until_decided_rounds_run_one_after_another():
    """Each round is a grid run ending in the report: round 2 holds the runs its look added, with
    check_params and the report again, and the wall is the rounds' schedules summed."""
    params = load_params(DEFAULT_PARAMS)
    base, other = params.report.baseline, next(v for v in params.ablations if v != params.report.baseline)
    top = max(params.seeds)
    runs = {f"{v}-{s}": {"variant": v, "seed": s} for v in (base, other) for s in (top + 1, top + 2, top + 3)}
    looks = [len(params.seeds), len(params.seeds) + 2, len(params.seeds) + 3]
    params = params.model_validate({**params.model_dump(), "decide": {"looks": looks, "alpha": 0.05, "runs": runs}})
    costs = study.StageCosts({f: 1.0 for f in study.FIXED}, 2.0, ["toy"])
    stages = study.study_stages(params, {(v, None): 10.0 for v in params.ablations}, costs)
    first, second, third = study.rounds(stages, params)
    assert {s.name for s in first} == {s.name for s in stages if "_more@" not in s.name}
    assert [s.name for s in second][0] == "check_params" and second[-1].name == "report"
    assert {s.name.partition("@")[2] for s in second if "@" in s.name} == {f"{v}-{s}" for v in (base, other)
                                                                         for s in (top + 1, top + 2)}
    assert {s.name.partition("@")[2] for s in third if "@" in s.name} == {f"{base}-{top + 3}", f"{other}-{top + 3}"}
    serial = study.schedule(stages, 1)
    assert study.rounds_wall(stages, params, 1) == pytest.approx(serial + 2 * (1.0 + 1.0))  # check_params + report
    # Unlimited slots: a later round is check_params, then train (2 + 10), its evaluate (1), the report.
    assert study.rounds_wall(stages, params, 1000) == pytest.approx(study.schedule(first, 1000) + 2 * (1 + 12 + 1 + 1))


def test_a_stage_never_starts_before_what_it_depends_on():
    """Dependencies honoured: a knock-out waits for its seed's baseline even with free slots, and
    the report for every stage (here the knock-out's train is made the longest)."""
    params, stages = toy_stages(loop=1.0)
    slow = f"train@{params.report.baseline}-{knockout_seeds(params.knockout.seeds, params.seeds)[0]}"
    stages = [replace(s, seconds=100.0) if s.name == slow else s for s in stages]
    # 5 data + the slow train + its knock-out (or evaluate) + report.
    assert study.schedule(stages, 1000) == pytest.approx(5 + 100 + 1 + 1)
    with pytest.raises(estimate.PlanError, match="--jobs"):
        study.schedule(stages, 0)


@pytest.mark.multiprocess
def test_the_plans_stages_are_dvcs(tmp_path):
    """The stages the plan times are the ones dvc.yaml lays out for the same params (lr sweep,
    scales and knock-outs on), by name."""
    from tests.tiny_project import make_project, sh

    params = tiny_params(lr_sweep=[0.01], scales={"wide": {"model": {"d_model": 64}}}, knockout={"seeds": [0]})
    env = make_project(tmp_path / "project", params)
    listed = {line.split()[0] for line in sh(["dvc", "stage", "list"], tmp_path / "project", env).stdout.splitlines()}
    loaded = load_params(tmp_path / "project" / "params.yaml")
    loops = {(v, s): 1.0 for v in loaded.ablations for s in (None, *loaded.scales)}
    costs = study.StageCosts({f: 1.0 for f in study.FIXED}, 1.0, ["toy"])
    assert {s.name for s in study.study_stages(loaded, loops, costs)} == listed


@pytest.mark.slow
def test_plan_prints_the_study_wall(tmp_path, capsys):
    path = write(tmp_path / "params.yaml", tiny_params(knockout={"seeds": [0]}))
    plan.main(["--params", str(path), "--shards", str(tmp_path / "none"), "--jobs", "2", "--cpu-peak", "studies"])
    out = capsys.readouterr().out
    assert "Study wall: **" in out and "at --jobs 2" in out and "knockout 2 x" in out  # knockout@0 and seed 1's off marker
    plan.main(["--params", str(path), "--shards", str(tmp_path / "none"), "--json", "--cpu-peak", "studies"])
    result = json.loads(capsys.readouterr().out)["study"]
    assert result["jobs"] == 1 and result["wall_s"] == pytest.approx(result["serial_s"])
    assert result["families"]["train"]["stages"] == 4 and result["families"]["knockout"]["stages"] == 2
    with pytest.raises(SystemExit, match=r"^plan: --jobs: 0 is not"):
        plan.main(["--params", str(path), "--jobs", "0"])
    (tmp_path / "reports").mkdir()  # calibration reports without run.json: no stage costs
    for report in REPORTS:
        (tmp_path / "reports" / report.parent.name).mkdir(exist_ok=True)
        (tmp_path / "reports" / report.parent.name / "report.md").write_text(report.read_text())
        if (report.parent / "params.yaml").is_file():
            (tmp_path / "reports" / report.parent.name / "params.yaml").write_text((report.parent / "params.yaml").read_text())
    plan.main(["--params", str(path), "--shards", str(tmp_path / "none"), "--calibration", str(tmp_path / "reports"),
               "--cpu-peak", "studies"])
    assert "Study wall: not predicted (no committed study has a run.json" in capsys.readouterr().out


def test_warm_stage_costs_come_from_warm_studies_and_else_from_cold_ones(tmp_path):
    """The grid launcher's warm starts cost less than a plain `dvc repro`'s new processes: a warm
    plan takes its figures from studies run warm (run.json `warm`), a family no warm study timed
    from the cold ones (an upper bound, said so); a cold plan the other way round (a lower bound)."""
    import shutil

    folders = []
    for name, warm in (("tinystories_cpu", False), ("tiny_shakespeare_cpu", True)):
        folder = tmp_path / name
        shutil.copytree(ROOT / "reports" / "studies" / name, folder)
        run = json.loads((folder / "run.json").read_text())
        run["warm"], run["jobs"] = warm, 1  # whichever way (and -j) the committed study ran
        if warm:
            run["stage_s"]["evaluate"] /= 4
            del run["stage_s"]["report"]
        (folder / "run.json").write_text(json.dumps(run))
        folders.append(folder)
    cold_only, warm_only = (study.measured_study(f) for f in folders)
    warm = study.fit_costs(folders, warm=True)
    assert warm.per_stage["evaluate"] == pytest.approx(warm_only["evaluate"])
    assert warm.per_stage["report"] == pytest.approx(cold_only["report"]) and warm.borrowed == ["report"]
    assert "as no study run warm timed them, report as run cold, an upper bound" in warm.describe()
    cold = study.fit_costs(folders, warm=False)
    assert cold.studies == ["tinystories_cpu"] and cold.per_stage["evaluate"] == pytest.approx(cold_only["evaluate"])
    # and the other way: a family no cold study timed takes the warm figure, a lower bound
    del (cold_run := json.loads((folders[0] / "run.json").read_text()))["stage_s"]["train_bpe"]
    (folders[0] / "run.json").write_text(json.dumps(cold_run))
    cold = study.fit_costs(folders, warm=False)
    assert cold.borrowed == ["train_bpe"] and cold.per_stage["train_bpe"] == pytest.approx(warm_only["train_bpe"])
    assert "as no study run cold timed them, train_bpe as run warm, a lower bound" in cold.describe()


def test_seeds_until_decided_costs_its_rounds_and_states_both_ends():
    """decide.runs adds train_more / evaluate_more / knockout_more stages (the baseline's knocks out,
    a variant's writes its marker); decide_bounds gives the study at the first look and at the budget."""
    from pipeline.params import Params

    base = load_params(DEFAULT_PARAMS)
    params = Params.model_validate({**base.model_dump(), "decide": {
        "looks": [3, 5], "runs": {"baseline-3": {"variant": "baseline", "seed": 3},
                                   "single_head-3": {"variant": "single_head", "seed": 3}}}})
    costs = study.StageCosts({**{f: 1.0 for f in study.FIXED}, "knockout": 5.0}, 2.0, ["toy"])
    loops = {(v, None): 10.0 for v in params.ablations}
    names = {s.name: s for s in study.study_stages(params, loops, costs)}
    assert {"train_more@baseline-3", "evaluate_more@single_head-3", "knockout_more@single_head-3"} <= set(names)
    assert names["knockout_more@baseline-3"].seconds == costs.per_stage["knockout"]  # knockout.seeds: all
    assert names["knockout_more@single_head-3"].seconds < costs.per_stage["knockout"]  # its off marker
    first, budget = study.decide_bounds(params)
    n_first, n_budget = (len(study.study_stages(p, loops, costs)) for p in (first, budget))
    assert n_first == len(study.study_stages(base, loops, costs))
    assert n_budget - n_first == 3 * 2 * len(params.ablations)  # seeds 3 and 4 for every variant, 3 stages each
    assert study.stage_counts(params)["train_more"] == 2 and study.decide_bounds(base) is None
