"""Multi30k English-German (translation): image captions and their German translations.

Reads the JSON-lines files of the Hugging Face hub dataset `bentrevett/multi30k` (the WMT16
multimodal task 1 data: 29,000 train / 1,014 validation / 1,000 test pairs; downloaded by the
hub's client, pipeline/sources/hub.py), one object {"en": ..., "de": ...} per line; `direction`
picks which side is the source.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pipeline.sources.common import (
    Direction, HubOptions, NeededFile, RemoteFiles, Split, hub_file, parse_options, write_raw,
)
from pipeline.sources.formats import read_jsonl

NAME = "multi30k"
task = "translation"

REPO = "bentrevett/multi30k"


class Options(HubOptions):
    repo: str = REPO
    files: dict[Split, str] = Field(default_factory=lambda: {
        "train": "train.jsonl", "validation": "val.jsonl", "test": "test.jsonl"})
    direction: Direction = "en-de"


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    return [hub_file(opts, file, cache_dir, split)
            for split, file in opts.files.items()]


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict:
    opts = parse_options(Options, options, NAME)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    src_lang, tgt_lang = opts.direction.split("-")
    splits, records = {}, []
    for item in files.needed:
        split = item.split
        path, record = files.get(item)
        records.append({"split": split, **record})
        rows = read_jsonl(path, opts.max_rows)
        for i, row in enumerate(rows):
            if not all(isinstance(row.get(k), str) for k in ("en", "de")):
                raise ValueError(f"{path}: record {i + 1}: needs string fields 'en' and 'de'")
        splits[split] = {"source": [r[src_lang] for r in rows],
                         "target": [r[tgt_lang] for r in rows]}
    return write_raw(out_dir, splits, {"source": NAME, "task": task, "direction": opts.direction,
                                "files": records, "options": opts.model_dump()})
