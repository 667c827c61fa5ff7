"""The report stage mirrors each training run into MLflow as a top-level run, plus one `report` run."""
import json
import logging
import os

import mlflow.tracking as mlflow_tracking  # a hard dependency: imported plainly, so a broken mlflow fails
import pytest

from pipeline.report import main
from pipeline.reporting.mlflow_mirror import mirror_runs
from tests.fixtures.report.fake_runs import VARIANTS, make_project

pytestmark = pytest.mark.slow  # each test writes and reads an MLflow store: seconds each


def encoded_shards(root) -> None:
    """data/shards and the dvc.lock entry whose hash names the data in MLflow's Dataset column."""
    shards = root / "data" / "shards"
    shards.mkdir(parents=True)
    (shards / "manifest.json").write_text("{}")
    (root / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  encode:\n    cmd: python -m pipeline.encode\n    outs:\n"
        "    - path: data/shards\n      hash: md5\n      md5: 0123456789abcdef0123456789abcdef.dir\n")


def test_report_tags_training_runs_with_its_report_run(tmp_path, monkeypatch, caplog):
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

    reports = client.search_runs([exp_id], filter_string="tags.stage = 'report'")
    assert len(reports) == 1
    report_id = reports[0].info.run_id
    for (variant, seed), run_id in run_ids.items():
        if run_id == "f" * 32:
            continue
        tags = client.get_run(run_id).data.tags
        assert tags["report_run"] == report_id
        assert "mlflow.parentRunId" not in tags  # a child would be hidden under the report row in `mlflow ui`
        assert (tags["variant"], tags["seed"]) == (variant, str(seed))
    assert any("f" * 32 in r.getMessage() for r in caplog.records)
    top = {a.path for a in client.list_artifacts(report_id)}
    assert {"report.md", "report.html", "figures"} <= top
    figs = {a.path for a in client.list_artifacts(report_id, "figures")}
    assert "figures/curves.png" in figs
    assert reports[0].data.tags["linked_runs"] == str(len(run_ids) - 1)


def test_mlflow_failure_is_a_warning_not_an_error(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in-the-way").write_text("a file where the store's directory should be")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'in-the-way' / 'mlflow.db'}")
    (tmp_path / "report").mkdir()
    with caplog.at_level(logging.WARNING, logger="pipeline.report"):
        assert mirror_runs([], tmp_path / "report", "ablation-lab") is None
    assert any("MLflow linking skipped" in r.getMessage() for r in caplog.records)


def _report(tmp_path, p, seeds=(0, 1)):
    params = tmp_path / "params.yaml"
    params.write_text(
        f"seeds: {list(seeds)}\nablations: {{{', '.join(f'{v}: {{}}' for v in VARIANTS)}}}\n"
        "report: {baseline: baseline, experiment: abl-test}\ntrain: {budget_tokens: 200000, lr: 0.001}\n",
        encoding="utf-8",
    )
    main(["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
          "--params", str(params), "--out-dir", str(tmp_path / "reports")])


def test_runs_trained_without_live_tracking_are_mirrored_from_their_files_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    p = make_project(tmp_path, seeds=(0, 1), missing_runs=())
    for run_dir in p.runs.iterdir():  # the resolved params the train stage writes
        (run_dir / "config.json").write_text(json.dumps({"model": {"d_model": 32}, "train": {"lr": 0.001}}))
    _report(tmp_path, p)
    client = mlflow_tracking.MlflowClient()
    exp = client.get_experiment_by_name("abl-test")
    exp_id = exp.experiment_id
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the "Model training" view
    first = client.search_runs([exp_id], filter_string="tags.stage = 'train'")
    assert sorted(r.info.run_name for r in first) == sorted(f"{v}-{s}" for v in VARIANTS for s in (0, 1))
    report = client.search_runs([exp_id], filter_string="tags.stage = 'report'")[0]
    run = next(r for r in first if r.info.run_name == "baseline-1")
    assert run.info.status == "FINISHED" and run.data.tags["report_run"] == report.info.run_id
    assert run.data.params["model.d_model"] == "32" and run.data.tags["seed"] == "1"
    curve = (p.runs / "baseline-1" / "train_curve.csv").read_text().splitlines()[1:]
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(int(r.split(",")[0]), float(r.split(",")[2])) for r in curve]
    assert run.data.metrics["rougeL"] == pytest.approx(p.eval_values[("baseline", 1)]["rougeL"])
    # val_loss is also a curve: the latest value (`mlflow ui`'s column) is the evaluation's, as in the report
    assert run.data.metrics["val_loss"] == pytest.approx(p.eval_values[("baseline", 1)]["val_loss"])
    assert max(m.step for m in client.get_metric_history(run.info.run_id, "val_loss")) == 201  # last step: 200
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rougeL")] == [0]  # not a curve: a bar
    files = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "train_curve.csv", "train.json", "eval.json", "samples.json"} <= files

    client.set_tag(run.info.run_id, "mlflow.parentRunId", report.info.run_id)  # as earlier versions linked it
    _report(tmp_path, p)  # unchanged files: the same runs, tagged with the new report run
    again = client.search_runs([exp_id], filter_string="tags.stage = 'train'")
    assert sorted(r.info.run_id for r in again) == sorted(r.info.run_id for r in first)
    newest = client.search_runs([exp_id], filter_string="tags.stage = 'report'", order_by=["start_time DESC"])[0]
    assert {r.data.tags["report_run"] for r in again} == {newest.info.run_id}
    assert not any("mlflow.parentRunId" in r.data.tags for r in again)  # no longer hidden under a report row
    assert client.get_run(report.info.run_id).data.tags["mlflow.parentRunId"] == newest.info.run_id  # history

    eval_json = p.evals / "baseline-1" / "eval.json"  # a re-evaluation: that run alone is mirrored anew
    eval_json.write_text(eval_json.read_text().replace("summarization", "summarization "))
    os.utime(eval_json, (1, 1))
    _report(tmp_path, p)
    trained = client.search_runs([exp_id], filter_string="tags.stage = 'train'")
    assert len(trained) == len(first) + 1
    new = next(r for r in trained if r.info.run_name == "baseline-1" and r.info.run_id != run.info.run_id)
    assert "mlflow.parentRunId" not in new.data.tags  # the current version: a row of its own
    assert client.get_run(run.info.run_id).data.tags["mlflow.parentRunId"] == new.info.run_id  # folded under it


