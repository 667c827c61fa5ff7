"""The downloaded sources, each served from a local HTTP server (127.0.0.1) with tiny fixture files:
plain URLs (tiny_shakespeare) and the Hugging Face Hub's endpoint (HF_ENDPOINT) for the hub
datasets, downloaded by its client into a per-test HF_HOME."""
from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.sources import SOURCES, get_source
from pipeline.sources.common import TASKS, write_raw
from pipeline.sources import hub as hub_client
from pipeline.sources.http import ChecksumError, DownloadError
from pipeline.sources.plain_text import split_paragraphs
from tests.fixtures.sources.server import closed_port_url, serve

FIXTURES = Path(__file__).parent / "fixtures" / "sources"
FAST = {"timeout_s": 2.0, "retries": 1}  # plain URLs (tiny_shakespeare); the hub's client has its own


@pytest.fixture(autouse=True)
def _hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # the hub's client caches per test


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "www"
    root.mkdir()
    with serve(root) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url().rstrip("/"))
        yield srv


def put(server, path: str, data: bytes | str) -> None:
    """A file at `path` of the server: a plain URL, or fixtures/<name>/... of hub dataset fixtures/<name>."""
    file = server.root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(data.encode() if isinstance(data, str) else data)


def put_parquet(server, path: str, columns: dict) -> None:
    file = server.root / path
    file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), file)


def hand_path(tmp_path: Path, repo: str, filename: str, revision: str = "main") -> Path:
    """Where a hub file put by hand is found (the project cache the tests give, tmp_path/cache)."""
    return (tmp_path / "cache" / "huggingface.co" / "datasets" / repo / "resolve" / revision.replace("/", "%2F")
            / filename)


def run(name: str, options: dict, tmp_path: Path) -> tuple[dict[str, pd.DataFrame], dict]:
    out = tmp_path / "raw"
    SOURCES[name].fetch(options, tmp_path / "cache", out)
    frames = {p.stem: pd.read_parquet(p) for p in sorted(out.glob("*.parquet"))}
    for frame in frames.values():
        assert list(frame.columns) == ["source", "target"]
        assert all(isinstance(v, str) for col in frame for v in frame[col])
    return frames, json.loads((out / "meta.json").read_text())


CNN = "fixtures/cnn"  # the hub dataset; the source's default subfolder 3.0.0 holds the shards


def cnn_shards(hub) -> dict:
    put_parquet(hub, f"{CNN}/3.0.0/train-0.parquet",
                {"id": ["a", "b", "c"], "article": ["A1", "A2", "A3"], "highlights": ["H1", "H2", "H3"]})
    put_parquet(hub, f"{CNN}/3.0.0/train-1.parquet",
                {"id": ["d"], "article": ["A4"], "highlights": ["H4"]})
    put_parquet(hub, f"{CNN}/3.0.0/val.parquet", {"id": ["e", "f"], "article": ["V1", "V2"],
                                                  "highlights": ["W1", "W2"]})
    files = {"train": ["train-0.parquet", "train-1.parquet"], "validation": ["val.parquet"]}
    return {"repo": CNN, "files": files}


def test_cnn_dailymail_maps_article_and_highlights_and_records_provenance(hub, tmp_path):
    frames, meta = run("cnn_dailymail", cnn_shards(hub), tmp_path)
    assert frames["train"].to_dict("list") == {"source": ["A1", "A2", "A3", "A4"],
                                               "target": ["H1", "H2", "H3", "H4"]}
    assert frames["validation"]["source"].tolist() == ["V1", "V2"]
    assert (meta["source"], meta["task"], meta["rows"]) == ("cnn_dailymail", "summarization",
                                                            {"train": 4, "validation": 2})
    served = hub.root / CNN / "3.0.0/train-1.parquet"
    record = next(f for f in meta["files"] if f["file"] == "train-1.parquet")
    assert record["sha256"] == hashlib.sha256(served.read_bytes()).hexdigest()
    assert record["url"] == hub.url(hub.hub_path(CNN, "3.0.0/train-1.parquet"))
    assert (record["repo"], record["revision"], len(record["commit"])) == (CNN, "main", 40)


def test_second_run_uses_the_cache(hub, tmp_path):
    options = cnn_shards(hub)
    run("cnn_dailymail", options, tmp_path)
    n_requests = len(hub.log), len(hub.heads)
    run("cnn_dailymail", options, tmp_path)
    assert (len(hub.log), len(hub.heads)) == n_requests and n_requests[0] == 3


