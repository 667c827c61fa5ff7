"""pipeline.plan: its counts equal the real model's and the train stage's, its memory terms add up,
bad input is one line, a run too big for the device says so, and its CPU wall times match the
committed studies' measured ones (no timing here: the walls come from the committed report.md files,
which the report stage writes from each run's train.json)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from model import build_model
from pipeline import plan
from pipeline.planning import calibration, estimate
from pipeline.params import Params, load_params, model_config, resolve_variant
from pipeline.train import flops_per_target_token, mean_lengths
from pipeline.training.batching import load_split, read_manifest
from tests.committed import default_params
from tests.tiny_project import tiny_params

ROOT = Path(__file__).resolve().parents[1]
REPORTS = [ROOT / "reports" / "report.md", *sorted((ROOT / "reports" / "studies").glob("*/report.md"))]


def write(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump(params))
    return path


def rows_for(params: Params, manifest: dict | None, device: str = "4090", mfu: float = 0.5, sublayer_s: float = 0.0,
             shards: Path | None = None):
    name, capacity = plan.GPUS.get(device, (None, estimate.ram_bytes()))
    peak = plan.gpu_peak(name) if name else 1e11
    time = calibration.Calibration(mfu, sublayer_s, float("inf"), 0, "test")
    return estimate.plan(params, manifest, device, peak, time, capacity, shards)[0]


def test_tiny_seq2seq_counts_equal_the_real_model_and_train_stage(tiny_shards, tmp_path):
    from pipeline.training import trainer

    params = load_params(write(tmp_path / "params.yaml", tiny_params(seeds=[0])))
    shards = tiny_shards / "shards"
    manifest = read_manifest(shards)
    rows = rows_for(params, manifest, shards=shards)
    assert [r.variant for r in rows] == list(params.ablations)
    split = load_split(shards, manifest, "train")
    for row in rows:
        resolved = resolve_variant(params, row.variant)
        cfg = model_config(resolved["model"], manifest, row.variant)
        torch.manual_seed(0)
        model = build_model(cfg)  # real weights, as the train stage builds them
        assert row.params == model.param_counts()["total"]
        assert row.flops_per_token == pytest.approx(flops_per_target_token(model, cfg, *mean_lengths(
            split, resolved["train"], False)))
        assert row.runs == len(params.seeds)
        m = row.memory
        assert (m["weights"], m["gradients"], m["adamw"]) == (4 * row.params, 4 * row.params, 8 * row.params)
        assert m["bf16_weight_copies"] == 2 * row.params  # --device 4090: bf16 autocast
        assert m["total"] == (m["weights"] + m["gradients"] + m["adamw"] + m["bf16_weight_copies"] + m["activations"]
                              + m["logits_gradient"])
        batch_rows, _, tgt_len = m["batch_shape"]
        assert m["logits_gradient"] == 4 * batch_rows * tgt_len * cfg.vocab_size
        assert row.seconds_per_run == pytest.approx(row.flops_per_token * row.tokens_per_run
                                                    / (plan.gpu_peak("4090") * 0.5))
        # The real training loop on the same data: the steps and tokens the plan said.
        data = trainer.Data(task=manifest["task"], train=split, val=split,
                            ids={k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")},
                            batch_tokens=resolved["train"]["batch_tokens"], batch_size=resolved["train"]["batch_size"],
                            context=resolved["train"]["context"], seed=0)
        result = trainer.train(model, data, resolved["train"], tmp_path / row.variant, "plan-test", log=lambda *a: None)
        assert (row.steps_per_run, row.tokens_per_run) == (result["steps"], result["tokens_trained"])
    # Without the encoded data the budget is the tokens, and the steps ignore padding (fewer).
    for guess, row in zip(rows_for(params, None), rows):
        assert guess.tokens_per_run == params.train.budget_tokens and guess.steps_per_run <= row.steps_per_run


def test_language_model_tokens_steps_and_activations_by_hand(tmp_path):
    lm = tiny_params(
        data={"source": "local", "local": {"task": "language_modeling", "paths": {"train": "x.txt"}}},
        model={"arch": "decoder_only", "d_model": 32, "n_heads": 2, "n_decoder_layers": 2, "d_ff": 64,
               "max_len": 64, "dropout": 0.0},
        train={"budget_steps": 7, "batch_size": 3, "context": 16, "grad_accum": 2, "device": "cpu"},
        lr_sweep=[0.01], scales={"wide": {"model": {"d_model": 64}}})
    params = load_params(write(tmp_path / "params.yaml", lm))
    rows = rows_for(params, None, device="cpu")
    main = [r for r in rows if r.scale is None]
    wide = [r for r in rows if r.scale == "wide"]
    assert len(main) == len(wide) == len(params.ablations)
    for row in main:
        assert row.tokens_per_run == 7 * 3 * 16 * 2 and row.steps_per_run == 7
        assert row.runs == len(params.seeds) * 2  # train.lr and the one lr_sweep point
        assert row.memory["bf16_weight_copies"] == 0  # cpu trains in float32
    assert all(w.params > m.params and w.runs == len(params.seeds) for w, m in zip(wide, main))
    # The logits of one batch (batch x context x vocab, fp32) are kept for the loss's backward:
    # the activations hold at least them, and far less than a thousand times them.
    logits = 3 * 16 * params.train_bpe.vocab_size * 4
    assert logits < main[0].memory["activations"] < 1000 * logits


def test_gpu_step_is_never_shorter_than_the_hosts_work(tiny_shards, tmp_path):
    params = load_params(write(tmp_path / "params.yaml", tiny_params()))
    manifest = read_manifest(tiny_shards / "shards")
    flops_only = rows_for(params, manifest)
    hosted = rows_for(params, manifest, sublayer_s=0.05)
    for fast, slow in zip(flops_only, hosted):
        n = estimate.sublayers(model_config(resolve_variant(params, slow.variant)["model"], manifest, slow.variant))
        assert slow.seconds_per_run == pytest.approx(max(fast.seconds_per_run, 0.05 * n * slow.steps_per_run))
        assert slow.seconds_per_run > fast.seconds_per_run  # a tiny model: the host's work decides


@pytest.mark.parametrize("switches, rows, src_len, tgt_len", [
    ({"arch": "encoder_decoder", "n_encoder_layers": 2}, 8, 40, 20),
    ({"arch": "decoder_only", "positional": "rope", "norm": "rmsnorm", "norm_position": "pre", "ffn": "swiglu"}, 4, 0, 64),
    ({"arch": "decoder_only", "relative_bias": True, "dropout": 0.1}, 4, 0, 64),
])
def test_meta_activations_match_a_real_forward(switches, rows, src_len, tgt_len):
    """The meta-device count against the tensors a real CPU forward keeps for backward (storages
    counted once, weights left out). The meta trace takes attention's math path where the CPU's fused
    kernel keeps less: it may overcount a little, never undercount."""
    from model import ModelConfig

    cfg = ModelConfig(vocab_size=300, d_model=64, n_heads=4, n_decoder_layers=2, d_ff=128, max_len=128, **switches)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    src = torch.randint(4, 300, (rows, src_len)) if src_len else None
    tgt = torch.randint(4, 300, (rows, tgt_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(src, tgt, tgt)
    real = sum(kept.values())
    with torch.device("meta"):
        meta_model = build_model(cfg)
    counted = estimate.activation_bytes(meta_model, cfg, rows, src_len, tgt_len, bf16=False)
    assert real <= counted <= 1.2 * real


def test_bad_device_is_one_line(tmp_path, capsys):
    path = write(tmp_path / "params.yaml", tiny_params())
    with pytest.raises(SystemExit) as exc:
        plan.main(["--params", str(path), "--device", "tpu"])
    assert str(exc.value) == "plan: --device: unknown device 'tpu' (choose h100, a100, 4090 or cpu)"
    with pytest.raises(SystemExit) as exc:
        plan.main(["--params", str(tmp_path / "missing.yaml"), "--device", "h100"])
    assert str(exc.value).startswith("plan: ") and "missing.yaml" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow
def test_a_run_too_big_for_the_device_says_so(tmp_path, capsys):
    big = tiny_params(
        data={"source": "local", "local": {"task": "language_modeling", "paths": {"train": "x.txt"}}},
        model={"arch": "decoder_only", "d_model": 4096, "n_heads": 32, "n_decoder_layers": 32, "d_ff": 16384,
               "max_len": 2048},
        train={"batch_size": 16, "context": 2048}, train_bpe={"vocab_size": 32000},
        ablations={"baseline": {}})
    path = write(tmp_path / "params.yaml", big)
    plan.main(["--params", str(path), "--device", "4090", "--shards", str(tmp_path / "none")])
    out = capsys.readouterr().out
    assert "CANNOT FIT: baseline needs" in out and "**NO**" in out
    plan.main(["--params", str(path), "--device", "4090", "--json", "--shards", str(tmp_path / "none")])
    result = json.loads(capsys.readouterr().out)
    assert result["total"]["all_fit"] is False and result["rows"][0]["memory"]["total"] > 24 * 10**9


# --- predicted vs measured on the committed CPU studies -------------------------------------------

def fitted_without(report: Path) -> tuple[calibration.Calibration, float]:
    """The time model of `report`'s products (pinned or torch's own) fitted to every committed study
    but `report`'s, and the peak the runs divided by."""
    cal = calibration.calibrate([r for r in REPORTS if r != report], calibration.pinned_report(report))
    return cal, cal.peak


