"""The hub datasets' files through the Hugging Face Hub's own client (pipeline/sources/hub.py), the
download stage run in-process against a local server that plays the hub's endpoint
(HF_ENDPOINT=http://127.0.0.1:PORT, set before the stage runs; never the network): the client's
cache under HF_HOME, its URL layout and headers, a download cut short and resumed, a gated dataset,
HF_HUB_OFFLINE with and without the files, and files put by hand."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from pipeline import download
from tests.fixtures.sources.server import commit, put_hub, serve

REPO = "fixtures/m30k"
FILES = {"train": "train.jsonl", "validation": "val.jsonl"}
TRAIN = "".join(json.dumps({"en": f"A dog runs {i}.", "de": f"Ein Hund läuft {i}."}) + "\n" for i in range(3000))
VAL = json.dumps({"en": "A cat sleeps.", "de": "Eine Katze schläft."}) + "\n"


@pytest.fixture(autouse=True)
def _scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    (tmp_path / "www").mkdir()
    with serve(tmp_path / "www") as srv:
        put_hub(srv, REPO, "train.jsonl", TRAIN)
        put_hub(srv, REPO, "val.jsonl", VAL)
        monkeypatch.setenv("HF_ENDPOINT", srv.url().rstrip("/"))
        yield srv


def stage(tmp_path: Path, **options) -> dict:
    """The download stage on `data.multi30k` (REPO's files and `options`); its meta.json."""
    params = {"data": {"source": "multi30k", "cache_dir": str(tmp_path / "cache"),
                       "multi30k": {"repo": REPO, "files": FILES, **options}}}
    (tmp_path / "params.yaml").write_text(json.dumps(params))
    download.main(["--params", "params.yaml", "--out", "raw"])
    return json.loads(Path("raw/meta.json").read_text())


def stage_fails(tmp_path: Path, **options) -> str:
    """The stage exits with one line, fast, and writes nothing."""
    start = time.monotonic()
    with pytest.raises(SystemExit) as info:
        stage(tmp_path, **options)
    message = info.value.code
    assert isinstance(message, str) and message.startswith("download: ") and "\n" not in message, message
    assert not Path("raw").exists()
    assert time.monotonic() - start < 10  # not the client's ~20 s of retries with backoff; wide for a loaded machine
    return message


def snapshot(tmp_path: Path, name: str, revision: str = "main") -> Path:
    """Where the client keeps a file of REPO: $HF_HOME/hub/datasets--<owner>--<name>/snapshots/<commit>/."""
    return tmp_path / "hf_home" / "hub" / "datasets--fixtures--m30k" / "snapshots" / commit(REPO, revision) / name


def hand_path(tmp_path: Path, name: str, revision: str = "main") -> Path:
    return tmp_path / "cache" / "huggingface.co" / "datasets" / REPO / "resolve" / revision / name


def test_a_hub_file_goes_into_the_clients_cache_from_the_endpoint_set_before_the_stage(hub, tmp_path):
    import huggingface_hub.constants

    # The client read HF_ENDPOINT when it was imported (conftest: a closed port); the stage reads it now.
    assert huggingface_hub.constants.ENDPOINT != hub.url().rstrip("/")
    pin = hashlib.sha256(TRAIN.encode()).hexdigest()
    meta = stage(tmp_path, sha256={"train.jsonl": pin})
    assert meta["rows"] == {"train": 3000, "validation": 1}
    paths = [hub.hub_path(REPO, name) for name in ("train.jsonl", "val.jsonl")]
    assert hub.log == [(paths[0], None), (paths[1], None)]  # the client's layout, whole files
    assert set(hub.heads) == set(paths)  # the metadata the client reads first (X-Repo-Commit, ETag)
    assert snapshot(tmp_path, "train.jsonl").read_text() == TRAIN
    assert (tmp_path / "hf_home/hub/datasets--fixtures--m30k/refs/main").read_text() == commit(REPO)
    assert not (tmp_path / "cache").exists()  # nothing in the project's cache
    record = meta["files"][0]
    assert record == {"split": "train", "file": "train.jsonl", "url": hub.url(paths[0]), "sha256": pin,
                      "bytes": len(TRAIN.encode()), "repo": REPO, "revision": "main", "commit": commit(REPO)}
    requests = len(hub.log), len(hub.heads)
    stage(tmp_path)  # cached: not one request, not even the client's HEAD
    assert (len(hub.log), len(hub.heads)) == requests


def test_a_download_cut_short_resumes_with_a_range_request(hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 14)  # (10 MB by default)
    path = hub.hub_path(REPO, "train.jsonl")
    hub.add_faults(path, "truncate")  # the first answer stops half-way and closes the connection
    stage(tmp_path)
    first, second = hub.requests_for(path)
    resumed_at = int(second.removeprefix("bytes=").removesuffix("-"))
    assert first is None and 0 < resumed_at <= len(TRAIN.encode()) // 2
    assert snapshot(tmp_path, "train.jsonl").read_text() == TRAIN


def test_a_gated_dataset_is_one_line_naming_the_file_and_hf_token(hub, tmp_path, monkeypatch):
    hub.gated[REPO] = "hf_reader"
    message = stage_fails(tmp_path)
    assert message.startswith(f"download: multi30k: train.jsonl: the hub refused access (401): set HF_TOKEN "
                              f"to a token with access to {REPO} "), message
    assert hub.log == []
    monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
    message = stage_fails(tmp_path)
    assert message.startswith("download: multi30k: train.jsonl: the hub refused access (403): your token "), message
    monkeypatch.setenv("HF_TOKEN", "hf_reader")  # the client's token, from the environment
    assert stage(tmp_path)["rows"]["train"] == 3000


def test_not_on_the_hub_is_one_line(hub, tmp_path):
    message = stage_fails(tmp_path, files={"train": "nope.jsonl"})
    assert message == (f"download: multi30k: nope.jsonl: not on the hub (404): {REPO} at revision main has no "
                       f"nope.jsonl (check data.multi30k.repo, revision and files)")


def test_offline_with_nothing_cached_says_where_to_put_each_file_at_once(hub, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = stage_fails(tmp_path)
    assert "(HF_HUB_OFFLINE is set and it is not cached)" in message
    for name in FILES.values():
        assert f"{name} -> {hand_path(tmp_path, name)}" in message
        assert f"multi30k: {name} is not cached: put it at {hand_path(tmp_path, name)}" in caplog.text
    assert f"`hf download {REPO} train.jsonl val.jsonl --repo-type dataset --revision main`" in message
    assert hub.log == [] and hub.heads == []


def test_offline_with_the_files_cached_makes_no_request(hub, tmp_path, monkeypatch):
    first = stage(tmp_path)
    requests = len(hub.log), len(hub.heads)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert stage(tmp_path)["files"] == first["files"]
    assert (len(hub.log), len(hub.heads)) == requests


def test_files_put_by_hand_are_used_offline(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name, text in (("train.jsonl", TRAIN), ("val.jsonl", VAL)):
        hand_path(tmp_path, name).parent.mkdir(parents=True, exist_ok=True)
        hand_path(tmp_path, name).write_text(text)
    meta = stage(tmp_path)
    assert meta["rows"]["train"] == 3000 and "commit" not in meta["files"][0]
    assert hub.log == [] and hub.heads == []


def test_a_revision_pinned_to_a_commit_is_what_is_cached_and_asked_for(hub, tmp_path, monkeypatch):
    sha = "0123456789abcdef0123456789abcdef01234567"
    meta = stage(tmp_path, revision=sha)
    assert hub.log[0] == (hub.hub_path(REPO, "train.jsonl", sha), None)
    assert meta["files"][0]["commit"] == sha and snapshot(tmp_path, "train.jsonl", sha).read_text() == TRAIN
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    stage(tmp_path, revision=sha)
