"""TinyStories V2 (language modelling): short GPT-4-written stories, the Hugging Face Hub dataset
roneneldan/TinyStories (downloaded by the hub's client: pipeline/sources/hub.py).

Files: TinyStoriesV2-GPT4-train.txt (2.2 GB) and TinyStoriesV2-GPT4-valid.txt (22 MB), plain text
with stories separated by `<|endoftext|>`. Each story is one document.
Splits: train from the train file. The dataset has no test file, so the validation file is cut in
two, in file order: the last `test_from_validation` fraction of its stories become test (0 keeps
the whole file as validation and writes no test split).
Size: `max_rows` keeps the first N stories read from each file; `max_bytes` downloads only the
first N bytes of each file (a Range request; the prefix is kept in the project's cache, not the
hub's, which holds whole files only), dropping the story cut at the end — use it to try the
dataset without fetching the 2.2 GB train file.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, PositiveInt

from pipeline.io.progress import Progress
from pipeline.sources.common import HubOptions, NeededFile, RawWriter, RemoteFiles, Split, hub_file, parse_options
from pipeline.sources.plain_text import delimited_batches

NAME = "tinystories"
task = "language_modeling"

REPO = "roneneldan/TinyStories"
SEPARATOR = "<|endoftext|>"


class Options(HubOptions):
    repo: str = REPO
    files: dict[Split, str] = Field(default_factory=lambda: {
        "train": "TinyStoriesV2-GPT4-train.txt", "validation": "TinyStoriesV2-GPT4-valid.txt"})
    max_bytes: PositiveInt | None = None  # download only this many leading bytes of each file
    test_from_validation: float = Field(0.5, ge=0, lt=1)


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    """One file per split; with max_bytes, its prefix (cached under a `.first-N-bytes` name)."""
    return [hub_file(opts, file, cache_dir, split, opts.max_bytes)
            for split, file in opts.files.items()]


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict:
    opts = parse_options(Options, options, NAME)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    raw = RawWriter(out_dir, {"source": NAME, "task": task})
    records = []
    for item in files.needed:
        split = item.split
        path, record = files.get(item)
        records.append({"split": split, **record})
        # a file exactly max_bytes long was (almost surely) cut mid-story
        cut = opts.max_bytes is not None and record["bytes"] == opts.max_bytes

        def stories(what: str) -> Iterator[list[str]]:
            """The file's stories (the first max_rows), a list at a time, streamed."""
            with Progress(f"{what} {path.name}", total=record["bytes"], unit="B") as progress:
                left = opts.max_rows
                for batch in delimited_batches(path, SEPARATOR, drop_tail=cut, progress=progress):
                    batch = batch if left is None else batch[:left]
                    yield batch
                    if left is not None:
                        left -= len(batch)
                        if not left:
                            return

        if split == "validation" and "test" not in opts.files and opts.test_from_validation > 0:
            # The last fraction of the stories becomes test: count them first (a second pass
            # over a file of some MB keeps memory bounded for any size).
            n = sum(len(b) for b in stories("counting"))
            n_test = round(n * opts.test_from_validation)
            if n_test < 1 or n_test == n:
                raise ValueError(f"data.{NAME}.test_from_validation: cannot cut {n} validation "
                                 f"stories into validation and test")
            with raw.split("validation") as val, raw.split("test") as test:
                for batch in stories("reading"):
                    keep = max(0, min(len(batch), n - n_test - val.count))
                    val.extend_strings(None, batch[:keep])
                    test.extend_strings(None, batch[keep:])
            continue
        with raw.split(split) as rows:
            for batch in stories("reading"):
                rows.extend_strings(None, batch)
    return raw.finish(files=records, options=opts.model_dump())
