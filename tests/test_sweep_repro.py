"""Fair-LR and scale sweeps through the real `dvc repro`: each point is a stage of its own, so
adding a learning rate or a size adds stages and reruns none of the existing runs."""
from __future__ import annotations

import json

import pytest

from tests.tiny_project import copy_project, ran_stages, sh, tiny_params, write_params


def stages(points: dict[str, list[str]], variants=("baseline", "no_positional")) -> set[str]:
    """train_<kind>@<variant>-0-<point> and its evaluate stage, for kind -> points."""
    return {f"{stage}_{kind}@{v}-0-{p}" for kind, ps in points.items() for p in ps for v in variants
            for stage in ("train", "evaluate")}


@pytest.mark.repro
@pytest.mark.slow
def test_adding_a_rate_or_a_size_adds_only_its_own_stages(tiny_repo, tmp_path):
    project = tmp_path / "project"
    env = {**copy_project(tiny_repo, project), "ABLATION_LAB_TRACKING": "0"}
    params = tiny_params(seeds=[0], lr_sweep=[0.01], scales={"wide": {"model": {"d_model": 48}}})
    write_params(project, params)
    ran = ran_stages(sh(["dvc", "repro"], project, env).stdout)
    # The main runs (train@baseline-0, ...) are the sweep's point at train.lr and the first size.
    assert ran == stages({"lr": ["0.01"], "scale": ["wide"]}) | {"check_params", "report"}
    assert (project / "data/runs/lr/no_positional-0-0.01/model.pt").is_file()
    report = (project / "reports/report.md").read_text()
    assert "## Fair learning rates" in report and "## Across scales" in report
    summary = json.loads((project / "reports/details.json").read_text())
    assert set(summary["fair_lr"]) == {"baseline", "no_positional"} and "no_positional" in summary["scales"]

    params["lr_sweep"].append(0.03)
    params["scales"]["deep"] = {"model": {"n_encoder_layers": 2, "n_decoder_layers": 2}}
    write_params(project, params)
    stale = json.loads(sh(["dvc", "status", "--json"], project, env).stdout)
    assert set(stale) == stages({"lr": ["0.03"], "scale": ["deep"]}) | {"check_params", "report"}