def test_max_rows_stops_before_downloading_later_shards(hub, tmp_path):
    frames, _ = run("cnn_dailymail", {**cnn_shards(hub), "max_rows": 2}, tmp_path)
    assert frames["train"]["source"].tolist() == ["A1", "A2"]
    assert hub.requests_for(hub.hub_path(CNN, "3.0.0/train-1.parquet")) == []


def test_pinned_sha256_mismatch_is_a_checksum_error(hub, tmp_path):
    options = {**cnn_shards(hub), "sha256": {"val.parquet": "0" * 64}}
    with pytest.raises(ChecksumError, match="val.parquet"):
        run("cnn_dailymail", options, tmp_path)


def test_pin_for_an_unknown_file_names_the_key(hub, tmp_path):
    with pytest.raises(ValueError, match=r"data.cnn_dailymail.sha256.nope.parquet: not one of"):
        run("cnn_dailymail", {**cnn_shards(hub), "sha256": {"nope.parquet": "0" * 64}}, tmp_path)


def test_offline_error_lists_every_needed_file_at_once_and_fails_fast(tmp_path, monkeypatch, caplog):
    files = {"train": ["train-0.parquet", "train-1.parquet"], "validation": ["val.parquet"]}
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url("").rstrip("/"))  # nothing listens: no network
    start = time.monotonic()
    with pytest.raises(DownloadError) as info:
        run("cnn_dailymail", {"repo": CNN, "files": files}, tmp_path)
    # refused at once: not the client's ~20 s of retries with backoff (10 s: wide for a loaded machine)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message and message.startswith("cnn_dailymail: cannot download ")
    assert "Connection refused" in message
    for split, shards in files.items():
        for shard in shards:  # the shards not attempted yet are listed too, and logged a line each
            path = hand_path(tmp_path, CNN, f"3.0.0/{shard}")
            assert f"{shard} -> {path}" in message
            assert f"cnn_dailymail: {shard} is not cached: put it at {path}" in caplog.text
    for alternative in ("data.cache_dir", "$ABLATION_LAB_CACHE", "data.source: local",
                        f"`hf download {CNN} 3.0.0/train-0.parquet 3.0.0/train-1.parquet 3.0.0/val.parquet "
                        f"--repo-type dataset --revision main` and the same HF_HOME"):
        assert alternative in message
    assert not (tmp_path / "raw").exists()


def test_offline_error_names_the_prefix_file_of_max_bytes(tmp_path):
    with pytest.raises(DownloadError) as info:  # HF_ENDPOINT: conftest's closed port
        run("tinystories", {"max_bytes": 100}, tmp_path)
    path = hand_path(tmp_path, "roneneldan/TinyStories", "TinyStoriesV2-GPT4-valid.txt")
    assert (f"TinyStoriesV2-GPT4-valid.txt (its first 100 bytes) -> {path}.first-100-bytes"
            in str(info.value))


def forbid_network(monkeypatch) -> None:
    def network(*args, **kwargs):
        raise AssertionError("the network was used")
    monkeypatch.setattr(urllib.request, "urlopen", network)
    monkeypatch.setattr(hub_client, "download", network)


@pytest.mark.parametrize("name", ["cnn_dailymail", "tinystories"])
def test_a_cached_source_never_touches_the_network(hub, tmp_path, monkeypatch, name):
    if name == "cnn_dailymail":
        options = cnn_shards(hub)
    else:  # a max_bytes prefix is found under its own cache name
        options = {**tinystories(hub)[0], "max_bytes": 600}
    first, _ = run(name, options, tmp_path)
    n_requests = len(hub.log)
    hub.shutdown()  # offline from now on
    hub.server_close()
    forbid_network(monkeypatch)
    start = time.monotonic()
    second, _ = run(name, options, tmp_path)
    assert len(hub.log) == n_requests  # no request reached the hub (and forbid_network let none out)
    assert time.monotonic() - start < 10  # no retries with backoff (~20 s) either; wide for a loaded machine
    assert all(second[s].equals(first[s]) for s in first)


