"""Dataset sources for the download stage: each turns a public dataset (or local files) into raw/.

Every source is a module `pipeline.sources.<name>` with
    task: "summarization" | "translation" | "language_modeling"  (None for `local`: set by options)
    Options: a pydantic model of its `data.<name>` params section (unknown keys are errors)
    fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict[str, common.TextStats]
        downloads into cache_dir (reused when present and valid) and writes
        out_dir/<split>.parquet (string columns source, target) and out_dir/meta.json, with
        common.RawWriter or write_raw; returns what they return (each split's rows and lengths).
and the downloaded (remote) sources also
    needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]
        every file the options call for, with its URL and cache path, known before any download;
        `RemoteFiles` checks them against the caches first and names the missing ones when offline.
meta.json["task"] is authoritative (it is the only place `local` records its task).
Shared by the sources: common (options, needed files, writing raw/), hub (a Hugging Face Hub
dataset's files, with the hub's client: its cache, token, endpoint and offline switch), http
(plain URLs: cache and checksum), text_io (opening text: gzip, UTF-8, bounded lines), formats (readers
of parquet, JSONL, JSON, CSV) and plain_text (text cut into documents, parallel text).

`SOURCES` maps name -> module and imports a module only when it is looked up, so importing this
package has no side effects and one broken or missing source cannot break the others.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

from pipeline.params import SOURCE_NAMES

# `synthetic` is not here: it generates data in-process and the download stage handles it itself.
_NAMES = tuple(name for name in SOURCE_NAMES if name != "synthetic")


class _Registry(Mapping[str, ModuleType]):
    def __getitem__(self, name: str) -> ModuleType:
        if name not in _NAMES:
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name}")

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)


SOURCES: Mapping[str, ModuleType] = _Registry()


def get_source(name: str) -> ModuleType:
    """SOURCES[name], with a one-line error listing the valid names."""
    if name not in _NAMES:
        raise ValueError(f"data.source: unknown source {name!r}; choose one of {', '.join(_NAMES)}")
    return SOURCES[name]
