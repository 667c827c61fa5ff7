"""The IWSLT release as its organisers ship it, and the check that markup is never read as text.

Two shapes (IWSLT 2017, e.g. the extracted `en-de/` folder):
- dev/test sets as XML, one language a file (IWSLT17.TED.tst2013.en-de.en.xml): `<doc docid=..>`
  holds `<url>`, `<keywords>`, `<talkid>`, `<title>`, `<description>` and the text, one
  `<seg id="N"> text </seg>` a line. Only the seg text is kept (XML entities unescaped,
  stripped); each `<doc>` is one document. Parallel files are aligned by (doc, seg id).
- training text as "tagged" lines (train.tags.en-de.en): each talk starts with lines such as
  `<url>..</url>`, `<keywords>`, `<speaker>`, `<talkid>`, `<title>`, `<description>`,
  `<reviewer>`, `<translator>`; the other lines are the text, one sentence a line. Tag lines are
  dropped and the two files' text lines aligned; a talk (the text between tag blocks) is one
  document.

The files are read line by line (they hold one seg per line), so any size streams; a file that
breaks these shapes is a one-line error naming the file and line.
"""
from __future__ import annotations

import html
import itertools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.sources.plain_text import aligned
from pipeline.sources.text_io import iter_raw_lines, open_text, quote

if TYPE_CHECKING:
    from pipeline.io.progress import Progress

XML_STARTS = ("<?xml", "<mteval", "<srcset", "<refset", "<doc", "<seg", "<!doctype")
_TAG_LINE = re.compile(r"\s*<([A-Za-z][\w-]*)(\s[^>]*)?>.*</\1>\s*$")  # <t ..>..</t> on one line
_LONE_TAG = re.compile(r"\s*</?[A-Za-z][\w-]*(\s[^>]*)?/?>\s*$")  # <doc ..>, </doc>
_TAG_START = re.compile(r"\s*<[A-Za-z][\w-]*(\s[^>]*)?>")
_DOC = re.compile(r"<doc\b([^>]*)>", re.I)
_DOCID = re.compile(r"""\bdocid\s*=\s*["']([^"']*)["']""", re.I)
_SEG = re.compile(r"""<seg\b([^>]*)>(.*?)</seg\s*>""", re.I)
_SEGID = re.compile(r"""\bid\s*=\s*["']?([^"'\s>]*)""", re.I)
SNIFF_LINES = 50


def sniff_markup(path: Path, gz: bool | None) -> tuple[str, int, str] | None:
    """(format to use, line, the line) when the first lines of `path` are XML/SGML markup."""
    with open_text(path, gz, errors="replace", newline="\n") as f:
        head = f.read(1 << 16)
    lines = [(i, line.strip()) for i, line in enumerate(head.split("\n")[:-1] or [head], 1)
             if line.strip()][:SNIFF_LINES]
    if not lines:
        return None
    xml = next(((i, line) for i, line in lines if line.lower().startswith(XML_STARTS)), None)
    if xml is not None and xml[0] == lines[0][0] or any("<seg" in line for _, line in lines):
        i, line = xml or lines[0]
        return "iwslt_xml", i, line
    tagged = [(i, line) for i, line in lines if _TAG_START.match(line)]
    if _TAG_LINE.match(lines[0][1]) or 2 * len(tagged) > len(lines):
        return ("iwslt_tags", *tagged[0])
    return None


def check_not_markup(path: Path, gz: bool | None, read_as: str) -> None:
    """A one-line error when a file about to be read as plain text is markup."""
    found = sniff_markup(path, gz)
    if found is not None:
        fmt, line, text = found
        raise ValueError(f"{path}: looks like XML/SGML markup, not {read_as} (line {line}: "
                         f"{quote(text)}); read it with data.local.format: {fmt} (an IWSLT "
                         f"file) or convert it to text first")