def test_partly_cached_source_lists_only_the_missing_files(hub, tmp_path):
    options = cnn_shards(hub)
    run("cnn_dailymail", options, tmp_path)
    snapshot = tmp_path / "hf_home" / "hub" / "datasets--fixtures--cnn" / "snapshots"
    for name in ("train-1.parquet", "val.parquet"):  # gone from the hub client's cache
        next(snapshot.glob(f"*/3.0.0/{name}")).unlink()
    hub.shutdown()
    hub.server_close()
    with pytest.raises(DownloadError, match="cannot download .*train-1.parquet") as info:
        run("cnn_dailymail", options, tmp_path)
    message = str(info.value)
    by_hand = {f: hand_path(tmp_path, CNN, f"3.0.0/{f}") for f in ("train-0.parquet", "train-1.parquet", "val.parquet")}
    assert f"train-1.parquet -> {by_hand['train-1.parquet']}" in message
    assert f"val.parquet -> {by_hand['val.parquet']}" in message  # not attempted, still listed
    assert "train-0.parquet" not in message


def test_a_failing_hub_lists_the_files(hub, tmp_path):
    options = cnn_shards(hub)
    hub.add_faults(hub.hub_path(CNN, "3.0.0/train-0.parquet"), *["500"] * 5)
    with pytest.raises(DownloadError, match=r"\(HTTP 500 from http://127.0.0.1:\d+\).*val.parquet -> "):
        run("cnn_dailymail", options, tmp_path)
    # The client retries a HEAD's 5xx and a download cut short, not a GET answered 500.
    assert len(hub.requests_for(hub.hub_path(CNN, "3.0.0/train-0.parquet"))) == 1


def test_tiny_shakespeare_splits_speeches_contiguously(hub, tmp_path):
    text = (FIXTURES / "tiny_shakespeare_input.txt").read_text()
    put(hub, "ts/input.txt", text)
    options = {"base_url": hub.url("ts"), "validation_fraction": 0.1, "test_fraction": 0.1, **FAST}
    frames, meta = run("tiny_shakespeare", options, tmp_path)
    speeches = split_paragraphs(text)
    n = round(len(speeches) * 0.1)
    assert [len(frames[s]) for s in ("validation", "test")] == [n, n]
    assert sum((frames[s]["target"].tolist() for s in ("train", "validation", "test")), []) == speeches
    assert set(frames["train"]["source"]) == {""}
    assert meta["task"] == "language_modeling"


def test_tiny_shakespeare_packs_speeches_up_to_doc_chars(hub, tmp_path):
    text = (FIXTURES / "tiny_shakespeare_input.txt").read_text()
    put(hub, "ts/input.txt", text)
    options = {"base_url": hub.url("ts"), "doc_chars": 300, "validation_fraction": 0.2,
               "test_fraction": 0.2, **FAST}
    frames, _ = run("tiny_shakespeare", options, tmp_path)
    docs = sum((frames[s]["target"].tolist() for s in ("train", "validation", "test")), [])
    speeches = split_paragraphs(text)
    assert "\n\n".join(docs) == "\n\n".join(speeches) and len(docs) < len(speeches)
    assert all(len(d) <= 300 or d in speeches for d in docs)


def test_tiny_shakespeare_too_few_documents_is_an_error(hub, tmp_path):
    put(hub, "ts/input.txt", "A:\nHi.\n\nB:\nHo.\n")
    with pytest.raises(ValueError, match="too few"):
        run("tiny_shakespeare", {"base_url": hub.url("ts"), **FAST}, tmp_path)


def tinystories(hub, n_train: int = 10) -> tuple[dict, list[str], list[str]]:
    train = [f"Story {i}: a little fox found {i} red berries." for i in range(n_train)]
    put(hub, "fixtures/tiny/train.txt", "".join(f"{s}\n<|endoftext|>\n" for s in train))
    valid_text = (FIXTURES / "tinystories_valid.txt").read_text()
    put(hub, "fixtures/tiny/valid.txt", valid_text)
    valid = [s.strip() for s in valid_text.split("<|endoftext|>") if s.strip()]
    options = {"repo": "fixtures/tiny", "files": {"train": "train.txt", "validation": "valid.txt"}}
    return options, train, valid


def test_tinystories_splits_on_endoftext_and_carves_test_from_validation(hub, tmp_path):
    options, train, valid = tinystories(hub)
    frames, meta = run("tinystories", options, tmp_path)
    assert frames["train"]["target"].tolist() == train
    assert frames["validation"]["target"].tolist() + frames["test"]["target"].tolist() == valid
    assert len(frames["test"]) == round(len(valid) * 0.5)
    assert meta["rows"]["train"] == len(train)


