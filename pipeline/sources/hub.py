"""Files of Hugging Face Hub datasets, fetched with the hub's own client (huggingface_hub), so they
behave as in every other tool that uses it: one cache shared with them ($HF_HUB_CACHE, default
$HF_HOME/hub, default ~/.cache/huggingface/hub), HF_TOKEN (or `hf auth login`) for gated datasets,
HF_ENDPOINT for a mirror, HF_HUB_OFFLINE=1 to never ask the network, HF_HUB_DOWNLOAD_TIMEOUT and
HF_HUB_ETAG_TIMEOUT for its timeouts; none of them is overridden here.

The environment is read when a stage runs, not when huggingface_hub was imported: its `constants`
module reads HF_ENDPOINT, HF_HUB_OFFLINE and HF_HOME once, at import, so `settings()` reads them
again at each call and the endpoint and cache folder are passed to the client explicitly.

Where a needed file comes from (common.RemoteFiles asks in this order):
1. a file put by hand at `hand_path` in the project's cache (`data.cache_dir`): the layout earlier
   versions downloaded to, so their caches still count, and a plain path to copy a file to offline;
2. the client's cache, looked up with try_to_load_from_cache: no request at all;
3. `download`: one HEAD request first, not retried: when no connection can be opened (no
   network, the endpoint refusing) the stage stops at once instead of after the client's ~20 s of
   backoff, and 401/403/404 stop it too; otherwise (the file is there, or the hub is failing and
   the client's retries may help) hf_hub_download downloads it into the client's cache.
`max_bytes` prefixes (the first 800 MB of TinyStories' 2.2 GB train file) are not files of the
hub, and the client only downloads whole files: a prefix is a Range request through the client's
http_get (its headers and token, its retries within a run), kept in the project's cache at
`hand_path` (`<file>.first-N-bytes`), resumed from its `.part` file by the next run.
"""
from __future__ import annotations

import logging
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from pipeline.sources.http import DownloadError

log = logging.getLogger(__name__)

DEFAULT_HOST = "huggingface.co"  # hand_path's host folder, whatever the endpoint (a mirror: same files)


class HubRefused(DownloadError):
    """The hub answered and no other try will help: access refused (401/403) or no such repo,
    revision or file (404). One line; the caller adds the source and file."""


@dataclass(frozen=True)
class Settings:
    endpoint: str  # HF_ENDPOINT, else huggingface.co
    cache_dir: Path  # the client's cache: HF_HUB_CACHE, else $HF_HOME/hub
    offline: bool  # HF_HUB_OFFLINE


def _true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}  # as huggingface_hub reads it


