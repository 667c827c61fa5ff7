"""Stage `filter`: keep examples within the token-length limits, subsample, split.

    python -m pipeline.filter --raw data/raw --out data/filtered --metrics data/metrics/filter.json

Lengths are counted with a cheap pre-tokenizer (words and punctuation marks), before any subword
model exists, so the limits bound the BPE length only roughly (BPE is usually longer); or, with
`filter.length_unit: chars`, in characters (character-level studies, or a limit stated in
characters, as CNN/DailyMail's `len(article) <= 1640`). A maximum of null leaves that side
unlimited. After the limits, `filter.subsample` keeps that fraction of each split, drawn with
`filter.seed`. Per split the stats record the examples seen (`raw`), those within the limits
(`kept_length`), those also drawn by the subsample (`kept_subsample`) and their share of the seen
(`kept_share`), before any carve moves rows between splits.
Sources without a validation or test split get one carved from train: with a seeded shuffle, or
for language modelling (meta.json's task) from the end of train in document order, validation
then test, so that neighbouring paragraphs of one text only meet at the split boundaries (a
shuffle would put the rest of a training story into the test set).

The stage streams, so a corpus of gigabytes needs a few record batches of memory, not the corpus:
a first pass counts lengths (pre-tokens in worker processes: pipeline.filtering.lengths), draws
the subsample and keeps one byte a row (the keep mask) and length histograms (the percentiles); a
second pass writes the kept rows batch by batch (pipeline.filtering.tables). The shuffled carve
still writes train in the permuted order: rows go to bucket files by their place in the
permutation, and each bucket is sorted in memory.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.filtering import tables
from pipeline.filtering.lengths import WORKERS, Histogram, counted, percentiles
from pipeline.filtering.tables import (
    FrameSink, ParquetSink, Permuter, Reader, parquet_reader, texts,
)
from pipeline.io.atomic import atomic_path, atomic_write_json
from pipeline.io.progress import Progress
from pipeline.params import FilterParams, ParamsError, load_params, stage_error

SPLITS = ("train", "validation", "test")


def _measure(readers: dict[str, Reader], cfg: FilterParams, rng: np.random.Generator, pool,
             progress: Progress) -> tuple[dict, dict, dict, int]:
    """Pass 1: per split the keep mask (one byte a row), the counts; length histograms; the text
    bytes kept in train (for the shuffled carve's buckets)."""
    masks, splits, train_bytes = {}, {}, 0
    hists = {(side, stage): Histogram() for side in ("source", "target") for stage in ("raw", "kept")}
    for split, read in readers.items():
        parts, n_ok = [], 0
        for table, src_len, tgt_len in counted(map(texts, read()), cfg.length_unit, pool):
            ok = _within(src_len, cfg.min_source_tokens, cfg.max_source_tokens) & \
                _within(tgt_len, cfg.min_target_tokens, cfg.max_target_tokens)
            keep = ok.copy()
            if cfg.subsample < 1.0:
                # Drawn batch by batch: the same stream of numbers as one draw for the whole split.
                keep[ok] = rng.random(int(ok.sum())) < cfg.subsample
            for side, n in (("source", src_len), ("target", tgt_len)):
                hists[side, "raw"].add(n)
                hists[side, "kept"].add(n[keep])  # carving only moves kept rows between splits
            if split == "train":
                sizes = [np.asarray(pc.binary_length(table.column(c))) for c in ("source", "target")]
                train_bytes += int((sizes[0] + sizes[1])[keep].sum())
            parts.append(keep)
            n_ok += int(ok.sum())
            progress.update(table.num_rows)
        keep = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
        masks[split] = keep
        splits[split] = _counts(len(keep), n_ok, int(keep.sum()))
    return masks, splits, hists, train_bytes


def _within(n: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    """lo <= n <= hi, element-wise; hi None: no upper limit."""
    ok = lo <= n
    return ok if hi is None else ok & (n <= hi)


def _counts(raw: int, kept_length: int, kept_subsample: int) -> dict:
    """One split's counts before any carve: seen, within the limits, also drawn by the subsample,
    and that last one's share of the seen (None for a split that had no rows)."""
    return {"raw": raw, "dropped_length": raw - kept_length, "dropped_subsample": kept_length - kept_subsample,
            "kept_length": kept_length, "kept_subsample": kept_subsample,
            "kept_share": kept_subsample / raw if raw else None, "kept": kept_subsample}


def _carve(splits: dict, readers: dict, cfg: FilterParams, task: str | None,
           rng: np.random.Generator) -> tuple[str | None, list, np.ndarray | None]:
    """Where train's kept rows go: (carve, [(split, first place, end place)], places). Row k of
    train's kept rows has place k (the tail carve) or places[k] (the seeded shuffle)."""
    missing = [s for s in ("validation", "test") if s not in readers]
    if not missing:
        return None, [], None
    n = splits["train"]["kept"]
    fractions = {"validation": cfg.val_fraction, "test": cfg.test_fraction}
    sizes = {split: int(round(n * fractions[split])) for split in missing}
    if task == "language_modeling":
        # The tail in document order: a story cut into paragraph rows straddles at most the
        # train/validation and validation/test boundaries.
        start, places, carve = max(0, n - sum(sizes.values())), None, "contiguous_tail"
        ranges = [("train", 0, start)]
    else:
        # Train in permuted order, as before the stage streamed: validation, test, then train.
        permutation = rng.permutation(n)
        places = np.empty(n, dtype=np.int64)
        places[permutation] = np.arange(n)
        start, carve, ranges = 0, "shuffled", [("train", sum(sizes.values()), n)]
    for split in missing:
        ranges.append((split, start, start + sizes[split]))
        splits[split] = {**_counts(0, 0, 0), "kept": sizes[split], "from_train": sizes[split]}
        splits["train"][f"to_{split}"] = sizes[split]
        start += sizes[split]
    ranges = [(split, min(lo, n), min(hi, n)) for split, lo, hi in ranges]
    splits["train"]["kept"] = next(hi - lo for split, lo, hi in ranges if split == "train")
    return carve, ranges, places


def _route(table: pa.Table, first: int, ranges: list, sinks: dict) -> None:
    """Rows at places first, first + 1, ... to the splits whose ranges hold them."""
    for split, lo, hi in ranges:
        a, b = max(lo, first), min(hi, first + table.num_rows)
        if a < b:
            sinks[split].write(table.slice(a - first, b - a))


def _write(readers: dict[str, Reader], masks: dict, ranges: list, places: np.ndarray | None,
           train_bytes: int, sinks: dict, scratch: Path, progress: Progress) -> None:
    """Pass 2: the kept rows of every split to its sink, train's carved as `ranges` say."""
    permuter = Permuter(len(places), train_bytes, scratch) if places is not None else None
    for split, read in readers.items():
        mask, offset, k = pa.array(masks[split]), 0, 0
        for batch in read():
            table = texts(batch)
            kept = table.filter(mask.slice(offset, table.num_rows))
            offset += table.num_rows
            if split != "train" or not ranges:
                sinks[split].write(kept)
            elif permuter is None:
                _route(kept, k, ranges, sinks)
            else:
                permuter.add(kept, places[k:k + kept.num_rows])
            k += kept.num_rows
            progress.update(table.num_rows)
    if permuter is not None:
        for table, first in permuter.ordered():
            _route(table, first, ranges, sinks)
    for sink in sinks.values():
        sink.close()


def run_filter(readers: dict[str, Reader], cfg: FilterParams, task: str | None, open_sink,
               scratch: Path, rows: int | None = None, workers: int = 1) -> dict:
    """Length filter + subsample per split, then carve missing validation/test splits from train:
    shuffled, or for task language_modeling the contiguous tail of train (never shuffled).
    `open_sink(split)` gives where a split's rows go; `rows` (the total, if known) is for progress.

    Per split the stats add up: raw = dropped_length + dropped_subsample + kept + moved to other
    splits; kept_length and kept_subsample (and kept_share = kept_subsample / raw) are the counts
    before the carve. Length percentiles are given for the raw examples and for the kept ones.
    """
    if "train" not in readers:
        raise ValueError("no train split")
    rng = np.random.default_rng(cfg.seed)
    # Pre-tokens are counted in `workers` processes (forked: they start at once); characters are
    # counted by Arrow, which needs none.
    pool = multiprocessing.Pool(workers) if workers > 1 and cfg.length_unit == "pretokens" else None
    try:
        with Progress("filter: counting lengths", total=rows, unit="rows") as progress:
            masks, splits, hists, train_bytes = _measure(readers, cfg, rng, pool, progress)
    finally:
        if pool is not None:
            pool.terminate()
    stats = {"splits": splits, "length_unit": cfg.length_unit}
    carve, ranges, places = _carve(splits, readers, cfg, task, rng)
    if carve:
        stats["carve"] = carve
    sizes = {split: hi - lo for split, lo, hi in ranges}
    for split in SPLITS:
        if split not in splits or sizes.get(split, splits[split]["kept"]) == 0:
            raise ValueError(f"split {split!r} is empty after filtering: {_why_empty(split, splits, cfg)}")
    stats["length_percentiles"] = {side: {stage: percentiles(hists[side, stage]) for stage in ("raw", "kept")}
                                   for side in ("source", "target")}
    stats["limits"] = cfg.model_dump()
    with Progress("filter: writing", total=rows, unit="rows") as progress:
        _write(readers, masks, ranges, places, train_bytes, {s: open_sink(s) for s in SPLITS}, scratch, progress)
    return stats


def filter_splits(frames: dict[str, pd.DataFrame], cfg: FilterParams, task: str | None = None,
                  batch_rows: int = 4096, workers: int = 1) -> tuple[dict[str, pd.DataFrame], dict]:
    """run_filter on frames in memory; the kept frames and the stats."""
    given = {}
    for split, frame in frames.items():
        missing = {"source", "target"} - set(frame.columns)
        if missing:
            raise ValueError(f"{split}: missing column(s) {', '.join(sorted(missing))}")
        given[split] = pa.Table.from_pandas(frame[["source", "target"]], preserve_index=False)
    sinks = {split: FrameSink() for split in SPLITS}
    with tempfile.TemporaryDirectory() as scratch:
        stats = run_filter({split: (lambda t=table: t.to_batches(max_chunksize=batch_rows))
                            for split, table in given.items()}, cfg, task, sinks.__getitem__, Path(scratch),
                           workers=workers)
    return {split: sink.frame() for split, sink in sinks.items()}, stats


def filter_files(raw_dir: Path, out_dir: Path, cfg: FilterParams) -> dict:
    """The stage: data/raw/<split>.parquet -> out_dir/<split>.parquet (+ meta.json); the stats."""
    meta = raw_dir / "meta.json"
    info = json.loads(meta.read_text(encoding="utf-8")) if meta.exists() else {}
    readers, rows, size = {}, 0, 0
    for split in SPLITS:
        if (raw_dir / f"{split}.parquet").exists():
            readers[split], n, nbytes = parquet_reader(raw_dir / f"{split}.parquet")
            rows, size = rows + n, size + nbytes
    if "train" not in readers:
        raise ValueError(f"{raw_dir}: no train.parquet")
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        # Below a few batches, forking the counting processes costs more than it saves.
        workers = WORKERS if size > 4 * tables.BATCH_BYTES else 1
        stats = run_filter(readers, cfg, info.get("task"), lambda split: ParquetSink(tmp / f"{split}.parquet"),
                           tmp / ".carve", rows, workers)
        shutil.rmtree(tmp / ".carve", ignore_errors=True)
        if meta.exists():
            shutil.copy(meta, tmp / "meta.json")
    # What the source said about its splits (e.g. "test is the validation text"): the report
    # reads it from here, next to the split counts it qualifies.
    stats["source_notes"] = list(info.get("notes", []))
    return stats


def _why_empty(split: str, splits: dict, cfg: FilterParams) -> str:
    """What emptied `split` and the setting to change: the length limits are blamed only when they
    removed examples (raising them cannot fill a split that had no rows to begin with)."""
    train = splits["train"]
    carved = train.get("to_validation", 0) + train.get("to_test", 0)
    def span(lo: int, hi: int | None) -> str:
        return f"{lo}-{hi}" if hi is not None else f">= {lo}"

    limits = (f"source {span(cfg.min_source_tokens, cfg.max_source_tokens)}, target "
              f"{span(cfg.min_target_tokens, cfg.max_target_tokens)} {cfg.length_unit}")
    s = splits[split]
    if "from_train" in s:  # carved from train, which is not empty (it is checked first)
        fraction = "val_fraction" if split == "validation" else "test_fraction"
        why = (f"filter.{fraction} = {getattr(cfg, fraction)} of the {train['kept'] + carved} training "
               f"examples left rounds to none; raise it or give the source more examples")
        removed = [f"the length limits ({limits}) removed {train['dropped_length']} of {train['raw']}"
                   ] if train["dropped_length"] else []
        if train["dropped_subsample"]:
            removed.append(f"filter.subsample = {cfg.subsample} removed {train['dropped_subsample']}")
        return why + (f" ({'; '.join(removed)})" if removed else "")
    if s["raw"] == 0:
        return "the raw split has no examples"
    if s["dropped_length"] == s["raw"]:
        return f"all {s['raw']} examples are outside the length limits ({limits}); loosen the filter limits"
    if s["kept"] + (carved if split == "train" else 0) == 0:
        return (f"filter.subsample = {cfg.subsample} kept none of the {s['raw'] - s['dropped_length']} "
                f"examples within the length limits; raise it")
    return (f"filter.val_fraction + filter.test_fraction took all {carved} examples for validation and "
            f"test; lower them")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--raw", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    try:
        cfg = load_params(args.params).filter
        stats = filter_files(Path(args.raw), Path(args.out), cfg)
        atomic_write_json(args.metrics, stats)
    except (ParamsError, ValueError, OSError) as exc:
        raise stage_error("filter", exc) from None


if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
