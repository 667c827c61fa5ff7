"""HTTP(S) downloader for the dataset sources: stdlib urllib, no extra dependencies.

Design decisions:
- A download goes to `<dest>.part` and is renamed onto `dest` only after its size and sha256 check
  out, so a failed or interrupted download never leaves a half file at `dest`. The `.part` file is
  kept on network errors: the next attempt (or the next run) resumes it with an HTTP Range request.
- A server that ignores Range (answers 200 instead of 206) restarts the file from byte 0; one that
  answers 416 to a resume means the `.part` file was already complete.
- Connection errors, timeouts (a stalled socket raises after `timeout` seconds) and 408/429/5xx
  answers are retried with exponential backoff; every loop is bounded by `retries`. Other HTTP
  errors (404, 403, ...) are permanent and raised at once.
- A host that cannot be reached at all on the first attempt (DNS failure, connection refused, no
  route) is not retried: that is what being offline looks like, and backing off would only delay
  the error. Once a server has answered, the same errors are retried (a restart, a network blip).
- The cache is a plain directory that mirrors URLs (`cache_path`); a cached file that verifies is
  returned without touching the network, so one can also place files there by hand when offline.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm import tqdm

from pipeline.params import default_cache_dir  # noqa: F401 - part of this module's API

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 16
USER_AGENT = "ablation-lab/0.1 (python-urllib)"
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_SLEEP_S = 60.0  # cap on one backoff sleep (and on a server's Retry-After)


class DownloadError(OSError):
    """A download failed for good (after retries, or on a permanent HTTP error).

    An OSError, so callers that already report I/O failures as one-line errors report it too.
    `reason` is the cause alone (e.g. "URLError: [Errno 111] Connection refused"), for callers
    that word their own message around it.
    """

    def __init__(self, message: str, *, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


class ChecksumError(DownloadError):
    """The downloaded bytes do not match the expected size or sha256."""


class _Retry(Exception):
    """A transient failure: the attempt may be repeated (resuming the .part file)."""

    def __init__(self, reason: str, delay_s: float | None = None, unreachable: bool = False):
        super().__init__(reason)
        self.delay_s = delay_s
        self.unreachable = unreachable  # no connection could be opened at all


# errno values of a connect() that fails because there is no network (besides refused / DNS)
_NO_ROUTE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN})


def _unreachable(err: BaseException) -> bool:
    """True when the request never reached a server: DNS failure, connection refused, no route.

    urllib wraps errors raised while connecting in URLError; timeouts and resets are not in this
    set (a slow or flaky server is worth retrying, an absent one is not).
    """
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    return (isinstance(reason, (socket.gaierror, ConnectionRefusedError))
            or (isinstance(reason, OSError) and reason.errno in _NO_ROUTE))


def is_cached(dest: str | os.PathLike, size: int | None = None, sha256: str | None = None) -> bool:
    """Whether `dest` exists and verifies, i.e. `fetch` would return it without the network."""
    dest = Path(dest)
    return dest.is_file() and _verify(dest, size, sha256) is None


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


def fetch(url: str, dest: str | os.PathLike, sha256: str | None = None, size: int | None = None,
          retries: int = 4, backoff: float = 1.0, timeout: float = 30.0, progress: bool = True,
          max_bytes: int | None = None) -> Path:
    """Download `url` to `dest` unless `dest` already exists and verifies; return `dest`.

    sha256/size: expected digest and byte count of the final file (checked when given).
    retries: extra attempts after the first; the sleep before attempt k is `backoff * 2**(k-1)`.
    timeout: seconds for connecting and for each socket read (a stall longer than this retries).
    progress: show a tqdm bar (only when stderr is a terminal).
    max_bytes: download only the first `max_bytes` bytes (a Range request; the rest is skipped).
    """
    dest = Path(dest)
    if dest.exists():
        problem = _verify(dest, size, sha256)
        if problem is None:
            log.info("using cached %s", dest)
            return dest
        log.warning("cached file %s is invalid (%s); downloading it again", dest, problem)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    log.info("downloading %s -> %s", url, dest)

    last: _Retry | None = None
    for attempt in range(retries + 1):
        if attempt:
            delay = backoff * 2 ** (attempt - 1) if last.delay_s is None else last.delay_s
            time.sleep(min(delay, MAX_SLEEP_S))
        try:
            _attempt(url, part, size, max_bytes, timeout, progress)
            last = None
            break
        except _Retry as err:
            last = err
            log.warning("download of %s failed (attempt %d of %d): %s", url, attempt + 1,
                        retries + 1, err)
            if err.unreachable and attempt == 0:
                break  # offline (see the module docstring): fail now, not after the backoff
    if last is not None:
        n = attempt + 1
        reason = f"{last}; {n} attempt{'s' if n > 1 else ''}"
        if last.unreachable and n == 1 and retries:
            reason += ", not retried: the host cannot be reached"
        resume = f"; rerunning resumes from {part.name}" if part.exists() else ""
        raise DownloadError(
            f"could not download {url} after {n} attempt{'s' if n > 1 else ''} "
            f"({last}). If you are offline, download it by hand and put it at {dest} (the cache), "
            f"or use the `local` source with your own files{resume}.", reason=reason)

    problem = _verify(part, size, sha256)
    if problem is not None:
        part.unlink()
        raise ChecksumError(f"{url}: {problem}; deleted the download, nothing was written to {dest}")
    os.replace(part, dest)
    return dest


def _verify(path: Path, size: int | None, sha256: str | None) -> str | None:
    """None if `path` matches the expectations, else what is wrong (size is checked first: cheap)."""
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        return f"size {actual_size} bytes, expected {size}"
    if sha256 is not None:
        actual = sha256_file(path)
        if actual != sha256.lower():
            return f"sha256 {actual}, expected {sha256.lower()}"
    return None


def _attempt(url: str, part: Path, size: int | None, max_bytes: int | None, timeout: float,
             progress: bool) -> None:
    """One request: complete `part` or raise _Retry (transient) / DownloadError (permanent)."""
    have = part.stat().st_size if part.exists() else 0
    final = size if size is not None else max_bytes  # the length we stop at, when known up front
    if final is not None and have > final:
        part.unlink()  # longer than the whole file: not a prefix of it
        have = 0
    if have and final is not None and have == final:
        return  # already complete from an earlier run; the caller verifies it

    headers = {"User-Agent": USER_AGENT}
    if have or max_bytes is not None:
        headers["Range"] = f"bytes={have}-{'' if max_bytes is None else max_bytes - 1}"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as err:
        with err:
            if err.code == 416 and have:
                total = _content_range(err.headers.get("Content-Range", ""))[2]
                if total == have:
                    return  # the .part file already holds the whole file
                part.unlink()
                raise _Retry("server refused the resume range; restarting from byte 0") from None
            if err.code in RETRY_STATUS:
                raise _Retry(f"HTTP {err.code} {err.reason}",
                             _retry_after(err.headers.get("Retry-After"))) from None
            raise DownloadError(f"HTTP {err.code} {err.reason} for {url}",
                                reason=f"HTTP {err.code} {err.reason}") from None
    except (OSError, http.client.HTTPException) as err:  # URLError, refused, timeout, reset
        raise _Retry(f"{type(err).__name__}: {getattr(err, 'reason', err)}",
                     unreachable=_unreachable(err)) from None

    with resp:
        if resp.status == 206:
            start, end, total = _content_range(resp.headers.get("Content-Range", ""))
            if start != have:
                part.unlink(missing_ok=True)
                raise _Retry(f"server resumed at byte {start}, not {have}; restarting")
            mode = "ab"
            expected = end + 1 if end is not None else total
        else:  # 200: the whole file from byte 0, whatever Range we sent
            if have:
                log.info("server ignored the Range request; restarting %s from byte 0", url)
            have, mode = 0, "wb"
            length = resp.headers.get("Content-Length")
            expected = int(length) if length is not None and length.isdigit() else None
            if expected is not None and max_bytes is not None:
                expected = min(expected, max_bytes)
        if size is not None and expected is not None and expected != size:
            part.unlink(missing_ok=True)
            raise DownloadError(f"server reports {expected} bytes for {url}, expected size {size}")
        stop = expected if expected is not None else max_bytes
        with open(part, mode) as f, tqdm(total=expected, initial=have, unit="B", unit_scale=True,
                                         unit_divisor=1024, desc=part.name[:-5], leave=False,
                                         disable=None if progress else True) as bar:
            while stop is None or have < stop:
                try:
                    # read1: whatever has arrived (one socket read), so a stall loses nothing
                    chunk = resp.read1(CHUNK_BYTES if stop is None else min(CHUNK_BYTES, stop - have))
                except (OSError, http.client.HTTPException) as err:  # stall (timeout) or reset
                    raise _Retry(f"connection lost after {have} bytes "
                                 f"({type(err).__name__})") from None
                if not chunk:
                    break
                f.write(chunk)
                have += len(chunk)
                bar.update(len(chunk))
    if expected is not None and have < expected:
        raise _Retry(f"connection closed after {have} of {expected} bytes")


_CONTENT_RANGE = re.compile(r"bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)")


def _content_range(value: str) -> tuple[int | None, int | None, int | None]:
    """Parse `bytes a-b/total` or `bytes */total` into (a, b, total); unknown parts are None."""
    m = _CONTENT_RANGE.match(value.strip())
    if not m:
        return None, None, None
    start, end, total = (int(g) if g and g != "*" else None for g in m.groups())
    return start, end, total


def _retry_after(value: str | None) -> float | None:
    return float(value) if value is not None and value.strip().isdigit() else None
