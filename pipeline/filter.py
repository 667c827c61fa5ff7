"""Stage `filter`: keep examples within the token-length limits, subsample, split.

    python -m pipeline.filter --raw data/raw --out data/filtered --metrics data/metrics/filter.json

Lengths are counted with a cheap pre-tokenizer (words and punctuation marks), before any subword
model exists, so the limits bound the BPE length only roughly (BPE is usually longer); or, with
`filter.length_unit: chars`, in characters (character-level studies).
Sources without a validation or test split get one carved from train: with a seeded shuffle, or
for language modelling (meta.json's task) from the end of train in document order, validation
then test, so that neighbouring paragraphs of one text only meet at the split boundaries (a
shuffle would put the rest of a training story into the test set).

The stage streams, so a corpus of gigabytes needs a few record batches of memory, not the corpus:
a first pass counts lengths (pre-tokens in WORKERS processes), draws the subsample and keeps one
byte a row (the keep mask) and length histograms (the percentiles); a second pass writes the kept
rows batch by batch. The shuffled carve still writes train in the permuted order: rows go to bucket
files by their place in the permutation, and each bucket (about ROW_GROUP_BYTES of text) is sorted
in memory. A file of at most ROW_GROUP_BYTES of text is one row group, byte-identical to what the
stage wrote when it held the corpus in memory.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import shutil
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from pipeline.atomic import atomic_path, atomic_write_json
from pipeline.params import FilterParams, ParamsError, load_params, stage_error
from pipeline.progress import Progress

SPLITS = ("train", "validation", "test")
_PRETOKEN = re.compile(r"\w+|[^\w\s]")
BATCH_BYTES = 4 << 20  # text per record batch read
ROW_GROUP_BYTES = 64 << 20  # text per row group written, and per bucket of the shuffled carve
# Processes counting pre-tokens, the stage's CPU-bound part: one per core, up to the 2 cores this
# project targets (the reading process feeds them too).
WORKERS = max(1, min(2, os.cpu_count() or 1))
# The schema pandas gave these files (its metadata included): small outputs stay byte-identical.
SCHEMA = pa.Schema.from_pandas(pd.DataFrame({"source": [""], "target": [""]}), preserve_index=False)

# One split's rows, batch by batch; called again for the second pass.
Reader = Callable[[], Iterable[pa.RecordBatch]]


def count_tokens(text: str) -> int:
    return len(_PRETOKEN.findall(text))


class Histogram:
    """Counts of integer lengths: dense bins below DENSE, a Counter above (a 50 MB document counted
    in characters must not cost a 50M-bin array)."""
    DENSE = 1 << 16

    def __init__(self):
        self.dense = np.zeros(0, dtype=np.int64)
        self.sparse: Counter[int] = Counter()

    def add(self, values: np.ndarray) -> None:
        small = values < self.DENSE
        counts = np.bincount(values[small], minlength=len(self.dense))
        counts[:len(self.dense)] += self.dense
        self.dense = counts
        for value, n in zip(*np.unique(values[~small], return_counts=True)):
            self.sparse[int(value)] += int(n)

    def sorted_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct values in increasing order and how often each occurs."""
        present = np.flatnonzero(self.dense)
        big = sorted(self.sparse)
        return (np.concatenate([present, np.array(big, dtype=np.int64)]).astype(np.int64),
                np.concatenate([self.dense[present], np.array([self.sparse[v] for v in big], dtype=np.int64)]))


def percentiles(hist: Histogram) -> dict[str, float | None]:
    """np.percentile(lengths, [50, 90, 99]) (linear interpolation) and the max, from the histogram:
    the same arithmetic as NumPy's, on the values at the neighbouring ranks."""
    values, counts = hist.sorted_counts()
    n = int(counts.sum())
    if n == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    virtual = (n - 1) * np.true_divide(np.array([50, 90, 99]), 100)
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1  # NumPy takes the last value there
    previous[above] = following[above] = -1
    previous, following = previous.astype(np.intp), following.astype(np.intp)
    gamma = virtual - previous
    ends = np.cumsum(counts)

    def at(rank: np.ndarray) -> np.ndarray:  # the value at each rank of the sorted lengths
        return values[np.searchsorted(ends, np.where(rank < 0, n - 1, rank), side="right")]

    a, b = at(previous), at(following)
    diff = b - a
    q = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=q, where=gamma >= 0.5)
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": float(values[-1])}


