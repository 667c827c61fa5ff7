"""The official IWSLT 2017 release read as it ships (XML dev/test sets, train.tags files), and
markup never read silently as text (issue #25, item 4). Fixtures are written here in the shapes
of the release."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.sources import SOURCES

HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n'
TALK = """<doc docid="{docid}" genre="lectures">
<url>http://www.ted.com/talks/{docid}</url>
<description>TED Talk Subtitles and Transcript: a talk &amp; more.</description>
<keywords>talks, science</keywords>
<talkid>{docid}</talkid>
<title>Speaker: A talk</title>
{segs}</doc>
"""
EN = {"1518": ["Hello &amp; welcome.", "It&#39;s &quot;great&quot; &lt;really&gt;."],
      "1520": ["Second talk, first seg."]}
DE = {"1518": ["Hallo &amp; willkommen.", "Es ist &quot;toll&quot; &lt;wirklich&gt;."],
      "1520": ["Zweiter Vortrag."]}
CLEAN = [("Hello & welcome.", "Hallo & willkommen."),
         ("It's \"great\" <really>.", "Es ist \"toll\" <wirklich>."),
         ("Second talk, first seg.", "Zweiter Vortrag.")]


def xml(path: Path, talks: dict[str, list[str]], setname: str = "srcset", ids: dict | None = None) -> Path:
    docs = "".join(TALK.format(docid=docid, segs="".join(
        f'<seg id="{(ids or {}).get((docid, i), i)}"> {text} </seg>\n' for i, text in enumerate(segs, 1)))
        for docid, segs in talks.items())
    path.write_text(f'{HEAD}<{setname} setid="iwslt2017-tst2013" srclang="english">\n{docs}'
                    f"</{setname}>\n</mteval>\n", encoding="utf-8")
    return path


def tags(path: Path, talks: list[list[str]], extra_tags: bool = False) -> Path:
    lines = []
    for n, text in enumerate(talks, 1):
        lines += [f"<url>http://www.ted.com/talks/{n}</url>", "<keywords>talks, a</keywords>",
                  "<speaker>A Person</speaker>", f"<talkid>{n}</talkid>", "<title>A: Talk</title>",
                  "<description>TED Talk Subtitles and Transcript: about it.</description>"]
        if extra_tags:  # only one side has these, between text lines: alignment must ignore them
            lines += [text[0], '<reviewer href="http://x">R. Viewer</reviewer>',
                      '<translator href="http://y">T. Ranslator</translator>', *text[1:]]
        else:
            lines += text
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(options: dict, tmp_path: Path) -> dict[str, pd.DataFrame]:
    out = tmp_path / "raw"
    SOURCES["local"].fetch(options, tmp_path / "cache", out)
    return {p.stem: pd.read_parquet(p) for p in out.glob("*.parquet")}


def pairs(frame: pd.DataFrame) -> list[tuple[str, str]]:
    return list(zip(frame["source"], frame["target"]))


def test_xml_pair_is_the_seg_text_unescaped_and_aligned(tmp_path):
    en = xml(tmp_path / "IWSLT17.TED.tst2013.en-de.en.xml", EN)
    de = xml(tmp_path / "IWSLT17.TED.tst2013.en-de.de.xml", DE, "refset")
    frames = run({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}},
                 tmp_path)
    assert pairs(frames["train"]) == CLEAN  # 3 segs in 2 docs; no markup, no header line


def test_xml_for_language_modeling_is_one_document_per_doc(tmp_path):
    en = xml(tmp_path / "IWSLT17.TED.tst2013.en-de.en.xml", EN)
    frames = run({"task": "language_modeling", "paths": {"train": str(en)}}, tmp_path)
    assert frames["train"]["target"].tolist() == [f"{CLEAN[0][0]}\n{CLEAN[1][0]}", CLEAN[2][0]]


def test_xml_pair_with_a_differing_seg_id_names_both_files(tmp_path):
    en = xml(tmp_path / "a.en.xml", EN)
    de = xml(tmp_path / "a.de.xml", DE, "refset", ids={("1518", 2): 7})
    with pytest.raises(ValueError) as info:
        run({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}}, tmp_path)
    message = str(info.value)
    assert "\n" not in message and f"{en} line 11" in message and f"{de} line 11" in message
    assert "seg '2'" in message and "seg '7'" in message and "not aligned" in message
    assert not (tmp_path / "raw").exists()


def test_xml_pair_with_a_missing_seg_names_both_counts(tmp_path):
    en = xml(tmp_path / "a.en.xml", EN)
    de = xml(tmp_path / "a.de.xml", {"1518": DE["1518"], "1520": []}, "refset")
    with pytest.raises(ValueError, match=rf"{en} has 3 segs but {de} has 2"):
        run({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}}, tmp_path)


def test_train_tags_pair_drops_tag_lines_and_aligns_text(tmp_path):
    en = tags(tmp_path / "train.tags.en-de.en", [["First.", "Second & more."], ["Third."]])
    de = tags(tmp_path / "train.tags.en-de.de", [["Erstens.", "Zweitens & mehr."], ["Drittens."]],
              extra_tags=True)
    frames = run({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}},
                 tmp_path)
    assert pairs(frames["train"]) == [("First.", "Erstens."), ("Second & more.", "Zweitens & mehr."),
                                      ("Third.", "Drittens.")]
    lm = run({"task": "language_modeling", "paths": {"validation": str(de), "train": str(en)}}, tmp_path)
    assert lm["train"]["target"].tolist() == ["First.\nSecond & more.", "Third."]  # a talk a document


def test_train_tags_pair_with_a_missing_line_is_an_error_naming_both(tmp_path):
    en = tags(tmp_path / "train.tags.en-de.en", [["First.", "Second."], ["Third."]])
    de = tags(tmp_path / "train.tags.en-de.de", [["Erstens."], ["Drittens."]])
    with pytest.raises(ValueError, match=rf"{en} has 3 text lines but {de} has 2"):
        run({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}}, tmp_path)


def test_format_option_reads_iwslt_files_under_any_name(tmp_path):
    en = xml(tmp_path / "tst.en", EN)
    de = xml(tmp_path / "tst.de", DE, "refset")
    frames = run({"task": "translation", "format": "iwslt_xml",
                  "paths": {"train": {"source": str(en), "target": str(de)}}}, tmp_path)
    assert pairs(frames["train"]) == CLEAN


@pytest.mark.parametrize("shape, fmt", [("xml", "iwslt_xml"), ("tags", "iwslt_tags")])
def test_markup_given_as_plain_parallel_text_is_an_error_naming_file_and_format(tmp_path, shape, fmt):
    if shape == "xml":
        en, de = xml(tmp_path / "tst.en", EN), xml(tmp_path / "tst.de", DE, "refset")
    else:
        en = tags(tmp_path / "train.en", [["First."], ["Second."]])
        de = tags(tmp_path / "train.de", [["Erstens."], ["Zweitens."]])
    with pytest.raises(ValueError) as info:
        run({"task": "translation", "paths": {"train": {"source": str(en), "target": str(de)}}}, tmp_path)
    message = str(info.value)
    assert message.startswith(f"{en}: looks like XML/SGML markup") and "\n" not in message
    assert f"data.local.format: {fmt}" in message


def test_markup_given_as_txt_is_an_error(tmp_path):
    path = xml(tmp_path / "talks.txt", EN)
    with pytest.raises(ValueError, match=rf"{path}: looks like XML/SGML markup.*format: iwslt_xml"):
        run({"task": "language_modeling", "paths": {"train": str(path)}}, tmp_path)


def test_text_with_an_occasional_tag_is_still_text(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("A story about <b> tags.\n\nAnother one.\n\n<i>Quoted</i> markup once.\n\nMore text.\n")
    frames = run({"task": "language_modeling", "paths": {"train": str(path)}}, tmp_path)
    assert len(frames["train"]) == 4


def official(root: Path, drop: str | None = None) -> Path:
    folder = root / "en-de"
    folder.mkdir(parents=True)
    tags(folder / "train.tags.en-de.en", [["First.", "Second."], ["Third."]])
    tags(folder / "train.tags.en-de.de", [["Erstens.", "Zweitens."], ["Drittens."]], extra_tags=True)
    for split in ("dev2010", "tst2010"):
        xml(folder / f"IWSLT17.TED.{split}.en-de.en.xml", EN)
        xml(folder / f"IWSLT17.TED.{split}.en-de.de.xml", DE, "refset")
    if drop:
        (folder / drop).unlink()
    return folder


@pytest.mark.parametrize("direction", ["en-de", "de-en"])
def test_iwslt2017_reads_the_official_release_from_local_dir(tmp_path, direction):
    folder = official(tmp_path)
    out = tmp_path / "raw"
    SOURCES["iwslt2017"].fetch({"local_dir": str(folder), "direction": direction}, tmp_path / "cache", out)
    frames = {p.stem: pairs(pd.read_parquet(p)) for p in out.glob("*.parquet")}
    flip = (lambda ps: ps) if direction == "en-de" else (lambda ps: [(t, s) for s, t in ps])
    assert frames["train"] == flip([("First.", "Erstens."), ("Second.", "Zweitens."), ("Third.", "Drittens.")])
    assert frames["validation"] == frames["test"] == flip(CLEAN)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["rows"] == {"train": 3, "validation": 3, "test": 3} and meta["direction"] == direction
    assert not (tmp_path / "cache").exists()  # nothing downloaded


def test_iwslt2017_local_dir_missing_files_are_listed_in_one_line(tmp_path):
    folder = official(tmp_path, drop="IWSLT17.TED.tst2010.en-de.de.xml")
    with pytest.raises(ValueError) as info:
        SOURCES["iwslt2017"].fetch({"local_dir": str(folder)}, tmp_path / "cache", tmp_path / "raw")
    message = str(info.value)
    assert message.startswith("data.iwslt2017.local_dir: 1 of 6 files missing: ") and "\n" not in message
    assert str(folder / "IWSLT17.TED.tst2010.en-de.de.xml") in message
    assert not (tmp_path / "raw").exists()


def test_iwslt2017_local_dir_must_be_under_the_folder_dvc_tracks(tmp_path):
    from pipeline.params.data import check_source_paths

    check_source_paths("iwslt2017", {"local_dir": str(tmp_path / "local" / "en-de")}, tmp_path / "local")
    with pytest.raises(ValueError, match=r"data.iwslt2017.local_dir: .* is outside"):
        check_source_paths("iwslt2017", {"local_dir": str(tmp_path / "en-de")}, tmp_path / "local")
