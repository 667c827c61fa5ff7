"""The report as a list of blocks, rendered once to Markdown and once to self-contained HTML.

Building the content once and rendering it twice keeps report.md and report.html identical in
substance. The HTML embeds each figure as a base64 data URI and carries its CSS inline, so the file
opens offline and can be mailed or attached to an MLflow run on its own.
"""
from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    notes: list[str] = field(default_factory=list)  # printed under the table


@dataclass
class Figure:
    path: str  # relative to the report directory, e.g. "figures/curves.png"
    caption: str


Block = Heading | Paragraph | Table | Figure


def _md_cell(text: str) -> str:
    # A pipe would end the cell and a newline the row.
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: Sequence[Block]) -> str:
    """GitHub-flavoured Markdown; figures are linked by relative path."""
    out = [f"# {title}", ""]
    for block in blocks:
        if isinstance(block, Heading):
            out += [f"{'#' * block.level} {block.text}", ""]
        elif isinstance(block, Paragraph):
            out += [block.text, ""]
        elif isinstance(block, Table):
            if block.caption:
                out += [f"**{block.caption}**", ""]
            out.append("| " + " | ".join(_md_cell(h) for h in block.headers) + " |")
            out.append("|" + "|".join("---" for _ in block.headers) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            out.append("")
            for note in block.notes:  # plain text: variant names may hold underscores
                out += [note, ""]
        elif isinstance(block, Figure):
            out += [f"![{block.caption}]({block.path})", "", f"*{block.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
caption { caption-side: top; font-weight: bold; text-align: left; padding-bottom: 4px; }
.table-wrap { overflow-x: auto; margin: 0.5em 0 1.2em; }
.table-wrap table { margin: 0; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-style: italic; color: #555; }
.note { color: #555; font-size: 0.85em; margin: -0.8em 0 1em; }
"""


def _img_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def to_html(title: str, blocks: Sequence[Block], root: Path) -> str:
    """One HTML file; figures under `root` are read and embedded."""
    e = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            level = min(max(block.level, 1), 6)
            out.append(f"<h{level}>{e(block.text)}</h{level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{e(block.text)}</p>")
        elif isinstance(block, Table):
            # A table wider than the page (many variants, or a long unbroken output in a cell)
            # scrolls inside its wrapper instead of widening the whole page.
            out.append('<div class="table-wrap"><table>')
            if block.caption:
                out.append(f"<caption>{e(block.caption)}</caption>")
            out.append("<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in block.headers) + "</tr></thead>")
            out.append("<tbody>")
            for row in block.rows:
                out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
            out.append("</tbody></table></div>")
            out += [f'<p class="note">{e(note)}</p>' for note in block.notes]
        elif isinstance(block, Figure):
            out.append(
                f'<figure><img src="{_img_data_uri(root / block.path)}" alt="{e(block.caption)}">'
                f"<figcaption>{e(block.caption)}</figcaption></figure>"
            )
    out.append("</body></html>")
    return "\n".join(out) + "\n"
