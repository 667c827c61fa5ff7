"""The `local` source: the user's own parquet / jsonl / csv / txt files (no network, no cache)."""
from __future__ import annotations

import gzip
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
    with pytest.raises(ValueError, match=r"record 1 column 'target' is 3, not a string"):
        run({"task": "summarization", "paths": {"train": str(path)}}, tmp_path)


def test_errors_count_records_from_1_and_cut_a_long_record(tmp_path):
    path = tmp_path / "t.jsonl"
    big = {"body": "word " * 500}  # a whole article where a string belongs
    path.write_text('{"source": "a", "target": "b"}\n' + json.dumps({"source": "c", "target": big}) + "\n")
    with pytest.raises(ValueError, match=r"record 2 column 'target' is \{'body': 'word word") as info:
        run({"task": "summarization", "paths": {"train": str(path)}}, tmp_path)
    assert len(str(info.value)) < len(str(path)) + 200 and "…" in str(info.value)



# --- gzip, parallel text, nested records, text documents, misnamed files ----------------------

def gzip_file(path: Path, data: str | bytes) -> Path:
    with gzip.open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


def one_line_error(options: dict, tmp_path: Path, message: str) -> str:
    with pytest.raises(ValueError, match=message) as info:
        run(options, tmp_path)
    text = str(info.value)
    assert "\n" not in text and "codec" not in text, text
    return text


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
def test_gzip_files_read_like_the_plain_ones(tmp_path, fmt):
    plain = tmp_path / f"plain.{fmt}"
    if fmt == "json":
        plain.write_text(json.dumps([{"de": d, "en": e} for d, e in PAIRS]))
    else:
        write(plain, fmt, PAIRS)
    packed = gzip_file(tmp_path / f"train.{fmt}.gz", plain.read_bytes())
    columns = {"source": "de", "target": "en"}
    frames, meta = run({"task": "translation", "paths": {"train": str(packed)}, "columns": columns},
                       tmp_path)
    assert frames["train"].to_dict("list") == {"source": [p[0] for p in PAIRS],
                                               "target": [p[1] for p in PAIRS]}
    assert meta["files"][0]["path"] == str(packed)
    # an explicit format reads a gzip file whatever its name
    odd = gzip_file(tmp_path / "data.bin", plain.read_bytes())
    frames, _ = run({"task": "translation", "paths": {"train": str(odd)}, "columns": columns,
                     "format": fmt}, tmp_path)
    assert frames["train"]["target"].tolist() == [p[1] for p in PAIRS]


