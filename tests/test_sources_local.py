"""The `local` source: the user's own parquet / jsonl / csv / txt files (no network, no cache)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.sources import SOURCES

PAIRS = [("Guten Morgen.", "Good morning."), ("Wie geht's?", "How are you?"), ("Danke.", "Thanks.")]


def run(options: dict, tmp_path: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    out = tmp_path / "raw"
    SOURCES["local"].fetch(options, tmp_path / "cache", out)
    assert not (tmp_path / "cache").exists()  # local files are read in place
    frames = {p.stem: pd.read_parquet(p) for p in out.glob("*.parquet")}
    return frames, json.loads((out / "meta.json").read_text())


def write(path: Path, fmt: str, rows: list[tuple[str, str]]) -> Path:
    frame = pd.DataFrame(rows, columns=["de", "en"])
    if fmt == "parquet":
        frame.to_parquet(path, index=False)
    elif fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                                for r in frame.to_dict("records")), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_tabular_files_map_columns_to_source_and_target(tmp_path, fmt):
    train = write(tmp_path / f"train.{fmt}", fmt, PAIRS)
    test = write(tmp_path / f"test.{fmt}", fmt, PAIRS[:1])
    options = {"task": "translation", "paths": {"train": str(train), "test": str(test)},
               "columns": {"source": "de", "target": "en"}}
    frames, meta = run(options, tmp_path)
    assert frames["train"].to_dict("list") == {"source": [p[0] for p in PAIRS],
                                               "target": [p[1] for p in PAIRS]}
    assert (meta["source"], meta["task"], meta["rows"]) == ("local", "translation",
                                                            {"train": 3, "test": 1})


def test_csv_cells_stay_strings(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("src,tgt\n007,NA\n1e3,\n")  # numbers, "NA" and empty must not become NaN/float
    frames, _ = run({"task": "summarization", "paths": {"train": str(path)},
                     "columns": {"source": "src", "target": "tgt"}}, tmp_path)
    assert frames["train"].to_dict("list") == {"source": ["007", "1e3"], "target": ["NA", ""]}


def test_txt_paragraphs_or_whole_files_are_lm_documents(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("First para.\n\nSecond para.\n")
    (docs / "b.txt").write_text("Third.\n")
    (docs / ".hidden.txt").write_text("never read")
    frames, _ = run({"task": "language_modeling", "paths": {"train": str(docs)}}, tmp_path)
    assert frames["train"].to_dict("list") == {"source": [""] * 3,
                                               "target": ["First para.", "Second para.", "Third."]}
    frames, _ = run({"task": "language_modeling", "paths": {"train": str(docs)},
                     "documents": "file"}, tmp_path)
    assert frames["train"]["target"].tolist() == ["First para.\n\nSecond para.", "Third."]


def test_language_modeling_reads_only_the_target_column(tmp_path):
    path = tmp_path / "lm.jsonl"
    path.write_text('{"text": "one"}\n{"text": "two"}\n')
    frames, _ = run({"task": "language_modeling", "paths": {"train": [str(path)]},
                     "columns": {"target": "text"}}, tmp_path)
    assert frames["train"].to_dict("list") == {"source": ["", ""], "target": ["one", "two"]}


def test_max_rows_caps_each_split_across_files(tmp_path):
    a = write(tmp_path / "a.jsonl", "jsonl", PAIRS)
    b = write(tmp_path / "b.jsonl", "jsonl", PAIRS)
    frames, meta = run({"task": "translation", "paths": {"train": [str(a), str(b)]},
                        "columns": {"source": "de", "target": "en"}, "max_rows": 4}, tmp_path)
    assert len(frames["train"]) == 4 and len(meta["files"]) == 2


@pytest.mark.parametrize("options, message", [
    ({"task": "translation", "paths": {"validation": "x.jsonl"}}, r"data.local.paths.train: required"),
    ({"task": "translation", "paths": {"train": "missing.jsonl"}}, r"paths.train: no such file"),
    ({"task": "translation", "paths": {"train": "{dir}/t.txt"}}, r"t.txt: .txt files only work"),
    ({"task": "translation", "paths": {"train": "{dir}/t.jsonl"}}, r"t.jsonl: record 1 has no key"),
    ({"task": "translation", "paths": {"train": "{dir}/t.dat"}}, r"t.dat: cannot tell the format"),
    ({"task": "chat", "paths": {"train": "x"}}, r"data.local.task: Input should be"),
])
def test_bad_input_is_a_one_line_error_naming_the_file_or_key(tmp_path, options, message):
    (tmp_path / "t.txt").write_text("a\n\nb\n")
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "t.dat").write_text("a")
    options = json.loads(json.dumps(options).replace("{dir}", str(tmp_path)))
    with pytest.raises(ValueError, match=message) as info:
        run(options, tmp_path)
    assert "\n" not in str(info.value)


def test_non_string_values_are_rejected(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"source": "a", "target": 3}\n')
    with pytest.raises(ValueError, match=r"row 0 column 'target' is 3, not a string"):
        run({"task": "summarization", "paths": {"train": str(path)}}, tmp_path)