def predicted_vs_measured(report: Path, params: Params, manifest: dict | None,
                          shards: Path | None = None) -> dict[str, tuple[float, float]]:
    """{variant: (predicted s, measured s)}: the whole plan (steps, FLOPs, mean batch, time) of
    `params`, under the time model fitted leaving this study out."""
    cal, peak = fitted_without(report)
    rows = estimate.plan(params, manifest, "cpu", peak, cal, estimate.ram_bytes(), shards)[0]
    # Its walls at the reference machine's speed (calibration.day_speed), as the fit's are.
    measured = {p.variant: p.wall_s for p in calibration.study_points(report, peak)}
    return {r.variant: (r.seconds_per_run, measured[r.variant]) for r in rows if r.variant in measured}


# Issue #26: predicted within ±30% of measured, each study predicted by the model fitted to the
# others. Met for each study's wall (its variants' sum); single variants land within ±40% (the
# default study's single_head and tinystories_cpu's baseline reach +37%). Timings a report marks
# as contended by its direct measure are neither fitted nor checked.
STUDY_TOLERANCE = 0.3
VARIANT_TOLERANCE = 0.4


def assert_within(pairs: dict[str, tuple[float, float]]) -> None:
    assert len(pairs) >= 3, f"too few variants of this study have a usable measured wall: {sorted(pairs)}"
    off = {v: p / m - 1 for v, (p, m) in pairs.items()}
    total = sum(p for p, _ in pairs.values()) / sum(m for _, m in pairs.values()) - 1
    assert abs(total) <= STUDY_TOLERANCE, f"study wall off by {total:+.0%}"
    assert all(abs(e) <= VARIANT_TOLERANCE for e in off.values()), {v: f"{e:+.0%}" for v, e in off.items()}


