"""What the sources share: option parsing, the files a remote source needs and their download
(a plain URL: http; a Hugging Face Hub dataset's file: hub, with the hub's own client), and
writing raw/<split>.parquet + meta.json (and what they hold, for the download metrics). Sources import this, never the package, so the
registry in __init__ and the sources it loads do not import each other."""
from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pydantic
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from pipeline.io.atomic import atomic_path, atomic_write_json
from pipeline.params import fields_at
from pipeline.sources import hub
from pipeline.sources.http import ChecksumError, DownloadError, cache_path, fetch, sha256_file, verify

log = logging.getLogger(__name__)

TASKS = ("summarization", "translation", "language_modeling")
SPLITS = ("train", "validation", "test")
SHA256 = pydantic.constr(pattern=r"^[0-9a-fA-F]{64}$")
Split = Literal["train", "validation", "test"]
Direction = Literal["en-de", "de-en"]


class RemoteOptions(BaseModel):
    """Options shared by the downloaded sources; each source subclasses UrlOptions or HubOptions."""
    model_config = ConfigDict(extra="forbid")

    max_rows: PositiveInt | None = None  # keep the first N rows of each split (None: all)
    sha256: dict[str, SHA256] = Field(default_factory=dict)  # file (as in `files`) -> digest


class UrlOptions(RemoteOptions):
    """A source whose files are plain URLs (`<base_url>/<file>`), downloaded by pipeline/sources/http."""
    timeout_s: float = Field(30.0, gt=0)  # per socket read; a stall this long is retried
    retries: int = Field(4, ge=0)


class HubOptions(RemoteOptions):
    """A source whose files are a Hugging Face Hub dataset's: `<subfolder>/<file>` of `repo` at
    `revision` (a branch, tag or commit), downloaded by the hub's client (pipeline/sources/hub)."""
    repo: str  # owner/name
    revision: str = Field("main", min_length=1)
    subfolder: str = ""  # the files' folder in the repo ("" for its top)

    # Keys of UrlOptions, each with what replaces it here (parse_options says so).
    MOVED: ClassVar[dict[str, str]] = {
        "base_url": "the files are the hub's: set repo, revision and subfolder; HF_ENDPOINT for a mirror",
        "timeout_s": "the hub's client has its own: set HF_HUB_DOWNLOAD_TIMEOUT / HF_HUB_ETAG_TIMEOUT",
        "retries": "the hub's client retries on its own",
    }

    @field_validator("repo")
    @classmethod
    def _owner_and_name(cls, repo: str) -> str:
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            raise ValueError("must be owner/name, e.g. roneneldan/TinyStories")
        return repo

    def path(self, file: str) -> str:
        """`file`'s path in the repo."""
        return f"{self.subfolder.strip('/')}/{file}" if self.subfolder.strip("/") else file


M = TypeVar("M", bound=BaseModel)
SHOWN_CHARS = 80  # a value quoted in an error message is cut here: a record can be a whole article


def shown(value: Any) -> str:
    """`value` as an error message quotes it: its repr, cut to SHOWN_CHARS with an ellipsis.
    (Records and rows in messages are counted from 1, as an editor counts lines.)"""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"


def parse_options(model: type[M], options: Mapping[str, Any] | None, source: str) -> M:
    """Validate `data.<source>`; the error is one line naming the offending key."""
    try:
        return model.model_validate(dict(options or {}))
    except pydantic.ValidationError as err:
        e = err.errors()[0]
        loc = [str(p) for p in e["loc"] if p != "[key]"]  # "[key]": the error is in a dict key
        key = ".".join([f"data.{source}", *loc])
        if e["type"] == "extra_forbidden":
            moved = getattr(model, "MOVED", {}).get(loc[-1]) if len(loc) == 1 else None
            if moved:
                raise ValueError(f"{key}: not an option of a hub source: {moved}") from None
            allowed = fields_at(model, loc[:-1])
            hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
            raise ValueError(f"{key}: unknown option{hint}") from None
        if e["type"] == "missing":
            raise ValueError(f"{key}: required option is missing") from None
        got = f" (got {e['input']!r})" if loc else ""  # a whole-model error: input is everything
        raise ValueError(f"{key}: {e['msg']}{got}") from None


def check_pins(opts: RemoteOptions, files: Sequence[str], source: str) -> None:
    """Every key of `sha256` must name one of the files, so a typo does not silently skip a check."""
    for key in opts.sha256:
        if key not in files:
            raise ValueError(f"data.{source}.sha256.{key}: not one of the files ({', '.join(files)})")


