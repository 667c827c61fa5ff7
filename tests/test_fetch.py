"""pipeline.sources.http (plain URLs: the files not on the Hugging Face Hub) against a local
fault-injecting HTTP server (127.0.0.1 only, never the network). The hub's files: tests/test_hub.py."""
from __future__ import annotations

import errno
import hashlib
import socket
import time
import urllib.error
import urllib.request

import pytest

from pipeline.sources import http as plain_http
from pipeline.sources.http import ChecksumError, DownloadError, cache_path, default_cache_dir, fetch
from tests.fixtures.sources.server import closed_port_url, serve

DATA = bytes(range(256)) * 1000  # 256 kB: several read chunks, so a half body is a real prefix
SHA = hashlib.sha256(DATA).hexdigest()
FAST = dict(backoff=0.0, timeout=0.5)  # keeps every retry loop short


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "data.bin").write_bytes(DATA)
    with serve(root, stall_s=1.5) as srv:
        yield srv


def test_download_verifies_and_leaves_no_temporary(server, tmp_path):
    dest = tmp_path / "out" / "data.bin"
    assert fetch(server.url("data.bin"), dest, sha256=SHA, **FAST) == dest
    assert dest.read_bytes() == DATA
    assert [p.name for p in dest.parent.iterdir()] == ["data.bin"]


def test_http_500_is_retried_then_succeeds(server, tmp_path):
    server.add_faults("data.bin", "500", "500")
    dest = fetch(server.url("data.bin"), tmp_path / "d.bin", sha256=SHA, **FAST)
    assert dest.read_bytes() == DATA
    assert len(server.requests_for("data.bin")) == 3


def test_retries_are_bounded_and_the_error_is_clear(server, tmp_path):
    server.add_faults("data.bin", *["500"] * 10)
    dest = tmp_path / "d.bin"
    with pytest.raises(DownloadError, match=r"after 3 attempts .*HTTP 500") as info:
        fetch(server.url("data.bin"), dest, retries=2, **FAST)
    assert len(server.requests_for("data.bin")) == 3
    assert str(dest) in str(info.value) and not dest.exists() and not list(tmp_path.glob(".d.bin.*"))


def test_http_404_is_not_retried(server, tmp_path):
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(server.url("missing.bin"), tmp_path / "m.bin", **FAST)
    assert len(server.requests_for("missing.bin")) == 1


def test_truncated_body_is_downloaded_again(server, tmp_path):
    server.add_faults("data.bin", "truncate")
    dest = fetch(server.url("data.bin"), tmp_path / "d.bin", sha256=SHA, **FAST)
    assert dest.read_bytes() == DATA
    assert server.requests_for("data.bin") == [None, None]  # a small file: whole again, no resume


def test_a_truncated_body_is_never_taken_for_the_file(server, tmp_path):
    server.add_faults("data.bin", "truncate")  # no pin: only the length tells the cut
    dest = tmp_path / "d.bin"
    with pytest.raises(DownloadError, match=r"IncompleteRead"):
        fetch(server.url("data.bin"), dest, retries=0, **FAST)
    assert not dest.exists() and [p.name for p in tmp_path.iterdir()] == ["www"]  # no temporary


def test_wrong_checksum_raises_and_leaves_no_file(server, tmp_path):
    dest = tmp_path / "d.bin"
    with pytest.raises(ChecksumError, match=f"expected {'0' * 64}"):
        fetch(server.url("data.bin"), dest, sha256="0" * 64, **FAST)
    assert not dest.exists() and [p.name for p in tmp_path.iterdir()] == ["www"]  # no temporary


def test_stall_times_out_and_is_retried(server, tmp_path):
    server.add_faults("data.bin", "stall")
    server.stall_s = 60.0  # far beyond the client's 0.5 s timeout: no loaded machine takes that long
    start = time.monotonic()
    dest = fetch(server.url("data.bin"), tmp_path / "d.bin", sha256=SHA, **FAST)
    assert dest.read_bytes() == DATA
    assert server.requests_for("data.bin") == [None, None]
    assert time.monotonic() - start < server.stall_s  # gave up on the stall, did not wait it out


