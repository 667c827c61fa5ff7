"""The report stage adopts the training runs as children of one MLflow parent run."""
import logging

import pytest

from pipeline.report import link_runs, main
from tests.fixtures.report.fake_runs import VARIANTS, make_project

mlflow_tracking = pytest.importorskip("mlflow.tracking")


def test_report_links_training_runs_as_children_of_a_parent_run(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # default artifact root ./mlruns lands in tmp_path
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow_tracking.MlflowClient()
    exp_id = client.create_experiment("abl-test")
    seeds = (0, 1)
    run_ids = {(v, s): client.create_run(exp_id, run_name=f"{v}-{s}").info.run_id
               for v in VARIANTS for s in seeds}
    run_ids[("no_ffn", 1)] = "f" * 32  # a run that is not in this store: warned about, not fatal
    p = make_project(tmp_path, seeds=seeds, missing_runs=(), run_ids=run_ids)
    params = tmp_path / "params.yaml"
    params.write_text(
        f"seeds: [0, 1]\nablations: {{{', '.join(f'{v}: {{}}' for v in VARIANTS)}}}\n"
        "report: {baseline: baseline, experiment: abl-test}\ntrain: {budget_tokens: 200000, lr: 0.001}\n",
        encoding="utf-8",
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.report"):
        main(["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
              "--params", str(params), "--out-dir", str(tmp_path / "reports")])

    parents = client.search_runs([exp_id], filter_string="tags.stage = 'report'")
    assert len(parents) == 1
    parent_id = parents[0].info.run_id
    for (variant, seed), run_id in run_ids.items():
        if run_id == "f" * 32:
            continue
        tags = client.get_run(run_id).data.tags
        assert tags["mlflow.parentRunId"] == parent_id
        assert (tags["variant"], tags["seed"]) == (variant, str(seed))
    assert any("f" * 32 in r.getMessage() for r in caplog.records)
    top = {a.path for a in client.list_artifacts(parent_id)}
    assert {"report.md", "report.html", "figures"} <= top
    figs = {a.path for a in client.list_artifacts(parent_id, "figures")}
    assert "figures/curves.png" in figs
    assert parents[0].data.tags["linked_runs"] == str(len(run_ids) - 1)


def test_mlflow_failure_is_a_warning_not_an_error(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in-the-way").write_text("a file where the store's directory should be")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'in-the-way' / 'mlflow.db'}")
    (tmp_path / "report").mkdir()
    with caplog.at_level(logging.WARNING, logger="pipeline.report"):
        assert link_runs(["a" * 32], tmp_path / "report", "ablation-lab") is None
    assert any("MLflow linking skipped" in r.getMessage() for r in caplog.records)
