"""IWSLT 2017 English-German (translation): TED talk transcripts and their translations.

Reads the parquet export of the Hugging Face hub dataset `IWSLT/iwslt2017`, config
`iwslt2017-en-de` (the hub's parquet-converter branch `refs/convert/parquet`; the dataset's main
branch only holds a loading script and the original zipped XML), downloaded by the hub's client
(pipeline/sources/hub.py). Each row has a `translation`
struct {"de": ..., "en": ...}; `direction` picks which side is the source.

`local_dir`: read the official release instead (for when the Hugging Face copy is unreachable):
the extracted `en-de/` folder of the IWSLT 2017 archive, as the organisers ship it. Train is
train.tags.en-de.{en,de} (tag lines dropped), validation IWSLT17.TED.dev2010.en-de.{en,de}.xml
and test IWSLT17.TED.tst2010.en-de.{en,de}.xml (the <seg> text, aligned by document and seg id),
the same splits as the Hugging Face copy; `local_files` renames them ({lang}: en or de).
Nothing is downloaded then. A missing file is a one-line error listing every file expected.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pipeline.io.progress import Progress
from pipeline.sources.common import (
    Direction, HubOptions, NeededFile, RawWriter, RemoteFiles, Split, hub_file, parse_options, shown, write_raw,
)
from pipeline.sources.formats import read_parquet
from pipeline.sources.http import ChecksumError, DownloadError, sha256_file
from pipeline.sources.markup import tagged_pairs, xml_pairs

NAME = "iwslt2017"
task = "translation"

REPO = "IWSLT/iwslt2017"


LOCAL_FILES = {"train": "train.tags.en-de.{lang}", "validation": "IWSLT17.TED.dev2010.en-de.{lang}.xml",
               "test": "IWSLT17.TED.tst2010.en-de.{lang}.xml"}


class Options(HubOptions):
    repo: str = REPO
    revision: str = "refs/convert/parquet"
    subfolder: str = "iwslt2017-en-de"
    files: dict[Split, str] = Field(default_factory=lambda: {
        s: f"{s}/0000.parquet" for s in ("train", "validation", "test")})
    direction: Direction = "en-de"
    local_dir: str | None = None  # the official release's extracted en-de/ folder
    local_files: dict[Split, str] = Field(default_factory=lambda: dict(LOCAL_FILES))


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    return [hub_file(opts, file, cache_dir, split)
            for split, file in opts.files.items()]


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict:
    opts = parse_options(Options, options, NAME)
    if opts.local_dir is not None:
        return fetch_local(opts, out_dir)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    src_lang, tgt_lang = opts.direction.split("-")
    splits, records = {}, []
    for item in files.needed:
        split = item.split
        try:
            path, record = files.get(item)
        except ChecksumError:
            raise
        except DownloadError as err:
            raise DownloadError(f"{err}; or set data.{NAME}.local_dir to the extracted en-de/ folder "
                                f"of the official release", reason=err.reason) from err
        records.append({"split": split, **record})
        pairs = read_parquet(path, ["translation"], opts.max_rows)["translation"]
        for i, pair in enumerate(pairs):
            if not isinstance(pair, dict) or not all(isinstance(pair.get(k), str)
                                                     for k in ("en", "de")):
                raise ValueError(f"{path}: record {i + 1}: translation must hold strings 'en' and 'de' "
                                 f"(got {shown(pair)})")
        splits[split] = {"source": [p[src_lang] for p in pairs],
                         "target": [p[tgt_lang] for p in pairs]}
    return write_raw(out_dir, splits, {"source": NAME, "task": task, "direction": opts.direction,
                                "files": records, "options": opts.model_dump()})


def fetch_local(opts: Options, out_dir: Path) -> dict:
    """The official release in `local_dir`, streamed (train.tags + XML, see the module doc)."""
    root = Path(opts.local_dir).expanduser()
    src_lang, tgt_lang = opts.direction.split("-")
    paths = {split: tuple(root / name.format(lang=lang) for lang in (src_lang, tgt_lang))
             for split, name in opts.local_files.items()}
    missing = [str(p) for pair in paths.values() for p in pair if not p.is_file()]
    if missing:
        raise ValueError(f"data.{NAME}.local_dir: {len(missing)} of {2 * len(paths)} files missing: "
                         f"{', '.join(missing)} (expected the extracted en-de/ folder of the "
                         f"official IWSLT 2017 release, with {', '.join(sorted(set(opts.local_files.values())))})")
    raw = RawWriter(out_dir, {"source": NAME, "task": task})
    records = []
    for split, (source, target) in paths.items():
        reader = tagged_pairs if source.name.startswith("train.tags.") else xml_pairs
        total = source.stat().st_size + target.stat().st_size
        with raw.split(split) as rows, Progress(f"reading {split}", total=total, unit="B") as progress:
            for s, t in reader(source, target, progress=progress):
                if opts.max_rows is None or rows.count < opts.max_rows:
                    rows.add(s, t)  # past max_rows: read on, to check the alignment to the end
        records += [{"split": split, "path": str(p), "sha256": sha256_file(p), "bytes": p.stat().st_size}
                    for p in (source, target)]
    return raw.finish(direction=opts.direction, files=records, options=opts.model_dump())
