"""CNN/DailyMail 3.0.0 (summarization): news article -> its bullet-point highlights.

Reads the parquet shards of the Hugging Face hub dataset `abisee/cnn_dailymail` (columns id,
article, highlights): article -> source, highlights -> target. Shards are fetched in order and,
with `max_rows`, only until the split has enough rows (the train shards are ~250 MB each).
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pipeline.sources import (RemoteOptions, Split, check_pins, download, parse_options,
                              write_raw)
from pipeline.sources.formats import read_parquet

NAME = "cnn_dailymail"
task = "summarization"

BASE_URL = "https://huggingface.co/datasets/abisee/cnn_dailymail/resolve/main/3.0.0"
FILES = {
    "train": [f"train-0000{i}-of-00003.parquet" for i in range(3)],
    "validation": ["validation-00000-of-00001.parquet"],
    "test": ["test-00000-of-00001.parquet"],
}


class Options(RemoteOptions):
    base_url: str = BASE_URL  # override for a mirror (tests point it at 127.0.0.1)
    files: dict[Split, list[str]] = Field(
        default_factory=lambda: {k: list(v) for k, v in FILES.items()})


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> None:
    opts = parse_options(Options, options, NAME)
    check_pins(opts, [f for shards in opts.files.values() for f in shards], NAME)
    splits, records = {}, []
    for split, shards in opts.files.items():
        rows: dict[str, list[str]] = {"source": [], "target": []}
        for shard in shards:
            left = None if opts.max_rows is None else opts.max_rows - len(rows["source"])
            if left == 0:
                break  # enough rows: do not download the remaining shards
            path, record = download(opts.base_url, shard, cache_dir, opts)
            records.append({"split": split, **record})
            table = read_parquet(path, ["article", "highlights"], left)
            rows["source"] += table["article"]
            rows["target"] += table["highlights"]
        splits[split] = rows
    write_raw(out_dir, splits, {"source": NAME, "task": task, "files": records,
                                "options": opts.model_dump()})