def test_a_read_only_store_is_one_warning_that_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    mlflow_tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()  # creates the tables
    # SQLite's own read-only mode: root ignores a file's mode bits, so chmod would prove nothing here.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///file:{tmp_path / 'mlflow.db'}?mode=ro&uri=true")
    (tmp_path / "report").mkdir()
    with caplog.at_level(logging.INFO):
        assert mirror_runs([], tmp_path / "report", "ablation-lab") is None
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "is read-only" in said[0] and "Traceback" not in caplog.text, said


def test_mirrored_runs_carry_training_times_their_dataset_and_a_comparison_view(tmp_path, monkeypatch):
    from pipeline.reporting.mlflow_view import TAG_PREFIX, VIEW_ID

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # where the report stage finds dvc.lock
    p = make_project(tmp_path, seeds=(0, 1), missing_runs=())
    started = {}
    for i, run_dir in enumerate(sorted(p.runs.iterdir())):
        (run_dir / "config.json").write_text(json.dumps({"model": {"d_model": 32}}))
        train = json.loads((run_dir / "train.json").read_text())
        started[run_dir.name] = 1_700_000_000.25 + 100 * i
        train.update(started_at=started[run_dir.name], finished_at=started[run_dir.name] + 7.5 + i)
        (run_dir / "train.json").write_text(json.dumps(train))
    old = p.runs / "baseline-1" / "train.json"  # written before start and end were recorded
    train = json.loads(old.read_text())
    del train["started_at"], train["finished_at"]
    old.write_text(json.dumps(train))
    os.utime(old, (1_700_005_000, 1_700_005_000))
    encoded_shards(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(
        f"seeds: [0, 1]\nablations: {{{', '.join(f'{v}: {{}}' for v in VARIANTS)}}}\n"
        "data: {source: tiny_shakespeare, tiny_shakespeare: {split_unit: characters}}\n"
        "report: {baseline: baseline, experiment: abl-test}\ntrain: {budget_tokens: 200000}\n", encoding="utf-8")
    main(["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
          "--shards", "data/shards", "--params", str(params), "--out-dir", str(tmp_path / "reports")])

    client = mlflow_tracking.MlflowClient()
    exp = client.get_experiment_by_name("abl-test")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id], filter_string="tags.stage = 'train'")}
    for i, name in enumerate(sorted(runs)):
        info = runs[name].info
        if name == "baseline-1":  # the file's time and wall_time_s stand in
            assert info.end_time == 1_700_005_000_000
            wall_ms = p.train_values[("baseline", 1)]["wall_time_s"] * 1000
            assert abs(info.end_time - info.start_time - wall_ms) <= 1  # whole milliseconds
        else:
            assert (info.start_time, info.end_time) == (int(started[name] * 1000), int((started[name] + 7.5 + i) * 1000))
        (dataset,) = [d.dataset for d in runs[name].inputs.dataset_inputs]
        assert (dataset.name, dataset.digest) == ("tiny_shakespeare", "0123456789abcdef0123456789abcdef")
        assert json.loads(dataset.source)["tiny_shakespeare"] == {"split_unit": "characters"}
    view = json.loads(exp.tags[TAG_PREFIX + VIEW_ID])
    state = json.loads(view["state"])
    assert view["name"] == "Compare variants" and isinstance(view["createdAt"], int)
    assert state["selectedColumns"] == ["attributes.`Dataset`", "attributes.`Duration`", "metrics.`val_loss`",
                                        "metrics.`rougeL`"]  # the primary metric, then the task metric
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "variant"}]
    current = client.search_runs([exp.experiment_id], filter_string=state["searchFilter"])
    assert sorted(r.info.run_name for r in current) == sorted(runs)  # the view's filter is valid MLflow search