def _texts(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """source and target as SCHEMA's strings, a missing text as ""."""
    empty = pa.scalar("", pa.large_string())
    return pa.Table.from_arrays([pc.fill_null(batch.column(name).cast(pa.large_string()), empty)
                                 for name in ("source", "target")], schema=SCHEMA)


def _pretokens(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    return tuple(np.fromiter(map(count_tokens, table.column(name).to_pylist()), dtype=np.int64,
                             count=table.num_rows) for name in ("source", "target"))


def _chars(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    return tuple(pc.utf8_length(table.column(name)).to_numpy().astype(np.int64)
                 for name in ("source", "target"))


def counted(tables: Iterable[pa.Table], unit: str, pool=None) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:
    """(table, source lengths, target lengths) in order; pre-tokens counted in `pool` if given."""
    count = _chars if unit == "chars" else _pretokens
    if pool is None or unit == "chars":
        for table in tables:
            yield table, *count(table)
        return
    pending: deque = deque()
    for table in tables:
        pending.append((table, pool.apply_async(count, (table,))))
        if len(pending) > 2 * WORKERS:  # a bounded read-ahead, never the whole file queued
            done, result = pending.popleft()
            yield done, *result.get()
    while pending:
        done, result = pending.popleft()
        yield done, *result.get()


class ParquetSink:
    """One output file written a row group at a time (ROW_GROUP_BYTES of text buffered)."""

    def __init__(self, path: Path):
        self.path, self.parts, self.bytes, self.writer = path, [], 0, None

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            self.parts.append(table)
            self.bytes += table.nbytes
        if self.bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self, whole: bool = False) -> None:
        table = pa.concat_tables(self.parts or [SCHEMA.empty_table()])
        if whole:  # the file is this one row group: one chunk, as pandas wrote it, gives the same bytes
            table = table.combine_chunks()
        self.parts, self.bytes = [], 0
        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, SCHEMA)
        self.writer.write_table(table)
        del table
        pa.default_memory_pool().release_unused()  # give the row group's buffers back to the OS

    def close(self) -> None:
        if self.parts or self.writer is None:
            self._flush(whole=self.writer is None)
        self.writer.close()


class FrameSink:
    """The rows of one split in memory, as a DataFrame (filter_splits: tests and small corpora)."""

    def __init__(self):
        self.parts = []

    def write(self, table: pa.Table) -> None:
        self.parts.append(table)

    def close(self) -> None:
        pass

    def frame(self) -> pd.DataFrame:
        return pa.concat_tables(self.parts or [SCHEMA.empty_table()]).to_pandas()


class Permuter:
    """Rows handed in with their places in a permutation come back in that order, a bucket of
    consecutive places at a time. One bucket (a train split of at most ROW_GROUP_BYTES of text)
    stays in memory; more spill to Arrow IPC files in `scratch`, each sorted when read back."""

    def __init__(self, n_rows: int, n_bytes: int, scratch: Path):
        self.n_buckets = max(1, math.ceil(n_bytes / ROW_GROUP_BYTES))
        self.size = max(1, math.ceil(n_rows / self.n_buckets))
        self.scratch, self.parts, self.writers = scratch, [], {}

    def add(self, table: pa.Table, places: np.ndarray) -> None:
        table = table.append_column("place", pa.array(places, pa.int64()))
        if self.n_buckets == 1:
            self.parts.append(table)
            return
        bucket = places // self.size
        order = np.argsort(bucket, kind="stable")
        table, bounds = table.take(order), np.searchsorted(bucket[order], np.arange(self.n_buckets + 1))
        for b in np.flatnonzero(bounds[1:] > bounds[:-1]):
            if b not in self.writers:
                self.scratch.mkdir(parents=True, exist_ok=True)
                self.writers[b] = ipc.new_stream(self.scratch / f"{b}.arrow", table.schema)
            self.writers[b].write_table(table.slice(bounds[b], bounds[b + 1] - bounds[b]))

    def ordered(self) -> Iterator[tuple[pa.Table, int]]:
        """(rows, the place of the first) bucket by bucket, in permutation order."""
        for writer in self.writers.values():
            writer.close()
        for b in range(self.n_buckets):
            if self.n_buckets == 1:
                table = pa.concat_tables(self.parts) if self.parts else None
            elif b in self.writers:
                with ipc.open_stream(self.scratch / f"{b}.arrow") as reader:
                    table = reader.read_all()
                (self.scratch / f"{b}.arrow").unlink()
            else:
                table = None
            if table is not None and table.num_rows:
                table = table.take(np.argsort(table.column("place").to_numpy()))
                yield table.drop_columns(["place"]), b * self.size


def _measure(readers: dict[str, Reader], cfg: FilterParams, rng: np.random.Generator, pool,
             progress: Progress) -> tuple[dict, dict, dict, int]:
    """Pass 1: per split the keep mask (one byte a row), the counts; length histograms; the text
    bytes kept in train (for the shuffled carve's buckets)."""
    masks, splits, train_bytes = {}, {}, 0
    hists = {(side, stage): Histogram() for side in ("source", "target") for stage in ("raw", "kept")}
    for split, read in readers.items():
        parts, n_ok = [], 0
        for table, src_len, tgt_len in counted(map(_texts, read()), cfg.length_unit, pool):
            ok = (cfg.min_source_tokens <= src_len) & (src_len <= cfg.max_source_tokens) & \
                (cfg.min_target_tokens <= tgt_len) & (tgt_len <= cfg.max_target_tokens)
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
        splits[split] = {"raw": len(keep), "dropped_length": len(keep) - n_ok,
                         "dropped_subsample": n_ok - int(keep.sum()), "kept": int(keep.sum())}
    return masks, splits, hists, train_bytes


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
        splits[split] = {"raw": 0, "dropped_length": 0, "dropped_subsample": 0, "kept": sizes[split],
                         "from_train": sizes[split]}
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
            table = _texts(batch)
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
    splits. Length percentiles are given for the raw examples and for the kept ones.
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
    tables = {}
    for split, frame in frames.items():
        missing = {"source", "target"} - set(frame.columns)
        if missing:
            raise ValueError(f"{split}: missing column(s) {', '.join(sorted(missing))}")
        tables[split] = pa.Table.from_pandas(frame[["source", "target"]], preserve_index=False)
    sinks = {split: FrameSink() for split in SPLITS}
    with tempfile.TemporaryDirectory() as scratch:
        stats = run_filter({split: (lambda t=table: t.to_batches(max_chunksize=batch_rows))
                            for split, table in tables.items()}, cfg, task, sinks.__getitem__, Path(scratch),
                           workers=workers)
    return {split: sink.frame() for split, sink in sinks.items()}, stats


def parquet_reader(path: Path) -> tuple[Reader, int, int]:
    """A Reader of `path`'s source and target, its rows and its text bytes (from the metadata)."""
    with pq.ParquetFile(path) as file:
        missing = {"source", "target"} - set(file.schema_arrow.names)
        meta = file.metadata
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
    rows = meta.num_rows
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    batch_rows = max(1, min(1 << 16, BATCH_BYTES * rows // max(size, 1)))

    def batches() -> Iterator[pa.RecordBatch]:
        # A column chunk read piece by piece: by default (pre_buffer, or no buffer_size) Arrow reads
        # it whole, and a file written as one row group is then held whole.
        with pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False) as file:
            yield from file.iter_batches(batch_size=batch_rows, columns=["source", "target"])
    return batches, rows, size


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
        workers = WORKERS if size > 4 * BATCH_BYTES else 1
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
    limits = (f"source {cfg.min_source_tokens}-{cfg.max_source_tokens}, target {cfg.min_target_tokens}-"
              f"{cfg.max_target_tokens} {cfg.length_unit}")
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
    # Run from the imported module, not __main__: the counting processes are handed its functions
    # by name, and `python -m` (or a profiler) would name them after __main__.
    from pipeline.filter import main as run

    run()