def test_tinystories_max_rows_and_no_test(hub, tmp_path):
    options, train, valid = tinystories(hub)
    frames, _ = run("tinystories", {**options, "max_rows": 4, "test_from_validation": 0}, tmp_path)
    assert frames["train"]["target"].tolist() == train[:4]
    assert frames["validation"]["target"].tolist() == valid[:4] and "test" not in frames


def test_tinystories_max_bytes_downloads_a_prefix_and_drops_the_cut_story(hub, tmp_path):
    options, train, valid = tinystories(hub, n_train=50)
    cut = len("".join(f"{s}\n<|endoftext|>\n" for s in train[:7])) + 10  # inside story 7
    frames, meta = run("tinystories", {**options, "max_bytes": cut}, tmp_path)
    assert frames["train"]["target"].tolist() == train[:7]
    assert hub.requests_for(hub.hub_path("fixtures/tiny", "train.txt")) == [f"bytes=0-{cut - 1}"]
    assert meta["files"][0]["max_bytes"] == cut
    # The prefix lives in the project's cache, where it would be put by hand.
    prefix = hand_path(tmp_path, "fixtures/tiny", "train.txt").with_name(f"train.txt.first-{cut}-bytes")
    assert prefix.stat().st_size == cut
    frames, _ = run("tinystories", options, tmp_path)  # the cached prefix is not the whole file
    assert frames["train"]["target"].tolist() == train


def test_tinystories_prefix_resumes_its_part_file(hub, tmp_path):
    options, train, _ = tinystories(hub, n_train=50)
    cut = 900
    prefix = hand_path(tmp_path, "fixtures/tiny", "train.txt").with_name(f"train.txt.first-{cut}-bytes")
    prefix.parent.mkdir(parents=True)
    served = (hub.root / "fixtures/tiny/train.txt").read_bytes()
    prefix.with_name(prefix.name + ".part").write_bytes(served[:300])  # an earlier run, cut short
    run("tinystories", {**options, "max_bytes": cut}, tmp_path)
    assert hub.requests_for(hub.hub_path("fixtures/tiny", "train.txt")) == [f"bytes=300-{cut - 1}"]
    assert prefix.read_bytes() == served[:cut] and not prefix.with_name(prefix.name + ".part").exists()


def put_iwslt(hub, pairs: list[dict]) -> dict:
    for split in ("train", "validation"):
        put_parquet(hub, f"fixtures/iwslt/iwslt2017-en-de/{split}/0000.parquet", {"translation": pairs})
    files = {s: f"{s}/0000.parquet" for s in ("train", "validation")}
    return {"repo": "fixtures/iwslt", "files": files}


@pytest.mark.parametrize("direction", ["en-de", "de-en"])
def test_iwslt2017_reads_translation_structs_in_either_direction(hub, tmp_path, direction):
    pairs = [{"de": "Danke.", "en": "Thank you."}, {"de": "Hallo Welt.", "en": "Hello world."}]
    frames, meta = run("iwslt2017", {**put_iwslt(hub, pairs), "direction": direction}, tmp_path)
    src, tgt = direction.split("-")
    assert frames["train"].to_dict("list") == {"source": [p[src] for p in pairs],
                                               "target": [p[tgt] for p in pairs]}
    assert (meta["task"], meta["direction"]) == ("translation", direction)
    # the parquet-converter branch, quoted in the URL as the hub's client quotes it
    assert hub.requests_for("/datasets/fixtures/iwslt/resolve/refs%2Fconvert%2Fparquet/"
                            "iwslt2017-en-de/train/0000.parquet") == [None]


def test_iwslt2017_rejects_rows_without_both_languages(hub, tmp_path):
    options = put_iwslt(hub, [{"de": "Danke.", "en": None}])
    with pytest.raises(ValueError, match=r"record 1: translation must hold strings 'en' and 'de' \(got \{"):
        run("iwslt2017", options, tmp_path)