@dataclass(frozen=True)
class NeededFile:
    """One file a remote source reads, known from its options before anything is downloaded."""
    split: str | None  # None: one file feeds every split (tiny_shakespeare cuts one text in three)
    file: str  # as named in the options (and as the key of a sha256 pin)
    url: str
    path: Path  # in the project's cache: where to put it by hand when offline
    max_bytes: int | None = None  # only this many leading bytes are downloaded and kept
    repo: str | None = None  # a hub dataset's file (else a plain URL): its repo, revision, path
    revision: str | None = None
    filename: str | None = None


def needed_file(base_url: str, file: str, cache_dir: Path, split: str | None = None) -> NeededFile:
    """`<base_url>/<file>` and its cache path."""
    url = base_url.rstrip("/") + "/" + file.lstrip("/")
    return NeededFile(split, file, url, cache_path(cache_dir, url))


def hub_file(opts: HubOptions, file: str, cache_dir: Path, split: str | None = None,
             max_bytes: int | None = None) -> NeededFile:
    """`file` of the hub dataset `opts.repo` (at opts.revision, under opts.subfolder): its URL at
    the endpoint in effect (HF_ENDPOINT) and where a copy put by hand is found (hub.hand_path)."""
    filename = opts.path(file)
    url = hub.file_url(opts.repo, filename, opts.revision, hub.settings().endpoint)
    path = hub.hand_path(cache_dir, opts.repo, filename, opts.revision)
    if max_bytes is not None:  # a prefix must never be mistaken for the whole file in the cache
        path = path.with_name(f"{path.name}.first-{max_bytes}-bytes")
    return NeededFile(split, file, url, path, max_bytes, opts.repo, opts.revision, filename)


class RemoteFiles:
    """A source's needed files, looked up before anything is downloaded.

    A file found and verified (sha256 pin) is used as it is, so a source whose files are all
    found never touches the network. Where each is looked for: a plain URL's file in the project's
    cache; a hub file first where one put by hand is found (`NeededFile.path`), then in the hub
    client's cache (pipeline/sources/hub). When a file cannot be had (offline, HF_HUB_OFFLINE=1, a
    download failing for good) the error is one line listing every needed file still missing, also
    those not tried yet, with the path to put each at, and the log says the same a line per file:
    an offline user learns everything from one run instead of one file per run.
    """

    def __init__(self, source: str, needed: Sequence[NeededFile], opts: RemoteOptions):
        check_pins(opts, list(dict.fromkeys(n.file for n in needed)), source)
        self.source, self.needed, self.opts = source, list(needed), opts
        self.hub = hub.settings() if any(n.repo is not None for n in self.needed) else None
        self.found: dict[Path, tuple[Path, str | None]] = {}  # NeededFile.path -> (file, commit)
        for n in self.needed:
            if n.path not in self.found and (where := self._locate(n)) is not None:
                self.found[n.path] = where
        if self.missing():
            log.info("%s: %d of %d files are cached; downloading the others", source,
                     len(self.found), len({n.path for n in self.needed}))

    def _locate(self, n: NeededFile) -> tuple[Path, str | None] | None:
        pin = self.opts.sha256.get(n.file)
        if n.path.is_file():
            problem = verify(n.path, pin)
            if problem is None:
                return n.path, None
            if n.repo is not None:  # (a plain URL's fetch says so itself, and replaces it)
                log.warning("%s: ignoring %s: %s", self.source, n.path, problem)
        if n.repo is not None and n.max_bytes is None:
            path = hub.cached(n.repo, n.filename, n.revision, self.hub)
            if path is not None:
                problem = verify(path, pin)
                if problem is None:
                    return path, hub.commit_of(path, n.filename)
                log.warning("%s: ignoring %s in the Hugging Face cache: %s", self.source, path, problem)
        return None

    def missing(self) -> list[NeededFile]:
        """The needed files not found yet, in order, each path once."""
        missing: dict[Path, NeededFile] = {}
        for n in self.needed:
            if n.path not in self.found:
                missing.setdefault(n.path, n)
        return list(missing.values())

    def get(self, item: NeededFile) -> tuple[Path, dict]:
        """`item`'s file (downloaded first if missing) and its provenance record."""
        pin = self.opts.sha256.get(item.file)
        if item.path in self.found:
            path, commit = self.found[item.path]
            log.info("using cached %s", path)
        elif item.repo is None:
            try:
                path, commit = fetch(item.url, item.path, sha256=pin, retries=self.opts.retries,
                                     timeout=self.opts.timeout_s), None
            except ChecksumError:
                raise  # the server sent wrong bytes: a list of files to place does not help
            except DownloadError as err:
                raise DownloadError(self._missing_message(item, err.reason), reason=err.reason) from err
        else:
            path, commit = self._download_hub(item, pin)
        self.found[item.path] = path, commit
        record = {"file": item.file, "url": item.url,
                  "sha256": pin.lower() if pin else sha256_file(path),  # a pin was verified
                  "bytes": path.stat().st_size}
        if item.repo is not None:
            record |= {"repo": item.repo, "revision": item.revision}
            if commit is not None:
                record["commit"] = commit
        if item.max_bytes is not None:
            record["max_bytes"] = item.max_bytes
        return path, record

    def _download_hub(self, item: NeededFile, pin: str | None) -> tuple[Path, str | None]:
        if self.hub.offline:
            reason = "HF_HUB_OFFLINE is set and it is not cached"
            raise DownloadError(self._missing_message(item, reason), reason=reason)
        prefix = None if item.max_bytes is None else (item.path, item.max_bytes)
        try:
            path, commit = hub.download(item.repo, item.filename, item.revision, self.hub,
                                        self.source, prefix)
        except hub.HubRefused as err:  # access refused, no such file: placing files is no answer
            raise hub.HubRefused(f"{self.source}: {item.file}: {err}", reason=err.reason) from err
        except DownloadError as err:
            raise DownloadError(self._missing_message(item, err.reason), reason=err.reason) from err
        problem = verify(path, pin)
        if problem is not None:
            if prefix is not None:
                path.unlink()  # our own file: the next run downloads it again
                raise ChecksumError(f"{self.source}: {item.url}: {problem}; deleted {path}")
            raise ChecksumError(
                f"{self.source}: {item.file}: {problem} (data.{self.source}.sha256): the hub's file "
                f"at {item.repo} revision {item.revision} (commit {commit}) is not the pinned one; "
                f"pin data.{self.source}.revision to the commit you meant, or update the pin")
        return path, commit

    def _missing_message(self, failed: NeededFile, reason: str) -> str:
        """One line (stages print only the first): the failure, then every missing file; and a
        log line per missing file, saying where to put it."""
        missing = self.missing()
        for n in missing:
            log.warning("%s: %s%s is not cached: put it at %s", self.source, n.file,
                        "" if n.max_bytes is None else f" (its first {n.max_bytes} bytes)",
                        n.path.absolute())
        where = "; ".join(
            f"{n.file}{'' if n.max_bytes is None else f' (its first {n.max_bytes} bytes)'}"
            f" -> {n.path.absolute()}" for n in missing)
        hub_files = [n for n in missing if n.repo is not None and n.max_bytes is None]
        fill = ""
        if hub_files:
            repo, revision = hub_files[0].repo, hub_files[0].revision
            fill = (f"or fill the Hugging Face cache ({self.hub.cache_dir}) where there is a network, "
                    f"with `hf download {repo} {' '.join(n.filename for n in hub_files)} --repo-type "
                    f"dataset --revision {revision}` and the same HF_HOME, ")
        return (f"{self.source}: cannot download {failed.url} ({reason}); offline? put these "
                f"files in the cache by hand: {where} ({fill}or set data.cache_dir or "
                f"$ABLATION_LAB_CACHE to a cache that has them, or use data.source: local with "
                f"your own files)")


