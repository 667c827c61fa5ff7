"""params.yaml validation and the ablation merge."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.params import ParamsError, load_params, merge_overrides, resolve_variant
from tests.committed import DEFAULT_PARAMS, committed


def test_merge_overrides_is_recursive_and_leaves_base_untouched():
    base = {"model": {"d_model": 64, "n_heads": 4}, "train": {"lr": 1e-3}}
    merged = merge_overrides(base, {"model": {"n_heads": 1}})
    assert merged == {"model": {"d_model": 64, "n_heads": 1}, "train": {"lr": 1e-3}}
    assert base["model"]["n_heads"] == 4


def test_merge_overrides_rejects_unknown_key_with_its_path():
    with pytest.raises(ParamsError, match=r"ablations\.x\.model\.n_head: unknown key \(did you mean 'n_heads'\?\)"):
        merge_overrides({"model": {"n_heads": 4}}, {"model": {"n_head": 1}}, where="ablations.x")


def test_default_params_resolve_every_variant():
    params = load_params(DEFAULT_PARAMS)  # the default study as committed, not the workspace's edits
    assert "baseline" in params.ablations and len(params.seeds) >= 3
    base = resolve_variant(params, "baseline")
    for name in params.ablations:
        variant = resolve_variant(params, name)
        assert variant["train"] == base["train"]  # default ablations change the model only
        assert set(variant["model"]) == set(base["model"])
    assert resolve_variant(params, "no_positional")["model"]["positional"] == "none"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, where", [
    ("filter:\n  max_source_tokenz: 3\n", "filter.max_source_tokenz"),
    ("train:\n  lr: -1\n", "train.lr"),
    ("train:\n  schedule: wavy\n", "train.schedule"),
    ("train:\n  precision: fp16\n", "train.precision"),
    ("train:\n  compile: maybe\n", "train.compile"),
    ("ablations:\n  x: {optim: {lr: 1}}\n", "ablations.x"),
])
def test_bad_params_name_the_key(tmp_path, text, where):
    with pytest.raises(ParamsError) as err:
        load_params(write(tmp_path, text))
    assert where in str(err.value) and "\n" not in str(err.value)


def test_unknown_model_key_is_rejected_when_resolving(tmp_path):
    params = load_params(write(tmp_path, "model:\n  d_modle: 3\n"))
    with pytest.raises(ParamsError, match="d_modle"):
        resolve_variant(params, "baseline")


def test_unknown_variant_and_bad_ablation_value(tmp_path):
    params = load_params(write(tmp_path, "ablations:\n  baseline: {}\n  fast: {train: {lr: 0}}\n"))
    with pytest.raises(ParamsError, match="no variant named 'nope'"):
        resolve_variant(params, "nope")
    with pytest.raises(ParamsError, match=r"ablations.fast.train: lr"):
        resolve_variant(params, "fast")


def test_unreadable_params_file(tmp_path):
    with pytest.raises(ParamsError, match="cannot read"):
        load_params(tmp_path / "missing.yaml")


def test_synthetic_preset_is_the_default_params(tmp_path):
    # presets/synthetic.yaml lets users switch back to the default study; it must not drift from
    # the committed params.yaml (the workspace's may hold a user's edits: README "Edit params and rerun").
    write(tmp_path, committed("params.yaml"))
    assert load_params(DEFAULT_PARAMS) == load_params(tmp_path / "params.yaml")


def test_exponent_floats_without_a_dot_are_floats(tmp_path):
    """`1e-5` is a string to YAML 1.1 but a float to DVC and to users; the model takes it as one."""
    params = load_params(write(tmp_path, "model:\n  norm_eps: 1e-5\ntrain:\n  lr: 3e-4\n"))
    assert params.model["norm_eps"] == 1e-5 and isinstance(params.model["norm_eps"], float)
    assert resolve_variant(params, "baseline")["train"]["lr"] == 3e-4


def test_a_scale_resizes_the_baseline_under_the_variant_and_a_sweep_rate_comes_last(tmp_path):
    params = load_params(write(tmp_path, (
        "model:\n  d_model: 32\n  n_heads: 2\ntrain:\n  lr: 0.001\nlr_sweep: [0.01]\n"
        "scales:\n  wide: {model: {d_model: 64, n_heads: 4}, train: {lr: 0.0005}}\n"
        "ablations:\n  baseline: {}\n  one_head: {model: {n_heads: 1}, train: {lr: 0.002}}\n")))
    wide = resolve_variant(params, "one_head", "wide")
    assert (wide["model"]["d_model"], wide["model"]["n_heads"], wide["train"]["lr"]) == (64, 1, 0.002)
    assert resolve_variant(params, "baseline", "wide")["train"]["lr"] == 0.0005
    assert resolve_variant(params, "one_head", lr=0.01)["train"]["lr"] == 0.01
    with pytest.raises(ParamsError, match="scales: no scale named 'tall' \\(have: wide\\)"):
        resolve_variant(params, "baseline", "tall")
