"""Reading a text file safely: gzip told from its first bytes, UTF-8, bounded lines, errors that
name the file and line.

Every reader of the sources' text formats (pipeline.sources.formats, plain_text, markup) opens
its file here. Text is read a chunk at a time, so memory is bounded by a chunk and the longest
record, never by the file: a record longer than `limit` characters (a file without line breaks, a
misnamed binary) is an error naming the file and line. A gzip file is decompressed as it is read;
a leading byte-order mark is dropped; a bad byte is reported with its offset and line, never as a
bare codec error. `progress` (pipeline.io.progress) is advanced by the bytes read.
"""
from __future__ import annotations

import codecs
import gzip
import io
import itertools
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20

if TYPE_CHECKING:
    from pipeline.io.progress import Progress


def head_bytes(path: Path, n: int = 4) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)



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


def quote(text: str, n: int = 80) -> str:
    """`text` for an error message: repr'd, cut to about n characters."""
    return repr(text) if len(text) <= n else repr(text[:n]) + f"... ({len(text):,} characters)"


def cut(text: str, n: int = 80) -> str:
    """`text` (already printable, e.g. a repr) cut to about n characters for an error message."""
    return text if len(text) <= n else text[:n] + f"... ({len(text):,} characters)"