def test_stall_on_every_attempt_gives_up(server, tmp_path):
    server.add_faults("data.bin", "stall", "stall")
    with pytest.raises(DownloadError, match="after 2 attempts"):
        fetch(server.url("data.bin"), tmp_path / "d.bin", retries=1, **FAST)


def test_offline_error_names_the_cache_path_and_local(tmp_path):
    dest = cache_path(tmp_path / "cache", closed_port_url("x/input.txt"))
    with pytest.raises(DownloadError) as info:
        fetch(closed_port_url("x/input.txt"), dest, retries=1, **FAST)
    message = str(info.value)
    assert str(dest) in message and "`local`" in message and "\n" not in message


def test_unreachable_host_is_not_retried(tmp_path, monkeypatch):
    sleeps = []  # the backoff's sleeps, recorded instead of slept: 1 + 2 + 4 + 8 s if it retried
    monkeypatch.setattr(plain_http.time, "sleep", sleeps.append)
    with pytest.raises(DownloadError, match="after 1 attempt ") as info:
        fetch(closed_port_url(), tmp_path / "d.bin", retries=4, backoff=1.0, timeout=0.5)
    assert sleeps == []
    assert "not retried: the host cannot be reached" in info.value.reason


def fake_urlopen(monkeypatch, *errors: BaseException) -> list:
    """urlopen raises `errors` in turn (the last one forever); returns the list of calls."""
    calls = []

    def urlopen(request, timeout=None):
        calls.append(request.full_url)
        raise errors[min(len(calls), len(errors)) - 1]
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return calls


@pytest.mark.parametrize("reason, attempts", [
    (socket.gaierror(-2, "Name or service not known"), 1),  # DNS failure: offline
    (OSError(errno.ENETUNREACH, "Network is unreachable"), 1),
    (TimeoutError("timed out"), 4),  # a slow server: retried
    (ConnectionResetError(104, "Connection reset by peer"), 4),
])
def test_only_a_host_out_of_reach_fails_fast(monkeypatch, tmp_path, reason, attempts):
    calls = fake_urlopen(monkeypatch, urllib.error.URLError(reason))
    with pytest.raises(DownloadError):
        fetch("http://example.invalid/d.bin", tmp_path / "d.bin", retries=3, **FAST)
    assert len(calls) == attempts


def test_refused_after_the_server_answered_is_retried(monkeypatch, tmp_path):
    http_503 = urllib.error.HTTPError("http://x/d.bin", 503, "Unavailable", {}, None)
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    calls = fake_urlopen(monkeypatch, http_503, refused)
    with pytest.raises(DownloadError, match="after 3 attempts"):
        fetch("http://x/d.bin", tmp_path / "d.bin", retries=2, **FAST)
    assert len(calls) == 3  # a restarting server, not an offline machine


def test_verified_cache_hit_makes_no_request(tmp_path):
    dest = tmp_path / "d.bin"
    dest.write_bytes(DATA)
    assert fetch(closed_port_url(), dest, sha256=SHA, **FAST) == dest


def test_corrupt_cached_file_is_downloaded_again(server, tmp_path):
    dest = tmp_path / "d.bin"
    dest.write_bytes(b"stale")
    fetch(server.url("data.bin"), dest, sha256=SHA, **FAST)
    assert dest.read_bytes() == DATA


def test_redirect_is_followed(server, tmp_path):
    server.add_faults("data.bin", "truncate")
    dest = fetch(server.url("redirect/data.bin"), tmp_path / "d.bin", sha256=SHA, **FAST)
    assert dest.read_bytes() == DATA
    assert server.requests_for("data.bin") == [None, None]


def test_cache_path_mirrors_the_url_and_cannot_escape(tmp_path):
    url = "https://huggingface.co/datasets/a/b/resolve/refs%2Fconvert%2Fparquet/../x/0000.parquet"
    path = cache_path(tmp_path, url)
    assert path.is_relative_to(tmp_path)
    assert path.parts[-3:] == ("refs%2Fconvert%2Fparquet", "x", "0000.parquet")
    assert cache_path(tmp_path, "http://127.0.0.1:8000/f.txt") == tmp_path / "127.0.0.1_8000/f.txt"


def test_default_cache_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ABLATION_LAB_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("ABLATION_LAB_CACHE")
    assert default_cache_dir().parts[-2:] == (".cache", "ablation-lab")
