"""Readers for the file formats the sources parse (parquet, jsonl, json, csv, plain text).

They read lazily and stop at `max_rows`, so capping a split never loads a multi-GB file, and their
errors name the file (and line, record or column) at fault. Text formats may be gzip-compressed:
`gz=None` tells it from the first bytes, and the file is decompressed as it is read. Text is
UTF-8 (a leading byte-order mark is dropped); a bad byte is reported with its offset, never as a
bare codec error.
"""
from __future__ import annotations

import codecs
import gzip
import itertools
import json
import re
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"  # at the start and at the end of every parquet file
_CHUNK = 1 << 20
_BLANK = re.compile(r"[ \t\n\r]*")


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
              newline: str | None = None) -> Iterator[TextIO]:
    """`path` opened for streamed UTF-8 reading, through gzip when it is compressed.

    gz None: tell it from the magic bytes. newline as for open(): None reads "\\r\\n" as "\\n";
    "\\n" ends lines at "\\n" only; "" leaves line ends alone (CSV).
    """
    if gz is None:
        gz = head_bytes(path, 2) == GZIP_MAGIC
    opener = gzip.open if gz else open
    # utf-8-sig: a byte-order mark (Notepad, Excel CSV) must not become part of the first value
    f = opener(path, "rt", encoding="utf-8-sig", errors=errors, newline=newline)
    # The errors are checked against this file's own bytes before they are blamed on it: with
    # two files open (parallel text) the error may come from the other one.
    try:
        with f:
            yield f
    except UnicodeDecodeError:
        bad = _first_bad_byte(path, gz)
        if bad is None:
            raise
        raise ValueError(f"{path}: not UTF-8 text ({bad})") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as err:
        if not gz or _gzip_ok(path):
            raise
        raise ValueError(f"{path}: corrupt or truncated gzip file ({err})") from None


