"""Readers for the file formats the sources parse (parquet, jsonl, json, csv, plain text).

They read lazily and stop at `max_rows`, so capping a split never loads a multi-GB file, and their
errors name the file (and line, record or column) at fault. Text formats may be gzip-compressed:
`gz=None` tells it from the first bytes, and the file is decompressed as it is read. Text is
UTF-8 (a leading byte-order mark is dropped); a bad byte is reported with its offset and line,
never as a bare codec error.

Memory is bounded by a chunk of text and the longest record, never by the file: text is read a
chunk at a time and a record longer than `limit` characters (a file without line breaks, a
misnamed binary) is an error naming the file and line. `progress` (pipeline.progress) is
advanced by the bytes read.
"""
from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"  # at the start and at the end of every parquet file
_CHUNK = 1 << 20
NL = "\n"
_BLANK = re.compile(r"[ \t\n\r]*")

if TYPE_CHECKING:
    from pipeline.progress import Progress


def head_bytes(path: Path, n: int = 4) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def is_parquet(path: Path) -> bool:
    with open(path, "rb") as f:
        start = f.read(4)
        if f.seek(0, 2) < 8:
            return False
        f.seek(-4, 2)
        return start == f.read(4) == PARQUET_MAGIC


@contextmanager
def open_text(path: Path, gz: bool | None = None, errors: str = "strict",
              newline: str | None = None, progress: Progress | None = None) -> Iterator[TextIO]:
    """`path` opened for streamed UTF-8 reading, through gzip when it is compressed.

    gz None: tell it from the magic bytes. newline as for open(): None reads "\\r\\n" as "\\n";
    "\\n" ends lines at "\\n" only; "" leaves line ends alone (CSV). progress: advanced by the
    bytes of `path` read (compressed bytes for gzip), as `chunks` reads on.
    """
    if gz is None:
        gz = head_bytes(path, 2) == GZIP_MAGIC
    raw = open(path, "rb")  # noqa: SIM115 - closed by the TextIOWrapper around it
    body = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
    # utf-8-sig: a byte-order mark (Notepad, Excel CSV) must not become part of the first value
    f = io.TextIOWrapper(body, encoding="utf-8-sig", errors=errors, newline=newline)
    f.progress, f.raw_file, f.read_pos = progress, raw, 0  # for `chunks`
    # The errors are checked against this file's own bytes before they are blamed on it: with
    # two files open (parallel text) the error may come from the other one.
    try:
        with f, raw:
            yield f
    except UnicodeDecodeError:
        bad = _first_bad_byte(path, gz)
        if bad is None:
            raise
        raise ValueError(f"{path}: not UTF-8 text ({bad})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        if not gz:
            raise
        lines = _gzip_readable_lines(path)
        if lines is None:
            raise
        raise ValueError(f"{path}: corrupt or truncated gzip file ({err}; it breaks off after "
                         f"line {lines} of the decompressed text)") from None


def chunks(f: TextIO, size: int = _CHUNK) -> Iterator[str]:
    """The text of a file from open_text, `size` characters at a time (memory: one chunk)."""
    while True:
        chunk = f.read(size)
        if f.progress is not None:
            pos = f.raw_file.tell()
            f.progress.update(pos - f.read_pos)
            f.read_pos = pos
        if not chunk:
            return
        yield chunk


def too_long(path: Path, what: str, limit: int) -> ValueError:
    """A record over the limit: reading on would hold an unbounded amount of text."""
    return ValueError(f"{path}: {what} is longer than {limit:,} characters (a file without line "
                      f"breaks, or the wrong format?); raise data.local.max_record_chars if it is "
                      f"meant to be one record")


def iter_raw_lines(f: TextIO, path: Path, limit: int | None = None) -> Iterator[str]:
    """The lines of a file from open_text, without their "\\n" (a last line without one counts
    too, as `for line in f` and `wc -l` + 1 see it). A line longer than `limit` characters is
    an error naming the line, found while reading: memory stays bounded by `limit`.
    """
    tail, lineno = "", 0
    for chunk in chunks(f):
        parts = (tail + chunk).split("\n") if tail else chunk.split("\n")
        tail = parts.pop()
        if limit is not None and (len(tail) > limit or (parts and max(map(len, parts)) > limit)):
            at = next((i for i, p in enumerate(parts) if len(p) > limit), len(parts))
            raise too_long(path, f"line {lineno + at + 1}", limit)
        lineno += len(parts)
        yield from parts
    if tail:
        yield tail


def _first_bad_byte(path: Path, gz: bool) -> str | None:
    """Where UTF-8 decoding fails, found by rescanning the raw bytes a chunk at a time (on the
    error path only: TextIOWrapper's error gives an offset into some internal chunk, not into
    the file), with its 1-based line as an editor shows it."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 0
    where = " of the decompressed data" if gz else ""
    with (gzip.open if gz else open)(path, "rb") as f:
        for chunk in itertools.chain(iter(lambda: f.read(_CHUNK), b""), [None]):
            pending = decoder.getstate()[0]  # bytes of a character cut by the last chunk
            try:
                decoder.decode(chunk or b"", final=chunk is None)
            except UnicodeDecodeError as err:  # err.object is the pending bytes + this chunk
                at = offset - len(pending) + err.start
                line = lines + err.object.count(b"\n", len(pending), err.start) + 1
                return f"byte 0x{err.object[err.start]:02x} at offset {at}{where}, line {line}"
            offset += len(chunk or b"")
            lines += (chunk or b"").count(b"\n")
    return None


def _gzip_readable_lines(path: Path) -> int | None:
    """How many lines of a damaged gzip file decompress (None: it decompresses fine)."""
    lines = 0
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                lines += chunk.count(b"\n")
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return lines
    return None


def _file_progress(progress: Progress | None, size: int, done: float, fraction: float) -> float:
    """Advance `progress` to `fraction` of a file of `size` bytes (formats read by a library)."""
    if progress is None:
        return done
    now = size * min(fraction, 1.0)
    progress.update(now - done)
    return now


def iter_parquet(path: Path, columns: Sequence[str], max_rows: int | None = None,
                 progress: Progress | None = None) -> Iterator[dict[str, list]]:
    """The given columns of a parquet file, a record batch at a time, as python lists (structs
    become dicts).

    A dotted name that is not a column names a struct field: "translation.en" is field "en" of
    the struct column "translation" (as in Hugging Face translation datasets).
    """
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: not a readable parquet file ({err})") from None
    fields = {c: _struct_path(path, pf.schema_arrow, c) for c in columns}
    tops = list(dict.fromkeys(p[0] for p in fields.values()))
    size, total, n, done = path.stat().st_size, max(pf.metadata.num_rows, 1), 0, 0.0
    try:  # a damaged page shows only when it is decoded, as a bare "Corrupt snappy ..." error
        for batch in pf.iter_batches(batch_size=4096, columns=tops):
            if max_rows is not None:
                batch = batch.slice(0, max_rows - n)
            out = {}
            for c, (top, *sub) in fields.items():
                values = batch.column(top)
                out[c] = (pc.struct_field(values, sub) if sub else values).to_pylist()
            n += batch.num_rows
            done = _file_progress(progress, size, done, n / total)
            yield out
            if max_rows is not None and n >= max_rows:
                break
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: corrupt parquet file ({str(err).strip().splitlines()[0]})") from None
    _file_progress(progress, size, done, 1.0)


def read_parquet(path: Path, columns: Sequence[str], max_rows: int | None = None
                 ) -> dict[str, list]:
    """iter_parquet, whole (for the small files of the remote sources)."""
    out: dict[str, list] = {c: [] for c in columns}
    for batch in iter_parquet(path, columns, max_rows):
        for c in columns:
            out[c].extend(batch[c])
    return out


def _struct_path(path: Path, schema: pa.Schema, name: str) -> list[str]:
    """[column] for a column, [column, field, ...] for a dotted struct field."""
    if name in schema.names:
        return [name]
    parts = name.split(".")
    if parts[0] not in schema.names:
        raise ValueError(f"{path}: no column {name!r} (columns: {', '.join(schema.names)})")
    typ = schema.field(parts[0]).type
    for i, part in enumerate(parts[1:], 1):
        if not pa.types.is_struct(typ):
            raise ValueError(f"{path}: no column {name!r} ({'.'.join(parts[:i])} is {typ}, "
                             f"not a struct)")
        if typ.get_field_index(part) < 0:
            have = ", ".join(typ.field(j).name for j in range(typ.num_fields))
            raise ValueError(f"{path}: no column {name!r} ({'.'.join(parts[:i])} has fields: "
                             f"{have})")
        typ = typ.field(part).type
    return parts


def iter_jsonl(path: Path, gz: bool | None = None, limit: int | None = None,
               progress: Progress | None = None) -> Iterator[dict]:
    """One JSON object per non-empty line."""
    with open_text(path, gz, progress=progress) as f:
        for lineno, line in enumerate(iter_raw_lines(f, path, limit), 1):
            if not line.strip():
                continue
            # line 1 is where a JSON array or a pretty-printed object shows up
            hint = ("" if lineno > 1 else "; a JSON array belongs in a .json file"
                    if line.lstrip().startswith("[")
                    else "; expected one JSON object per line, or a JSON array in a .json file")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg}){hint}: "
                                 f"{quote(line)}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got "
                                 f"{type(row).__name__}{hint}")
            yield row


def quote(text: str, n: int = 80) -> str:
    """`text` for an error message: repr'd, cut to about n characters."""
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text):,} characters)"


