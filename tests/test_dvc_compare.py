"""DVC's compare views: reports/metrics.json holds what a verdict needs, so `dvc exp show` stays readable."""
from __future__ import annotations

import csv
import io
import itertools
import json
import re
import numpy as np
import pytest
import yaml

from pipeline.report import render_report
from pipeline.reporting.dvc_files import metrics_summary
from pipeline.reporting.inputs import Run
from pipeline.reporting.results import compute_results
from pipeline.reporting.study import Study, read_inputs
from tests.committed import default_params
from tests.fixtures.report.fake_runs import make_project
from tests.tiny_project import ROOT, copy_project, sh

META = ("Experiment", "rev", "typ", "Created", "parent")  # dvc exp show's own columns
# `dvc exp show --drop '.*' --keep COMPARE_DELTAS`: per experiment, each ablation's Δ of the primary metric.
COMPARE_DELTAS = r"Experiment|[^.]+\.delta$"
MAX_COLUMNS = 150


def flat(tree, prefix: str = "", nulls: bool = False) -> list[str]:
    """Dotted keys of the values in a nested mapping, as DVC names its columns (an empty mapping has
    none, nor a null unless `nulls`: DVC shows no column for a key that is null in every row)."""
    if not isinstance(tree, dict):
        return [] if tree is None and not nulls else [prefix]
    return [k for key, value in tree.items() for k in flat(value, f"{prefix}.{key}" if prefix else str(key), nulls)]


def resolve(text: str, params: dict, item: dict) -> str:
    def value(match: re.Match) -> str:
        scope, *path = match.group(1).split(".")
        node = item if scope == "item" else params[scope]
        for key in path:
            node = node[key]
        return str(node)
    return re.sub(r"\$\{([^}]+)\}", value, text)


def stage_deps(dvc_yaml: dict, params: dict) -> set[str]:
    """Every dep path of every stage, each matrix expanded with `params` as DVC expands it."""
    out = set()
    for stage in dvc_yaml["stages"].values():
        items = [{}]
        if "matrix" in stage:
            axes = {k: resolve_list(v, params) for k, v in stage["matrix"].items()}
            items = [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())]
        out |= {resolve(dep, params, item) for item in items for dep in stage.get("deps", [])}
    return out


def resolve_list(ref: str, params: dict) -> list:
    node = params
    for key in ref.strip("${}").split("."):
        node = node[key]
    return list(node)


def predicted_columns(params: dict, dvc_yaml: dict, metrics: dict, committed: dict | None = None) -> int:
    """The columns of `dvc exp show --csv` for a run project: DVC's own, every params.yaml value,
    every stage dep and every metric (tests/test_dvc_compare.py checks it against DVC itself).
    DVC shows the committed revision (HEAD) beside the workspace, so a metric key in either file
    is a column: `committed` is HEAD's metrics.json where it differs from the workspace's."""
    keys = set(flat(metrics)) | set(flat(committed or {}))
    return len(META) + len(flat(params)) + len(stage_deps(dvc_yaml, params)) + len(keys)


def default_metrics(params: dict) -> dict:
    """reports/metrics.json as the report stage writes it for `params`' variants and seeds (a task
    metric as the default synthetic data gives: rougeLsum), from made-up eval values."""
    rng = np.random.default_rng(0)  # seeds that disagree: every Δ has an interval and a p (no null)
    runs = {(v, s): Run(v, s, eval={"val_loss": 2.0 + i / 10 + rng.normal(0, 0.05),
                                    "rougeLsum": 0.3 - i / 50 + rng.normal(0, 0.01)})
            for i, v in enumerate(params["ablations"]) for s in params["seeds"]}
    results = compute_results(runs, list(params["ablations"]), params["seeds"], params["report"]["baseline"])
    return metrics_summary(results, list(params["ablations"]))


@pytest.mark.slow
def test_metrics_json_holds_the_verdicts_numbers_and_details_json_the_rest(tmp_path):
    p = make_project(tmp_path)
    out = tmp_path / "reports"
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline")), out)
    metrics, details = (json.loads((out / name).read_text()) for name in ("metrics.json", "details.json"))
    primary, task = details["primary_metric"], details["main_metric"]
    assert metrics["primary_metric"] == primary == "val_loss" and task == "rougeL"
    assert set(metrics) == {"primary_metric", *p.variants}
    full = details["variants"]
    # The primary metric's numbers directly under the variant (`no_ffn.delta`), the task metric's under its name.
    assert metrics["baseline"] == {"mean": full["baseline"][primary]["mean"], "ci95": full["baseline"][primary]["ci95"],
                                   task: {k: full["baseline"][task][k] for k in ("mean", "ci95")}}
    for key in ("mean", "delta", "delta_ci95", "p"):
        assert metrics["no_ffn"][key] == full["no_ffn"][primary][key]  # primary: its paired t-test's p
    assert metrics["no_ffn"][task]["p"] == full["no_ffn"][task]["p_holm"]  # secondary: the p its verdict is judged by
    assert metrics["no_ffn"][task]["delta"] == full["no_ffn"][task]["delta"]
    assert len(flat(metrics, nulls=True)) == 1 + 2 * 2 + 4 * 2 * (len(p.variants) - 1)  # a few dozen, not hundreds
    assert max(len(k) for k in flat(metrics) if k.count(".") == 1) <= len("single_head.delta_ci95")


