"""Plain text cut into examples: documents by blank line, by line, by separator or the whole file,
and line-aligned parallel text (line i of one file goes with line i of the other).

Each reader streams its file through pipeline.sources.text_io and yields a list of documents per
chunk read, so memory is bounded by a chunk and the longest document (at most `limit` characters,
else an error naming the file and where the document starts).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.sources.text_io import chunks, iter_raw_lines, open_text, quote, too_long

if TYPE_CHECKING:
    from pipeline.io.progress import Progress


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
