"""The report's training-cost table: timings taken under contention are marked, by what other
processes used where train.json measured it."""
import json

import pytest

from tests.fixtures.report.fake_runs import make_project
from tests.test_report import md_table, render


def _with_load(p, variant: str, seed: int, start: float, end: float, threads: int = 2,
               others: float | None = None) -> None:
    path = p.runs / f"{variant}-{seed}" / "train.json"
    train = json.loads(path.read_text())
    train.update(threads=threads, load={"start": {"loadavg_1m": start, "other_running": 0},
                                        "end": {"loadavg_1m": end, "other_running": 3}})
    if others is not None:
        train["load"]["others_cpu_share"] = others
    path.write_text(json.dumps(train))


def test_cost_table_marks_timings_taken_under_contention(tmp_path):
    p = make_project(tmp_path)
    for s in p.seeds:
        _with_load(p, "baseline", s, 0.4, 1.9)  # a quiet machine: the run's own two threads
        _with_load(p, "no_ffn", s, 0.5, 5.2 if s == 1 else 1.5)  # seed 1 shared the cores
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert not cost["baseline"]["wall time (s)"].endswith("⚠") and cost["baseline"]["load (max)"] == "1.9"
    assert cost["no_ffn"]["wall time (s)"].endswith(" ⚠") and cost["no_ffn"]["tokens/s"].endswith(" ⚠")
    assert cost["no_ffn"]["load (max)"] == "5.2" and cost["no_ffn"]["cores"] == "2"
    assert cost["single_head"]["load (max)"] == "—"  # not recorded: unknown, not quiet
    assert "understate this code's speed: no_ffn (seed 1)." in md


@pytest.mark.slow
def test_contention_is_what_other_processes_used_where_train_json_measured_it(tmp_path):
    """A load of 3 on 2 cores with others at 2% of the CPU: the run's own threads and the previous
    stage's tail, not contention. 25%: contention, whatever the load said."""
    p = make_project(tmp_path)
    for s in p.seeds:
        _with_load(p, "baseline", s, 2.9, 3.0, others=0.02)
        _with_load(p, "no_ffn", s, 0.5, 1.5, others=0.25 if s == 2 else 0.01)
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert not cost["baseline"]["wall time (s)"].endswith("⚠") and cost["baseline"]["others' CPU (max)"] == "2%"
    assert cost["no_ffn"]["wall time (s)"].endswith(" ⚠") and cost["no_ffn"]["others' CPU (max)"] == "25%"
    assert cost["single_head"]["others' CPU (max)"] == "—"
    assert "understate this code's speed: no_ffn (seed 2)." in md
    assert "sibling stages" not in md  # no run here was the grid launcher's


@pytest.mark.slow
def test_runs_beside_the_grid_launchers_siblings_are_said_so(tmp_path):
    p = make_project(tmp_path)
    for s in p.seeds:
        _with_load(p, "baseline", s, 1.5, 1.9, threads=1, others=0.5)
        path = p.runs / f"baseline-{s}" / "train.json"
        train = json.loads(path.read_text())
        train["grid_share"] = 1  # the launcher gave each of its 2 stages 1 of the 2 cores
        path.write_text(json.dumps(train))
    md = (render(p) / "report.md").read_text(encoding="utf-8")
    cost = {r["variant"]: r for r in md_table(md, "variant", "tokens trained")}
    assert cost["baseline"]["wall time (s)"].endswith(" ⚠")  # still marked: the planner leaves it out
    assert "count the study's own sibling stages as other processes" in md
