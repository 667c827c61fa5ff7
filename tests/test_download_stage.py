"""The download stage at scale (issue #25): what the documents split did (data/metrics/download.json,
shown by the report), and bad input found while streaming — one line naming the file and
line/byte, no half-written output, the previous outputs intact."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import download
from pipeline.sources.common import SplitWriter

# TinyStories without separators: paragraphs end at a blank line, stories at a single newline.
STORIES = [["Once upon a time there was a cat.", "The cat was happy."],
           ["One day a dog came.", "They played all day.", "The end."],
           ["Lily had a red ball."]]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the params name files relative to the working directory


def tinystories_text() -> str:
    return "\n".join("\n\n".join(story) for story in STORIES) + "\n"


def stage(tmp_path: Path, local: dict, out: str = "raw") -> tuple[Path, Path]:
    (tmp_path / "params.yaml").write_text(json.dumps({"data": {"source": "local", "local": local}}))
    raw, metrics = tmp_path / out, tmp_path / "metrics" / "download.json"
    download.main(["--params", str(tmp_path / "params.yaml"), "--out", str(raw),
                   "--local-root", str(tmp_path), "--metrics", str(metrics)])
    return raw, metrics


def fails(tmp_path: Path, local: dict, *parts: str) -> str:
    """The stage exits with one line holding `parts`; the previous raw/ and metrics are untouched."""
    raw, metrics = tmp_path / "raw", tmp_path / "metrics" / "download.json"
    raw.mkdir(exist_ok=True)
    (raw / "train.parquet").write_bytes(b"previous")
    metrics.parent.mkdir(exist_ok=True)
    metrics.write_text("previous")
    with pytest.raises(SystemExit) as info:
        stage(tmp_path, local)
    message = info.value.code
    assert isinstance(message, str) and message.startswith("download: ") and "\n" not in message, message
    for part in parts:
        assert part in message, message
    assert sorted(p.name for p in raw.iterdir()) == ["train.parquet"]
    assert (raw / "train.parquet").read_bytes() == b"previous" and metrics.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries
    return message


def test_metrics_say_what_paragraph_mode_did_to_tinystories_and_warn(tmp_path, caplog):
    (tmp_path / "stories.txt").write_text(tinystories_text())
    _, metrics = stage(tmp_path, {"task": "language_modeling", "paths": {"train": "stories.txt"}})
    m = json.loads(metrics.read_text())
    # Blocks: story 0 p0 | story 0 p1 + story 1 p0 | story 1 p1 | story 1 p2 + story 2 p0
    docs = ["Once upon a time there was a cat.", "The cat was happy.\nOne day a dog came.",
            "They played all day.", "The end.\nLily had a red ball."]
    lengths = sorted(len(d) for d in docs)  # 20, 33, 38, 39: nearest rank p50 = 2nd, p90 = 4th
    assert m["documents"] == "paragraph" and m["separator"] is None
    assert m["splits"]["train"] == {"rows": 4, "target_chars": {"p50": lengths[1], "p90": lengths[3],
                                                                "p99": lengths[3], "max": lengths[3]},
                                    "documents_with_line_breaks": 2}
    assert len(m["warnings"]) == 1 and "2 of 4 documents (50%)" in m["warnings"][0]
    assert "documents: paragraph joins" in caplog.text


def test_separator_mode_keeps_stories_whole_and_does_not_warn(tmp_path):
    text = "<|endoftext|>\n".join("\n\n".join(s) + "\n" for s in STORIES)
    (tmp_path / "stories.txt").write_text(text)
    raw, metrics = stage(tmp_path, {"task": "language_modeling", "paths": {"train": "stories.txt"},
                                    "documents": "separator", "separator": "<|endoftext|>"})
    m = json.loads(metrics.read_text())
    assert pq.read_table(raw / "train.parquet")["target"].to_pylist() == ["\n\n".join(s) for s in STORIES]
    assert m["splits"]["train"]["rows"] == 3 and m["warnings"] == []
    assert (m["documents"], m["separator"]) == ("separator", "<|endoftext|>")


def test_the_report_shows_the_download_table(tmp_path):
    from pipeline.reporting.render import to_markdown
    from pipeline.reporting.data_tables import download_blocks

    (tmp_path / "stories.txt").write_text(tinystories_text())
    _, metrics = stage(tmp_path, {"task": "language_modeling", "paths": {"train": "stories.txt"}})
    m = json.loads(metrics.read_text())
    md = to_markdown("report", download_blocks(m, metrics))
    row = next(line for line in md.splitlines() if line.startswith("| train | 4 |"))
    chars = m["splits"]["train"]["target_chars"]
    assert row.strip("| ").split(" | ")[2:7] == [str(chars[k]) for k in ("p50", "p90", "p99", "max")] + ["2"]
    assert "documents: paragraph" in md and "2 of 4 documents (50%)" in md
    assert "not available" in to_markdown("report", download_blocks(None, tmp_path / "none.json"))


def test_a_split_bigger_than_one_batch_is_written_in_row_groups_with_the_same_rows(tmp_path):
    writer = SplitWriter(tmp_path / "train.parquet", "train", flush_chars=100)
    rows = [(f"s{i}", "t" * (i % 7)) for i in range(200)]
    for s, t in rows[:50]:
        writer.add(s, t)
    writer.extend_strings([s for s, _ in rows[50:]], [t for _, t in rows[50:]])
    assert writer.close() == 200
    table = pq.read_table(tmp_path / "train.parquet")
    assert list(zip(table["source"].to_pylist(), table["target"].to_pylist())) == rows
    assert pq.ParquetFile(tmp_path / "train.parquet").num_row_groups > 1


# --- bad input, found while streaming --------------------------------------------------------


def test_a_bad_byte_deep_in_a_file_names_offset_and_line(tmp_path):
    line = b"word " * 20 + b"\n"
    body = line * 30_000 + b"bad \xff here\n" + line * 10  # past the reader's first chunks (3 MB)
    (tmp_path / "big.txt").write_bytes(body)
    offset = body.index(b"\xff")
    fails(tmp_path, {"task": "language_modeling", "paths": {"train": "big.txt"}, "documents": "line"},
          "big.txt: not UTF-8 text", f"byte 0xff at offset {offset}, line 30001")


@pytest.mark.parametrize("documents", ["line", "paragraph", "separator", "file"])
def test_a_record_over_max_record_chars_names_the_file_line_and_key(tmp_path, documents):
    (tmp_path / "big.txt").write_text("short\n\n" + "x" * 3_000_000 + "\n")  # one 3 MB line
    extra = {"separator": "<|endoftext|>"} if documents == "separator" else {}
    message = fails(tmp_path, {"task": "language_modeling", "paths": {"train": "big.txt"},
                               "documents": documents, "max_record_chars": 1_000_000, **extra},
                    "big.txt: ", "longer than 1,000,000 characters", "data.local.max_record_chars")
    if documents == "line":
        assert "line 3 " in message
    assert len(message) < 400  # the record is quoted cut short, never whole


def test_a_long_jsonl_line_and_a_long_parallel_line_name_their_line(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n{"text": "' + "y" * 50_000 + '"}\n')
    fails(tmp_path, {"task": "language_modeling", "paths": {"train": "t.jsonl"},
                     "columns": {"target": "text"}, "max_record_chars": 10_000},
          "t.jsonl: line 2 is longer than 10,000 characters")
    (tmp_path / "a.en").write_text("a\nb\n" + "c" * 50_000 + "\n")
    (tmp_path / "a.de").write_text("a\nb\nc\n")
    fails(tmp_path, {"task": "translation", "paths": {"train": {"source": "a.en", "target": "a.de"}},
                     "max_record_chars": 10_000}, "a.en: line 3 is longer than 10,000")


def test_a_truncated_gzip_file_names_the_last_line_it_holds(tmp_path):
    data = gzip.compress("".join(f"line {i}\n" for i in range(100_000)).encode())
    (tmp_path / "t.txt.gz").write_bytes(data[: len(data) // 2])
    fails(tmp_path, {"task": "language_modeling", "paths": {"train": "t.txt.gz"}, "documents": "line"},
          "t.txt.gz: corrupt or truncated gzip file", "breaks off after line ")


@pytest.mark.parametrize("name, text, parts", [
    ("t.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "c', ("t.jsonl:3: invalid JSON", "'{\"text\": \"c'")),
    ("t.json", '[\n {"text": "a"},\n {"text": "b"}\n', ("t.json: after array element 2",
                                                      "the end of the file after line 3")),
    ("t.json", '[\n {"text": "a"},\n {"text": "b', ("t.json: array element 2: invalid JSON",
                                                    "line 3", "the file ends inside it")),
    ("t.csv", 'text,other\na,b\n"c,d\ne,f\n', ("t.csv: unclosed quote", "line 3")),
])
def test_a_file_that_ends_mid_record_names_file_and_line(tmp_path, name, text, parts):
    (tmp_path / name).write_text(text)
    fails(tmp_path, {"task": "language_modeling", "paths": {"train": name}, "columns": {"target": "text"}},
          f"{name}", *parts)


def test_a_json_array_is_streamed_across_chunks(tmp_path):
    records = [{"text": f"record {i} " + "z" * (i % 50)} for i in range(40_000)]  # ~1.5 MB
    (tmp_path / "t.json").write_text(json.dumps(records, indent=1))
    raw, _ = stage(tmp_path, {"task": "language_modeling", "paths": {"train": "t.json"},
                              "columns": {"target": "text"}})
    assert pq.read_table(raw / "train.parquet")["target"].to_pylist() == [r["text"] for r in records]


def test_max_rows_stops_before_a_damaged_tail(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n' + "x" * 100 + "\xff-not json\n")
    raw, metrics = stage(tmp_path, {"task": "language_modeling", "paths": {"train": "t.jsonl"},
                                    "columns": {"target": "text"}, "max_rows": 2})
    assert pq.read_table(raw / "train.parquet")["target"].to_pylist() == ["a", "b"]
    assert json.loads(metrics.read_text())["splits"]["train"]["rows"] == 2


def test_reading_shows_progress_in_bytes_of_the_files(tmp_path, monkeypatch, capsys):
    from pipeline.io.progress import Progress
    from pipeline.sources import local

    class Every(Progress):  # a log line at every update instead of every 10 s
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "every_s": 0})

    monkeypatch.setattr(local, "Progress", Every)
    (tmp_path / "big.txt").write_text("word word word\n\n" * 200_000)  # 3.2 MB: 4 chunks
    stage(tmp_path, {"task": "language_modeling", "paths": {"train": "big.txt"}})
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("reading train: ")]
    assert len(lines) >= 4 and lines[-1].startswith("reading train: 3.1 MB/3.1 MB (100%)")


def test_a_long_bad_value_is_quoted_cut_short_with_a_1_based_row(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n{"text": ["' + "v" * 5000 + '"]}\n')
    message = fails(tmp_path, {"task": "language_modeling", "paths": {"train": "t.jsonl"},
                               "columns": {"target": "text"}}, "t.jsonl: record 2 column 'text' is ['vvv",
                    "…, not a string")
    assert len(message) < 300
