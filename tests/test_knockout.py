"""Stage `knockout`: the worker on tiny shards, its params errors, and the report's knock-out section."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from model import build_model
from model.knockout import COUNTERPARTS, plan
from pipeline.check_params import check
from pipeline.evaluate import lm_metrics, split_loss
from pipeline.knockout import run_knockouts
from pipeline.params import EvaluateParams, KnockoutParams, ParamsError, knockout_seeds, knocks_out, load_params
from pipeline.reporting.inputs import Run
from pipeline.reporting.knockout import counterpart_variants, knockout_blocks, side_by_side
from pipeline.reporting.render import Figure, Table, to_markdown
from pipeline.training.batching import load_split, read_manifest
from tests.committed import DEFAULT_PARAMS
from tests.test_evaluate_lm import lm_shards, make_model, save_run  # noqa: F401 - lm_shards is a fixture
from tests.test_layout import check_stage_deps, loaded_files
from tests.tiny_project import ROOT, copy_project, ran_stages, record_imports, sh, tiny_params, write_params

EVAL = EvaluateParams(max_new_tokens=8, batch_size=8)


def test_stage_scores_every_planned_knockout_against_the_unknocked_model(tiny_shards, tmp_path):
    shards = tiny_shards / "shards"
    manifest = read_manifest(shards)
    cfg = dataclasses.replace(make_model(manifest, "encoder_decoder").cfg, positional="sinusoidal")
    model = build_model(cfg).eval()  # absolute positions: mean-ablation of positions is defined
    run = save_run(model, tmp_path / "run")
    # Per mode: 2 cross heads, heads_but_one, positions, 3 layers + all skips (the plan: test_model_knockout).
    cfg = KnockoutParams(parts=["heads", "positional", "residual"], attentions=["cross"], heads=[1],
                         max_loss_tokens=10 ** 9, max_examples=3, mean_examples=4)
    summary = run_knockouts(shards, tiny_shards / "tokenizer", run, tmp_path / "ko", cfg, EVAL, 64, 8)
    on_disk = json.loads((tmp_path / "ko" / "knockout.json").read_text())
    assert on_disk["base"] == summary["base"]
    planned = plan(model.cfg, cfg.parts, cfg.attentions, cfg.heads, cfg.modes)
    assert [(r["name"], r["mode"]) for r in on_disk["knockouts"]] == [(n, m) for n, m, _ in planned]
    # Every token of the validation split: the un-knocked loss is the evaluate stage's val_loss.
    val = load_split(shards, manifest, "validation")
    full = split_loss(model, load_split(shards, manifest, "train", limit=1), val,
                      {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}, manifest["task"], 4096, 64, 8,
                      "cpu", "validation loss", sum(len(t) for t in val.tgt))
    assert on_disk["base"]["val_loss"] == pytest.approx(full, rel=1e-5)
    assert on_disk["n_examples"] == 3 and "rougeL" in on_disk["base"] and len(planned) == 2 * (2 + 1 + 1 + 4)
    for record in on_disk["knockouts"]:
        assert record["delta_val_loss"] == pytest.approx(record["val_loss"] - on_disk["base"]["val_loss"])
        assert math.isfinite(record["val_loss"])
        assert ("delta_rougeL" in record) == (record["name"] in ("heads_but_one", "positional", "residual.all"))
    assert len({r["val_loss"] for r in on_disk["knockouts"]}) > len(on_disk["knockouts"]) // 2  # they differ
    rows = (tmp_path / "ko" / "knockout.csv").read_text().splitlines()
    assert rows[0].startswith("name,mode,kind,knocks,val_loss,delta_val_loss") and len(rows) == len(planned) + 1


def test_stage_bounds_the_loss_tokens_and_scores_language_models(lm_shards, tmp_path):  # noqa: F811
    shards = lm_shards / "shards"
    manifest = read_manifest(shards)
    model = make_model(manifest, "decoder_only")
    run = save_run(model, tmp_path / "run")
    cfg = KnockoutParams(parts=["heads", "positional"], modes=["zero", "mean"], max_loss_tokens=50, mean_examples=2)
    summary = run_knockouts(shards, lm_shards / "tokenizer", run, tmp_path / "ko", cfg, EVAL, 20, 4)
    assert summary["n_loss_tokens"] == 50 and summary["n_examples"] == 0 and list(summary["base"]) == ["val_loss"]
    modes = {(r["name"], r["mode"]) for r in summary["knockouts"]}
    assert ("positional", "zero") in modes and ("positional", "mean") not in modes  # RoPE has no mean
    big = run_knockouts(shards, lm_shards / "tokenizer", run, tmp_path / "all", cfg.model_copy(
        update={"max_loss_tokens": 10 ** 9, "parts": ["ffn"]}), EVAL, 20, 4)
    val, test = (load_split(shards, manifest, s) for s in ("validation", "test"))
    expected = lm_metrics(model, val, test, ["x"], manifest["eos_id"], 20, 4, "cpu", None)[0]["val_loss"]
    assert big["base"]["val_loss"] == pytest.approx(expected, rel=1e-5)


def with_knockout(section: str) -> str:
    """The default study's params (as committed) with its knockout section replaced by `section`."""
    text, n = re.subn(r"^knockout:\n  seeds: .*\n", section, DEFAULT_PARAMS.read_text(), flags=re.M)
    assert n == 1
    return text