def cut(text: str, n: int = 80) -> str:
    """`text` (already printable, e.g. a repr) cut to about n characters for an error message."""
    return text if len(text) <= n else text[:n] + f"... ({len(text):,} characters)"


def read_jsonl(path: Path, max_rows: int | None = None) -> list[dict]:
    return list(itertools.islice(iter_jsonl(path), max_rows))


def iter_json(path: Path, gz: bool | None = None, limit: int | None = None,
              progress: Progress | None = None) -> Iterator[dict]:
    """A .json file: an array of objects, or JSON Lines (what `datasets`' to_json writes).

    The array is decoded element by element from a buffer of about one chunk, so memory is
    bounded by the largest element (at most `limit` characters), not by the file.
    """
    with open_text(path, gz) as f:
        array = f.read(1 << 16).lstrip().startswith("[")
    if not array:
        yield from iter_jsonl(path, gz, limit, progress)
        return
    with open_text(path, gz, progress=progress) as f:
        yield from _JsonArray(path, chunks(f), limit).elements()


class _JsonArray:
    """The elements of a JSON array read from text chunks; errors name the element and line."""

    def __init__(self, path: Path, parts: Iterator[str], limit: int | None):
        self.path, self.parts, self.limit = path, parts, limit
        self.buf, self.pos, self.line, self.eof = "", 0, 1, False  # line: 1-based, at buf[0]
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        """Append the next chunk (dropping what was consumed); False at the end of the file."""
        chunk = next(self.parts, None)
        if chunk is None:
            self.eof = True
            return False
        self.line += self.buf.count("\n", 0, self.pos)
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        return True

    def _skip(self) -> str:
        """Skip blank space; the next character ("" at the end of the file)."""
        while True:
            self.pos = _BLANK.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def _where(self, pos: int) -> str:
        return f"line {self.line + self.buf.count(NL, 0, pos)}"

    def elements(self) -> Iterator[dict]:
        self._skip()
        self.pos += 1  # the "["
        if self._skip() == "]":
            self.pos += 1
        else:
            for n in itertools.count(1):
                value = self._decode(n)
                if not isinstance(value, dict):
                    raise ValueError(f"{self.path}: array element {n}: expected a JSON object, "
                                     f"got {type(value).__name__}")
                yield value
                sep = self._skip()
                self.pos += 1
                if sep == "]":
                    break
                if not sep:
                    last = self.line + self.buf.count(NL, 0, len(self.buf.rstrip()))
                    raise ValueError(f"{self.path}: after array element {n}: expected ',' or ']', "
                                     f"got the end of the file after line {last} (cut short?)")
                if sep != ",":
                    raise ValueError(f"{self.path}: after array element {n} "
                                     f"({self._where(self.pos - 1)}): expected ',' or ']', got {sep!r}")
        if self._skip():
            raise ValueError(f"{self.path}: text after the end of the JSON array "
                             f"({self._where(self.pos)})")

    def _decode(self, n: int) -> object:
        self._skip()
        while True:
            try:
                value, self.pos = self.decoder.raw_decode(self.buf, self.pos)
                return value
            except json.JSONDecodeError as err:
                # Incomplete in the buffer, or invalid: read on (up to the limit) before blaming it.
                if self.limit is not None and len(self.buf) - self.pos > self.limit:
                    raise too_long(self.path, f"array element {n} ({self._where(self.pos)})",
                                   self.limit) from None
                if not self.eof and self._more():
                    continue
                ends = err.pos >= len(self.buf.rstrip()) - 1 or err.msg.startswith("Unterminated")
                cut = " (the file ends inside it)" if ends else ""
                raise ValueError(f"{self.path}: array element {n}: invalid JSON ({err.msg}, "
                                 f"{self._where(err.pos)}){cut}") from None