# The default study as committed (tests/committed.py): a user's edits to params.yaml change the columns.
def test_the_default_project_compares_in_at_most_150_columns():
    params = default_params()
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    assert dvc_yaml["metrics"] == ["reports/metrics.json"]  # the data metrics are outputs, not columns
    metrics = default_metrics(params)
    # every one a column: 37 for the five variants
    assert len(flat(metrics)) == len(flat(metrics, nulls=True)) == 1 + 2 * 2 + 4 * 2 * (len(params["ablations"]) - 1)
    assert predicted_columns(params, dvc_yaml, metrics) <= MAX_COLUMNS
    # COMPARE_DELTAS keeps the Experiment column and each ablation's Δ: two experiments' rows (their
    # names up to ~25 characters with DVC's tree) fit 120 columns, 3 spaces between columns.
    kept = [k for k in flat(metrics) if re.fullmatch(COMPARE_DELTAS.split("|", 1)[1], k)]
    assert kept == [f"{v}.delta" for v in params["ablations"] if v != params["report"]["baseline"]]
    assert 25 + sum(len(k) + 3 for k in kept) <= 120


def test_the_committed_default_report_has_the_layout_the_report_stage_writes():
    # A fresh clone's `bash run.sh` writes today's layout; DVC then shows HEAD's keys beside it, so a
    # committed report in an older layout doubles the columns (679 once, with 603 stale keys).
    # Regenerate it with `bash run.sh` whenever the report stage's layout changes.
    params = default_params()
    committed = json.loads((ROOT / "reports" / "metrics.json").read_text())
    assert sorted(flat(committed, nulls=True)) == sorted(flat(default_metrics(params), nulls=True)), \
        "reports/metrics.json is not in the report stage's layout: rerun `bash run.sh` and commit reports/"


def test_a_fresh_clone_after_bash_run_sh_compares_in_at_most_150_columns():
    params = default_params()
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    committed = json.loads((ROOT / "reports" / "metrics.json").read_text())
    assert predicted_columns(params, dvc_yaml, default_metrics(params), committed) <= MAX_COLUMNS


@pytest.mark.repro
@pytest.mark.slow
def test_dvc_exp_show_has_the_predicted_columns(tiny_repo, tmp_path):
    project = tmp_path / "p"
    env = copy_project(tiny_repo, project)
    header = next(csv.reader(io.StringIO(sh(["dvc", "exp", "show", "--csv"], project, env).stdout)))
    params = yaml.safe_load((project / "params.yaml").read_text())
    metrics = json.loads((project / "reports" / "metrics.json").read_text())
    assert header[:len(META)] == list(META)
    assert set(flat(metrics)) <= set(header) and not [c for c in header if "p50" in c or "detectable" in c]
    assert len(header) == predicted_columns(params, yaml.safe_load((project / "dvc.yaml").read_text()), metrics)
    table = sh(["dvc", "exp", "show", "--md", "--drop", ".*", "--keep", COMPARE_DELTAS], project, env).stdout
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == ["Experiment", "no_positional.delta"] and max(len(line) for line in table.splitlines()) <= 120
    assert float(rows[2][1]) == pytest.approx(metrics["no_positional"]["delta"], rel=1e-3)  # the workspace row


@pytest.mark.repro
@pytest.mark.slow
def test_dvc_exp_show_adds_the_committed_reports_stale_keys(tiny_repo, tmp_path):
    # What a fresh clone met: HEAD's metrics.json in an older layout beside the workspace's new one.
    project = tmp_path / "p"
    env = copy_project(tiny_repo, project)
    path = project / "reports" / "metrics.json"
    today = path.read_text()
    old = json.loads(today)
    old["no_positional"]["val_loss"] = {"p50": 1.0, "detectable_delta": 0.1}  # keys no report writes now
    path.write_text(json.dumps(old))
    sh(["git", "commit", "-qam", "a report in an older layout"], project, env)
    path.write_text(today)
    header = next(csv.reader(io.StringIO(sh(["dvc", "exp", "show", "--csv"], project, env).stdout)))
    params = yaml.safe_load((project / "params.yaml").read_text())
    dvc_yaml = yaml.safe_load((project / "dvc.yaml").read_text())
    assert len(header) == predicted_columns(params, dvc_yaml, json.loads(today), old) \
        == predicted_columns(params, dvc_yaml, json.loads(today)) + 2
    assert {"no_positional.val_loss.p50", "no_positional.val_loss.detectable_delta"} <= set(header)