@pytest.mark.parametrize("knockout, pattern", [
    ("{seeds: [0], heads: [0, 4]}", r"^knockout\.heads: head 4 is beyond the model's n_heads=4"),
    ("{seeds: [], attentions: [cross]}", r"^knockout\.attentions: 'cross': a decoder_only model has self-attention only"),
    ("{seeds: [], parts: [positional]}", r"^knockout\.parts: positional: the model has no position information"),
    ("{seeds: [5, 7]}", r"knockout\.seeds: none of \[5, 7\] is in seeds \[0, 1, 2\]"),
    ("{seeds: [1, 1]}", r"knockout\.seeds: 1 is listed twice"),
    ("{seeds: some}", r"knockout\.seeds"),
])
def test_check_params_names_the_knockout_key_the_baseline_lacks(tmp_path, knockout, pattern):
    text = with_knockout(f"knockout: {knockout}\n")
    baseline = "{model: {arch: decoder_only}}" if "cross" in knockout else (
        "{model: {positional: none}}" if "positional" in knockout else "{}")
    text = text.replace("  baseline: {}\n", f"  baseline: {baseline}\n")
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(ParamsError, match=pattern):
        check(load_params(tmp_path / "params.yaml"), tmp_path)


def test_knockout_seeds_follow_seeds_so_shrinking_seeds_needs_no_second_edit(tmp_path):
    # The default study's params (as committed) with only `seeds` edited, as a user trying one seed would.
    text = DEFAULT_PARAMS.read_text()
    assert "\nseeds: [0, 1, 2]\n" in text and "\n  seeds: all\n" in text
    (tmp_path / "params.yaml").write_text(text.replace("\nseeds: [0, 1, 2]\n", "\nseeds: [0]\n"))
    params = load_params(tmp_path / "params.yaml")
    check(params, tmp_path)  # the check_params stage passes
    assert knockout_seeds(params.knockout.seeds, params.seeds) == [0]
    # A list keeps the seeds of it that are trained; [] is off; no knockout section: every seed.
    assert knockout_seeds([2, 0, 9], [0, 1, 2]) == [0, 2] and knockout_seeds([], [0, 1]) == []
    (tmp_path / "bare.yaml").write_text("seeds: [3, 4]\n")
    assert load_params(tmp_path / "bare.yaml").knockout.seeds == "all"
    assert [knocks_out("all", 4), knocks_out([0], 1), knocks_out([1], 1)] == [True, False, True]


