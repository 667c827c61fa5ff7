"""Bad params through the real `dvc repro`: every key is checked by a stage that reruns when it
changes, the error is one line naming the key, and no output is lost (issues #14, #15)."""
from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest

from pipeline import check_params
from tests.tiny_project import copy_project, ran_stages, sh, tiny_params, write_params

BASE = tiny_params(seeds=[0])


@pytest.fixture(scope="module")
def project(tiny_repo, tmp_path_factory):
    project = tmp_path_factory.mktemp("params") / "project"
    return project, copy_project(tiny_repo, project)


def outputs(project: Path) -> dict[str, str]:
    """sha256 of every file the pipeline wrote (data/ but the user's data/local, and reports/)."""
    files = [p for p in (project / "data").rglob("*") if p.is_file() and "local" not in p.parts]
    files += [p for p in (project / "reports").rglob("*") if p.is_file()]
    return {str(p.relative_to(project)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def edit(params: dict, path: str, value) -> dict:
    """A copy of `params` with `path` ("train.betas", or "+seed" for a new top-level key) set."""
    params = copy.deepcopy(params)
    *parents, last = path.lstrip("+").split(".")
    node = params
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return params


def renamed(params: dict, old: str, new: str) -> dict:
    params = copy.deepcopy(params)
    params[new] = params.pop(old)
    return params


CASES = [  # params, then the line the failing stage prints
    (edit(BASE, "+seed", [0, 1]), "check_params: params.yaml: seed: unknown key (did you mean 'seeds'?)"),
    (renamed(BASE, "filter", "fitler"), "check_params: params.yaml: fitler: unknown key (did you mean 'filter'?)"),
    (edit(BASE, "data.synthetc", {"n_examples": 10}),
     "check_params: params.yaml: data.synthetc: unknown key (did you mean 'synthetic'?)"),
    (edit(BASE, "data.multi30k", {"max_rowz": 10}), "check_params: data.multi30k.max_rowz: unknown option"),
    (edit(BASE, "seeds", ["x"]), "check_params: params.yaml: seeds.0: Input should be a valid integer"),
    (edit(BASE, "ablations.my variant", {}), "check_params: params.yaml: ablations.'my variant': a variant name"),
    (edit(BASE, "report.baseline", "base"), "check_params: params.yaml: report.baseline: 'base' is not a variant"),
    (edit(BASE, "model.n_heads", 3), "check_params: model: ModelConfig.d_model (32) must be divisible by n_heads"),
    (edit(BASE, "ablations.no_positional", {"model": {"n_heads": 3}}),
     "check_params: ablations.no_positional: ModelConfig.d_model (32) must be divisible by n_heads"),
    (edit(BASE, "filter.test_fraction", 0.9), "check_params: params.yaml: filter.val_fraction + filter.test_fraction = 1"),
    (edit(BASE, "train.budget_tokens", 10**11), "train: train.budget_tokens: 100000000000 is "),
]


@pytest.mark.repro
@pytest.mark.slow
@pytest.mark.parametrize("params,line", CASES, ids=[c[1].split(": ", 2)[-1][:40] for c in CASES])
def test_a_bad_key_stops_dvc_repro_with_one_line_naming_it(project, params, line):
    project, env = project
    before = outputs(project)
    write_params(project, params)
    try:
        result = sh(["dvc", "repro"], project, env, ok=False)
    finally:
        write_params(project, BASE)
    assert result.returncode != 0
    printed = [ln for ln in (result.stdout + result.stderr).splitlines() if ln.startswith(line.split(":")[0] + ": ")]
    assert len(printed) == 1 and printed[0].startswith(line), result.stdout[-2000:] + result.stderr[-2000:]
    if not line.startswith("check_params"):  # a stage that needs data: its own outputs come back from the cache
        sh(["dvc", "checkout", "-q"], project, env)
    assert outputs(project) == before


# Values any stage would reject, checked here by the stage itself (the cases above show it runs first).
VALUES = [
    (edit(BASE, "train.betas", [0.9, 1.5]), "params.yaml: train.betas.1: Input should be less than 1 (got 1.5)"),
    (edit(BASE, "ablations.x", {"train": {"betas": [1.0, 0.9]}}), "ablations.x.train: betas.0: Input should be less than 1"),
    (edit(BASE, "seeds", [-1]), "params.yaml: seeds.0: Input should be greater than or equal to 0 (got -1)"),
    (edit(BASE, "seeds", [2**32]), "params.yaml: seeds.0: Input should be less than 4294967296"),
    (edit(BASE, "seeds", [1, 1]), "params.yaml: seeds: 1 is listed twice"),
    (edit(BASE, "ablations.a/b", {}), "params.yaml: ablations.'a/b': a variant name must be letters, digits"),
    (edit(BASE, "ablations.x", {"optim": {}}), "params.yaml: ablations.x.optim: unknown section (allowed: model, train)"),
    (edit(BASE, "data.source", "shakespeare"), "params.yaml: data.source: Input should be 'synthetic'"),
    (edit(BASE, "data.local", {"task": "language_modeling", "paths": {"train": "/elsewhere/a.txt"}}),
     "data.local.paths.train: /elsewhere/a.txt is outside"),
    (edit(BASE, "model.n_head", 1), "model.n_head: unknown key (did you mean 'n_heads'?)"),
    (edit(BASE, "+lr_sweep", [0.01, 0.001]), "params.yaml: lr_sweep: 0.001 is train.lr; the main runs train at it"),
    (edit(BASE, "+lr_sweep", [0.01, 0.01]), "params.yaml: lr_sweep: 0.01 is listed twice"),
    (edit(BASE, "+lr_sweep", [0]), "params.yaml: lr_sweep.0: Input should be greater than 0"),
    (edit(BASE, "+scales", {"wide": {}}), "params.yaml: scales.wide: the baseline's own size"),
    (edit(BASE, "+scales", {"wide": {"optim": {}}}), "params.yaml: scales.wide.optim: unknown section"),
    (edit(BASE, "+scales", {"wide": {"model": {"d_modl": 64}}}),
     "scales.wide.model.d_modl: unknown key (did you mean 'd_model'?)"),
    (edit(BASE, "+scales", {"wide": {"model": {"d_model": 33}}}),
     "scales.wide: ModelConfig.d_model (33) must be divisible by n_heads"),
    (edit(edit(BASE, "+scales", {"wide": {"model": {"d_model": 34}}}), "ablations.x", {"model": {"n_heads": 4}}),
     "ablations.x at scales.wide: ModelConfig.d_model (34) must be divisible by n_heads (4)"),
    (edit(edit(BASE, "train.budget_steps", 10), "train.budget_flops", 1e9),
     "params.yaml: train.budget_flops and train.budget_steps are both set"),
]


@pytest.mark.parametrize("params,line", VALUES, ids=[c[1][:40] for c in VALUES])
def test_check_params_names_the_bad_value(tmp_path, monkeypatch, params, line):
    monkeypatch.chdir(tmp_path)
    write_params(tmp_path, params)
    with pytest.raises(SystemExit) as info:
        check_params.main(["--out", "params.checked", "--local-root", "data/local"])
    message = str(info.value.code)
    assert message.startswith(f"check_params: {line}") and "\n" not in message, message
    assert not (tmp_path / "params.checked").exists()


def test_check_params_writes_the_same_stamp_for_any_valid_params(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stamps = []
    for params in (BASE, edit(BASE, "seeds", [0, 1, 2]), edit(BASE, "ablations.x", {"model": {"n_heads": 1}})):
        write_params(tmp_path, params)
        check_params.main(["--out", "params.checked"])
        stamps.append((tmp_path / "params.checked").read_bytes())
    assert len(set(stamps)) == 1  # so no stage after it reruns because of it


@pytest.mark.repro
@pytest.mark.slow
def test_a_vocabulary_the_corpus_cannot_fill_is_named_in_params_terms(project):
    project, env = project
    before = outputs(project)
    for size, said in ((5, "is below the"), (5000, "is above the")):
        write_params(project, edit(BASE, "train_bpe.vocab_size", size))
        try:
            result = sh(["dvc", "repro"], project, env, ok=False)
        finally:
            write_params(project, BASE)
        line = next(ln for ln in result.stderr.splitlines() + result.stdout.splitlines() if ln.startswith("train_bpe: "))
        assert result.returncode != 0 and line.startswith(f"train_bpe: train_bpe.vocab_size: {size} {said}"), line
    sh(["dvc", "checkout", "-q"], project, env)  # DVC removed the cached tokenizer before the stage ran
    assert outputs(project) == before


@pytest.mark.repro
@pytest.mark.slow
def test_a_failing_report_stage_keeps_the_last_good_output_and_a_failing_filter_is_restored(project):
    project, env = project
    report = (project / "reports" / "report.md").read_text()
    filter_json = (project / "data" / "metrics" / "filter.json").read_text()
    eval_json = project / "data" / "eval" / "baseline-0" / "eval.json"
    good = eval_json.read_bytes()
    eval_json.write_text("{ not json")  # an input the report cannot read
    try:
        result = sh(["dvc", "repro", "--single-item", "report"], project, env, ok=False)
    finally:
        eval_json.write_bytes(good)
    assert result.returncode != 0 and "eval.json" in result.stderr + result.stdout
    assert (project / "reports" / "report.md").read_text() == report
    assert not list((project / "reports").glob(".*"))  # no temporary left behind

    write_params(project, edit(BASE, "filter.max_source_tokens", 1))  # valid, but nothing passes it
    try:
        result = sh(["dvc", "repro"], project, env, ok=False)
    finally:
        write_params(project, BASE)
    assert result.returncode != 0 and ran_stages(result.stdout) == {"check_params", "filter"}
    # filter.json is cached (a grid machine restores filter from the run-cache): like the filtered
    # data, it comes back from the cache.
    sh(["dvc", "checkout", "-q"], project, env)
    assert (project / "data" / "metrics" / "filter.json").read_text() == filter_json
    # check_params passed the edited params, so it reruns on the restored ones; nothing else does.
    assert ran_stages(sh(["dvc", "repro"], project, env).stdout) == {"check_params"}
