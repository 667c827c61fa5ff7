"""The study table in docs/datasets-and-presets.md: generated from the committed reports, and stale
tables caught."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from scripts import report_studies

ROOT = Path(__file__).resolve().parents[1]


def page(root: Path) -> Path:
    """Where the table lives under `root` (its folder made)."""
    path = root / report_studies.PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_the_committed_docs_table_matches_the_committed_reports():
    report_studies.main(["--root", str(ROOT), "--check"])


def write_study(root: Path, name: str, delta: float) -> None:
    folder = root / "reports" / "studies" / name
    folder.mkdir(parents=True)
    # The verdict is on the primary metric (val_loss); the main metric's Δ (bits_per_char, a derived
    # one with a Holm-corrected source) is another, which the table no longer shows.
    variants = {"baseline": {"val_loss": {"mean": 1.5, "ci95": 0.02, "n": 3},
                             "bits_per_char": {"mean": 2.25, "ci95": 0.03, "n": 3}},
                "no_positional": {"val_loss": {"mean": 1.5 + delta, "ci95": 0.02, "n": 3, "delta": delta,
                                               "delta_ci95": 0.01, "p": 0.0123, "verdict": "worse", "role": "primary"},
                                  "bits_per_char": {"mean": 2.5, "ci95": 0.03, "n": 3, "delta": 0.25, "p": None,
                                                    "verdict": "derived from test_loss: no test of its own"}}}
    (folder / "metrics.json").write_text(json.dumps({"main_metric": "bits_per_char", "primary_metric": "val_loss",
                                                     "variants": variants}))
    params = {"report": {"baseline": "baseline", "reference": {"metric": "val_loss", "value": 1.4857, "source": "x"}},
              "seeds": [0, 1, 2]}
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    (folder / "run.json").write_text(json.dumps({"wall_s": 754, "cpu_count": 2, "device": "cpu"}))


def test_table_reads_every_number_from_the_study_files(tmp_path):
    page(tmp_path).write_text(f"intro\n{report_studies.BEGIN}\nold\n{report_studies.END}\nrest\n")
    write_study(tmp_path, "toy", 0.125)
    report_studies.main(["--root", str(tmp_path)])
    text = page(tmp_path).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| [toy]"))
    assert "(../reports/studies/toy/report.md)" in row  # relative to the page
    assert "| 2 × 3 |" in row  # variants × seeds
    assert "1.5 ± 0.02 (reference 1.4857)" in row and "bits_per_char ↓ 2.25 ± 0.03" in row
    assert "val_loss ↓: no_positional +0.125 (95% CI [0.115, 0.135], p 0.012, worse)" in row
    assert "12 min 34 s (`dvc repro`), cpu, 2 CPUs" in row and "0.25" not in row
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "\nold\n" not in text
    report_studies.main(["--root", str(tmp_path), "--check"])  # now current


def test_the_wall_says_how_the_study_ran(tmp_path):
    """An older run.json (a plain `dvc repro`) and the launcher's, serial or side by side, warm or cold."""
    page(tmp_path).write_text(f"{report_studies.BEGIN}\n{report_studies.END}\n")
    write_study(tmp_path, "toy", 0.125)
    run = tmp_path / "reports" / "studies" / "toy" / "run.json"
    for fields, said in (({"jobs": 1, "warm": True}, "(`pipeline.grid` serial, warm)"),
                         ({"jobs": 16}, "(`pipeline.grid` -j 16, cold)"),
                         ({"jobs": 2, "warm": True}, "(`pipeline.grid` -j 2, warm)")):
        run.write_text(json.dumps({"wall_s": 754, "cpu_count": 2, "device": "cpu", **fields}))
        report_studies.main(["--root", str(tmp_path)])
        assert f"12 min 34 s {said}, cpu, 2 CPUs" in page(tmp_path).read_text()
    run.write_text(json.dumps({"wall_s": 754, "cpu_count": 2, "device": "cpu (x86_64)", "jobs": 1, "warm": True,
                               "cpu": "AMD EPYC (family 25 model 1)"}))  # a run.json that names its CPU
    report_studies.main(["--root", str(tmp_path)])
    assert "warm), cpu (x86_64), AMD EPYC (family 25 model 1), 2 CPUs" in page(tmp_path).read_text()


