"""The README and docs/ against the benchmark JSONs they cite (issue #51: a front door that had
become a logbook, with figures of runs that no file held any more). Every link to a file under
reports/benchmarks/ resolves, and every mention of such a file names one that exists. Every figure
written beside such a link must be a value of that JSON, at the precision shown: a figure is a
number with a decimal point, with thousands separators, or with a unit (ms, s, min, h, %, ×); "beside"
is the same paragraph or list item, or the same table row; a table row that links no file takes
the benchmark links of the paragraph right above its table (its caption). A time in min or h may be the
JSON's seconds, ms its seconds, and a % its fraction (0.32) or its ratio less one (1.08 for +8%).
Earlier runs are not in reports/benchmarks/ (one JSON per benchmark, the latest), so a figure of
theirs beside a current file's link fails here; docs/tests-and-benchmarks.md's history names the
commit that holds each. Reuses tests/test_gpu_docs.py's number reading (its `numbers`, `Number`,
`LINK`, `CODE`). Reads files, well under a second."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_docs import FENCE, PAGES
from tests.test_gpu_docs import CODE, LINK, Number, numbers
from tests.tiny_project import ROOT

BENCHMARKS = ROOT / "reports" / "benchmarks"
UNIT = re.compile(r"\**\s*(ms|min|s|h|%|×)(?!\w)")
SCALES = {"ms": (1.0, 1e-3), "s": (1.0,), "min": (1.0, 60.0), "h": (1.0, 3600.0), "%": (1.0, 0.01), "×": (1.0,), None: (1.0,)}
NOT_A_FIGURE = re.compile(r"e[+-]?\d|\.\d")  # right after a number: 1.61e11, a version's 2.13.0
MENTION = re.compile(r"reports/benchmarks/[\w.-]+\.json")
ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)\s")


def leaves(value) -> list[float]:
    """Every number a JSON value holds: its numeric leaves, and the numbers in its strings."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    return [n.value for n in numbers(str(value))]


def held(n: Number, unit: str | None, values: list[float]) -> bool:
    """`n` (with its unit) is one of `values`, at the precision it is shown."""
    for scale in SCALES[unit]:
        tolerance = 0.5 * 10 ** -n.decimals * scale + 1e-9
        if any(abs(n.value * scale - v) <= tolerance for v in values):
            return True
    if unit == "%":  # +8% for a ratio of 1.08
        return any(abs(1 + n.value / 100 - v) <= 0.5 * 10 ** -(n.decimals + 2) + 1e-9 for v in values)
    return False


def blocks(text: str) -> list[tuple[str, bool]]:
    """The page's paragraphs and list items, and its table rows, each as (text, is a row); a table
    right after a paragraph (with or without a blank line between) follows it in the list."""
    out: list[tuple[str, bool]] = []
    for chunk in re.split(r"\n[ \t]*\n", FENCE.sub("", text)):
        lines = chunk.splitlines()
        if lines and all(line.startswith("    ") for line in lines):  # an indented code block
            continue
        prose: list[str] = []
        for line in lines + [""]:
            if line.strip().startswith("|") or ITEM.match(line) or not line.strip():
                if prose:
                    out.append(("\n".join(prose), False))
                    prose = []
            if line.strip().startswith("|"):
                if not set(line) <= set("|-: \t"):  # not the separator row
                    out.append((line, True))
            elif line.strip():
                prose.append(line)
    return out


def benchmark_links(block: str, page: Path) -> list[Path]:
    found = []
    for _, target in LINK.findall(block):
        path = (page.parent / target.partition("#")[0]).resolve()
        if BENCHMARKS in path.parents and path.suffix == ".json":
            found.append(path)
    return found


def figures(block: str) -> list[tuple[Number, str | None, str]]:
    """The figures of a block (its code spans and links' targets left out): each number with a
    decimal point, thousands separators or a unit, with its unit and how it is shown."""
    text = CODE.sub(" ", LINK.sub(lambda m: m.group(1), block))
    out = []
    for n in numbers(text):
        after = text[n.end:]
        if NOT_A_FIGURE.match(after):
            continue
        unit = UNIT.match(after)
        if n.decimals or "," in text[n.start:n.end] or unit:
            out.append((n, unit.group(1) if unit else None, text[n.start:n.end] + (unit.group(0) if unit else "")))
    return out