def settings() -> Settings:
    """The client's settings as the environment gives them now (see the module docstring); an
    unset variable falls back to what the client read at import (its defaults)."""
    from huggingface_hub import constants

    env = os.environ
    endpoint = (env.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache and env.get("HF_HOME"):
        cache = os.path.join(env["HF_HOME"], "hub")
    cache = os.path.expanduser(os.path.expandvars(cache)) if cache else constants.HF_HUB_CACHE
    offline = (_true(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE"))
               or constants.HF_HUB_OFFLINE)  # the client's own switch blocks its requests anyway
    return Settings(endpoint, Path(cache), offline)


def file_url(repo: str, filename: str, revision: str, endpoint: str) -> str:
    """The client's URL of a dataset file: `<endpoint>/datasets/<repo>/resolve/<revision>/<filename>`."""
    from huggingface_hub import hf_hub_url

    return hf_hub_url(repo, filename, repo_type="dataset", revision=revision, endpoint=endpoint)


def hand_path(cache_dir: Path, repo: str, filename: str, revision: str) -> Path:
    """Where a file put by hand is found: `<cache_dir>/huggingface.co/datasets/<repo>/resolve/
    <revision>/<filename>` (the revision URL-quoted, as in the hub's URL)."""
    return Path(cache_dir, DEFAULT_HOST, "datasets", *repo.split("/"), "resolve",
                urllib.parse.quote(revision, safe=""), *filename.split("/"))


def cached(repo: str, filename: str, revision: str, hub: Settings) -> Path | None:
    """The file in the client's cache (revision: a commit, or a branch as last resolved), or None."""
    from huggingface_hub import try_to_load_from_cache

    path = try_to_load_from_cache(repo, filename, cache_dir=hub.cache_dir, revision=revision,
                                  repo_type="dataset")
    return Path(path) if isinstance(path, str) else None


def commit_of(path: Path, filename: str) -> str | None:
    """The commit a path of the client's cache belongs to (`.../snapshots/<commit>/<filename>`)."""
    parts = path.parts
    depth = len(filename.split("/"))
    if len(parts) > depth + 1 and parts[-depth - 2] == "snapshots":
        return parts[-depth - 1]
    return None


def download(repo: str, filename: str, revision: str, hub: Settings, source: str,
             prefix: tuple[Path, int] | None = None) -> tuple[Path, str | None]:
    """Download a file into the client's cache (or, with `prefix` (path, max_bytes), its first
    max_bytes bytes to that path); the path and the commit it came from.

    Raises HubRefused (401/403/404) or DownloadError (no network, the hub failing), one line each.
    """
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, XetDownloadError

    url = file_url(repo, filename, revision, hub.endpoint)
    if logging.getLogger("httpx2").level == logging.NOTSET:  # not a log line per HEAD and GET
        logging.getLogger("httpx2").setLevel(logging.WARNING)
    if prefix is None:
        log.info("downloading %s -> the Hugging Face cache %s", url, hub.cache_dir)
    try:
        try:  # one HEAD, not retried (see the module docstring)
            meta = get_hf_file_metadata(url, endpoint=hub.endpoint)
        except (httpx2.ConnectError, OfflineModeIsEnabled):
            raise  # no connection at all: offline, stop now
        except HfHubHTTPError as err:
            if err.response.status_code in (401, 403, 404):
                raise  # refused or not there: retrying will not change it
            meta = None  # the hub failing (5xx, 429): the client's own retries, below
        except httpx2.TimeoutException:
            meta = None
        if prefix is not None:
            if meta is None:
                meta = get_hf_file_metadata(url, endpoint=hub.endpoint, retry_on_errors=True)
            return _download_prefix(url, meta, *prefix), meta.commit_hash
        path = Path(hf_hub_download(repo, filename, repo_type="dataset", revision=revision,
                                    cache_dir=hub.cache_dir, endpoint=hub.endpoint))
    except DownloadError:
        raise
    except (OSError, httpx2.HTTPError, XetDownloadError) as err:  # the client's failures: one line
        raise _one_line(err, repo, filename, revision, hub, source) from err
    return path, commit_of(path, filename)


def _download_prefix(url: str, meta, dest: Path, max_bytes: int) -> Path:
    """The first `max_bytes` bytes (or the whole file, if shorter) to `dest`, through `<dest>.part`."""
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    size = max_bytes if meta.size is None else min(max_bytes, meta.size)
    headers = build_hf_headers()  # the client's user agent and token (HF_TOKEN, `hf auth login`)
    if urllib.parse.urlsplit(meta.location).netloc != urllib.parse.urlsplit(url).netloc:
        headers.pop("authorization", None)  # a signed CDN address: the token stays with the hub
    headers["Range"] = f"bytes=0-{size - 1}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()  # longer than the prefix: not a prefix of it
        have = 0
    log.info("downloading the first %d bytes of %s -> %s%s", size, url, dest,
             f" (resuming at byte {have})" if have else "")
    with open(part, "ab") as f:
        if size:
            http_get(meta.location, f, resume_size=have, headers=headers, expected_size=size,
                     displayed_filename=dest.name)
    os.replace(part, dest)
    return dest


def _causes(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    while err is not None and err not in chain:
        chain.append(err)
        err = err.__cause__ or err.__context__
    return chain


def _one_line(err: Exception, repo: str, filename: str, revision: str, hub: Settings,
              source: str) -> DownloadError:
    """The client's error (often several lines, the cause wrapped in another) as one line."""
    from huggingface_hub import get_token

    chain = _causes(err)
    status = next((r.status_code for e in chain if (r := getattr(e, "response", None)) is not None
                   and isinstance(getattr(r, "status_code", None), int)), None)
    page = f"{hub.endpoint}/datasets/{repo}"
    if status in (401, 403):
        if get_token() is None:
            hint = (f"set HF_TOKEN to a token with access to {repo} (a gated dataset: accept its terms "
                    f"at {page} first; a repo that does not exist is refused the same way)")
        else:
            hint = (f"your token (HF_TOKEN or `hf auth login`) has no access to {repo}: accept the "
                    f"dataset's terms at {page}, or check data.{source}.repo")
        return HubRefused(f"the hub refused access ({status}): {hint}", reason=f"HTTP {status}")
    if status == 404:
        return HubRefused(f"not on the hub (404): {repo} at revision {revision} has no {filename} "
                          f"(check data.{source}.repo, revision and files)", reason="HTTP 404")
    if status is not None:
        reason = f"HTTP {status} from {hub.endpoint}"
    else:  # no answer: connection refused, DNS, timeout, offline mode, a download cut for good
        root = chain[-1]
        text = str(root).strip().splitlines()[0] if str(root).strip() else ""
        reason = f"{type(root).__name__}: {text}" if text else type(root).__name__
    return DownloadError(f"cannot download {filename} of {repo} from {hub.endpoint} ({reason})",
                         reason=reason)
