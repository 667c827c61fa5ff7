"""The docs' generated blocks (the study table, the preset cost table): each script renders its
block between its own begin/end markers in its page under docs/, and this replaces it in place
or checks it is current."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from pipeline.io.atomic import atomic_write_text


def replace_block(text: str, block: str, begin: str, end: str, where: str) -> str:
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{where}: no '{begin}' ... '{end}' block")
    return text[:start] + block + text[stop + len(end):]


def update_page(name: str, what: str, page: str, render: Callable[[Path], str], begin: str, end: str,
                argv: list[str] | None = None, description: str | None = None) -> None:
    """`python -m scripts.<name> [--root DIR] [--check]`: rewrite the block in `page` (a path
    under the root, e.g. docs/datasets-and-presets.md), or with --check exit 1 when it is stale.
    Errors are one line starting with `name:`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--root", default=".")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if {page}'s block is stale")
    args = parser.parse_args(argv)
    root = Path(args.root)
    path = root / page
    try:
        text = path.read_text()
        new = replace_block(text, render(root), begin, end, str(path))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{name}: {str(exc).splitlines()[0]}") from None
    if args.check:
        if new != text:
            raise SystemExit(f"{name}: {path}'s {what} is stale: run python -m scripts.{name}")
        return
    if new != text:
        atomic_write_text(path, new)