class TextStats:
    """What a split holds, gathered a record batch at a time (memory: a histogram of lengths):
    rows, each column's lengths in characters, and targets holding a line break."""

    def __init__(self) -> None:
        self.lengths = {"source": Counter(), "target": Counter()}
        self.line_breaks = 0

    def add(self, table: pa.Table | pa.RecordBatch) -> None:
        for name, hist in self.lengths.items():
            counts = pc.value_counts(pc.utf8_length(table.column(name)))
            hist.update(dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())))
        self.line_breaks += pc.sum(pc.match_substring(table.column("target"), "\n")).as_py() or 0

    @property
    def rows(self) -> int:
        return sum(self.lengths["target"].values())


FLUSH_CHARS = 32 << 20  # text held before a record batch is written: bounds memory, not the corpus
SCHEMA = pa.schema([("source", pa.string()), ("target", pa.string())])


class SplitWriter:
    """raw/<split>.parquet written in record batches as rows arrive (atomically: the file appears
    when `close` succeeds), so memory is bounded by one batch, not by the corpus.

    A split that fits in one batch is written by one write_table call, byte-identical to the
    pq.write_table of the whole split that earlier versions did (committed dvc.lock hashes stay
    valid); a bigger one is a sequence of row groups with the same rows.
    """

    def __init__(self, path: Path, split: str, flush_chars: int = FLUSH_CHARS):
        self.path, self.split, self.flush_chars = Path(path), split, flush_chars
        self.source: list[str] = []
        self.target: list[str] = []
        self.chars = self.rows = 0
        self.stats = TextStats()
        self._atomic = atomic_path(self.path)  # entered at the first write: a failure before
        self.writer: pq.ParquetWriter | None = None  # it leaves nothing behind
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    @property
    def count(self) -> int:
        """Rows added so far."""
        return self.rows + len(self.target)

    def add(self, source: str, target: str) -> None:
        if not isinstance(source, str) or not isinstance(target, str):
            col, v = ("source", source) if not isinstance(source, str) else ("target", target)
            raise ValueError(f"{self.split}.{col}: record {self.count + 1}: expected a string, got {shown(v)}")
        self.source.append(source)
        self.target.append(target)
        self.chars += len(source) + len(target)
        if self.chars >= self.flush_chars:
            self._flush()

    def extend(self, sources: Sequence[str], targets: Sequence[str]) -> None:
        if len(sources) != len(targets):
            raise ValueError(f"{self.split}: source and target have different lengths")
        for s, t in zip(sources, targets):
            self.add(s, t)

    def extend_strings(self, sources: list[str] | None, targets: list[str]) -> None:
        """Rows a reader has already checked to be strings (None: every source is ""), added a
        list at a time: a text corpus of millions of documents costs no Python per row."""
        self.target += targets
        self.source += [""] * len(targets) if sources is None else sources
        self.chars += sum(map(len, targets)) + (0 if sources is None else sum(map(len, sources)))
        if self.chars >= self.flush_chars:
            self._flush()

    def _flush(self) -> None:
        table = pa.table({"source": pa.array(self.source, type=pa.string()),
                          "target": pa.array(self.target, type=pa.string())})
        if self.writer is None:
            self.writer = pq.ParquetWriter(self._atomic.__enter__(), table.schema)
            self._pool = ThreadPoolExecutor(1)
        self._wait()
        # Encoding and compressing a batch releases the GIL: it runs on the second core while the
        # reader parses the next one (at most two batches in memory).
        self._pending = self._pool.submit(self._write, table)
        self.rows += table.num_rows
        self.source, self.target, self.chars = [], [], 0

    def _write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.stats.add(table)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # re-raises a failed write here

    def close(self) -> int:
        """Write what is left and put the file in place; the number of rows."""
        if self.source or self.writer is None:  # an empty split is one empty table, as before
            self._flush()
        self._wait()
        self._pool.shutdown()
        self.writer.close()
        self._atomic.__exit__(None, None, None)
        return self.rows

    def abort(self) -> None:
        if self.writer is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self.writer.close()
            self._atomic.__exit__(ValueError, None, None)  # removes the temporary