def test_a_seed_left_out_writes_its_marker_without_a_model(tmp_path, capsys):
    from pipeline.knockout import OFF, main
    (tmp_path / "params.yaml").write_text("seeds: [0, 1]\nknockout: {seeds: [0]}\n")
    out = tmp_path / "ko"
    main(["--params", str(tmp_path / "params.yaml"), "--shards", "nowhere", "--tokenizer", "nowhere",
          "--seed", "1", "--run", str(tmp_path / "no-run"), "--out", str(out)])
    assert [p.name for p in out.iterdir()] == [OFF] and "knockout@1: off" in capsys.readouterr().out
    assert json.loads((out / OFF).read_text())["seed"] == 1


def test_check_params_stage_exits_with_one_line_naming_the_key(tmp_path):
    from pipeline.check_params import main
    text = with_knockout("knockout: {seeds: [0], heads: [9]}\n")
    (tmp_path / "params.yaml").write_text(text)
    with pytest.raises(SystemExit) as info:
        main(["--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "checked")])
    assert str(info.value.code).startswith("check_params: knockout.heads: head 9 is beyond")
    assert "\n" not in str(info.value.code) and not (tmp_path / "checked").exists()


# -- the report's section on synthetic numbers --------------------------------------------------
ABLATIONS = {"baseline": {}, "no_positional": {"model": {"positional": "none"}},
             "single_head": {"model": {"n_heads": 1}}, "decoder_only": {"model": {"arch": "decoder_only"}}}
TRAIN_VAL = {"baseline": [2.0, 2.1, 2.2], "no_positional": [2.5, 2.7, 2.8], "single_head": [2.01, 2.12, 2.2]}
TEST_DELTA = {"positional": [3.0, 3.3, 3.1], "heads_but_one": [0.02, -0.01, 0.015], "ffn.decoder.L0": [0.4, 0.5, 0.6]}


def synthetic(seeds=(0, 1, 2)):
    runs = {(v, s): Run(v, s, train={"wall_time_s": 10.0}, eval={"val_loss": vals[i]})
            for v, vals in TRAIN_VAL.items() for i, s in enumerate(seeds)}
    knockouts = {}
    for i, s in enumerate(seeds):
        records = [{"name": f"head.decoder.{a}.L{layer}.H{h}", "mode": "zero", "kind": "head", "knocks": 1,
                    "stack": "decoder", "attn": a, "layer": layer, "head": h, "delta_val_loss": 0.1 * h + layer}
                   for a in ("self", "cross") for layer in range(2) for h in range(2)]
        records += [{"name": n, "mode": "zero", "kind": "head" if n == "heads_but_one" else "ffn",
                     "knocks": 6 if n == "heads_but_one" else 1, "delta_val_loss": v[i]} for n, v in TEST_DELTA.items()]
        knockouts[s] = {"base": {"val_loss": 1.0}, "knockouts": records, "metrics": ["val_loss"], "wall_s": 2.0,
                        "counterparts": {k: list(v) for k, v in COUNTERPARTS.items()},
                        "modes": ["zero"], "n_loss_tokens": 100, "mean_examples": 4}
    return runs, knockouts


def test_side_by_side_pairs_train_and_test_deltas_by_seed_with_holm():
    from scipy import stats
    runs, knockouts = synthetic()
    assert counterpart_variants(COUNTERPARTS, ABLATIONS, "baseline") == {"heads_but_one": "single_head",
                                                                         "positional": "no_positional"}
    rows = {r["part"]: r for r in side_by_side(knockouts, runs, [0, 1, 2], "baseline", ABLATIONS)}
    train = [v - b for v, b in zip(TRAIN_VAL["no_positional"], TRAIN_VAL["baseline"])]
    pos = rows["positional"]
    assert pos["train"].mean == pytest.approx(sum(train) / 3)
    assert pos["test"].mean == pytest.approx(sum(TEST_DELTA["positional"]) / 3)
    p = stats.ttest_rel(train, TEST_DELTA["positional"]).pvalue
    other = stats.ttest_rel([v - b for v, b in zip(TRAIN_VAL["single_head"], TRAIN_VAL["baseline"])],
                            TEST_DELTA["heads_but_one"]).pvalue
    assert pos["diff"].p_value == pytest.approx(p)
    low, high = sorted([p, other])  # Holm over the table's two rows: 2 x the smaller, then running max
    assert pos["p_holm"] == pytest.approx(min(1.0, 2 * low) if p == low else max(min(1.0, 2 * low), high))


def test_knockout_section_renders_heatmap_tables_and_sentences(tmp_path):
    runs, knockouts = synthetic()
    blocks = knockout_blocks(knockouts, runs, [0, 1, 2], "baseline", ABLATIONS, tmp_path)
    assert (tmp_path / "knockout_heads.png").stat().st_size > 0
    assert any(isinstance(b, Figure) for b in blocks)
    tables = [b for b in blocks if isinstance(b, Table)]
    sublayer, pairs = tables
    assert [r[0] for r in sublayer.rows] == list(TEST_DELTA)  # heads are in the heatmap, not the table
    reading = {r[0]: r[-1] for r in pairs.rows}
    assert reading["positional encoding"].startswith("positional encoding: removing after training (zero-ablation) costs more")
    assert "a significant difference" in reading["positional encoding"]
    assert "not significant at 5% after Holm" in reading["every head but one"]
    text = to_markdown("r", blocks)
    assert "20% of training the baseline run" in text  # 2 s of knock-outs per 10 s of training
    assert knockout_blocks({}, runs, [0, 1, 2], "baseline", ABLATIONS, tmp_path) == []


@pytest.mark.repro
@pytest.mark.slow
def test_knockout_stage_through_dvc_follows_the_seeds(tiny_repo, tmp_path):
    # tiny_repo ran knockout@0 with knock-outs off (its knockout.seeds is []): the marker alone.
    env = {**copy_project(tiny_repo, tmp_path / "p"), "ABLATION_LAB_TRACKING": "0"}
    project = tmp_path / "p"
    assert [p.name for p in (project / "data/eval/knockout/baseline-0").iterdir()] == ["off.json"]
    knock = {"seeds": "all", "max_examples": 2, "mean_examples": 4}
    write_params(project, tiny_params(seeds=[0], knockout=knock))
    imports = tmp_path / "imports"
    log = sh(["dvc", "repro"], project, {**env, **record_imports(imports)}).stdout
    assert ran_stages(log) == {"check_params", "knockout@0", "report"}
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["knockout"]
    check_stage_deps("knockout", stage, loaded_files(imports)["knockout"], project)
    assert (project / "data/eval/knockout/baseline-0/knockout.json").is_file()
    report = (project / "reports" / "report.md").read_text()
    assert "## Knock-outs: what the trained baseline uses" in report and "positional encoding" in report
    assert (project / "reports" / "figures" / "knockout_heads.png").is_file()
    assert "knockout" in json.loads((project / "reports" / "details.json").read_text())
    assert "knockout@0" not in ran_stages(sh(["dvc", "repro"], project, env).stdout)

    # A second seed: `seeds` is the one list edited. Its runs and its knock-outs are added; seed 0's
    # knock-outs are not redone.
    write_params(project, tiny_params(seeds=[0, 1], knockout=knock))
    ran = ran_stages(sh(["dvc", "repro"], project, env).stdout)
    new_runs = {f"{s}@{v}-1" for s in ("train", "evaluate") for v in ("baseline", "no_positional")}
    assert ran == new_runs | {"check_params", "knockout@1", "report"}
    knocked = json.loads((project / "reports" / "details.json").read_text())["knockout"]["zero"]
    assert all(k["ci95"] is not None for k in knocked.values())  # over both seeds: an interval each
    # And back: seed 1's stages leave the pipeline, nothing reruns but the check and the report.
    write_params(project, tiny_params(seeds=[0], knockout=knock))
    assert ran_stages(sh(["dvc", "repro"], project, env).stdout) == {"check_params", "report"}