def iter_csv(path: Path, max_rows: int | None = None, gz: bool | None = None,
             progress: Progress | None = None, rows: int = 10_000) -> Iterator[pd.DataFrame]:
    """A CSV with a header row, `rows` records at a time; every cell is read as a string (no NaN,
    no number parsing). The first frame always comes (empty for a header-only file)."""
    with open_text(path, gz, newline="") as f:  # "": quoted line breaks stay as written
        done = 0
        try:
            for frame in pd.read_csv(f, dtype=str, keep_default_na=False, nrows=max_rows,
                                     chunksize=rows):
                if progress is not None:
                    pos = f.raw_file.tell()
                    progress.update(pos - done)
                    done = pos
                yield frame
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
            msg = str(err).splitlines()[0]
            if "EOF inside string" in msg:
                raise ValueError(f"{path}: unclosed quote: the quoted field that starts in the "
                                 f"record at line {_unclosed_quote_line(path, gz)} runs to the end "
                                 f"of the file") from None
            raise ValueError(f"{path}: unreadable CSV ({msg})") from None


def _unclosed_quote_line(path: Path, gz: bool | None) -> int:
    """The line where the CSV record with an unclosed quote starts (error path: a rescan)."""
    with open_text(path, gz, newline="") as f:
        reader = csv.reader(f, strict=True)
        start = 1
        try:
            for _ in reader:
                start = reader.line_num + 1
        except csv.Error:
            pass
    return start