def test_knockout_runs_carry_their_stage_times_and_dataset(tmp_path, monkeypatch):
    from tests.test_knockout import synthetic

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # where the report stage finds dvc.lock
    p = make_project(tmp_path, seeds=(0, 1), missing_runs=())
    for run_dir in p.runs.iterdir():
        (run_dir / "config.json").write_text(json.dumps({"model": {"d_model": 32}}))
    _, knockouts = synthetic(seeds=(0, 1))
    started = {0: 1_700_000_000.5, 1: None}  # seed 1: a knockout.json from before the times were recorded
    for seed, record in knockouts.items():
        path = p.evals / "knockout" / f"baseline-{seed}" / "knockout.json"
        path.parent.mkdir(parents=True)
        if started[seed] is not None:
            record.update(started_at=started[seed], finished_at=started[seed] + 12.25)
        record["wall_s"] = 9.5
        path.write_text(json.dumps(record))
        os.utime(path, (1_700_005_000, 1_700_005_000))
    (p.evals / "knockout" / "baseline-2").mkdir()  # a seed knockout.seeds left out: its marker only
    (p.evals / "knockout" / "baseline-2" / "off.json").write_text("{}")
    encoded_shards(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(
        f"seeds: [0, 1]\nablations: {{{', '.join(f'{v}: {{}}' for v in VARIANTS)}}}\n"
        "data: {source: synthetic}\nreport: {baseline: baseline, experiment: abl-test}\n"
        "knockout: {seeds: all}\n", encoding="utf-8")
    argv = ["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
            "--shards", "data/shards", "--params", str(params), "--out-dir", str(tmp_path / "reports")]
    main(argv)

    client = mlflow_tracking.MlflowClient()
    exp = client.get_experiment_by_name("abl-test")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id], "tags.stage = 'knockout'")}
    assert sorted(runs) == ["knockout-0", "knockout-1"]
    first, old = runs["knockout-0"].info, runs["knockout-1"].info
    assert (first.start_time, first.end_time) == (1_700_000_000_500, 1_700_000_012_750)  # the stage's own times
    assert old.end_time == 1_700_005_000_000 and old.end_time - old.start_time == 9_500  # file time, wall_s
    for run in runs.values():
        (dataset,) = run.inputs.dataset_inputs
        assert (dataset.dataset.name, dataset.dataset.digest) == ("synthetic", "0123456789abcdef0123456789abcdef")
        assert [(t.key, t.value) for t in dataset.tags] == [("mlflow.data.context", "evaluation")]
    main(argv)  # the same files and data: reused, not mirrored again
    assert len(client.search_runs([exp.experiment_id], "tags.stage = 'knockout'")) == 2
