"""The README's generated blocks (the study table, the preset cost table): each script renders its
block between its own begin/end markers, and this replaces it in place or checks it is current."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from pipeline.atomic import atomic_write_text


def replace_block(text: str, block: str, begin: str, end: str, where: str = "README.md") -> str:
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"{where}: no '{begin}' ... '{end}' block")
    return text[:start] + block + text[stop + len(end):]


def update_readme(name: str, what: str, render: Callable[[Path], str], begin: str, end: str,
                  argv: list[str] | None = None, description: str | None = None) -> None:
    """`python -m scripts.<name> [--root DIR] [--check]`: rewrite README.md's block, or with
    --check exit 1 when it is stale. Errors are one line starting with `name:`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--root", default=".")
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's block is stale")
    args = parser.parse_args(argv)
    root = Path(args.root)
    readme = root / "README.md"
    try:
        text = readme.read_text()
        new = replace_block(text, render(root), begin, end, str(readme))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{name}: {str(exc).splitlines()[0]}") from None
    if args.check:
        if new != text:
            raise SystemExit(f"{name}: {readme}'s {what} is stale: run python -m scripts.{name}")
        return
    if new != text:
        atomic_write_text(readme, new)
