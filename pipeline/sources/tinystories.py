"""TinyStories V2 (language modelling): short GPT-4-written stories, roneneldan/TinyStories.

Files: TinyStoriesV2-GPT4-train.txt (2.2 GB) and TinyStoriesV2-GPT4-valid.txt (22 MB), plain text
with stories separated by `<|endoftext|>`. Each story is one document.
Splits: train from the train file. The dataset has no test file, so the validation file is cut in
two, in file order: the last `test_from_validation` fraction of its stories become test (0 keeps
the whole file as validation and writes no test split).
Size: `max_rows` keeps the first N stories read from each file; `max_bytes` downloads only the
first N bytes of each file (a Range request), dropping the story cut at the end — use it to try
the dataset without fetching the 2.2 GB train file.
"""
from __future__ import annotations

import itertools
from pathlib import Path

from pydantic import Field, PositiveInt

from pipeline.sources.common import NeededFile, RemoteFiles, RemoteOptions, Split, needed_file, parse_options, write_raw
from pipeline.sources.formats import iter_delimited

NAME = "tinystories"
task = "language_modeling"

BASE_URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main"
SEPARATOR = "<|endoftext|>"


class Options(RemoteOptions):
    base_url: str = BASE_URL
    files: dict[Split, str] = Field(default_factory=lambda: {
        "train": "TinyStoriesV2-GPT4-train.txt", "validation": "TinyStoriesV2-GPT4-valid.txt"})
    max_bytes: PositiveInt | None = None  # download only this many leading bytes of each file
    test_from_validation: float = Field(0.5, ge=0, lt=1)


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    """One file per split; with max_bytes, its prefix (cached under a `.first-N-bytes` name)."""
    return [needed_file(opts.base_url, file, cache_dir, split, opts.max_bytes)
            for split, file in opts.files.items()]


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> None:
    opts = parse_options(Options, options, NAME)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    stories, records = {}, []
    for item in files.needed:
        split = item.split
        path, record = files.get(item)
        records.append({"split": split, **record})
        # a file exactly max_bytes long was (almost surely) cut mid-story
        cut = opts.max_bytes is not None and record["bytes"] == opts.max_bytes
        stories[split] = list(itertools.islice(iter_delimited(path, SEPARATOR, drop_tail=cut),
                                               opts.max_rows))
    if "validation" in stories and "test" not in stories and opts.test_from_validation > 0:
        val = stories["validation"]
        n_test = round(len(val) * opts.test_from_validation)
        if n_test < 1 or n_test == len(val):
            raise ValueError(f"data.{NAME}.test_from_validation: cannot cut {len(val)} validation "
                             f"stories into validation and test")
        stories["validation"], stories["test"] = val[:-n_test], val[-n_test:]
    splits = {s: {"source": [""] * len(docs), "target": docs} for s, docs in stories.items()}
    write_raw(out_dir, splits, {"source": NAME, "task": task, "files": records,
                                "options": opts.model_dump()})