def _first_bad_byte(path: Path, gz: bool) -> str | None:
    """Where UTF-8 decoding fails, found by rescanning the raw bytes (on the error path only:
    TextIOWrapper's error gives an offset into some internal chunk, not into the file)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    where = " of the decompressed data" if gz else ""
    with (gzip.open if gz else open)(path, "rb") as f:
        for chunk in itertools.chain(iter(lambda: f.read(_CHUNK), b""), [None]):
            pending = len(decoder.getstate()[0])  # bytes of a character cut by the last chunk
            try:
                decoder.decode(chunk or b"", final=chunk is None)
            except UnicodeDecodeError as err:  # err.object is the pending bytes + this chunk
                at = offset - pending + err.start
                return f"byte 0x{err.object[err.start]:02x} at offset {at}{where}"
            offset += len(chunk or b"")
    return None


def _gzip_ok(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as f:
            while f.read(_CHUNK):
                pass
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return False
    return True


def read_parquet(path: Path, columns: Sequence[str], max_rows: int | None = None
                 ) -> dict[str, list]:
    """The given columns of a parquet file as python lists (structs become dicts).

    A dotted name that is not a column names a struct field: "translation.en" is field "en" of
    the struct column "translation" (as in Hugging Face translation datasets).
    """
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: not a readable parquet file ({err})") from None
    fields = {c: _struct_path(path, pf.schema_arrow, c) for c in columns}
    tops = list(dict.fromkeys(p[0] for p in fields.values()))
    out: dict[str, list] = {c: [] for c in columns}
    n = 0
    try:  # a damaged page shows only when it is decoded, as a bare "Corrupt snappy ..." error
        for batch in pf.iter_batches(batch_size=4096, columns=tops):
            if max_rows is not None:
                batch = batch.slice(0, max_rows - n)
            for c, (top, *sub) in fields.items():
                values = batch.column(top)
                out[c].extend((pc.struct_field(values, sub) if sub else values).to_pylist())
            n += batch.num_rows
            if max_rows is not None and n >= max_rows:
                break
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: corrupt parquet file ({str(err).strip().splitlines()[0]})") from None
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


def iter_jsonl(path: Path, gz: bool | None = None) -> Iterator[dict]:
    """One JSON object per non-empty line."""
    with open_text(path, gz) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            # line 1 is where a JSON array or a pretty-printed object shows up
            hint = ("" if lineno > 1 else "; a JSON array belongs in a .json file"
                    if line.lstrip().startswith("[")
                    else "; expected one JSON object per line, or a JSON array in a .json file")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg}){hint}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got "
                                 f"{type(row).__name__}{hint}")
            yield row


def read_jsonl(path: Path, max_rows: int | None = None) -> list[dict]:
    return list(itertools.islice(iter_jsonl(path), max_rows))


def iter_json(path: Path, gz: bool | None = None) -> Iterator[dict]:
    """A .json file: an array of objects, or JSON Lines (what `datasets`' to_json writes).

    An array is read whole (a JSON array cannot be streamed with the standard library; such
    files are exports of a few hundred MB at most), then decoded element by element so that an
    error names the element.
    """
    with open_text(path, gz) as f:
        text = f.read()
    if not text.lstrip().startswith("["):
        yield from iter_jsonl(path, gz)
        return
    decoder = json.JSONDecoder()

    def skip(pos: int) -> int:
        return _BLANK.match(text, pos).end()

    pos = skip(text.index("[") + 1)
    if text.startswith("]", pos):
        pos += 1
    else:
        for n in itertools.count(1):
            try:
                value, pos = decoder.raw_decode(text, skip(pos))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: array element {n}: invalid JSON ({err.msg})") from None
            if not isinstance(value, dict):
                raise ValueError(f"{path}: array element {n}: expected a JSON object, "
                                 f"got {type(value).__name__}")
            yield value
            pos = skip(pos)
            sep, pos = text[pos:pos + 1], pos + 1
            if sep == "]":
                break
            if sep != ",":
                got = repr(sep) if sep else "the end of the file"
                raise ValueError(f"{path}: after array element {n}: expected ',' or ']', got {got}")
    if text[pos:].strip():
        raise ValueError(f"{path}: text after the end of the JSON array")


def read_csv(path: Path, max_rows: int | None = None, gz: bool | None = None) -> pd.DataFrame:
    """A CSV with a header row; every cell is read as a string (no NaN, no number parsing)."""
    with open_text(path, gz, newline="") as f:  # "": quoted line breaks stay as written
        try:
            return pd.read_csv(f, dtype=str, keep_default_na=False, nrows=max_rows)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
            raise ValueError(f"{path}: unreadable CSV ({str(err).splitlines()[0]})") from None


def split_paragraphs(text: str) -> list[str]:
    """Blocks separated by blank lines, stripped, empties dropped."""
    return [b.strip() for b in re.split(r"\n[ \t]*\n", text) if b.strip()]


def iter_paragraphs(path: Path, gz: bool | None = None) -> Iterator[str]:
    """split_paragraphs of a file, streamed line by line (a line of spaces and tabs is blank)."""
    with open_text(path, gz) as f:
        buf: list[str] = []
        for line in itertools.chain(f, [""]):
            if line.strip(" \t\n"):  # the "" appended at the end flushes the last one
                buf.append(line)
                continue
            doc = "".join(buf).strip()
            buf = []
            if doc:
                yield doc


def iter_lines(path: Path, gz: bool | None = None) -> Iterator[str]:
    """The non-blank lines of a file, stripped."""
    # newline="\n": a line is what ends in "\n" (as `wc -l` counts): a stray "\r" does not split it
    with open_text(path, gz, newline="\n") as f:
        for line in f:
            if line.strip():
                yield line.strip()


def read_text(path: Path, gz: bool | None = None) -> str:
    with open_text(path, gz) as f:
        return f.read()


def read_parallel(source: Path, target: Path, max_rows: int | None = None,
                  gz: tuple[bool | None, bool | None] = (None, None)
                  ) -> tuple[list[str], list[str]]:
    """Line-aligned parallel text: line i of `source` goes with line i of `target`.

    Lines end at "\\n" only (a stray "\\r" or U+2028 inside a sentence must not shift every pair
    after it) and lose just their "\\n" or "\\r\\n"; empty lines are kept, they hold a place.
    Both files are read to the end even past max_rows, to compare their line counts: one missing
    line anywhere misaligns all the pairs that follow.
    """
    sources: list[str] = []
    targets: list[str] = []
    with open_text(source, gz[0], newline="\n") as fs, open_text(target, gz[1], newline="\n") as ft:
        n = 0
        for s, t in itertools.zip_longest(fs, ft):
            if s is None or t is None:
                n_s = n + (s is not None) + sum(1 for _ in fs)
                n_t = n + (t is not None) + sum(1 for _ in ft)
                raise ValueError(f"{source} has {n_s} lines but {target} has {n_t}; "
                                 f"parallel files must have one line per example, in the same order")
            if max_rows is None or n < max_rows:
                sources.append(_chomp(s))
                targets.append(_chomp(t))
            n += 1
    return sources, targets


def _chomp(line: str) -> str:
    line = line[:-1] if line.endswith("\n") else line
    return line[:-1] if line.endswith("\r") else line


def iter_delimited(path: Path, separator: str, drop_tail: bool = False, gz: bool | None = None,
                   errors: str = "replace") -> Iterator[str]:
    """Documents of a text file separated by `separator`, streamed line by line.

    drop_tail: skip the text after the last separator (the file was cut, e.g. by max_bytes, so the
    last document is incomplete). errors="replace" (the default): a file cut at a byte limit may
    end inside a multi-byte character; "strict" reports a bad byte as not UTF-8.
    """
    buf: list[str] = []
    with open_text(path, gz, errors=errors) as f:
        for line in f:
            if separator not in line:
                buf.append(line)
                continue
            *complete, rest = line.split(separator)
            for piece in complete:
                doc = ("".join(buf) + piece).strip()
                buf = []
                if doc:
                    yield doc
            buf.append(rest)
    doc = "".join(buf).strip()
    if doc and not drop_tail:
        yield doc
