"""IWSLT 2017 English-German (translation): TED talk transcripts and their translations.

Reads the parquet export of the Hugging Face hub dataset `IWSLT/iwslt2017`, config
`iwslt2017-en-de` (the hub's parquet-converter branch `refs/convert/parquet`; the dataset's main
branch only holds a loading script and the original zipped XML). Each row has a `translation`
struct {"de": ..., "en": ...}; `direction` picks which side is the source.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pipeline.sources.common import (
    Direction, NeededFile, RemoteFiles, RemoteOptions, Split, needed_file, parse_options, shown, write_raw,
)
from pipeline.sources.formats import read_parquet

NAME = "iwslt2017"
task = "translation"

BASE_URL = ("https://huggingface.co/datasets/IWSLT/iwslt2017/resolve/refs%2Fconvert%2Fparquet/"
            "iwslt2017-en-de")


class Options(RemoteOptions):
    base_url: str = BASE_URL
    files: dict[Split, str] = Field(default_factory=lambda: {
        s: f"{s}/0000.parquet" for s in ("train", "validation", "test")})
    direction: Direction = "en-de"


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    return [needed_file(opts.base_url, file, cache_dir, split)
            for split, file in opts.files.items()]


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> None:
    opts = parse_options(Options, options, NAME)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    src_lang, tgt_lang = opts.direction.split("-")
    splits, records = {}, []
    for item in files.needed:
        split = item.split
        path, record = files.get(item)
        records.append({"split": split, **record})
        pairs = read_parquet(path, ["translation"], opts.max_rows)["translation"]
        for i, pair in enumerate(pairs):
            if not isinstance(pair, dict) or not all(isinstance(pair.get(k), str)
                                                     for k in ("en", "de")):
                raise ValueError(f"{path}: record {i + 1}: translation must hold strings 'en' and 'de' "
                                 f"(got {shown(pair)})")
        splits[split] = {"source": [p[src_lang] for p in pairs],
                         "target": [p[tgt_lang] for p in pairs]}
    write_raw(out_dir, splits, {"source": NAME, "task": task, "direction": opts.direction,
                                "files": records, "options": opts.model_dump()})
