"""Your own files as a dataset: parquet, jsonl, json, csv, plain text or parallel text.

    data:
      source: local
      local:
        task: translation          # summarization | translation | language_modeling
        paths: {train: data/local/my/train.jsonl, validation: data/local/my/dev.jsonl}
        columns: {source: en, target: de}

Paths. A split's entry is a file, a directory (its files whose format the name tells, or with
`format` set every non-hidden file, sorted by name), a pair of line-aligned text files
{source: PATH, target: PATH}, or a list of these. A split left out is carved from train by the
filter stage. Relative paths are relative to the working directory; under DVC the files live in
data/local/ (the folder dvc.yaml tracks, so edits rerun `download`). Nothing is downloaded or
cached.

Formats, told by the suffix (under a `.gz`: `train.jsonl.gz` is gzip-compressed jsonl) unless
`format` (parquet | jsonl | json | csv | txt | iwslt_xml | iwslt_tags) is set, which also reads a
misnamed gzip file. `*.xml` and `train.tags.*` are the IWSLT release as it ships
(pipeline/sources/markup.py): a pair of them gives aligned sentence pairs, one alone (language
modelling) a document per talk. A file read as plain text (txt, or a side of a parallel pair)
whose first lines are XML/SGML markup is an error naming the format to use.
A name that disagrees with the first bytes (gzip named .jsonl, parquet named .jsonl, .gz that is
not gzip) is an error before anything is parsed. Text is UTF-8. Examples:

    paths: {train: data/local/cnn/train.parquet}       # a dotted column may be a struct field
    columns: {source: article, target: highlights}

    paths: {train: data/local/m/train.jsonl.gz}        # {"en": "Hello.", "de": "Hallo."} a line
    columns: {source: en, target: de}

    paths: {train: data/local/iwslt/train.json}        # [{"translation": {"de": .., "en": ..}}]
    columns: {source: translation.en, target: translation.de}   # dotted: nested keys

    paths: {train: data/local/cnn/train.csv.gz}        # header row; cells stay strings
    columns: {source: article, target: highlights}

    paths: {train: {source: data/local/m30k/train.en.gz, target: data/local/m30k/train.de.gz}}

The last is parallel text as Moses, fairseq, Multi30k and WMT ship it: line i of the source file
goes with line i of the target file (each line loses only its "\\n" or "\\r\\n"); the files must
have the same number of lines; translation and summarization only; `format` does not apply
(except that, when set, the first bytes rather than the name tell whether a file is gzip).

Language modelling: target is the text and source is "". From tabular files, each record of
`columns.target` is one document. Text files (.txt) are split into documents by `documents`:

    documents: paragraph   # default: each blank-line separated block is its own document
    documents: line        # one document per non-blank line (one story per line)
    documents: file        # the whole file is one document
    documents: separator   # documents end at `separator`, e.g. TinyStories:
    separator: "<|endoftext|>"

A document is one row and is never split across rows, so with `paragraph` a story of several
paragraphs becomes several rows: use line, file or separator to keep stories whole. A document
keeps its inner newlines ("\\r\\n" read as "\\n"); only blank space around it is stripped. The
filter stage carves missing language-modelling splits from the end of train, in file order.

`max_rows` keeps the first N rows of each split (files are parsed only as far as needed, except
that both parallel files are counted to the end).

Every format is streamed and raw/ is written in record batches, so memory does not grow with the
files; a line or document longer than `max_record_chars` (default 16 Mi characters: a file
without line breaks, a binary file) is an error naming the file and line.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, PositiveInt, Tag, field_validator

from pipeline.io.progress import Progress
from pipeline.sources.common import RawWriter, Split, parse_options, shown
from pipeline.sources.formats import PARQUET_MAGIC, is_parquet, iter_csv, iter_json, iter_jsonl, iter_parquet
from pipeline.sources.http import sha256_file
from pipeline.sources.markup import (
    check_not_markup, tagged_documents, tagged_pairs, xml_documents, xml_pairs,
)
from pipeline.sources.plain_text import delimited_batches, iter_parallel, line_batches, paragraph_batches, read_text
from pipeline.sources.text_io import GZIP_MAGIC, cut, head_bytes

NAME = "local"
task = None  # chosen by the `task` option; meta.json records it

Format = Literal["parquet", "jsonl", "json", "csv", "txt", "iwslt_xml", "iwslt_tags"]
SUFFIXES: dict[str, Format] = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "json",
                               ".csv": "csv", ".txt": "txt", ".xml": "iwslt_xml"}
IWSLT = ("iwslt_xml", "iwslt_tags")
MAX_RECORD_CHARS = 16 << 20


class Columns(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = "source"
    target: str = "target"


class Pair(BaseModel):
    """Line-aligned parallel text files."""
    model_config = ConfigDict(extra="forbid")
    source: str
    target: str


# Tagged so that a bad pair is reported at its own key (paths.train.0.pair.target), not as
# "not a string".
Entry = Annotated[Union[Annotated[str, Tag("file")], Annotated[Pair, Tag("pair")]],
                  Discriminator(lambda v: "pair" if isinstance(v, (dict, Pair)) else "file")]


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: Literal["summarization", "translation", "language_modeling"]
    paths: dict[Split, list[Entry]]  # a single path or pair is accepted and becomes a list
    format: Literal["auto", "parquet", "jsonl", "json", "csv", "txt", "iwslt_xml", "iwslt_tags"] = "auto"
    columns: Columns = Columns()
    documents: Literal["paragraph", "line", "file", "separator"] = "paragraph"  # txt only
    separator: str | None = None  # with documents: separator
    max_rows: PositiveInt | None = None  # keep the first N rows of each split
    # A longer line or document is an error, not a silent multi-GB read (a file with no line
    # breaks, a binary file named .txt).
    max_record_chars: PositiveInt = MAX_RECORD_CHARS

    @field_validator("paths", mode="before")
    @classmethod
    def _one_entry_is_a_list(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: v if isinstance(v, list) else [v] for k, v in value.items()}
        return value


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict:  # noqa: ARG001 (no cache)
    opts = parse_options(Options, options, NAME)
    _check(opts)
    with ThreadPoolExecutor(1) as hasher:  # checksums on the second core while the first parses
        return _fetch(opts, RawWriter(out_dir, {"source": NAME, "task": opts.task}), hasher)


def _fetch(opts: Options, raw: RawWriter, hasher: ThreadPoolExecutor) -> dict:
    records = []
    for split, entry in opts.paths.items():
        key = f"data.{NAME}.paths.{split}"
        items = _expand(entry, opts, key)
        files = [p for item in items for p in (item if isinstance(item, tuple) else (item,))]
        total = sum(p.stat().st_size for p in files)
        with raw.split(split) as rows, Progress(f"reading {split}", total=total, unit="B") as progress:
            for item in items:
                left = None if opts.max_rows is None else opts.max_rows - rows.count
                if left == 0:
                    break
                for p in item if isinstance(item, tuple) else (item,):
                    records.append({"split": split, "path": str(p), "sha256": hasher.submit(sha256_file, p),
                                    "bytes": p.stat().st_size})
                batches = _batches(item, opts, progress, left)
                for sources, targets in batches:
                    if left is not None and len(targets) >= left:
                        sources, targets = sources and sources[:left], targets[:left]
                    rows.extend_strings(sources, targets)
                    left = None if left is None else left - len(targets)
                    if left == 0:
                        break
                if isinstance(item, tuple):
                    for _ in batches:  # both files to the end: a line missing anywhere is an error
                        pass
            if not rows.count:
                raise ValueError(f"{key}: no rows found in {[_show(e) for e in entry]}")
    for record in records:
        record["sha256"] = record["sha256"].result()
    # The default limit is left out of meta.json so raw/ of existing studies stays byte-identical.
    default = {"max_record_chars"} if opts.max_record_chars == MAX_RECORD_CHARS else set()
    return raw.finish(files=records, options=opts.model_dump(exclude=default))


Batch = tuple[list[str] | None, list[str]]  # (sources, or None for all "", targets)


def _batches(item: Path | tuple[Path, Path], opts: Options, progress: Progress,
             max_rows: int | None) -> Iterator[Batch]:
    """The rows of one file or pair, streamed as lists of checked strings (tabular files are
    parsed no further than max_rows records; text at most a chunk further)."""
    limit = opts.max_record_chars
    if isinstance(item, tuple):
        fmt = _pair_format(item, opts)
        gz = tuple(_kind(p, "lines" if fmt == "lines" else fmt, opts.format != "auto")[1] for p in item)
        if fmt == "lines":
            for p, z in zip(item, gz):
                check_not_markup(p, z, "parallel text (one sentence a line)")
            pairs = iter_parallel(*item, gz=gz, limit=limit, progress=progress)
        else:
            pairs = (xml_pairs if fmt == "iwslt_xml" else tagged_pairs)(*item, gz, limit, progress)
        return _batched(pairs)
    return _read(item, opts, progress, max_rows)


def _batched(pairs: Iterator[tuple[str, str]], n: int = 4096) -> Iterator[Batch]:
    while batch := list(itertools.islice(pairs, n)):
        sources, targets = zip(*batch)
        yield list(sources), list(targets)


def _pair_format(item: tuple[Path, Path], opts: Options) -> str:
    """"lines", or an IWSLT format when `format` says so or both names do."""
    if opts.format in IWSLT:
        return opts.format
    named = {_named_format(p)[0] for p in item}
    if opts.format == "auto" and len(named) == 1 and named <= set(IWSLT):
        return named.pop()
    if opts.format == "auto" and named & set(IWSLT):
        raise ValueError(f"{item[0]} and {item[1]}: one is named as an IWSLT file and the other "
                         f"is not; set data.{NAME}.format")
    return "lines"


def _check(opts: Options) -> None:
    if "train" not in opts.paths:
        raise ValueError(f"data.{NAME}.paths.train: required (a file, list of files or directory)")
    key = f"data.{NAME}.separator"
    if opts.documents == "separator" and not opts.separator:
        raise ValueError(f'{key}: required with documents: separator (e.g. "<|endoftext|>")')
    if opts.separator is not None and opts.documents != "separator":
        raise ValueError(f"{key}: only used with documents: separator "
                         f"(documents is {opts.documents})")
    if opts.separator and "\n" in opts.separator:  # documents are split line by line
        raise ValueError(f"{key}: must not contain a line break "
                         f"(documents: paragraph splits at blank lines)")


def _show(entry: str | Pair) -> Any:
    return entry.model_dump() if isinstance(entry, Pair) else entry


def _expand(entry: list[str | Pair], opts: Options, key: str) -> list[Path | tuple[Path, Path]]:
    """The files (and pairs of files) of a split, all checked before any is read."""
    items: list[Path | tuple[Path, Path]] = []
    for item in entry:
        if isinstance(item, Pair):
            if opts.task == "language_modeling":
                raise ValueError(f"{key}: a source/target pair of parallel files needs task "
                                 f"translation or summarization, not language_modeling")
            items.append((_file(item.source, f"{key}.source"), _file(item.target, f"{key}.target")))
            continue
        p = Path(item).expanduser()
        if p.is_dir():
            # auto: the files whose name tells the format; explicit format: every non-hidden file
            found = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                           and (opts.format != "auto" or _named_format(f)[0] is not None))
            if not found:
                raise ValueError(f"{key}: directory {p} holds no data files")
            items += found
        else:
            items.append(_file(item, key))
    return items


def _file(item: str, key: str) -> Path:
    p = Path(item).expanduser()
    if p.is_dir():  # only a pair's side gets here with a directory
        raise ValueError(f"{key}: {p} is a directory; a parallel pair is two files")
    if not p.is_file():
        raise ValueError(f"{key}: no such file or directory: {p}")
    return p


def _named_format(path: Path) -> tuple[Format | None, bool]:
    """The format the name says (the suffix under a .gz) and whether it says gzip."""
    name = path.name.lower()
    gz = name.endswith(".gz")
    if name.startswith("train.tags."):  # IWSLT training text: train.tags.en-de.en
        return "iwslt_tags", gz
    return SUFFIXES.get(Path(name[:-3] if gz else name).suffix), gz


def _kind(path: Path, fmt: str, explicit: bool) -> tuple[str, bool]:
    """The file's format and whether it is gzip-compressed, checked against its first bytes.

    fmt: the `format` option, or "lines" for a parallel text file. With an explicit format the
    bytes decide about gzip; otherwise name and bytes must agree (a name that lies would mislead
    every other tool too, and reading on would fail with a confusing parse error).
    """
    head = head_bytes(path)
    gz = head.startswith(GZIP_MAGIC)
    shown = " ".join(f"0x{b:02x}" for b in head[:2])
    fix = f"data.{NAME}.format"
    if fmt == "auto":
        fmt, named_gz = _named_format(path)
        if fmt is None:
            raise ValueError(f"{path}: cannot tell the format from the suffix; set {fix} "
                             f"(one of {', '.join(Format.__args__)})")
    else:
        named_gz = path.name.lower().endswith(".gz")
    if not explicit and gz and not named_gz:
        raise ValueError(f"{path}: looks gzip-compressed (starts with {shown}); "
                         f"name it {path}.gz or set {fix}")
    if not explicit and named_gz and not gz:
        raise ValueError(f"{path}: named .gz but not gzip-compressed (starts with {shown}); "
                         f"rename it or set {fix}")
    if fmt == "parquet":
        if gz:
            raise ValueError(f"{path}: gzip-compressed parquet; decompress it (parquet files "
                             f"are compressed inside)")
        if head != PARQUET_MAGIC:
            raise ValueError(f"{path}: not a parquet file (starts with {head[:4]!r}, not "
                             f"{PARQUET_MAGIC!r}); name it after its format or set {fix}")
    elif is_parquet(path):
        raise ValueError(f"{path}: looks like a parquet file (starts with PAR1), not {fmt}; "
                         f"name it *.parquet or set {fix}: parquet")
    return fmt, gz


def _read(path: Path, opts: Options, progress: Progress, max_rows: int | None) -> Iterator[Batch]:
    fmt, gz = _kind(path, opts.format, opts.format != "auto")
    lm = opts.task == "language_modeling"
    limit = opts.max_record_chars
    if fmt in ("txt", *IWSLT):
        if not lm:
            if fmt in IWSLT:
                raise ValueError(f"{path}: an IWSLT file holds one language; for task "
                                 f"{opts.task} name a {{source, target}} pair of them")
            raise ValueError(f"{path}: .txt files only work with task language_modeling "
                             f"(task is {opts.task}); use parquet, jsonl, json or csv with "
                             f"columns, or a {{source, target}} pair of line-aligned files")
        if fmt == "txt":
            check_not_markup(path, gz, "plain text")
        return ((None, docs) for docs in _documents(path, gz, fmt, opts, progress))
    wanted = list(dict.fromkeys([opts.columns.target] if lm
                                else [opts.columns.source, opts.columns.target]))
    if fmt == "parquet":
        batches = iter_parquet(path, wanted, max_rows, progress)
    elif fmt == "csv":
        batches = _csv_batches(path, gz, wanted, progress, max_rows)
    else:
        records = itertools.islice((iter_jsonl if fmt == "jsonl" else iter_json)(path, gz, limit, progress),
                                   max_rows)
        batches = ({c: [_lookup(rec, c, path, i) for i, rec in chunk] for c in wanted}
                   for chunk in _chunked(enumerate(records, 1)))
    return _table_batches(batches, path, wanted, opts)


def _chunked(items: Iterator, n: int = 4096) -> Iterator[list]:
    while chunk := list(itertools.islice(items, n)):
        yield chunk


def _csv_batches(path: Path, gz: bool, wanted: list[str], progress: Progress, max_rows: int | None
                 ) -> Iterator[dict[str, list]]:
    for frame in iter_csv(path, max_rows, gz=gz, progress=progress):
        missing = [c for c in wanted if c not in frame.columns]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r} (columns: {', '.join(frame.columns)})")
        yield {c: frame[c].tolist() for c in wanted}


def _table_batches(batches: Iterable[dict[str, list]], path: Path, wanted: list[str], opts: Options
                   ) -> Iterator[Batch]:
    """(sources, targets) of each batch of records; a value that is not a string names its row
    (1-based)."""
    lm = opts.task == "language_modeling"
    n = 0
    for batch in batches:
        for c in wanted:
            bad = next((i for i, v in enumerate(batch[c]) if not isinstance(v, str)), None)
            if bad is not None:
                v = batch[c][bad]
                hint = (f"; pick a field with a dotted name, e.g. {c}.{next(iter(v))}"
                        if isinstance(v, dict) and v else "")
                raise ValueError(f"{path}: record {n + bad + 1} column {c!r} is {shown(v)}, "
                                 f"not a string{hint}")
        targets = batch[opts.columns.target]
        yield (None if lm else batch[opts.columns.source]), targets
        n += len(targets)


def _documents(path: Path, gz: bool, fmt: str, opts: Options, progress: Progress) -> Iterator[list[str]]:
    """Lists of documents (a chunk's worth at a time for the big modes)."""
    limit = opts.max_record_chars
    if fmt == "iwslt_xml":
        return _chunked(xml_documents(path, gz, limit, progress), 256)
    if fmt == "iwslt_tags":
        return _chunked(tagged_documents(path, gz, limit, progress), 256)
    if opts.documents == "separator":
        return delimited_batches(path, opts.separator or "", gz=gz, errors="strict", limit=limit,
                                 progress=progress)
    if opts.documents == "line":
        return line_batches(path, gz, limit, progress)
    if opts.documents == "file":
        return iter([d] for d in [read_text(path, gz, limit, progress).strip()] if d)
    return paragraph_batches(path, gz, limit, progress)

def _lookup(record: dict, key: str, path: Path, i: int) -> Any:
    """record[key]; a dotted key that is not a key walks nested objects ("translation.en")."""
    if key in record:
        return record[key]
    value: Any = record
    for depth, part in enumerate(key.split(".")):
        if not isinstance(value, dict) or part not in value:
            parent = ".".join(key.split(".")[:depth]) or "the record"
            has = (f"{parent} has keys: {cut(', '.join(map(str, value)))}" if isinstance(value, dict)
                   else f"{parent} is a {type(value).__name__}")
            raise ValueError(f"{path}: record {i} has no key {key!r} ({has})")
        value = value[part]
    return value
