"""docs/gpu.md and the README's line on it, against the committed files they cite, so that no figure
drifts from its file. The page's figure tables give, for each figure, its id, value,
file and where in that file (a JSON key path, or a line of a log or report quoted as it stands);
every such value must be what the file holds, at the precision shown, and a yes/no under a target
must follow from the file's value. In the page's measured sections (everything above "Running
it"), every figure in the text (a time, a percentage, a figure with 3 or more decimals or with
thousands separators, or any number with an id after it) must carry the id of a row in brackets,
and be what that row's file holds; "[no file]" marks, explicitly, a figure that no file holds. In
the README's line on gpu.md every figure must be followed by a link to a file, and be what a row of
that file holds. The defaults the page states for `bash run.sh gpu` are benchmarks/gpu.py's.
CPU only, reads files, well under a second."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "gpu.md"
README = ROOT / "README.md"
MEASURED_END = "\n## Running it"  # the sections above it report runs; below, how to run

NUMBER = re.compile(r"(?<![\w.])([+−-]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?!\d)")
UNIT_AFTER = re.compile(r"\**\s*(?:(?:ms|s|min)\b|%)")
ID = r"[a-z0-9]+(?:-[a-z0-9]+)*"
CITE = re.compile(rf"\[({ID}|no file)\](?!\()")
CITE_AFTER = re.compile(rf"\**\s*\[{ID}\](?!\()")
LINK_AFTER = re.compile(r"\s*\(?\[")  # a figure with its file's link right after it (the README's way)
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`\n]*`")
NEAR = 40  # characters between a figure and its id (or, in the README, its file's link)


@dataclass
class Number:
    value: float
    decimals: int
    start: int = 0
    end: int = 0

    def agrees(self, actual: float) -> bool:
        """`actual` shown at this number's precision is this number."""
        return abs(self.value - actual) <= 0.5 * 10 ** -self.decimals + 1e-9


def numbers(text: str) -> list[Number]:
    out = []
    for m in NUMBER.finditer(text):
        sign = "-" if m.group(1) in ("-", "−") else ""
        decimals = m.group(3) or ""
        out.append(Number(float(sign + m.group(2).replace(",", "") + decimals), max(0, len(decimals) - 1),
                          m.start(), m.end()))
    return out


@dataclass
class Row:
    id: str
    value: str
    target: str
    met: str
    file: Path | None
    where: list[str]
    actual: list[list[float]] = field(default_factory=list)  # per `where` span, the numbers it holds


def cells(line: str) -> list[str]:
    """A markdown table row's cells; `\\|` (a pipe inside a cell) is a pipe."""
    line = line.strip()
    inner = line[1:-1] if line.endswith("|") and not line.endswith("\\|") else line[1:]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def figure_tables(text: str, page: Path) -> tuple[list[Row], list[str]]:
    """The rows of every table whose header has id, value, file and where columns."""
    rows, problems, header = [], [], None
    for line in text.splitlines():
        if not line.strip().startswith("|"):
            header = None
            continue
        row = cells(line)
        if header is None:
            header = [c.split(":")[0].strip().lower() for c in row]
            continue
        if set("".join(row)) <= set("-: "):  # the separator line
            continue
        if not {"id", "value", "file", "where"} <= set(header):
            continue
        if len(row) != len(header):
            problems.append(f"row {row[0]!r}: {len(row)} cells, its table has {len(header)} columns")
            continue
        get = dict(zip(header, row))
        link = LINK.search(get["file"])
        rows.append(Row(get["id"], get["value"], get.get("target", "—"), get.get("met", "—"),
                        (page.parent / link.group(2)).resolve() if link else None,
                        re.findall(r"`([^`]+)`", get["where"])))
    return rows, problems


def resolve(file: Path, where: str) -> list[float]:
    """The numbers `where` names in `file`: a JSON value by its dotted key path (a string's own
    numbers), or in any other file the numbers of the quoted line fragment, which must be there."""
    if file.suffix == ".json":
        value = json.loads(file.read_text(encoding="utf-8"))
        for key in where.split("."):
            if isinstance(value, list):
                value = value[int(key)]
            elif isinstance(value, dict) and key in value:
                value = value[key]
            else:
                raise KeyError(f"no key {key!r} on the way to {where!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{where!r} is {type(value).__name__}, not a figure")
        return [float(value)] if not isinstance(value, str) else [n.value for n in numbers(value)]
    if where not in file.read_text(encoding="utf-8", errors="replace"):
        raise KeyError(f"{where!r} is not in it")
    return [n.value for n in numbers(where)]


