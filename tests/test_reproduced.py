"""scripts/reproduced.py: a study's reports against the committed ones, in one answer."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.reproduced import main

METRICS = {"primary_metric": "val_loss", "baseline": {"mean": 0.6, "ci95": 0.1},
           "no_positional": {"mean": 1.2, "delta": 0.6, "delta_ci95": 0.2, "p": 0.006},
           "single_head": {"mean": 0.63, "delta": 0.03, "delta_ci95": 0.17, "p": 0.49}}
FINGERPRINT = {"models": {"baseline-0": "a" * 64, "no_positional-0": "b" * 64},
               "cpu_numerics": {"baseline-0": "pinned (AVX2)", "no_positional-0": "pinned (AVX2)"}}


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "metrics.json").write_text(json.dumps(METRICS))
    (tmp_path / "reports" / "fingerprint.json").write_text(json.dumps(FINGERPRINT))
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_identical_reports_say_so(repo, capsys):
    assert main([]) == 0
    assert "identical to HEAD (2 models the same bits" in capsys.readouterr().out


def test_a_moved_delta_is_given_in_units_of_its_interval_and_a_lost_verdict_is_named(repo, capsys):
    moved = json.loads(json.dumps(METRICS))
    moved["no_positional"].update(delta=0.1, delta_ci95=0.2)  # 2.5 half-widths: no longer significant
    moved["single_head"].update(delta=0.05)
    (repo / "reports" / "metrics.json").write_text(json.dumps(moved))
    printed = {**FINGERPRINT, "models": {**FINGERPRINT["models"], "baseline-0": "c" * 64},
               "cpu_numerics": {"baseline-0": "not pinned (x86_64, ATen AVX512)"}}
    (repo / "reports" / "fingerprint.json").write_text(json.dumps(printed))
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 models differ (baseline-0)" in out
    assert "not pinned (x86_64, ATen AVX512)" in out
    assert "no_positional: Δ +0.6 ± 0.2 -> +0.1 ± 0.2 (moved 2.50 of its interval's half-width; verdict CHANGED)" in out
    assert "single_head: Δ +0.03 ± 0.17 -> +0.05 ± 0.17 (moved 0.12 of its interval's half-width; verdict holds)" in out


def test_a_missing_file_is_one_line_naming_it(repo, capsys):
    (repo / "reports" / "fingerprint.json").unlink()
    with pytest.raises(SystemExit) as exit:
        main([])
    assert exit.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reports/fingerprint.json" in err and "No such file" in err


def test_models_differing_under_other_kernels_say_so_and_point_at_the_verdicts(repo, capsys):
    routed = "pinned (AVX2; products: openblas 0.3.31 Haswell, 1 thread)"
    changed = {**FINGERPRINT, "models": {**FINGERPRINT["models"], "baseline-0": "c" * 64},
               "cpu_numerics": {"baseline-0": routed, "no_positional-0": routed}}
    (repo / "reports" / "fingerprint.json").write_text(json.dumps(changed))
    assert main([]) == 1
    out = capsys.readouterr().out
    assert f"ran its CPU kernels as pinned (AVX2), this one as {routed}: other kernels, other bits" in out
    assert "compare the verdicts below" in out


def test_models_differing_though_pinned_alike_name_what_to_look_for(repo, capsys):
    changed = {**FINGERPRINT, "models": {**FINGERPRINT["models"], "baseline-0": "c" * 64}}
    (repo / "reports" / "fingerprint.json").write_text(json.dumps(changed))
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "both ran pinned alike, so the same bits were promised" in out
    assert "constraints.txt" in out and "docs/training-engine.md" in out and "please report it" in out
