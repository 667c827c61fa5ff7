"""The real `dvc repro` on a copy of the project with tiny params, then the rerun rules."""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.tiny_project import ROOT, TINY, copy_project, ran_stages, sh, tiny_params, write_params


@pytest.mark.repro
@pytest.mark.slow
def test_dvc_repro_end_to_end_and_rerun_rules(tiny_repo, tmp_path):
    # tiny_repo is the whole pipeline run from nothing by `dvc repro` (one seed, two variants).
    project = tmp_path / "project"
    env = copy_project(tiny_repo, project)  # MLflow on, in the project's own store
    tiny = tiny_params(seeds=[0])
    assert "up to date" in sh(["dvc", "status"], project, env).stdout

    # One edit to an ablation and a second seed (one repro for both, to keep the suite short): the
    # edited ablation retrains on every seed, the baseline only on the new one.
    tiny["ablations"]["no_positional"]["model"]["n_heads"] = 1
    write_params(project, tiny)
    stale = json.loads(sh(["dvc", "status", "--json"], project, env).stdout)
    # `dvc status` lists the stages whose own deps changed; evaluate follows once train reruns.
    assert set(stale) == {"train@no_positional-0", "check_params", "report"}
    tiny["seeds"].append(1)
    write_params(project, tiny)
    ran = ran_stages(sh(["dvc", "repro"], project, env).stdout)
    expected = {f"{stage}@no_positional-{s}" for stage in ("train", "evaluate") for s in tiny["seeds"]}
    # knockout@1: the new seed's knock-out stage, here off (tiny's knockout.seeds is []), writes its marker.
    assert ran == expected | {"train@baseline-1", "evaluate@baseline-1", "knockout@1", "check_params", "report"}

    report = (project / "reports" / "report.md").read_text()
    summary = json.loads((project / "reports" / "details.json").read_text())["variants"]
    for variant in tiny["ablations"]:
        # The results table row: mean ± interval over both seeds, the mean read from eval.json.
        row = next(line for line in report.splitlines() if line.startswith(f"| {variant} | ") and "(n=2" in line)
        vals = [json.loads((project / "data" / "eval" / f"{variant}-{s}" / "eval.json").read_text())["val_loss"]
                for s in tiny["seeds"]]
        assert summary[variant]["val_loss"]["mean"] == pytest.approx(sum(vals) / 2) and " ± " in row
        for seed in tiny["seeds"]:
            run = json.loads((project / "data" / "runs" / f"{variant}-{seed}" / "train.json").read_text())
            ev = json.loads((project / "data" / "eval" / f"{variant}-{seed}" / "eval.json").read_text())
            assert run["tokens_trained"] >= 1500 and ev["val_loss"] > 0 and 0 <= ev["rouge1"] <= 1
    assert list((project / "reports" / "figures").glob("*.png"))

    import mlflow

    # The report stage mirrored every run, those trained before MLflow was on included.
    client = mlflow.tracking.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("ablation-lab").experiment_id],
                              filter_string="tags.stage = 'train'")
    names = sorted(r.info.run_name for r in runs)
    assert names == sorted(f"{v}-{s}" for v in tiny["ablations"] for s in tiny["seeds"])
    assert all("val_loss" in r.data.metrics and "rouge1" in r.data.metrics for r in runs)
    # Each run names its data by the hash DVC recorded for data/shards, and lasts as long as it trained.
    outs = yaml.safe_load((project / "dvc.lock").read_text())["stages"]["encode"]["outs"]
    shards = next(o["md5"] for o in outs if o["path"] == "data/shards").removesuffix(".dir")
    assert all([d.dataset.digest for d in r.inputs.dataset_inputs] == [shards] for r in runs)
    for r in runs:
        train = json.loads((project / "data" / "runs" / r.info.run_name / "train.json").read_text())
        assert r.info.end_time - r.info.start_time == pytest.approx(
            1000 * (train["finished_at"] - train["started_at"]), abs=1)
    assert "up to date" in sh(["dvc", "status"], project, env).stdout