def check_rows(rows: list[Row]) -> list[str]:
    problems = []
    seen = set()
    for row in rows:
        name = f"row {row.id}"
        if not re.fullmatch(ID, row.id) or row.id in seen:
            problems.append(f"{name}: the id is not unique or not of the form a-b-1")
        seen.add(row.id)
        if row.file is None or not row.file.is_file():
            problems.append(f"{name}: no file linked, or it does not exist ({row.file})")
            continue
        try:
            row.actual = [resolve(row.file, where) for where in row.where]
        except (KeyError, ValueError, IndexError) as exc:
            problems.append(f"{name}: {row.file.name}: {exc}")
            continue
        shown = numbers(row.value)
        if not shown or not row.where:
            problems.append(f"{name}: no figure, or no place in its file")
            continue
        if len(row.where) == len(shown):
            pairs = list(zip(shown, row.actual))
        elif len(row.where) == 1:
            pairs = [(n, row.actual[0]) for n in shown]
        else:
            problems.append(f"{name}: {len(shown)} figures but {len(row.where)} places: give one place, or one each")
            continue
        matched = []
        for n, actual in pairs:
            hit = next((a for a in actual if n.agrees(a)), None)
            if hit is None:
                problems.append(f"{name}: the page says {row.value!r}, {row.file.name} holds {actual}")
            matched.append(hit)
        target = re.fullmatch(r"([≤≥])\s*([\d.]+)\s*\w*", row.target)
        met = row.met.split(":")[0].strip().lower()
        if target and met in ("yes", "no") and matched and matched[0] is not None:
            limit = float(target.group(2))
            ok = matched[0] <= limit if target.group(1) == "≤" else matched[0] >= limit
            if ok != (met == "yes"):
                problems.append(f"{name}: {matched[0]} against {row.target} is {'met' if ok else 'not met'}, "
                                f"the page says {row.met!r}")
    return problems


def without_tables_and_code(text: str) -> str:
    """The text of the page: no table rows, no code, links as their text."""
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("|"))
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = CODE.sub(" ", text)
    return LINK.sub(lambda m: m.group(1), text)


def check_text(text: str, rows: dict[str, Row]) -> list[str]:
    """Every figure of the text carries a row's id, and agrees with that row's file."""
    problems = []
    cites = [(m.start(), m.group(1)) for m in CITE.finditer(text)]
    for _, cited in cites:
        if cited != "no file" and cited not in rows:
            problems.append(f"[{cited}]: no row has this id")
    for n in numbers(text):
        after = text[n.end:]
        shown = text[max(0, n.start - 1):n.end + 6].strip()
        figure = n.decimals >= 3 or "," in text[n.start:n.end] or UNIT_AFTER.match(after) or CITE_AFTER.match(after)
        if not figure:
            continue
        cite = next((c for pos, c in cites if n.end <= pos <= n.end + NEAR), None)
        if cite is None:
            problems.append(f"{shown!r}: a figure without the id of the row it comes from")
        elif cite != "no file" and cite in rows:
            if not any(n.agrees(a) for actual in rows[cite].actual for a in actual):
                problems.append(f"{shown!r} [{cite}]: {rows[cite].file.name} holds {rows[cite].actual}")
    return problems


def check_readme_line(line: str, rows: list[Row]) -> list[str]:
    """Every figure of the README's line on gpu.md is followed by a link to its file, and agrees
    with a row of gpu.md from that file."""
    problems = []
    line = CODE.sub(lambda m: " " * len(m.group(0)), line)
    links = [(m.start(), (README.parent / m.group(2).partition("#")[0]).resolve()) for m in LINK.finditer(line)]
    line = LINK.sub(lambda m: "[" + " " * (len(m.group(0)) - 1), line)  # a link: its `[`, the rest blanked
    for n in numbers(line):
        after = line[n.end:]
        if not (n.decimals >= 3 or "," in line[n.start:n.end] or UNIT_AFTER.match(after) or LINK_AFTER.match(after)):
            continue
        shown = line[n.start:n.end + 2]
        file = next((f for pos, f in links if n.end <= pos <= n.end + NEAR), None)
        if file is None:
            problems.append(f"README {shown!r}: no link to the file it comes from right after it")
            continue
        actual = [a for row in rows if row.file == file for values in row.actual for a in values]
        if not actual:
            problems.append(f"README {shown!r}: gpu.md has no row from {file.name}")
        elif not any(n.agrees(a) for a in actual):
            problems.append(f"README {shown!r}: gpu.md's rows from {file.name} hold {sorted(set(actual))}")
    return problems


