"""Seeds until decided, the DVC side: params.yaml's decide block, the loop's params edit, the report's record
(typed, pipeline.deciding.record: what reports/decisions.json holds, byte for byte)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.deciding.record import Baseline, Comparison, Record
from pipeline.deciding.rule import Decision, Plan
from pipeline.grid.decide import add_runs, with_runs
from pipeline.params import ParamsError, load_params
from tests.committed import ROOT

PARAMS = """\
# a comment the loop must keep
seeds: [0, 1, 2]
ablations:
  baseline: {}
  single_head: {model: {n_heads: 1}}
  no_residual: {model: {residual: false}}

# Seeds until decided
decide:
  looks: [3, 5, 8]   # the looks' comment
  alpha: 0.05
  margin: 0.05
  runs: {}  # written by the loop

knockout:
  seeds: all
"""


def write(tmp_path: Path, text: str = PARAMS) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_the_edit_adds_runs_and_keeps_every_other_line(tmp_path):
    path = write(tmp_path)
    add_runs(path, [("single_head", 3), ("baseline", 3)])
    text = path.read_text()
    assert yaml.safe_load(text)["decide"]["runs"] == {"baseline-3": {"variant": "baseline", "seed": 3},
                                                      "single_head-3": {"variant": "single_head", "seed": 3}}
    kept = [line for line in PARAMS.splitlines() if "runs:" not in line]
    assert all(line in text.splitlines() for line in kept)
    add_runs(path, [("single_head", 4)])  # a second round adds, keeps the first
    runs = load_params(path).decide.runs
    assert sorted(runs) == ["baseline-3", "single_head-3", "single_head-4"]
    again = path.read_text()
    add_runs(path, [])
    assert path.read_text() == again  # nothing to add: the same bytes


def test_the_edit_appends_runs_to_a_decide_block_without_them(tmp_path):
    text = PARAMS.replace("  runs: {}  # written by the loop\n", "")
    out = with_runs(text, [("baseline", 3)])
    assert yaml.safe_load(out)["decide"]["runs"] == {"baseline-3": {"variant": "baseline", "seed": 3}}
    assert yaml.safe_load(out)["knockout"] == {"seeds": "all"}


def test_a_run_the_schema_refuses_never_reaches_params_yaml(tmp_path):
    path = write(tmp_path)
    before = path.read_text()
    with pytest.raises(ParamsError, match="decide.runs"):
        add_runs(path, [("nope", 3)])
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]  # no temp file left


@pytest.mark.parametrize("edit,match", [
    (("looks: [3, 5, 8]", "looks: [2, 5, 8]"), "decide.looks: the first look is at 2 seeds"),
    (("looks: [3, 5, 8]", "looks: [3, 8, 5]"), "decide.looks: .* must increase"),
    (("runs: {}", "runs: {single_head-9: {variant: single_head, seed: 9}}"), "decide.runs.single_head-9: seed 9"),
    (("runs: {}", "runs: {single_head-3: {variant: no_residual, seed: 3}}"), "the key must be variant-seed"),
    (("runs: {}", "runs: {other-3: {variant: other, seed: 3}}"), "'other' is not a variant"),
    (("looks: [3, 5, 8]", "looks: []"), None),
])
def test_the_decide_block_is_checked(tmp_path, edit, match):
    path = write(tmp_path, PARAMS.replace(*edit))
    if match is None:
        assert load_params(path).decide.looks == []
        return
    with pytest.raises(ParamsError, match=match):
        load_params(path)


def test_runs_left_with_the_study_off_are_refused(tmp_path):
    path = write(tmp_path, PARAMS.replace("looks: [3, 5, 8]", "looks: []").replace(
        "runs: {}", "runs: {single_head-3: {variant: single_head, seed: 3}}"))
    with pytest.raises(ParamsError, match="decide.runs: .* decide.looks is empty"):
        load_params(path)


def test_the_rounds_times_add_up_stage_by_stage():
    from pipeline.grid.decide import summed_times
    one = {"command": "python -m pipeline.grid -j 2", "jobs": 2, "warm": True, "total_s": 10.0,
           "before_first_stage_s": 1.5, "stages": {"train@baseline": 6.0, "report": 1.0},
           "families": {"train": 6.0, "report": 1.0}, "retries": 0}
    two = {**one, "total_s": 4.25, "before_first_stage_s": 0.5, "stages": {"train_more@baseline-3": 2.5, "report": 1.25},
           "families": {"train_more": 2.5, "report": 1.25}, "retries": 1}
    out = summed_times([one, two], "python -m pipeline.grid.decide -j 2")
    assert out["total_s"] == 14.25 and out["before_first_stage_s"] == 1.5 and out["retries"] == 1
    assert out["stages"] == {"train@baseline": 6.0, "report": 2.25, "train_more@baseline-3": 2.5}
    assert out["families"] == {"train": 6.0, "report": 2.25, "train_more": 2.5}
    assert out["rounds"] == [{"total_s": 10.0, "stages": 2}, {"total_s": 4.25, "stages": 2}]


def comparison(state: str, looks=(), needs=()) -> Comparison:
    """A comparison as a record holds it, with only what the test reads: (n, mean, lo, hi) per look."""
    verdicts = [state if i == len(looks) - 1 else "continue" for i in range(len(looks))]
    return Comparison([Decision(*look, verdict) for look, verdict in zip(looks, verdicts)], state, None, list(needs),
                      len(looks), None, None, None)


def a_record(plan: Plan, variants: dict[str, Comparison], needs=()) -> Record:
    return Record(plan, False, list(range(plan.budget)), Baseline("baseline", 3, list(needs), None), variants,
                  "val_loss", None)


def test_the_next_round_is_what_the_record_asks_for():
    record = a_record(Plan((3, 5), 0.05, None, 2), {"single_head": comparison("continue", needs=[3, 4]),
                                                     "no_residual": comparison("worse")}, needs=[3, 4])
    assert record.next_runs() == [("baseline", 3), ("baseline", 4), ("single_head", 3), ("single_head", 4)]


def test_the_committed_records_read_back_as_written():
    """Every committed decisions.json is read by the typed record; one of today's shape is written
    back byte for byte, an older one (before per-seed values and fingerprints) keeps its numbers."""
    import json

    from pipeline.deciding.record import read

    files = sorted((ROOT / "reports").glob("**/decisions.json"))
    assert any(read(f) is None for f in files)  # decide off: {"off": true}
    current = [f for f in files if "fingerprint" in f.read_text()]
    assert current
    for f in current:
        assert json.dumps(read(f).to_json(), indent=2) + "\n" == f.read_text(), f
    for f in files:
        data, record = json.loads(f.read_text()), read(f)
        if record is not None:
            assert (record.runs_spent, record.done) == (data["runs_spent"], data["done"]), f


def test_the_default_params_have_the_study_off():
    from tests.committed import DEFAULT_PARAMS

    params = load_params(DEFAULT_PARAMS)
    assert params.decide.looks == [] and params.decide.runs == {}


def test_the_reports_record_decides_from_the_runs_eval_files():
    from pipeline.reporting.decisions import decision_blocks, record
    from pipeline.reporting.inputs import Run
    from pipeline.reporting.render import to_markdown

    def runs_for(values: dict[str, list[float]]) -> dict:
        return {(v, s): Run(v, s, eval={"val_loss": x}) for v, xs in values.items() for s, x in enumerate(xs)}

    # no_residual is far worse at 3 seeds; single_head is within noise: it needs the next look's seeds.
    runs = runs_for({"baseline": [1.0, 1.1, 0.9], "no_residual": [5.0, 5.2, 4.85],
                     "single_head": [1.01, 1.08, 0.93]})
    rec = record(runs, ["baseline", "no_residual", "single_head"], [0, 1, 2], "baseline", "val_loss",
                 [3, 5, 8], 0.05, None)
    assert rec.variants["no_residual"].state == "worse" and rec.variants["no_residual"].needs == []
    assert rec.variants["single_head"].state == "continue" and rec.variants["single_head"].needs == [3, 4]
    assert rec.baseline.needs == [3, 4] and not rec.done
    assert (rec.runs_spent, rec.fixed_design_runs) == (9, 24)
    text = to_markdown("t", decision_blocks(rec))
    assert "Seeds until decided" in text and "not valid after adaptive stopping" in text
    assert "| no_residual | 3 | 3 |" in text


@pytest.mark.repro
@pytest.mark.kill
@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_loop_runs_rounds_through_dvc_and_resumes_after_a_kill(tiny_repo, tmp_path):
    """`bash run.sh decide` on the tiny project: every variant trains `seeds`, open comparisons get the
    next look's seeds as train_more stages; killed mid-round and started again, it ends with the same
    record a plain `dvc repro` reproduces, and nothing left to run."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.tiny_project import copy_project, ran_stages, sh, tiny_params, write_params

    project = tmp_path / "project"
    env = {**copy_project(tiny_repo, project), "ABLATION_LAB_TRACKING": "0"}
    params = tiny_params(seeds=[0, 1], decide={"looks": [2, 3, 4], "alpha": 0.05, "margin": None, "runs": {}},
                         knockout={"seeds": "all", "parts": ["heads"], "max_loss_tokens": 64})
    write_params(project, params)
    loop = [sys.executable, "-m", "pipeline.grid.decide", "-j", "1"]
    proc = subprocess.Popen(loop, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    started = project / "data" / "checkpoints" / "baseline-2"  # the second round's first run, training
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, f"the loop ended before a second round: {proc.stdout.read()}"
    os.killpg(proc.pid, signal.SIGKILL)  # mid-round: params.yaml has the added runs, not yet trained
    proc.wait()
    assert "baseline-2" in load_params(project / "params.yaml").decide.runs
    assert not (project / "data" / "eval" / "baseline-2" / "eval.json").exists()
    times = tmp_path / "times.json"  # scripts/study.sh's run.json reads the rounds' summed times
    for _ in range(60):  # the killed launcher's guard ends its processes, then frees the workspace
        done = subprocess.run([*loop, "--times", str(times)], cwd=project, env=env, capture_output=True, text=True, timeout=900)
        if "another launcher" not in done.stdout + done.stderr:
            break
        time.sleep(0.5)
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((project / "reports/decisions.json").read_text())
    assert record["done"]
    ran = {(v, s) for v, s in (name.rsplit("-", 1) for name in load_params(project / "params.yaml").decide.runs)}
    for name, rec in record["variants"].items():  # only comparisons open after a look got its seeds
        extra = sorted(int(s) for v, s in ran if v == name)
        assert extra == list(range(2, 2 + len(extra)))
        assert rec["runs"] == 2 + len(extra) and (rec["state"] != "undecided" or rec["runs"] == 4)
    assert "Seeds until decided" in (project / "reports/report.md").read_text()
    summed = json.loads(times.read_text())
    assert summed["command"] == "python -m pipeline.grid.decide -j 1" and summed["rounds"]
    assert summed["total_s"] == pytest.approx(sum(r["total_s"] for r in summed["rounds"]), abs=0.05)
    assert summed["stages"] and summed["families"]["report"] > 0
    knocked = project / "data/eval/knockout"  # knock-outs follow the baseline's added seeds, not a variant's
    assert (knocked / "baseline-2/knockout.json").is_file() and (knocked / "no_positional-2/off.json").is_file()
    assert "seeds 0, 1, 2" in (project / "reports/report.md").read_text().split("## Knock-outs")[1][:600]
    again = sh(["dvc", "repro"], project, env)
    assert ran_stages(again.stdout) == set(), again.stdout  # the final params reproduce, nothing reruns
    assert json.loads((project / "reports/decisions.json").read_text()) == record



def test_the_verdict_and_the_setup_follow_the_sequential_record():
    from pipeline.reporting.decisions import planned_seeds, verdict_blocks
    from pipeline.reporting.inputs import Run
    from pipeline.reporting.render import to_markdown
    from pipeline.reporting.tables import setup_blocks

    rec = a_record(Plan((3, 5), 0.05, 0.1, 2), {"a": comparison("worse", [(3, 1.0, 0.5, 1.5)]),
                                                 "b": comparison("equivalent", [(3, 0.0, -0.3, 0.3),
                                                                                (5, 0.01, -0.05, 0.07)])})
    text = to_markdown("t", verdict_blocks(rec))
    assert "a: val_loss ↓ Δ +1 (98.75% sequential interval [0.5, 1.5], 3 paired seeds, looks at 3): worse than baseline" in text
    assert "looks at 3, 5): equivalent to baseline (inside ±0.1)" in text
    assert "p " not in text  # no fixed-n p-value after adaptive stopping
    planned = planned_seeds(["baseline", "a", "b"], [0, 1, 2], {"b-3": {"variant": "b", "seed": 3},
                                                                "baseline-3": {"variant": "baseline", "seed": 3}})
    assert planned == {"baseline": [0, 1, 2, 3], "a": [0, 1, 2], "b": [0, 1, 2, 3]}
    runs = {(v, s): Run(v, s, train={"params_total": 10}, eval={"val_loss": 1.0}) for v, ss in planned.items() for s in ss}
    runs[("a", 3)] = Run("a", 3)  # decided at the first look: never run, not missing
    table = to_markdown("t", setup_blocks(runs, ["baseline", "a", "b"], [0, 1, 2, 3], "baseline", {}, None,
                                          planned=planned))
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "| 3/3 |" in rows["a"] and "run missing" not in rows["a"] and "| 4/4 |" in rows["b"]
    from pipeline.reporting.tables import per_run_blocks
    per_run = to_markdown("t", per_run_blocks(runs, ["baseline", "a", "b"], [0, 1, 2, 3], ["val_loss"], planned))
    listed = [line.split(" | ")[:2] for line in per_run.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert ["| a", "3"] not in listed and ["| b", "3"] in listed and len(listed) == 11  # the runs made, no more


def test_the_delta_figure_draws_the_sequential_intervals(tmp_path, monkeypatch):
    from pipeline.reporting import figures, plots
    from pipeline.reporting.results import Results
    from pipeline.reporting.stats import Delta

    drawn = {}
    monkeypatch.setattr(plots, "plot_deltas", lambda panels, *_: drawn.update(panels=panels))
    fixed = Delta(5, 0.02, 0.01, 0.01, "worse")  # what a fixed-n test over every seed would say
    results = Results(primary="val_loss", main_metric="bleu", metrics=["val_loss", "bleu"], summaries={},
                      deltas={"b": {"val_loss": fixed, "bleu": fixed}})
    rec = a_record(Plan((3, 5), 0.05, 0.1, 1), {"b": comparison("equivalent", [(3, 0.0, -0.3, 0.3),
                                                                               (5, 0.01, -0.05, 0.07)])})
    [fig] = figures.delta_blocks(results, "baseline", {}, tmp_path, rec)
    (primary, _, seq), (secondary, _, kept) = drawn["panels"]
    assert primary == "val_loss" and seq["b"] == Delta(5, 0.01, pytest.approx(0.06), None, "equivalent (n=5)")
    assert secondary == "bleu" and kept["b"] is fixed
    assert "sequential interval at level 0.9750" in fig.caption and "not valid after adaptive stopping" in fig.caption


def test_the_record_holds_the_values_every_look_is_recomputed_from():
    """decisions.json's per-seed values give back each look's interval and verdict (GPU issue #61:
    from a 4-digit table a look once recomputed to another verdict)."""
    from pipeline.deciding.rule import decide
    from pipeline.reporting.decisions import record
    from pipeline.reporting.inputs import Run

    values = {"baseline": [1.0, 1.1, 0.9, 1.05, 0.97], "single_head": [1.01, 1.08, 0.93, 1.2, 1.0]}
    runs = {(v, s): Run(v, s, eval={"val_loss": x}) for v, xs in values.items() for s, x in enumerate(xs)}
    rec = record(runs, ["baseline", "single_head"], [0, 1, 2], "baseline", "val_loss", [3, 5], 0.05, None)
    base, mine = rec.baseline.values, rec.variants["single_head"].values
    diffs = [mine[s] - base[s] for s in rec.seed_order if s in mine and s in base]
    assert diffs == rec.variants["single_head"].diffs
    plan = Plan((3, 5), 0.05, None, 1)
    for k, look in enumerate(rec.variants["single_head"].looks):
        assert decide(diffs, plan, k) == look


def test_a_changed_plan_between_rounds_is_refused_in_one_line(tmp_path):
    from pipeline.grid.decide import changed_plan, fingerprint

    path = write(tmp_path, PARAMS.replace("runs: {}", "runs: {single_head-3: {variant: single_head, seed: 3}}"))
    was = fingerprint(load_params(path))
    assert changed_plan(load_params(path), was) is None  # the same plan: go on
    for old, new in (("alpha: 0.05", "alpha: 0.1"), ("looks: [3, 5, 8]", "looks: [3, 5]"),
                     ("margin: 0.05", "margin: 0.02"), ("seeds: [0, 1, 2]", "seeds: [2, 1, 0]"),
                     ("  no_residual: {model: {residual: false}}\n", "")):
        edited = write(tmp_path, path.read_text().replace(old, new))
        why = changed_plan(load_params(edited), was)
        assert why is not None and "\n" not in why and "--restart" in why, old
        write(tmp_path, edited.read_text().replace(new, old) if new else PARAMS.replace(
            "runs: {}", "runs: {single_head-3: {variant: single_head, seed: 3}}"))
    fresh = write(tmp_path, PARAMS.replace("alpha: 0.05", "alpha: 0.1"))  # no runs added yet: a new study
    assert changed_plan(load_params(fresh), was) is None
    edited = write(tmp_path, path.read_text().replace("alpha: 0.05", "alpha: 0.1"))
    assert changed_plan(load_params(edited), None) is None  # no record of a plan (decide was off)


def test_the_shape_check_names_a_skew_from_late_seeds_and_passes_normal_draws():
    """The reviewer's case (GPU issue #61): a few seeds far out on one side (late plateau exits)
    are named and make the shape doubtful; normal draws of the same size are not flagged."""
    import numpy as np

    from pipeline.deciding.rounds import shape

    rng = np.random.default_rng(7)
    calm = list(rng.normal(0.0, 0.02, 20))
    late = list(calm)
    for s in (7, 8, 14, 18):
        late[s] += 0.35  # a run that left the plateau late: much worse, on one side
    seeds = list(range(20))
    assert shape(calm, seeds)["doubtful"] is False and shape(calm, seeds)["far_out"] == []
    got = shape(late, seeds)
    assert got["doubtful"] and got["far_out"] == [7, 8, 14, 18] and got["skew"] > 2 * got["skew_se"]
    assert shape([0.1, 0.2], [0, 1])["skew"] is None  # too few to say anything
