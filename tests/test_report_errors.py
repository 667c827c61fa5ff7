"""The report stage's errors and atomicity: one line naming the bad file, exit code 1, the previous
report kept, and a build folder left by a killed stage removed."""
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.report import _read_params, main
from pipeline.reporting.inputs import ReportInputError
from tests.fixtures.report.fake_runs import make_project
from tests.test_report import render

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bad_json_names_the_file_and_keeps_the_previous_report(tmp_path):
    p = make_project(tmp_path)
    out = render(p)
    before = (out / "report.md").read_text(encoding="utf-8")
    bad = p.evals / "no_ffn-1" / "eval.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ReportInputError, match="no_ffn-1/eval.json"):
        render(p, out)
    assert (out / "report.md").read_text(encoding="utf-8") == before
    assert [c.name for c in tmp_path.iterdir() if c.name.startswith(".reports")] == []


@pytest.mark.multiprocess
def test_cli_exits_1_with_one_line_on_bad_input(tmp_path):
    p = make_project(tmp_path, seeds=(0,), missing_runs=())
    params = tmp_path / "params.yaml"
    params.write_text("seeds: [0]\nablations: [baseline]\nreport: {baseline: baseline}\n", encoding="utf-8")
    args = ["--runs", str(p.runs), "--evals", str(p.evals), "--filter-metrics", str(p.filter_metrics),
            "--params", str(params), "--out-dir", str(tmp_path / "reports")]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert str(exc.value.code).startswith(f"report: {params}: ablations: ") and "\n" not in str(exc.value.code)
    params.write_text("seeds: [0]\nablations: {baseline: {}}\nreport: {baseline: base}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="report.baseline: 'base' is not a variant in ablations"):
        main(args)
    params.write_text("seeds: [0]\nablations: {baseline: {}, no_ffn: {}}\n", encoding="utf-8")
    (p.runs / "baseline-0" / "train_curve.csv").write_text("step,tokens\n1,2\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pipeline.report", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"report: {p.runs / 'baseline-0' / 'train_curve.csv'}: missing column(s) train_loss"]
    assert not (tmp_path / "reports").exists()


def test_primary_metric_must_be_a_reported_metric_with_its_own_test(tmp_path):
    params = tmp_path / "params.yaml"
    for name, message in (("val_ppl", "derived from 'val_loss'"), ("accuracy", "not a reported metric")):
        params.write_text(f"seeds: [0]\nablations: {{baseline: {{}}}}\nreport: {{primary_metric: {name}}}\n")
        with pytest.raises(ReportInputError, match=message):
            _read_params(params)


@pytest.mark.slow
def test_a_build_folder_left_by_a_killed_report_is_removed_by_the_next(tmp_path):
    p = make_project(tmp_path)
    out = tmp_path / "reports"
    (out / ".report-build.x1y2").mkdir(parents=True)  # SIGKILL while the report was being built
    (out / ".report.md.abc.tmp").write_text("half")  # ... or while it was swapped in
    (out / "studies").mkdir()  # not the stage's: kept
    render(p, out)
    assert sorted(q.name for q in out.iterdir()) == ["curves", "decisions.json", "details.json", "figures",
                                                    "fingerprint.json", "metrics.json", "report.html", "report.md",
                                                    "studies"]