@pytest.mark.slow
def test_default_study_wall_within_tolerance(tmp_path):
    """The default study's data are generated (no download), so the plan runs on its real data:
    the train stage's own batch plan gives steps, tokens and the mean batch."""
    from pipeline.download import write_synthetic
    from pipeline.encode import encode
    from pipeline.filter import filter_files
    from pipeline.train_bpe import train_tokenizer

    params = load_params(ROOT / "presets" / "synthetic.yaml")  # the committed params.yaml's preset
    write_synthetic(tmp_path / "raw", n_examples=params.data.synthetic.n_examples, seed=params.data.synthetic.seed)
    filter_files(tmp_path / "raw", tmp_path / "filtered", params.filter)
    train_tokenizer(tmp_path / "filtered" / "train.parquet", tmp_path / "tokenizer", params.train_bpe)
    manifest = encode(tmp_path / "filtered", tmp_path / "tokenizer", tmp_path / "shards", params.encode.shard_examples)
    assert_within(predicted_vs_measured(ROOT / "reports" / "report.md", params, manifest, tmp_path / "shards"))


def known_gaps(cases, gaps: dict[str, str], name=str) -> list:
    """`cases` as parametrize takes them, each whose name is in `gaps` expected to fail (strict:
    the day it holds again, the mark must go) for the reason given."""
    return [pytest.param(c, marks=pytest.mark.xfail(reason=gaps[name(c)], strict=True)) if name(c) in gaps else c
            for c in cases]


