"""The real `dvc repro` on a copy of the project with tiny params, then the rerun rules."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "data": {"source": "synthetic", "synthetic": {"n_examples": 240, "seed": 1}},
    "filter": {"max_source_tokens": 100, "max_target_tokens": 40, "val_fraction": 0.1, "test_fraction": 0.1},
    "train_bpe": {"vocab_size": 120},
    "encode": {"shard_examples": 100},
    "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
    "train": {"budget_tokens": 1500, "batch_tokens": 800, "eval_every": 5, "eval_examples": 16,
              "log_every": 2, "checkpoint_every": 5, "warmup_steps": 2, "device": "cpu", "threads": 1},
    "evaluate": {"max_examples": 8, "max_new_tokens": 20, "n_samples": 2},
    "report": {"baseline": "baseline"},
    "seeds": [0, 1],
    "ablations": {"baseline": {}, "no_positional": {"model": {"positional": "none"}}},
}


def sh(args, cwd, env):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{args}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.slow
def test_dvc_repro_end_to_end_and_rerun_rules(tmp_path):
    tiny = copy.deepcopy(TINY)  # edited below
    project = tmp_path / "project"
    project.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("model", "pipeline"):
        shutil.copytree(ROOT / name, project / name, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", project)
    shutil.copytree(ROOT / "data" / "local", project / "data" / "local")  # the download stage's dep
    (project / "params.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}", "ABLATION_LAB_TRACKING": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    sh(["git", "init", "-q"], project, env)
    sh(["dvc", "init", "-q"], project, env)
    sh(["dvc", "config", "core.analytics", "false"], project, env)
    sh(["dvc", "repro"], project, env)

    report = (project / "reports" / "report.md").read_text()
    summary = json.loads((project / "reports" / "metrics.json").read_text())["variants"]
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

    client = mlflow.tracking.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("ablation-lab").experiment_id],
                              filter_string="tags.stage = 'train'")
    names = sorted(r.info.run_name for r in runs)
    assert names == sorted(f"{v}-{s}" for v in tiny["ablations"] for s in tiny["seeds"])
    assert all("val_loss" in r.data.metrics and "rouge1" in r.data.metrics for r in runs)

    assert "up to date" in sh(["dvc", "status"], project, env)

    tiny["ablations"]["no_positional"]["model"]["n_heads"] = 1
    (project / "params.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    stale = json.loads(sh(["dvc", "status", "--json"], project, env))
    # `dvc status` lists the stages whose own deps changed; evaluate follows once train reruns.
    assert set(stale) == {f"train@no_positional-{s}" for s in tiny["seeds"]} | {"report"}
    log = sh(["dvc", "repro"], project, env)
    ran = {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage")}
    expected = {f"{stage}@no_positional-{s}" for stage in ("train", "evaluate") for s in tiny["seeds"]}
    assert ran == expected | {"report"}

    # A third seed trains and evaluates only the new runs; the report takes them in.
    tiny["seeds"].append(2)
    (project / "params.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    log = sh(["dvc", "repro"], project, env)
    ran = {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage")}
    assert ran == {f"{stage}@{v}-2" for stage in ("train", "evaluate") for v in tiny["ablations"]} | {"report"}
    assert "(n=3" in (project / "reports" / "report.md").read_text()


@pytest.mark.slow
def test_run_sh_study_reruns_a_preset_in_scratch_and_commits_its_report(tmp_path):
    # `bash run.sh study NAME` (scripts/study.sh) on a copy of the project: the report lands in
    # reports/studies/NAME/ with its params and wall time, the README table gets its row, and the
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
    readme = "# x\n<!-- studies:begin (generated by `python -m pipeline.report_studies`; do not edit) -->\n" \
             "<!-- studies:end -->\n"
    (project / "README.md").write_text(readme)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "ABLATION_LAB_TRACKING": "0", "TMPDIR": str(tmp_path)}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = sh(["bash", "scripts/study.sh", "tiny"], project, env)

    folder = project / "reports" / "studies" / "tiny"
    assert {"report.md", "report.html", "metrics.json", "params.yaml", "run.json", "figures"} <= {
        p.name for p in folder.iterdir()}
    assert yaml.safe_load((folder / "params.yaml").read_text())["seeds"] == [0]
    run = json.loads((folder / "run.json").read_text())
    assert isinstance(run["wall_s"], int) and run["wall_s"] >= 0 and f"took {run['wall_s']} s" in out
    assert set(run["stage_s"]) == {"download", "filter", "train_bpe", "encode", "train", "evaluate", "report"}
    assert "| [tiny](reports/studies/tiny/report.md) | 1 × 1 |" in (project / "README.md").read_text()
    assert (project / "params.yaml").read_text() == "untouched\n" and not (project / "data" / "raw").exists()

    elsewhere = tmp_path / "elsewhere"  # STUDY_OUT: the GPU run's way, reports/studies and README untouched
    sh(["bash", "scripts/study.sh", "tiny"], project, {**env, "STUDY_OUT": str(elsewhere)})
    assert (elsewhere / "run.json").is_file() and (elsewhere / "metrics.json").is_file()
    assert (project / "README.md").read_text().count("| [tiny]") == 1