def check_defaults(text: str) -> list[str]:
    """What "Running it" says `bash run.sh gpu` does by default is what benchmarks/gpu.py does."""
    from benchmarks.gpu import DEADLINE_S, DEFAULT_PARTS, LIMITS, TARGETS

    running = text[text.index(MEASURED_END):]
    flat = " ".join(running.split())
    problems = []
    limits = re.search(r"`--limits ([^`]+)` and a (\d+) s deadline", flat)
    parts = re.search(r"by default `--parts ([^`]+)`", flat)
    target = re.search(r"target ≤ (\d+) s\)", flat)
    if not limits or dict((k, float(v)) for k, v in (i.split("=") for i in limits.group(1).split(","))) != LIMITS:
        problems.append(f"Running it: the default --limits are {LIMITS}")
    if not limits or float(limits.group(2)) != DEADLINE_S:
        problems.append(f"Running it: the default deadline is {DEADLINE_S} s")
    if not parts or tuple(parts.group(1).split(",")) != DEFAULT_PARTS:
        problems.append(f"Running it: the default parts are {','.join(DEFAULT_PARTS)}")
    if not target or float(target.group(1)) != TARGETS["study_launch_to_report_s"][1]:
        problems.append(f"Running it: the study's target is {TARGETS['study_launch_to_report_s']}")
    return problems


def readme_line(readme: str) -> str:
    return next(line for line in readme.splitlines() if line.startswith("| [gpu.md](docs/gpu.md) |"))


def problems(page: str, readme: str) -> list[str]:
    rows, found = figure_tables(page, PAGE)
    found += check_rows(rows)
    measured = page[:page.index(MEASURED_END)]
    found += check_text(without_tables_and_code(measured), {row.id: row for row in rows})
    found += check_readme_line(readme_line(readme), rows)
    return found + check_defaults(page)


def test_every_figure_of_the_gpu_page_and_the_readme_line_is_its_files():
    page = PAGE.read_text(encoding="utf-8")
    rows, _ = figure_tables(page, PAGE)
    assert len(rows) >= 60  # the tables are read (not skipped by a format change)
    assert {row.file.parent.name for row in rows} >= {"gpu", "tiny_shakespeare_h200", "benchmarks"}
    assert problems(page, README.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("old, new", [
    ("| 469.1 s |", "| 491 s |"),  # a table's figure no longer its file's (issue #52's first)
    ("60.4 s [r12-warm] and 59.6 s", "60.5 s [r12-warm] and 59.6 s"),  # a figure of the text not its row's file
    ("6.3 s [r12-shared]", "6.3 s"),  # a figure of the text without its row
    ("1.4632 [sp-today]", "1.4632 [sp-kept]"),  # the id of another row
    ("| 1.6946 |", "| 1.6964 |"),
    ("| 17.4 s | ≤ 30 s | yes |", "| 17.4 s | ≤ 30 s | no |"),  # met, against the file's value
    ("`parts.recipe.recipe_best_estimate`", "`parts.recipe.recipe_best_estimat`"),  # a key the file lacks
    ("`31 stages run in 72 s`", "`32 stages run in 72 s`"),  # a line the log does not have
    ("0.19 s [r12-check]", "0.19 s [r12-chek]"),  # an id no row has
    ("and a 500 s\ndeadline", "and a 491 s\ndeadline"),  # a default that is not the script's
])
def test_a_changed_figure_of_the_page_is_found(old, new):
    page = PAGE.read_text(encoding="utf-8")
    assert old in page
    assert problems(page.replace(old, new, 1), README.read_text(encoding="utf-8"))


@pytest.mark.parametrize("old, new", [
    ("65.0 s cold", "65.9 s cold"),  # 65.9 s is a figure of run 14, not run 12
    ("MFU 0.4554 ([benchmark]", "MFU 0.47 ([benchmark]"),  # 2 decimals: a figure by the link after it
    ("1.4632 ([spread](reports/gpu/h200_run8_spread.json)",
     "1.4632 ([spread](reports/gpu/h200_run12_seed_study_tests.json)"),  # the right figure, another run's file
    ("0.4554 ([benchmark](reports/gpu/h200_run13_tests_bench.json))", "0.4554"),  # its file's link gone
])
def test_a_changed_figure_of_the_readme_line_is_found(old, new):
    readme = README.read_text(encoding="utf-8")
    assert old in readme_line(readme)
    assert problems(PAGE.read_text(encoding="utf-8"), readme.replace(old, new, 1))
