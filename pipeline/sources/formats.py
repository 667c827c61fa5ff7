"""Readers for the file formats the sources parse (parquet, jsonl, csv, plain text).

They read lazily and stop at `max_rows`, so capping a split never loads a multi-GB file, and their
errors name the file (and line or column) at fault.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet(path: Path, columns: Sequence[str], max_rows: int | None = None
                 ) -> dict[str, list]:
    """The given columns of a parquet file as python lists (structs become dicts)."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: not a readable parquet file ({err})") from None
    names = pf.schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")
    out: dict[str, list] = {c: [] for c in columns}
    for batch in pf.iter_batches(batch_size=4096, columns=list(columns)):
        if max_rows is not None:
            batch = batch.slice(0, max_rows - len(out[columns[0]]))
        for c in columns:
            out[c].extend(batch.column(c).to_pylist())
        if max_rows is not None and len(out[columns[0]]) >= max_rows:
            break
    return out


def read_jsonl(path: Path, max_rows: int | None = None) -> list[dict]:
    """One JSON object per non-empty line."""
    rows: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if max_rows is not None and len(rows) >= max_rows:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def read_csv(path: Path, max_rows: int | None = None) -> pd.DataFrame:
    """A CSV with a header row; every cell is read as a string (no NaN, no number parsing)."""
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, nrows=max_rows)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"{path}: unreadable CSV ({str(err).splitlines()[0]})") from None


def split_paragraphs(text: str) -> list[str]:
    """Blocks separated by blank lines, stripped, empties dropped."""
    return [b.strip() for b in re.split(r"\n[ \t]*\n", text) if b.strip()]


def iter_delimited(path: Path, separator: str, drop_tail: bool = False) -> Iterator[str]:
    """Documents of a text file separated by `separator`, streamed line by line.

    drop_tail: skip the text after the last separator (the file was cut, e.g. by max_bytes, so the
    last document is incomplete).
    """
    buf: list[str] = []
    # errors="replace": a file cut at a byte limit may end inside a multi-byte character
    with open(path, encoding="utf-8", errors="replace") as f:
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