def test_check_fails_when_a_report_changed_and_the_page_did_not(tmp_path):
    page(tmp_path).write_text(f"{report_studies.BEGIN}\n{report_studies.END}\n")
    write_study(tmp_path, "toy", 0.125)
    report_studies.main(["--root", str(tmp_path)])
    metrics = tmp_path / "reports" / "studies" / "toy" / "metrics.json"
    metrics.write_text(metrics.read_text().replace("0.125", "0.25"))
    with pytest.raises(SystemExit, match="study table is stale"):
        report_studies.main(["--root", str(tmp_path), "--check"])


def test_missing_markers_or_keys_are_one_line_errors(tmp_path):
    page(tmp_path).write_text("no block here\n")
    write_study(tmp_path, "toy", 0.125)
    with pytest.raises(SystemExit, match=r"^report_studies: .*datasets-and-presets\.md: no '<!-- studies:begin") as info:
        report_studies.main(["--root", str(tmp_path)])
    assert "\n" not in str(info.value)
    page(tmp_path).write_text(f"{report_studies.BEGIN}\n{report_studies.END}\n")
    (tmp_path / "reports" / "studies" / "toy" / "run.json").write_text("{}")
    with pytest.raises(SystemExit, match=r"toy: missing key 'wall_s'"):
        report_studies.main(["--root", str(tmp_path)])


def test_the_cell_is_the_primary_verdict_with_its_flags(tmp_path):
    """Another primary metric moves the cell; an older details.json without the Δ's interval gets the
    same t-interval from its sd and n; the report's degenerate-output notes come along; |Δ| is escaped."""
    page(tmp_path).write_text(f"{report_studies.BEGIN}\n{report_studies.END}\n")
    write_study(tmp_path, "toy", 0.125)
    folder = tmp_path / "reports" / "studies" / "toy"
    summary = json.loads((folder / "metrics.json").read_text())
    ablation = summary["variants"]["no_positional"]["val_loss"]
    del ablation["delta_ci95"]
    ablation.update(sd_delta=0.01, p=0.2, verdict="no significant difference at 5%: with 3 seeds only a true "
                                                  "|Δ| ≥ 0.05 is found with 80% power")
    (folder / "metrics.json").write_text(json.dumps(summary))
    (folder / "report.md").write_text("# r\n\n⚠ no_positional: degenerate outputs, so rouge1 score text ...\n")
    report_studies.main(["--root", str(tmp_path)])
    row = next(line for line in page(tmp_path).read_text().splitlines() if line.startswith("| [toy]"))
    assert ("no_positional +0.125 (95% CI [0.1, 0.15], p 0.200, no significant difference at 5%: with 3 seeds "
            "only a true \\|Δ\\| ≥ 0.05 is found with 80% power) ⚠ degenerate outputs") in row
    assert "2.25 ± 0.03 |" in row  # the baseline's outputs are not flagged
    summary["primary_metric"] = "bits_per_char"
    summary["variants"]["no_positional"]["bits_per_char"].update(p=0.01, verdict="worse", delta_ci95=0.1)
    (folder / "metrics.json").write_text(json.dumps(summary))
    report_studies.main(["--root", str(tmp_path)])
    row = next(line for line in page(tmp_path).read_text().splitlines() if line.startswith("| [toy]"))
    assert "bits_per_char ↓: no_positional +0.25 (95% CI [0.15, 0.35], p 0.010, worse)" in row


