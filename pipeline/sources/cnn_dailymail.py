"""CNN/DailyMail 3.0.0 (summarization): news article -> its bullet-point highlights.

Reads the parquet shards of the Hugging Face hub dataset `abisee/cnn_dailymail` (folder 3.0.0,
downloaded by the hub's client: pipeline/sources/hub.py; columns id, article, highlights): article -> source, highlights -> target. Shards are fetched in order and,
with `max_rows`, only until the split has enough rows (the train shards are ~250 MB each).
`needed_files` still lists every shard: how many a split uses depends on row counts that are only
known once the shards are read, so an offline error asks for all of them.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from pydantic import Field

from pipeline.io.progress import Progress
from pipeline.sources.common import HubOptions, NeededFile, RawWriter, RemoteFiles, Split, hub_file, parse_options
from pipeline.sources.formats import iter_parquet

NAME = "cnn_dailymail"
task = "summarization"

REPO = "abisee/cnn_dailymail"
FILES = {
    "train": [f"train-0000{i}-of-00003.parquet" for i in range(3)],
    "validation": ["validation-00000-of-00001.parquet"],
    "test": ["test-00000-of-00001.parquet"],
}


class Options(HubOptions):
    repo: str = REPO  # a mirror: HF_ENDPOINT (tests point it at 127.0.0.1)
    subfolder: str = "3.0.0"
    files: dict[Split, list[str]] = Field(
        default_factory=lambda: {k: list(v) for k, v in FILES.items()})


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    """Every shard of every split, in order (with max_rows, the later ones may go unread)."""
    return [hub_file(opts, shard, cache_dir, split)
            for split, shards in opts.files.items() for shard in shards]


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict:
    opts = parse_options(Options, options, NAME)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    raw = RawWriter(out_dir, {"source": NAME, "task": task})
    records = []
    for split, items in itertools.groupby(files.needed, key=lambda n: n.split):
        with raw.split(split) as rows:
            for item in items:
                left = None if opts.max_rows is None else opts.max_rows - rows.count
                if left == 0:
                    continue  # enough rows: do not download the split's remaining shards
                path, record = files.get(item)
                records.append({"split": item.split, **record})
                with Progress(f"reading {item.file}", total=record["bytes"], unit="B") as progress:
                    for batch in iter_parquet(path, ["article", "highlights"], left, progress):
                        rows.extend(batch["article"], batch["highlights"])
    return raw.finish(files=records, options=opts.model_dump())