class RawWriter:
    """out_dir/<split>.parquet for each split, then meta.json (`meta` + the row counts).
    `finish` returns each split's TextStats (what a source's fetch returns, for the stage's
    metrics)."""

    def __init__(self, out_dir: Path, meta: dict):
        if meta.get("task") not in TASKS:
            raise ValueError(f"meta.task: must be one of {', '.join(TASKS)} (got {meta.get('task')!r})")
        self.out_dir, self.meta, self.rows, self.stats = Path(out_dir), meta, {}, {}

    @contextmanager
    def split(self, split: str) -> Iterator[SplitWriter]:
        if split not in SPLITS:
            raise ValueError(f"raw splits must be a non-empty subset of {SPLITS} (got {split!r})")
        writer = SplitWriter(self.out_dir / f"{split}.parquet", split)
        try:
            yield writer
        except BaseException:
            writer.abort()
            raise
        self.rows[split] = writer.close()
        self.stats[split] = writer.stats

    def finish(self, **extra: object) -> dict[str, TextStats]:
        if not self.rows:
            raise ValueError(f"raw splits must be a non-empty subset of {SPLITS} (got [])")
        meta = {**self.meta, **extra, "rows": {s: self.rows[s] for s in SPLITS if s in self.rows}}
        atomic_write_json(self.out_dir / "meta.json", meta)
        return {s: self.stats[s] for s in SPLITS if s in self.stats}


def write_raw(out_dir: Path, splits: Mapping[str, Mapping[str, Sequence[str]]], meta: dict
              ) -> dict[str, TextStats]:
    """Write out_dir/<split>.parquet (string columns source, target) and out_dir/meta.json.

    `splits` maps split name -> {"source": [...], "target": [...]} (a DataFrame works too).
    `meta` must hold "source" and "task"; row counts are added under "rows". Returns each
    split's TextStats.
    """
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown or not splits:
        raise ValueError(f"raw splits must be a non-empty subset of {SPLITS} (got {sorted(splits)})")
    raw = RawWriter(out_dir, meta)
    for split in (s for s in SPLITS if s in splits):
        with raw.split(split) as w:
            w.extend(list(splits[split]["source"]), list(splits[split]["target"]))
    return raw.finish()