# `no_positional: val_loss ↓ Δ +0.161 (95% CI [0.145, 0.178], 3 paired seeds, p <0.001): worse than baseline.`
VERDICT = re.compile(r"^(\S+): (\S+) [↓↑] Δ (\S+) \((95% CI \[[^\]]+\]|no interval), \d+ paired seeds?, "
                     r"p ([^)]+)\): (.+)\.$")


SEQUENTIAL = re.compile(r"^(\S+): (\S+) [↓↑] Δ (\S+) \(([\d.]+% sequential interval \[[^\]]+\]), (\d+) paired "
                        r"seeds, looks at ([^)]+)\): (.+)\.$")


def test_every_cell_says_what_its_reports_verdict_says():
    """Each committed report's verdict lines, parsed from report.md, against its row of the docs table."""
    table = (ROOT / report_studies.PAGE).read_text().replace("\\|", "|")
    for report in sorted((ROOT / "reports" / "studies").glob("*/report.md")):
        row = next(line for line in table.splitlines() if line.startswith(f"| [{report.parent.name}]("))
        baseline = yaml.safe_load((report.parent / "params.yaml").read_text())["report"]["baseline"]
        lines = [m for m in map(VERDICT.match, report.read_text(encoding="utf-8").split("\n## Setup")[0].splitlines())
                 if m]
        cell = row.split(" | ")[4]
        sequential = [m for m in map(SEQUENTIAL.match, report.read_text(encoding="utf-8").split("\n## Setup")[0]
                                     .splitlines()) if m]
        for name, metric, delta, interval, n, looks, words in (m.groups() for m in sequential):
            for word in ("better", "worse"):
                words = word if words == f"{word} than {baseline}" else words
            assert cell.startswith(f"{metric} "), report
            assert f"{name} {delta} ({interval}, {n} paired seeds, looks at {looks}, {words})" in cell, (report, name)
        if sequential:  # seeds until decided: no fixed-n verdict in the table
            assert " (95% CI" not in cell and cell.count("sequential interval") == len(sequential), report
            continue
        assert cell.count(" (95% CI") + cell.count(" (no interval") == len(lines), report
        for name, metric, delta, ci, p, words in (m.groups() for m in lines):
            for word in ("better", "worse"):
                words = word if words == f"{word} than {baseline}" else words
            assert cell.startswith(f"{metric} "), report
            assert f"{name} {delta} ({ci}, p {p}, {words})" in cell, (report, name)


def test_table_gives_the_reference_with_its_interval(tmp_path):
    page(tmp_path).write_text(f"{report_studies.BEGIN}\n{report_studies.END}\n")
    write_study(tmp_path, "toy", 0.125)
    params_path = tmp_path / "reports" / "studies" / "toy" / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    params["report"]["reference"].update(value=1.9007, ci=0.011, n=3)
    params_path.write_text(yaml.safe_dump(params))
    report_studies.main(["--root", str(tmp_path)])
    assert "1.5 ± 0.02 (reference 1.9007 ± 0.011, n=3)" in page(tmp_path).read_text()


def test_a_study_in_todays_layout_is_read_from_its_details(tmp_path):
    # Since reports/metrics.json holds only the verdict's numbers, the study table reads details.json,
    # which has the keys the old metrics.json had (studies committed before keep only metrics.json).
    page(tmp_path).write_text(f"{report_studies.BEGIN}\n{report_studies.END}\n")
    write_study(tmp_path, "toy", 0.125)
    folder = tmp_path / "reports" / "studies" / "toy"
    (folder / "metrics.json").rename(folder / "details.json")
    (folder / "metrics.json").write_text(json.dumps({"primary_metric": "val_loss", "baseline": {"mean": 9.0}}))
    report_studies.main(["--root", str(tmp_path)])
    row = next(line for line in page(tmp_path).read_text().splitlines() if line.startswith("| [toy]"))
    assert "1.5 ± 0.02" in row and "no_positional +0.125 (95% CI [0.115, 0.135], p 0.012, worse)" in row
    assert "9.0" not in row
