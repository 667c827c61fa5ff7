"""Readers of the tabular formats the sources parse: parquet, JSON Lines, JSON and CSV.

They read lazily and stop at `max_rows`, so capping a split never loads a multi-GB file, and their
errors name the file (and line, record or column) at fault. The text formats are opened through
pipeline.sources.text_io (gzip, UTF-8, bounded records); plain text cut into documents is
pipeline.sources.plain_text.
"""
from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.sources.text_io import chunks, iter_raw_lines, open_text, quote, too_long

PARQUET_MAGIC = b"PAR1"  # at the start and at the end of every parquet file
NL = "\n"
_BLANK = re.compile(r"[ \t\n\r]*")

if TYPE_CHECKING:
    from pipeline.io.progress import Progress


def is_parquet(path: Path) -> bool:
    with open(path, "rb") as f:
        start = f.read(4)
        if f.seek(0, 2) < 8:
            return False
        f.seek(-4, 2)
        return start == f.read(4) == PARQUET_MAGIC



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