def problems(page: Path, text: str) -> list[str]:
    name = page.relative_to(ROOT)
    found = []
    for mention in sorted(set(MENTION.findall(text))):
        if not (ROOT / mention).is_file():
            found.append(f"{name}: {mention}: no such file")
    caption: list[Path] = []
    for block, row in blocks(text):
        links = benchmark_links(block, page)
        for path in links:
            if not path.is_file():
                found.append(f"{name}: link to {path.relative_to(ROOT)}: no such file")
        if not row:
            caption = links
        inherits = row and not LINK.search(block)  # a row that links no file at all
        cited = [p for p in (links or (caption if inherits else [])) if p.is_file()]
        if not cited:
            continue
        values = [v for p in cited for v in leaves(json.loads(p.read_text(encoding="utf-8")))]
        for n, unit, shown in figures(block):
            if not held(n, unit, values):
                found.append(f"{name}: {shown!r} is not in {', '.join(p.name for p in cited)}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_beside_a_benchmark_json_is_in_it(page):
    assert problems(page, page.read_text(encoding="utf-8")) == []


def test_the_figures_are_found_and_read():
    pages = {p.name: p.read_text(encoding="utf-8") for p in PAGES}
    checked = [f for p in PAGES for block, _ in blocks(pages[p.name]) if benchmark_links(block, p)
               for f in figures(block)]
    assert len(checked) >= 40  # the check reads figures (not skipped by a format change)
    assert {p.name for p in BENCHMARKS.glob("*.json")} <= {m.rpartition("/")[2] for t in pages.values()
                                                             for m in MENTION.findall(t)}, \
        "a JSON under reports/benchmarks/ that no page cites: an old snapshot (one JSON per benchmark)"


def test_a_caption_row_and_item_are_blocks(tmp_path):
    page = ROOT / "docs" / "page.md"  # where the links resolve from; nothing is written
    text = ("Measured ([x](../reports/benchmarks/grid_wall_norm.json)): 151.83 s, 3 min.\n\n"
            "| mode | wall |\n|---|---|\n| grid | 151.83 s, 0.732× |\n| other | 99.9 s ([y](../README.md)) |\n\n"
            "- 1.271× ([x](../reports/benchmarks/grid_wall_norm.json)), 1.4 (not a version: 2.13.0), 1.61e11\n"
            "- 99.1 s, no link\n\n"
            "    indented code 99.2 s ([x](../reports/benchmarks/grid_wall_norm.json))\n\n"
            "```\n99.3 s ([x](../reports/benchmarks/grid_wall_norm.json))\n```\n"
            "`reports/benchmarks/grid_wall_norm.json` 42.42 s\n")
    assert problems(page, text) == []
    assert problems(page, text.replace("0.732×", "0.733×")) == ["docs/page.md: '0.733×' is not in grid_wall_norm.json"]
    assert problems(page, text.replace("3 min", "12 min")) == ["docs/page.md: '12 min' is not in grid_wall_norm.json"]
    assert problems(page, text.replace("1.4 (", "1.9 (")) == ["docs/page.md: '1.9' is not in grid_wall_norm.json"]
    assert problems(page, text.replace("151.83 s, 3", "151.83 s, -17%, 3")) == []  # measured_over_plan 0.833
    assert problems(page, text.replace("`reports/benchmarks/grid_wall_norm.json`", "`reports/benchmarks/gone.json`")) \
        == ["docs/page.md: reports/benchmarks/gone.json: no such file"]


@pytest.mark.parametrize("path, old, new", [
    ("README.md", "151.83 s for the default study", "158.13 s for the default study"),  # the README's figure
    ("README.md", "about 3 min", "about 12 min"),  # a rounded one, in minutes (12 min holds no value)
    ("README.md", "(reports/benchmarks/grid_wall_norm.json)",
     "(reports/benchmarks/grid_wall_auto_warm.json)"),  # a removed snapshot
    ("docs/scaling-out-and-cost-plan.md", "| 1.271× |", "| 1.217× |"),  # a table row under its caption
    ("docs/scaling-out-and-cost-plan.md", "| 262.72 s |", "| 259.0 s |"),  # an earlier run's figure
    ("docs/tests-and-benchmarks.md", "| 151.83 s", "| 187.6 s"),
])
def test_a_changed_figure_is_found(path, old, new):
    page = ROOT / path
    text = page.read_text(encoding="utf-8")
    assert old in text
    assert problems(page, text.replace(old, new, 1))