@pytest.mark.parametrize("direction", ["en-de", "de-en"])
def test_multi30k_reads_jsonl_pairs(hub, tmp_path, direction):
    put(hub, "fixtures/m30k/train.jsonl", (FIXTURES / "multi30k_train.jsonl").read_bytes())
    put(hub, "fixtures/m30k/val.jsonl", '{"en": "A cat sleeps.", "de": "Eine Katze schläft."}\n')
    files = {"train": "train.jsonl", "validation": "val.jsonl"}
    options = {"repo": "fixtures/m30k", "files": files, "direction": direction}
    frames, _ = run("multi30k", options, tmp_path)
    rows = [json.loads(line) for line in (FIXTURES / "multi30k_train.jsonl").read_text().splitlines()
            if line.strip()]
    src, tgt = direction.split("-")
    assert frames["train"]["source"].tolist() == [r[src] for r in rows]
    assert frames["train"]["target"].tolist() == [r[tgt] for r in rows]
    cat = {"en": "A cat sleeps.", "de": "Eine Katze schläft."}
    assert frames["validation"].to_dict("list") == {"source": [cat[src]], "target": [cat[tgt]]}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_unknown_option_is_a_one_line_error_naming_the_key(name, tmp_path):
    required = {"task": "translation", "paths": {"train": "x"}} if name == "local" else {}
    options = {"bogus": 1, **required}
    with pytest.raises(ValueError, match=rf"^data\.{name}\.bogus: unknown option") as info:
        SOURCES[name].fetch(options, tmp_path / "cache", tmp_path / "raw")
    assert "\n" not in str(info.value) and not (tmp_path / "raw").exists()


@pytest.mark.parametrize("key, hint", [("base_url", "HF_ENDPOINT for a mirror"),
                                       ("timeout_s", "HF_HUB_DOWNLOAD_TIMEOUT"), ("retries", "retries on its own")])
def test_a_plain_url_option_on_a_hub_source_says_what_replaces_it(tmp_path, key, hint):
    with pytest.raises(ValueError, match=rf"^data\.tinystories\.{key}: not an option of a hub source: .*{hint}"):
        SOURCES["tinystories"].fetch({key: 1}, tmp_path / "cache", tmp_path / "raw")
    with pytest.raises(ValueError, match=r"^data\.multi30k\.repo: .*must be owner/name"):
        SOURCES["multi30k"].fetch({"repo": "multi30k"}, tmp_path / "cache", tmp_path / "raw")


def test_invalid_direction_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"data\.multi30k\.direction: .*'en-fr'"):
        SOURCES["multi30k"].fetch({"direction": "en-fr"}, tmp_path, tmp_path / "raw")


def test_registry_lists_every_source_with_task_fetch_and_strict_options():
    assert set(SOURCES) == {"cnn_dailymail", "tiny_shakespeare", "tinystories", "iwslt2017",
                            "multi30k", "local"}
    for name, source in SOURCES.items():
        assert source.task in (*TASKS, None) and callable(source.fetch)
        assert source.Options.model_config["extra"] == "forbid"
        assert name == "local" or callable(source.needed_files)
    with pytest.raises(ValueError, match="unknown source 'wikitext'"):
        get_source("wikitext")


def test_write_raw_rejects_bad_splits_and_values(tmp_path):
    meta = {"source": "x", "task": "translation"}
    with pytest.raises(ValueError, match="subset"):
        write_raw(tmp_path, {"dev": {"source": ["a"], "target": ["b"]}}, meta)
    with pytest.raises(ValueError, match=r"train.target: record 2: expected a string"):  # counted from 1
        write_raw(tmp_path, {"train": {"source": ["a", "b"], "target": ["c", None]}}, meta)
    with pytest.raises(ValueError, match="meta.task"):
        write_raw(tmp_path, {"train": {"source": ["a"], "target": ["b"]}}, {"task": "chat"})


def test_tiny_shakespeare_character_split_is_nanogpts_cut():
    from pipeline.sources.tiny_shakespeare import Options, split_characters

    text = "First Citizen:\nSpeak.\n\nAll:\nSpeak, speak.\n" * 7
    splits, notes = split_characters(text, 0.1, 0.0)
    n = int(len(text) * 0.9)
    assert splits["train"] == [text[:n]] and splits["validation"] == [text[n:]]
    assert splits["test"] == splits["validation"] and "test split is the validation text" in notes[0]
    splits, notes = split_characters(text, 0.1, 0.1)
    assert "".join(d for s in ("train", "validation", "test") for d in splits[s]) == text and not notes
    with pytest.raises(ValueError, match="needs split_unit: characters"):
        Options(test_fraction=0.0)