def split_paragraphs(text: str) -> list[str]:
    """Blocks separated by blank lines, stripped, empties dropped."""
    return [b.strip() for b in re.split(r"\n[ \t]*\n", text) if b.strip()]


_BLANK_LINE = re.compile(r"\n[ \t]*\n")


def paragraph_batches(path: Path, gz: bool | None = None, limit: int | None = None,
                      progress: Progress | None = None) -> Iterator[list[str]]:
    """split_paragraphs of a file, streamed: a list of documents per chunk read (a line of spaces
    and tabs is blank; no per-document Python)."""
    with open_text(path, gz, progress=progress) as f:
        tail = ""
        for chunk in chunks(f):
            # the text after the last blank line may go on in the next chunk: it is split again
            # with it (a blank line cut by the chunk boundary is found then too)
            *docs, tail = _BLANK_LINE.split(tail + chunk)
            _check_lens(docs, tail, path, limit, "a paragraph")
            yield [d for d in map(str.strip, docs) if d]
        doc = tail.strip()
        if doc:
            yield [doc]


def _check_lens(docs: list[str], tail: str, path: Path, limit: int | None, what: str) -> None:
    if limit is not None and (len(tail) > limit or (docs and max(map(len, docs)) > limit)):
        _check_len(tail, path, limit, what)
        for doc in docs:
            _check_len(doc, path, limit, what)


def _check_len(text: str, path: Path, limit: int | None, what: str) -> None:
    if limit is not None and len(text) > limit:
        raise too_long(path, f"{what} (starting {quote(text.lstrip()[:40])})", limit)


