"""What the sources share: option parsing, the files a remote source needs and their download,
and writing raw/<split>.parquet + meta.json. Sources import this, never the package, so the
registry in __init__ and the sources it loads do not import each other."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import pydantic
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from pipeline.atomic import atomic_path, atomic_write_json
from pipeline.params import fields_at
from pipeline.sources.http import ChecksumError, DownloadError, cache_path, fetch, is_cached, sha256_file

log = logging.getLogger(__name__)

TASKS = ("summarization", "translation", "language_modeling")
SPLITS = ("train", "validation", "test")
SHA256 = pydantic.constr(pattern=r"^[0-9a-fA-F]{64}$")
Split = Literal["train", "validation", "test"]
Direction = Literal["en-de", "de-en"]


class RemoteOptions(BaseModel):
    """Options shared by the downloaded sources; each source subclasses it with its defaults."""
    model_config = ConfigDict(extra="forbid")

    max_rows: PositiveInt | None = None  # keep the first N rows of each split (None: all)
    sha256: dict[str, SHA256] = Field(default_factory=dict)  # file (as in `files`) -> digest
    timeout_s: float = Field(30.0, gt=0)  # per socket read; a stall this long is retried
    retries: int = Field(4, ge=0)


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
    path: Path  # where the cache keeps it, i.e. where to put it by hand when offline
    max_bytes: int | None = None  # only this many leading bytes are downloaded and kept


def needed_file(base_url: str, file: str, cache_dir: Path, split: str | None = None,
                max_bytes: int | None = None) -> NeededFile:
    """`<base_url>/<file>` and its cache path."""
    url = base_url.rstrip("/") + "/" + file.lstrip("/")
    path = cache_path(cache_dir, url)
    if max_bytes is not None:  # a prefix must never be mistaken for the whole file in the cache
        path = path.with_name(f"{path.name}.first-{max_bytes}-bytes")
    return NeededFile(split, file, url, path, max_bytes)


class RemoteFiles:
    """A source's needed files, checked against the cache before anything is downloaded.

    A file that is in the cache and verifies (sha256 pin) is used as it is, so a source whose
    files are all cached never touches the network. When a download fails for good, the error
    lists every needed file still missing, also those not attempted yet, with the path to put
    each at: an offline user learns everything from one run instead of one file per run.
    """

    def __init__(self, source: str, needed: Sequence[NeededFile], opts: RemoteOptions):
        check_pins(opts, list(dict.fromkeys(n.file for n in needed)), source)
        self.source, self.needed, self.opts = source, list(needed), opts
        self.cached = {n.path for n in self.needed
                       if is_cached(n.path, sha256=opts.sha256.get(n.file))}
        if self.missing():
            log.info("%s: %d of %d files are cached; downloading the others", source,
                     len(self.cached), len({n.path for n in self.needed}))

    def missing(self) -> list[NeededFile]:
        """The needed files not in the cache yet, in order, each path once."""
        missing: dict[Path, NeededFile] = {}
        for n in self.needed:
            if n.path not in self.cached:
                missing.setdefault(n.path, n)
        return list(missing.values())

    def get(self, item: NeededFile) -> tuple[Path, dict]:
        """`item`'s cached file (downloaded first if missing) and its provenance record."""
        pin = self.opts.sha256.get(item.file)
        if item.path in self.cached:
            log.info("using cached %s", item.path)
        else:
            try:
                fetch(item.url, item.path, sha256=pin, retries=self.opts.retries,
                      timeout=self.opts.timeout_s, max_bytes=item.max_bytes)
            except ChecksumError:
                raise  # the server sent wrong bytes: a list of files to place does not help
            except DownloadError as err:
                raise DownloadError(self._missing_message(item, err), reason=err.reason) from err
            self.cached.add(item.path)
        record = {"file": item.file, "url": item.url,
                  "sha256": pin.lower() if pin else sha256_file(item.path),  # a pin was verified
                  "bytes": item.path.stat().st_size}
        if item.max_bytes is not None:
            record["max_bytes"] = item.max_bytes
        return item.path, record

    def _missing_message(self, failed: NeededFile, err: DownloadError) -> str:
        """One line (stages print only the first): the failure, then every missing file."""
        where = "; ".join(
            f"{n.file}{'' if n.max_bytes is None else f' (its first {n.max_bytes} bytes)'}"
            f" -> {n.path.absolute()}" for n in self.missing())
        return (f"{self.source}: cannot download {failed.url} ({err.reason}); offline? put these "
                f"files in the cache by hand: {where} (or set data.cache_dir or "
                f"$ABLATION_LAB_CACHE to a cache that has them, or use data.source: local with "
                f"your own files)")


def write_raw(out_dir: Path, splits: Mapping[str, Mapping[str, Sequence[str]]], meta: dict) -> dict:
    """Write out_dir/<split>.parquet (string columns source, target) and out_dir/meta.json.

    `splits` maps split name -> {"source": [...], "target": [...]} (a DataFrame works too).
    `meta` must hold "source" and "task"; row counts are added under "rows". Returns the meta.
    """
    if meta.get("task") not in TASKS:
        raise ValueError(f"meta.task: must be one of {', '.join(TASKS)} (got {meta.get('task')!r})")
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown or not splits:
        raise ValueError(f"raw splits must be a non-empty subset of {SPLITS} (got {sorted(splits)})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = {}
    for split in (s for s in SPLITS if s in splits):
        columns = {c: list(splits[split][c]) for c in ("source", "target")}
        if len(columns["source"]) != len(columns["target"]):
            raise ValueError(f"{split}: source and target have different lengths")
        for col, values in columns.items():
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise ValueError(f"{split}.{col}: record {bad + 1}: expected a string, got {shown(values[bad])}")
        table = pa.table({c: pa.array(v, type=pa.string()) for c, v in columns.items()})
        with atomic_path(out_dir / f"{split}.parquet") as tmp:
            pq.write_table(table, tmp)
        rows[split] = table.num_rows
    meta = {**meta, "rows": rows}
    atomic_write_json(out_dir / "meta.json", meta)
    return meta