def iter_segs(path: Path, gz: bool | None = None, limit: int | None = None,
              progress: Progress | None = None) -> Iterator[tuple[tuple[int, str, str], str, int]]:
    """((doc number, docid, seg id), text, line) for every <seg> of an IWSLT XML file."""
    doc, docid = 0, ""
    with open_text(path, gz, progress=progress) as f:
        for lineno, line in enumerate(iter_raw_lines(f, path, limit), 1):
            if "<" not in line:
                continue
            m = _DOC.search(line)
            if m:
                doc += 1
                found = _DOCID.search(m.group(1))
                docid = found.group(1) if found else ""
            segs = list(_SEG.finditer(line))
            if not segs and re.search(r"<seg\b", line, re.I):
                raise ValueError(f"{path}: line {lineno}: <seg> without its </seg> on the same "
                                 f"line ({quote(line.strip())})")
            for seg in segs:
                found = _SEGID.search(seg.group(1))
                key = (doc, docid, found.group(1) if found else "")
                yield key, html.unescape(seg.group(2)).strip(), lineno


def iter_tagged(path: Path, gz: bool | None = None, limit: int | None = None,
                progress: Progress | None = None) -> Iterator[tuple[int, str | None]]:
    """(line, text) for each text line of a train.tags file (stripped, XML entities left as
    written: these files are not XML), and (line, None) for each tag line."""
    with open_text(path, gz, newline="\n", progress=progress) as f:
        for lineno, line in enumerate(iter_raw_lines(f, path, limit), 1):
            if line.lstrip().startswith("<") and (_TAG_LINE.match(line) or _LONE_TAG.match(line)):
                yield lineno, None
            else:
                yield lineno, line.strip()


def xml_documents(path: Path, gz: bool | None = None, limit: int | None = None,
                  progress: Progress | None = None) -> Iterator[str]:
    """Each <doc> of an XML file as one document: its segs, a line each."""
    segs = iter_segs(path, gz, limit, progress)
    for _, group in itertools.groupby(segs, key=lambda s: s[0][0]):
        doc = "\n".join(text for _, text, _ in group if text)
        if doc:
            yield doc


def tagged_documents(path: Path, gz: bool | None = None, limit: int | None = None,
                     progress: Progress | None = None) -> Iterator[str]:
    """Each talk of a train.tags file (its text lines between tag lines) as one document."""
    lines = iter_tagged(path, gz, limit, progress)
    for is_text, group in itertools.groupby(lines, key=lambda x: x[1] is not None):
        doc = "\n".join(text for _, text in group if text) if is_text else ""
        if doc:
            yield doc


def xml_pairs(source: Path, target: Path, gz: tuple[bool | None, bool | None] = (None, None),
              limit: int | None = None, progress: Progress | None = None
              ) -> Iterator[tuple[str, str]]:
    """(source seg, target seg) of two XML files, aligned by document and seg id."""
    segs = aligned(iter_segs(source, gz[0], limit, progress), iter_segs(target, gz[1], limit, progress),
                   lambda n_s, n_t: f"{source} has {n_s} segs but {target} has {n_t}; the two sides of "
                                    f"a pair must hold the same documents and segs")
    for s, t in segs:
        if s[0] != t[0]:
            raise ValueError(f"{source} line {s[2]} (doc {s[0][0]} docid {s[0][1]!r} seg "
                             f"{s[0][2]!r}) does not match {target} line {t[2]} (doc {t[0][0]} "
                             f"docid {t[0][1]!r} seg {t[0][2]!r}); the files are not aligned")
        yield s[1], t[1]


def tagged_pairs(source: Path, target: Path, gz: tuple[bool | None, bool | None] = (None, None),
                 limit: int | None = None, progress: Progress | None = None
                 ) -> Iterator[tuple[str, str]]:
    """(source line, target line) of two train.tags files: their text lines, in order."""
    fs = (x for x in iter_tagged(source, gz[0], limit, progress) if x[1] is not None)
    ft = (x for x in iter_tagged(target, gz[1], limit, progress) if x[1] is not None)
    for s, t in aligned(fs, ft, lambda n_s, n_t: f"{source} has {n_s} text lines but {target} has {n_t} (tag "
                                                 f"lines not counted); the two sides of a pair must align line by line"):
        yield s[1], t[1]
