"""Plain HTTP(S) downloads, for the files that do not live on the Hugging Face Hub (Tiny
Shakespeare's GitHub raw file): stdlib urllib, the whole file at a time. Hub files are
downloaded by the hub's own client (pipeline/sources/hub.py).

- The file is written to a temporary next to `dest` and renamed onto it only once its sha256 (when
  pinned) checks out (pipeline.io.atomic.atomic_path): a failed download never leaves a file at `dest`.
- Server errors (408/425/429/5xx), timeouts (a socket silent for `timeout` seconds) and lost
  connections are retried from byte 0 with exponential backoff, `retries` times at most; other
  HTTP errors (404, 403, ...) are raised at once. A host that cannot be reached at all on the first
  attempt (DNS failure, connection refused, no route) is not retried: that is being offline.
- The cache mirrors URLs (`cache_path`); a cached file that verifies is returned without the
  network, so a file can also be put there by hand.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import logging
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from pipeline.io.atomic import atomic_path
from pipeline.params import default_cache_dir  # noqa: F401 - part of this module's API

log = logging.getLogger(__name__)

USER_AGENT = "ablation-lab/0.1 (python-urllib)"
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_SLEEP_S = 60.0  # cap on one backoff sleep


class DownloadError(OSError):
    """A download failed for good (after retries, on a permanent HTTP error, or offline).

    An OSError, so callers that already report I/O failures as one-line errors report it too.
    `reason` is the cause alone (e.g. "URLError: [Errno 111] Connection refused"), for callers
    that word their own message around it.
    """

    def __init__(self, message: str, *, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class ChecksumError(DownloadError):
    """The downloaded bytes do not match the expected sha256."""


# errno values of a connect() that fails because there is no network (besides refused / DNS)
_NO_ROUTE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN})


def _unreachable(err: BaseException) -> bool:
    """True when the request never reached a server: DNS failure, connection refused, no route."""
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    return (isinstance(reason, (socket.gaierror, ConnectionRefusedError))
            or (isinstance(reason, OSError) and reason.errno in _NO_ROUTE))


def cache_path(cache_dir: str | os.PathLike, url: str) -> Path:
    """Where `url` is cached: `<cache_dir>/<host>/<url path>` (readable, and distinct per URL)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.replace(":", "_")  # ':' is not allowed in Windows file names
    segments = [s for s in parts.path.split("/") if s not in ("", ".", "..")]
    if not host or not segments:
        raise ValueError(f"cannot derive a cache file name from URL {url!r}")
    return Path(cache_dir, host, *segments)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# What the network raises; a local write error (a full disk, no permission) is not retried.
_NETWORK = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException)


def _copy(resp: http.client.HTTPResponse, f) -> None:
    """The response body into `f`; a body shorter than its Content-Length is an error
    (http.client's read(n) returns the short body as if it were whole)."""
    length = resp.headers.get("Content-Length")
    expected = int(length) if length is not None and length.isdigit() else None
    have = 0
    while chunk := resp.read(1 << 16):
        f.write(chunk)
        have += len(chunk)
    if expected is not None and have < expected:
        raise http.client.IncompleteRead(b"", expected - have)


def verify(path: str | os.PathLike, sha256: str | None) -> str | None:
    """None if `path` matches the pin (or there is none), else what is wrong."""
    if sha256 is not None:
        actual = sha256_file(path)
        if actual != sha256.lower():
            return f"sha256 {actual}, expected {sha256.lower()}"
    return None


def fetch(url: str, dest: str | os.PathLike, sha256: str | None = None, retries: int = 4,
          backoff: float = 1.0, timeout: float = 30.0) -> Path:
    """Download `url` to `dest` unless `dest` already exists and verifies; return `dest`.

    retries: extra attempts after the first; the sleep before attempt k is `backoff * 2**(k-1)`.
    timeout: seconds for connecting and for each socket read (a stall longer than this retries).
    """
    dest = Path(dest)
    if dest.exists():
        problem = verify(dest, sha256)
        if problem is None:
            log.info("using cached %s", dest)
            return dest
        log.warning("cached file %s is invalid (%s); downloading it again", dest, problem)
        dest.unlink()
    log.info("downloading %s -> %s", url, dest)
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(backoff * 2 ** (attempt - 1), MAX_SLEEP_S))
        try:
            with atomic_path(dest) as tmp:
                with urllib.request.urlopen(request, timeout=timeout) as resp, open(tmp, "wb") as f:
                    _copy(resp, f)
                problem = verify(tmp, sha256)
                if problem is not None:
                    raise ChecksumError(f"{url}: {problem}; nothing was written to {dest}")
            return dest
        except urllib.error.HTTPError as err:
            err.close()
            if err.code not in RETRY_STATUS:
                raise DownloadError(f"HTTP {err.code} {err.reason} for {url}",
                                    reason=f"HTTP {err.code} {err.reason}") from None
            last, unreachable = f"HTTP {err.code} {err.reason}", False
        except _NETWORK as err:  # refused, DNS, timeout (a stall), reset, a body cut short
            last, unreachable = f"{type(err).__name__}: {getattr(err, 'reason', err)}", _unreachable(err)
        log.warning("download of %s failed (attempt %d of %d): %s", url, attempt + 1, retries + 1, last)
        if unreachable and attempt == 0:
            break  # offline (see the module docstring): fail now, not after the backoff
    n = attempt + 1
    attempts = f"{n} attempt{'s' if n > 1 else ''}"
    reason = f"{last}; {attempts}"
    if unreachable and n == 1 and retries:
        reason += ", not retried: the host cannot be reached"
    raise DownloadError(f"could not download {url} after {attempts} ({last}). If you are offline, "
                        f"download it by hand and put it at {dest} (the cache), or use the `local` "
                        f"source with your own files.", reason=reason)