def line_batches(path: Path, gz: bool | None = None, limit: int | None = None,
                 progress: Progress | None = None) -> Iterator[list[str]]:
    """The non-blank lines of a file, stripped: a list per chunk read."""
    # newline="\n": a line is what ends in "\n" (as `wc -l` counts): a stray "\r" does not split it
    with open_text(path, gz, newline="\n", progress=progress) as f:
        tail, lineno = "", 0
        for chunk in chunks(f):
            *lines, tail = (tail + chunk).split("\n")
            if limit is not None and (len(tail) > limit or (lines and max(map(len, lines)) > limit)):
                at = next((i for i, line in enumerate(lines) if len(line) > limit), len(lines))
                raise too_long(path, f"line {lineno + at + 1}", limit)
            lineno += len(lines)
            yield [s for s in map(str.strip, lines) if s]
        tail = tail.strip()
        if tail:
            yield [tail]


def read_text(path: Path, gz: bool | None = None, limit: int | None = None,
              progress: Progress | None = None) -> str:
    parts, n = [], 0
    with open_text(path, gz, progress=progress) as f:
        for chunk in chunks(f):
            n += len(chunk)
            if limit is not None and n > limit:
                raise too_long(path, "the file (documents: file)", limit)
            parts.append(chunk)
    return "".join(parts)


def iter_parallel(source: Path, target: Path, gz: tuple[bool | None, bool | None] = (None, None),
                  limit: int | None = None, progress: Progress | None = None
                  ) -> Iterator[tuple[str, str]]:
    """Line-aligned parallel text: line i of `source` goes with line i of `target`.

    Lines end at "\\n" only (a stray "\\r" or U+2028 inside a sentence must not shift every pair
    after it) and lose just their "\\n" or "\\r\\n"; empty lines are kept, they hold a place.
    A file with fewer lines is an error once it runs out, after counting the other to its end.
    """
    with open_text(source, gz[0], newline="\n", progress=progress) as fs, \
            open_text(target, gz[1], newline="\n", progress=progress) as ft:
        lines = aligned(iter_raw_lines(fs, source, limit), iter_raw_lines(ft, target, limit),
                        lambda n_s, n_t: f"{source} has {n_s} lines but {target} has {n_t}; "
                                         f"parallel files must have one line per example, in the same order")
        for s, t in lines:
            yield _chomp(s), _chomp(t)


def aligned(left: Iterator, right: Iterator, mismatch: Callable[[int, int], str]) -> Iterator[tuple]:
    """(a, b) pairs of two streams that must be equally long (their items never None). When one
    runs out first, the other is counted to its end and ValueError(mismatch(len left, len right))
    is raised: the message can say how far apart the two files are, not just that they differ."""
    n = 0
    for a, b in itertools.zip_longest(left, right):
        if a is None or b is None:
            raise ValueError(mismatch(n + (a is not None) + sum(1 for _ in left),
                                      n + (b is not None) + sum(1 for _ in right)))
        yield a, b
        n += 1


def _chomp(line: str) -> str:
    return line[:-1] if line.endswith("\r") else line


def delimited_batches(path: Path, separator: str, drop_tail: bool = False, gz: bool | None = None,
                      errors: str = "replace", limit: int | None = None,
                      progress: Progress | None = None) -> Iterator[list[str]]:
    """Documents of a text file separated by `separator`: a list per chunk read.

    drop_tail: skip the text after the last separator (the file was cut, e.g. by max_bytes, so the
    last document is incomplete). errors="replace" (the default): a file cut at a byte limit may
    end inside a multi-byte character; "strict" reports a bad byte as not UTF-8.
    """
    tail = ""
    with open_text(path, gz, errors=errors, progress=progress) as f:
        for chunk in chunks(f):
            *docs, tail = (tail + chunk).split(separator)
            _check_lens(docs, tail, path, limit, "a document")
            yield [d for d in map(str.strip, docs) if d]
    doc = tail.strip()
    if doc and not drop_tail:
        yield [doc]