# tiny_shakespeare_cpu's rerun (2026-11-30) ran -j 2: every run's wall was timed beside another run
# (others' CPU ~50%), so none is left to check the time model on (its study wall is checked:
# tests/test_plan_study.py).
DRIFTED = {"tiny_shakespeare_cpu": "its -j 2 rerun: every run timed beside another, no usable wall"}


@pytest.mark.slow
@pytest.mark.parametrize("study", known_gaps(("tinystories_cpu", "tiny_shakespeare_cpu"), DRIFTED))
def test_language_model_preset_wall_within_tolerance(study):
    """A language model needs no data to plan: the preset alone gives steps, FLOPs and batch."""
    report = ROOT / "reports" / "studies" / study / "report.md"
    params = load_params(report.parent / "params.yaml")
    ran, preset = (load_params(p).model_dump(exclude={"report"}) for p in (
        report.parent / "params.yaml", ROOT / "presets" / f"{study}.yaml"))
    # The report's notes, digest and claims do not change what was timed; arms the preset added
    # since (tiny_shakespeare_cpu's as-seed runs) were not timed, and every arm timed is the preset's.
    assert ran["ablations"].items() <= preset.pop("ablations").items()
    # Seeds until decided: the runs the rounds added are the study's record, not the preset's.
    assert preset["decide"]["runs"] == {}
    ran["decide"]["runs"] = {}
    assert ran | {"ablations": None} == preset | {"ablations": None}
    assert_within(predicted_vs_measured(report, params, None))


@pytest.mark.slow
def test_translation_preset_wall_within_tolerance():
    """multi30k_comparisons_cpu's data (Multi30k) are not in the tests: its steps, FLOPs and mean
    batch are the ones its report recorded, so this checks the time model alone on them."""
    report = ROOT / "reports" / "studies" / "multi30k_comparisons_cpu" / "report.md"
    cal, peak = fitted_without(report)
    assert_within({p.variant: (cal.cpu_seconds(p.steps, p.sublayers, p.act_bytes, p.flops, peak, p.split, p.threads),
                               p.wall_s) for p in calibration.study_points(report, peak)})


@pytest.mark.slow
def test_docs_preset_costs_are_current():
    from scripts import plan_presets

    plan_presets.main(["--root", str(ROOT), "--check"])


def test_preset_costs_without_reports_is_one_line(tmp_path):
    from scripts import plan_presets

    (tmp_path / "docs").mkdir()
    (tmp_path / plan_presets.PAGE).write_text(f"{plan_presets.BEGIN}\n{plan_presets.END}\n")
    with pytest.raises(SystemExit, match=r"^plan_presets: no committed report\.md") as info:
        plan_presets.main(["--root", str(tmp_path)])
    assert "\n" not in str(info.value)


# --- the time model's fit ---------------------------------------------------------------------------