@pytest.mark.repro
@pytest.mark.slow
def test_run_sh_study_reruns_a_preset_in_scratch_and_commits_its_report(tmp_path):
    # `bash run.sh study NAME` (scripts/study.sh) on a copy of the project: the report lands in
    # reports/studies/NAME/ with its params and wall time, the docs' study table gets its row, and the
    # workspace's own params.yaml and data/ are not touched.
    project = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("model", "pipeline", "scripts", "benchmarks"):
        shutil.copytree(ROOT / name, project / name, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", project)
    shutil.copytree(ROOT / "data" / "local", project / "data" / "local")
    (project / "presets").mkdir()
    tiny = {**copy.deepcopy(TINY), "seeds": [0], "ablations": {"baseline": {}}}
    (project / "presets" / "tiny.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    (project / "params.yaml").write_text("untouched\n")
    (project / "reports" / "studies").mkdir(parents=True)
    page = project / "docs" / "datasets-and-presets.md"
    page.parent.mkdir()
    page.write_text("# x\n<!-- studies:begin (generated by `python -m scripts.report_studies`; do not edit) -->\n"
                    "<!-- studies:end -->\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "ABLATION_LAB_TRACKING": "0", "TMPDIR": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = sh(["bash", "scripts/study.sh", "tiny"], project, env).stdout

    folder = project / "reports" / "studies" / "tiny"
    assert {"report.md", "report.html", "metrics.json", "details.json", "params.yaml", "run.json", "figures"} <= {
        p.name for p in folder.iterdir()}
    assert yaml.safe_load((folder / "params.yaml").read_text())["seeds"] == [0]
    run = json.loads((folder / "run.json").read_text())
    assert isinstance(run["wall_s"], int) and run["wall_s"] >= 0 and f"took {run['wall_s']} s" in out
    assert set(run["stage_s"]) == {"check_params", "download", "filter", "train_bpe", "encode", "train", "evaluate",
                                   "knockout", "report"}  # knockout: off in tiny, its marker written
    assert "| [tiny](../reports/studies/tiny/report.md) | 1 × 1 |" in page.read_text()
    assert (project / "params.yaml").read_text() == "untouched\n" and not (project / "data" / "raw").exists()

    elsewhere = tmp_path / "elsewhere"  # STUDY_OUT: the GPU run's way, reports/studies and the docs untouched
    sh(["bash", "scripts/study.sh", "tiny"], project, {**env, "STUDY_OUT": str(elsewhere)})
    assert (elsewhere / "run.json").is_file() and (elsewhere / "metrics.json").is_file()
    assert page.read_text().count("| [tiny]") == 1

    # A preset with decide.looks runs seeds until decided: the rounds' record and their walls.
    decide = {**copy.deepcopy(TINY), "seeds": [0, 1], "decide": {"looks": [2, 3], "alpha": 0.05, "runs": {}}}
    (project / "presets" / "tiny_decide.yaml").write_text(yaml.safe_dump(decide, sort_keys=False))
    decided = tmp_path / "decided"
    out = sh(["bash", "scripts/study.sh", "tiny_decide"], project, {**env, "STUDY_OUT": str(decided)}).stdout
    assert "decide: done after" in out
    run, record = (json.loads((decided / f).read_text()) for f in ("run.json", "decisions.json"))
    assert run["command"].startswith("python -m pipeline.grid.decide") and record["done"]
    assert len(run["rounds"]) == 1 + bool(record["baseline"]["runs"] > 2)  # a second round where one was open
    assert run["wall_s"] == round(sum(r["total_s"] for r in run["rounds"]))
    ran = yaml.safe_load((decided / "params.yaml").read_text())["decide"]["runs"]
    assert len(ran) == record["runs_spent"] - 4  # every run the rounds added is in the committed params