def test_a_directory_lists_gzip_files_by_the_suffix_under_gz(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    gzip_file(d / "a.txt.gz", "One.\n\nTwo.\n")
    (d / "b.txt").write_text("Three.\n")
    gzip_file(d / "notes.gz", "no format under .gz: skipped")
    frames, _ = run({"task": "language_modeling", "paths": {"train": str(d)}}, tmp_path)
    assert frames["train"]["target"].tolist() == ["One.", "Two.", "Three."]


@pytest.mark.slow
def test_gzip_is_streamed_so_max_rows_stops_before_a_damaged_tail(tmp_path):
    lines = "".join(json.dumps({"source": f"s{i}", "target": f"t{i}"}) + "\n" for i in range(200_000))
    path = gzip_file(tmp_path / "big.jsonl.gz", lines)
    data = path.read_bytes()
    path.write_bytes(data[:-100])  # a download cut short: the end is missing
    frames, _ = run({"task": "summarization", "paths": {"train": str(path)}, "max_rows": 2}, tmp_path)
    assert frames["train"]["target"].tolist() == ["t0", "t1"]
    one_line_error({"task": "summarization", "paths": {"train": str(path)}}, tmp_path,
                   r"big.jsonl.gz: corrupt or truncated gzip file")


def test_parallel_text_pairs_lines_of_two_files(tmp_path):
    # \r\n and a missing final newline are line ends; a stray \r inside a line is not; an empty
    # line keeps its place (dropping it would shift every later pair)
    en = gzip_file(tmp_path / "train.en.gz", "Hello.\r\nTwo\rparts\n\nLast")
    de = gzip_file(tmp_path / "train.de.gz", "Hallo.\nZwei Teile\n\nLetzte\n")
    pair = {"source": str(en), "target": str(de)}
    frames, meta = run({"task": "translation", "paths": {"train": pair}}, tmp_path)
    assert frames["train"].to_dict("list") == {"source": ["Hello.", "Two\rparts", "", "Last"],
                                               "target": ["Hallo.", "Zwei Teile", "", "Letzte"]}
    assert [f["path"] for f in meta["files"]] == [str(en), str(de)]
    assert meta["options"]["paths"]["train"] == [pair]
    plain_en = tmp_path / "dev.en"
    plain_en.write_text("a\nb\nc\n")
    plain_de = tmp_path / "dev.de"
    plain_de.write_text("A\nB\nC\n")
    frames, _ = run({"task": "summarization", "max_rows": 5, "paths": {
        "train": [pair, {"source": str(plain_en), "target": str(plain_de)}]}}, tmp_path)
    assert frames["train"]["source"].tolist() == ["Hello.", "Two\rparts", "", "Last", "a"]


def test_parallel_files_of_different_lengths_are_an_error_naming_both(tmp_path):
    en = tmp_path / "train.en"
    en.write_text("a\nb\nc\nd\n")
    de = tmp_path / "train.de"
    de.write_text("A\nB\nC\n")
    pair = {"source": str(en), "target": str(de)}
    message = rf"{en} has 4 lines but {de} has 3"
    one_line_error({"task": "translation", "paths": {"train": pair}}, tmp_path, message)
    # max_rows does not hide it: the files are misaligned somewhere, maybe in the first rows
    one_line_error({"task": "translation", "paths": {"train": pair}, "max_rows": 1}, tmp_path, message)
    one_line_error({"task": "language_modeling", "paths": {"train": pair}}, tmp_path,
                   r"data.local.paths.train: a source/target pair .* not language_modeling")
    one_line_error({"task": "translation", "paths": {"train": {"source": str(en)}}}, tmp_path,
                   r"data.local.paths.train.0.pair.target: required option is missing")


HF = [{"translation": {"de": d, "en": e}} for d, e in PAIRS]
NESTED = {"source": "translation.en", "target": "translation.de"}


@pytest.mark.parametrize("name", ["train.jsonl", "train.json", "train.json.gz", "lines.json"])
def test_hugging_face_translation_records_with_dotted_columns(tmp_path, name):
    path = tmp_path / name
    text = ("".join(json.dumps(r) + "\n" for r in HF) if name.endswith("l") or name == "lines.json"
            else json.dumps(HF, indent=2))  # lines.json: JSON Lines named .json, as to_json writes
    gzip_file(path, text) if name.endswith(".gz") else path.write_text(text)
    frames, _ = run({"task": "translation", "paths": {"train": str(path)}, "columns": NESTED},
                    tmp_path)
    assert frames["train"].to_dict("list") == {"source": [p[1] for p in PAIRS],
                                               "target": [p[0] for p in PAIRS]}


def test_a_missing_nested_key_names_file_record_and_key(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(HF + [{"translation": {"de": "Ja.", "fr": "Oui."}}]))
    one_line_error({"task": "translation", "paths": {"train": str(path)}, "columns": NESTED},
                   tmp_path, r"train.json: record 4 has no key 'translation.en' "
                             r"\(translation has keys: de, fr\)")
    one_line_error({"task": "translation", "paths": {"train": str(path)},
                    "columns": {"source": "translation", "target": "translation.de"}}, tmp_path,
                   r"column 'translation' is .*not a string; pick a field with a dotted name")


def test_json_array_errors_name_the_element(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[{"source": "a", "target": "b"}, {"source": "c" "target": "d"}]')
    one_line_error({"task": "summarization", "paths": {"train": str(path)}}, tmp_path,
                   r"t.json: array element 2: invalid JSON")
    path.write_text('[{"source": "a", "target": "b"}, 3]')
    one_line_error({"task": "summarization", "paths": {"train": str(path)}}, tmp_path,
                   r"t.json: array element 2: expected a JSON object, got int")


def test_dotted_columns_of_parquet_and_csv(tmp_path):
    pq_path = tmp_path / "train.parquet"
    pd.DataFrame({"translation": [r["translation"] for r in HF]}).to_parquet(pq_path)
    frames, _ = run({"task": "translation", "paths": {"train": str(pq_path)}, "columns": NESTED},
                    tmp_path)
    assert frames["train"]["target"].tolist() == [p[0] for p in PAIRS]
    one_line_error({"task": "translation", "paths": {"train": str(pq_path)},
                    "columns": {"source": "translation.en", "target": "translation.fr"}}, tmp_path,
                   r"train.parquet: no column 'translation.fr' \(translation has fields: de, en\)")
    # a literal column with a dot in its name comes first
    literal = tmp_path / "literal.parquet"
    pd.DataFrame({"translation.en": ["x"], "translation.de": ["y"]}).to_parquet(literal)
    frames, _ = run({"task": "translation", "paths": {"train": str(literal)}, "columns": NESTED},
                    tmp_path)
    assert frames["train"].to_dict("list") == {"source": ["x"], "target": ["y"]}
    csv_path = tmp_path / "train.csv"
    csv_path.write_text("translation.en,translation.de\nHi,Hallo\n")
    frames, _ = run({"task": "translation", "paths": {"train": str(csv_path)}, "columns": NESTED},
                    tmp_path)
    assert frames["train"].to_dict("list") == {"source": ["Hi"], "target": ["Hallo"]}


STORIES = "Once upon a time.\n\nThe end.\n<|endoftext|>\n  Tom ran.\nHe fell.  \n<|endoftext|>\n\n"


@pytest.mark.parametrize("documents, text, expected", [
    ("separator", STORIES, ["Once upon a time.\n\nThe end.", "Tom ran.\nHe fell."]),
    ("line", "One story.\n\n  Two stories.  \r\nThree\n", ["One story.", "Two stories.", "Three"]),
    ("paragraph", "A\nB\n \t\nC\n", ["A\nB", "C"]),
    ("file", "\n A\n\n\nB \n", ["A\n\n\nB"]),
])
def test_text_documents_keep_their_inner_newlines(tmp_path, documents, text, expected):
    path = gzip_file(tmp_path / "stories.txt.gz", text)
    options = {"task": "language_modeling", "paths": {"train": str(path)}, "documents": documents}
    if documents == "separator":
        options["separator"] = "<|endoftext|>"
    frames, _ = run(options, tmp_path)
    assert frames["train"]["target"].tolist() == expected
    frames, _ = run({**options, "max_rows": 1}, tmp_path)
    assert frames["train"]["target"].tolist() == expected[:1]


@pytest.mark.parametrize("extra, message", [
    ({"documents": "separator"}, r"data.local.separator: required with documents: separator"),
    ({"separator": "<|endoftext|>"}, r"data.local.separator: only used with documents: separator"),
    ({"documents": "separator", "separator": "\n\n"}, r"data.local.separator: must not contain"),
    ({"documents": "story"}, r"data.local.documents: Input should be"),
])
def test_document_options_are_checked(tmp_path, extra, message):
    path = tmp_path / "t.txt"
    path.write_text("a\n")
    one_line_error({"task": "language_modeling", "paths": {"train": str(path)}, **extra}, tmp_path,
                   message)


def test_a_misnamed_file_is_named_by_what_its_bytes_say(tmp_path):
    gz = gzip_file(tmp_path / "train.jsonl", '{"source": "a", "target": "b"}\n')
    text = one_line_error({"task": "summarization", "paths": {"train": str(gz)}}, tmp_path,
                          "looks gzip-compressed")
    assert text == (f"{gz}: looks gzip-compressed (starts with 0x1f 0x8b); name it {gz}.gz "
                    f"or set data.local.format")
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_text('{"source": "a", "target": "b"}\n')
    one_line_error({"task": "summarization", "paths": {"train": str(fake)}}, tmp_path,
                   r"fake.jsonl.gz: named .gz but not gzip-compressed")
    parquet = tmp_path / "data.jsonl"
    pd.DataFrame({"source": ["a"], "target": ["b"]}).to_parquet(parquet)
    one_line_error({"task": "summarization", "paths": {"train": str(parquet)}}, tmp_path,
                   r"data.jsonl: looks like a parquet file \(starts with PAR1\), not jsonl")
    not_parquet = tmp_path / "t.parquet"
    not_parquet.write_text('{"source": "a"}\n')
    one_line_error({"task": "summarization", "paths": {"train": str(not_parquet)}}, tmp_path,
                   r"t.parquet: not a parquet file")
    en = gzip_file(tmp_path / "p.en", "a\n")
    de = tmp_path / "p.de"
    de.write_text("b\n")
    one_line_error({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}},
                   tmp_path, r"p.en: looks gzip-compressed")


@pytest.mark.parametrize("name, options", [
    ("t.txt", {"task": "language_modeling"}),
    ("t.txt.gz", {"task": "language_modeling", "documents": "separator", "separator": "<|e|>"}),
    ("t.jsonl", {"task": "summarization"}),
    ("t.json", {"task": "summarization"}),
    ("t.csv", {"task": "summarization"}),
])
def test_text_that_is_not_utf8_says_where(tmp_path, name, options):
    body = {"t.csv": b"source,target\na,caf\xe9\n", "t.json": b'[{"source": "a", "target": "\xe9"}]'
            }.get(name, b'{"source": "ok", "target": "caf\xe9"}\n')
    offset = body.index(b"\xe9")
    path = tmp_path / name
    gzip_file(path, body) if name.endswith(".gz") else path.write_bytes(body)
    one_line_error({**options, "paths": {"train": str(path)}}, tmp_path,
                   rf"{name}: not UTF-8 text \(byte 0xe9 at offset {offset}\b")


def test_non_utf8_parallel_text_and_a_bad_byte_late_in_a_big_file(tmp_path):
    en = tmp_path / "a.en"
    en.write_bytes(b"x" * 3_000_000 + b"\n\xff\n")  # past the reader's first chunks
    de = tmp_path / "a.de"
    de.write_text("y\nz\n")
    one_line_error({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}},
                   tmp_path, r"a.en: not UTF-8 text \(byte 0xff at offset 3000001, line 2\)")
