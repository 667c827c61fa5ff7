"""A preset's report.notes quoted beside the generated facts about the data as run, and flagged when
written for other data (its data digest)."""
import json

import pytest

from pipeline.reporting.notes import data_digest
from tests.fixtures.report.fake_runs import make_project
from tests.test_report import render


@pytest.mark.slow
def test_preset_notes_are_quoted_beside_the_generated_data_facts_and_flagged_on_other_data(tmp_path):
    p = make_project(tmp_path)
    raw = tmp_path / "data" / "raw"
    meta = {"source": "local", "task": "summarization", "options": {"documents": "line"},
            "files": [{"split": "train", "path": "data/local/mine.csv", "sha256": "ab" * 32}]}
    raw.mkdir(parents=True)
    (raw / "meta.json").write_text(json.dumps(meta))
    shards = tmp_path / "data" / "shards"
    shards.mkdir(parents=True)
    (shards / "manifest.json").write_text(json.dumps({"vocab_size": 1234, "normalization": "NFKC"}))
    digest = data_digest(meta)
    note = "300 real CNN/DailyMail pairs: 240 train, 30 validation, 30 test"

    def report(written_for):
        out = render(p, tmp_path / "r", budget={}, notes=[note], raw_dir=raw, shards=shards,
                     notes_data_digest=written_for)
        return (out / "report.md").read_text(encoding="utf-8")

    md = report("0123456789abcdef")  # the preset's data, not this run's
    facts = next(line for line in md.splitlines() if line.startswith("Data as run"))
    assert "source local, task summarization, documents line" in facts
    assert "examples kept: train 3,000, validation 380, test 390" in facts  # filter.json, not the note
    assert "tokenizer: 1,234 tokens (NFKC)" in facts and f"data digest {digest}." in facts
    assert "written for other data (digest 0123456789abcdef; this run's is " + digest in md
    assert f"⚠ “{note}”" in md
    md = report(digest)
    assert f"written for this run's data (digest {digest})" in md and f"\n“{note}”\n" in md and "⚠ “" not in md
    assert "report.notes_data_digest unset" in report(None)


def test_data_digest_names_the_input_files_not_their_order_or_paths():
    a = {"files": [{"path": "x/a", "sha256": "11"}, {"path": "x/b", "sha256": "22"}]}
    b = {"files": [{"path": "y/b", "sha256": "22"}, {"path": "y/a", "sha256": "11"}]}
    assert data_digest(a) == data_digest(b) != data_digest({"files": [{"sha256": "11"}]})
    synthetic = {"source": "synthetic", "n_examples": 100, "seed": 0}
    assert data_digest(synthetic) != data_digest({**synthetic, "seed": 1}) and data_digest(None) is None