def synthetic_points(cal: calibration.Calibration, peak: float) -> list[calibration.Point]:
    """Walls made by `cal` itself for runs of different shapes (a known answer for the fit)."""
    shapes = [(400, 10, 12e6, 3e11), (9600, 4, 5e6, 3e12), (730, 4, 115e6, 8.5e12), (500, 8, 120e6, 7e12),
              (2000, 8, 30e6, 8e12), (1390, 4, 10e6, 6e11)]
    return [calibration.Point("s", f"v{i}", steps, n, act, flops, cal.cpu_seconds(steps, n, act, flops, peak))
            for i, (steps, n, act, flops) in enumerate(shapes)]


def test_the_fit_recovers_the_constants_that_made_the_walls():
    truth = calibration.Calibration(mfu=0.4, sublayer_s=2e-3, bytes_per_s=4e9, runs=0, source="truth")
    got = calibration.fit(synthetic_points(truth, 2e11), 2e11, "synthetic")
    assert (got.mfu, got.sublayer_s, got.bytes_per_s) == pytest.approx((0.4, 2e-3, 4e9), rel=1e-6)
    assert got.runs == 6


def test_the_fit_never_lets_flops_run_faster_than_the_peak():
    """Walls with no FLOPs term at all: unconstrained, FLOPs would cost nothing (MFU infinite)."""
    free = calibration.Calibration(mfu=float("inf"), sublayer_s=2e-3, bytes_per_s=4e9, runs=0, source="free")
    points = [dataclasses.replace(p, flops=p.wall_s * 2e11 * share)  # FLOPs at the peak: 1-8% of each wall
              for p, share in zip(synthetic_points(free, 2e11), (0.01, 0.08, 0.03, 0.05, 0.02, 0.07))]
    assert calibration.fit(points, 2e11, "synthetic").mfu == 1.0
    too_fast = [calibration.Point("s", "v", 1, 1, 0.0, 1e12, 1.0)] * 3  # 1e12 FLOPs in 1 s at a 2e11 peak
    with pytest.raises(estimate.PlanError, match="shorter than its FLOPs at the peak"):
        calibration.fit(too_fast, 2e11, "synthetic")


@pytest.mark.parametrize("cell, shape", [
    ("10.6 × (67.3 + 36.5)", (10.6, 67.3, 36.5)), ("12 × 64", (12.0, 0.0, 64.0)), ("—", None), (None, None),
    ("1,024 × 2,048", (1024.0, 0.0, 2048.0)),
])
def test_mean_batch_cells(cell, shape):
    assert calibration.mean_batch(cell) == shape


@pytest.mark.slow
def test_a_report_its_params_no_longer_describe_is_not_calibrated_on(tmp_path):
    """The workspace's params.yaml edited after its report was written: its layers differ from the
    report's parameter counts, so the report's walls are not paired with the wrong model."""
    report = ROOT / "reports" / "report.md"
    assert calibration.study_points(report)  # the committed pair matches
    (tmp_path / "reports").mkdir()
    copy = tmp_path / "reports" / "report.md"
    copy.write_text(report.read_text())
    params = default_params()  # what made the committed report, whatever the workspace's params.yaml holds
    write(tmp_path / "params.yaml", params)
    assert [p.variant for p in calibration.study_points(copy)] == [p.variant for p in calibration.study_points(report)]
    params["model"]["d_ff"] *= 2
    write(tmp_path / "params.yaml", params)
    assert calibration.study_points(copy) == []


def test_a_character_vocabulary_is_read_from_the_reported_embeddings():
    """tiny_shakespeare_cpu's params give train_bpe's vocab_size; its data have 65 characters."""
    report = ROOT / "reports" / "studies" / "tiny_shakespeare_cpu" / "report.md"
    params = load_params(report.parent / "params.yaml")
    counts = calibration.parameter_counts(report.read_text())["baseline"]
    cfg, model = calibration.matched_model(resolve_variant(params, "baseline"), params, "baseline", counts)
    assert model.param_counts()["embeddings"] == counts["embeddings"] and cfg.vocab_size < params.train_bpe.vocab_size
