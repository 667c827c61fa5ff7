"""Batches for training and evaluation, deterministic given the seed.

Seq2seq: examples are bucketed by length and packed under a cap on *padded* tokens per batch, so
padding stays low and memory is bounded whatever the length mix. The order of an epoch is a pure
function of (seed, epoch): resuming needs only (epoch, index), and every variant trained with the
same seed sees exactly the same batches, hence the same tokens.

Language modelling: contiguous windows of `context + 1` tokens from the concatenated stream. The
stream is written once from the parquet shards into a flat token file (a cache keyed by the shards)
and memory-mapped, so a corpus larger than RAM trains with nothing of it in the Python heap, and
every run, rank and variant shares one copy through the OS page cache.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from pipeline.io.atomic import atomic_path

# A token-cache temporary untouched this long was left by a killed builder (a live one writes on).
STALE_TEMP_S = 600


@dataclass
class Split:
    """One split's token ids; `src`/`tgt` are lists of int32 arrays."""
    src: list[np.ndarray]
    tgt: list[np.ndarray]


def read_manifest(shards: Path) -> dict:
    path = Path(shards) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the shard manifest ({exc})") from exc


@contextmanager
def reading_shard(path: Path) -> Iterator[None]:
    """Errors while reading a shard name it: pyarrow's own ("Corrupt snappy compressed data.") do not."""
    try:
        yield
    except FileNotFoundError:
        raise ValueError(f"{path}: shard listed in the manifest is missing; rebuild the shards with "
                         f"`dvc repro --force encode`") from None
    except (pa.ArrowException, OSError) as exc:
        # pyarrow sometimes puts the path in front of the reason; it is named once, first
        reason = re.sub(r"^Could not open Parquet input source '[^']*': ", "", str(exc).strip())
        reason = (reason.splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"{path}: corrupt or unreadable parquet shard ({reason}); rebuild the shards "
                         f"with `dvc repro --force encode`") from None


def numpy_view(array: pa.Array) -> np.ndarray:
    """An integer arrow array without nulls as a read-only numpy view of its buffer, no copy: what
    Array.to_numpy gives, without the pandas import it makes first (~0.3 s of every stage that
    reads shards: benchmarks/stage_overhead.py)."""
    if array.null_count or not pa.types.is_integer(array.type):
        return array.to_numpy(zero_copy_only=False)
    dtype = np.dtype(str(array.type))
    view = np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)
    view.flags.writeable = False
    return view


def load_split(shards: Path, manifest: dict, split: str, limit: int | None = None) -> Split:
    src, tgt = [], []
    for name in manifest["splits"][split]["files"]:
        # memory_map: pages come from the OS cache instead of a second copy in Python's heap.
        # ParquetFile, not pq.read_table: the same table, without read_table's import of
        # pyarrow.dataset (and through it pandas), ~0.3 s of every stage that reads shards.
        with reading_shard(Path(shards) / name):
            table = pq.ParquetFile(Path(shards) / name, memory_map=True).read(columns=["src_ids", "tgt_ids"])
        for column, out in (("src_ids", src), ("tgt_ids", tgt)):
            col = table.column(column).combine_chunks()
            values, offsets = numpy_view(col.values), numpy_view(col.offsets)
            out.extend(values[offsets[i]:offsets[i + 1]] for i in range(len(col)))
        if limit is not None and len(src) >= limit:
            break
    if limit is not None:
        src, tgt = src[:limit], tgt[:limit]
    return Split(src, tgt)


def load_texts(shards: Path, manifest: dict, split: str, limit: int | None = None
               ) -> tuple[list[str], list[str]]:
    """The split's raw (source, target) texts, as the dataset has them: what metrics score against."""
    src, tgt = [], []
    for name in manifest["splits"][split]["files"]:
        path = Path(shards) / name
        with reading_shard(path):
            shard = pq.ParquetFile(path)
            columns = shard.schema_arrow.names
        if "tgt_text" not in columns:
            raise ValueError(f"{path}: shard has no raw text (made by an older encode stage); "
                             f"rerun `dvc repro encode`")
        with reading_shard(path):
            table = shard.read(columns=["src_text", "tgt_text"])
        src += table.column("src_text").to_pylist()
        tgt += table.column("tgt_text").to_pylist()
        if limit is not None and len(src) >= limit:
            break
    return (src[:limit], tgt[:limit]) if limit is not None else (src, tgt)


def seq2seq_batches(split: Split, batch_tokens: int, seed: int, epoch: int,
                    shuffle: bool = True) -> list[np.ndarray]:
    """Index arrays, one per batch, for one epoch.

    Within chunks of ~50 batches' worth of examples, examples are sorted by length, cut into
    batches whose padded size (rows x (longest source + longest target + 1)) stays under
    `batch_tokens`, and the batches are shuffled. An example longer than the cap gets a batch alone.
    """
    n = len(split.src)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n) if shuffle else np.arange(n)
    lengths = np.array([len(s) + len(t) + 1 for s, t in zip(split.src, split.tgt)])
    src_len = np.array([len(s) for s in split.src])
    tgt_len = np.array([len(t) + 1 for t in split.tgt])
    mean_len = max(1.0, float(lengths.mean())) if n else 1.0
    chunk = max(1, int(50 * batch_tokens / mean_len))
    batches = []
    for start in range(0, n, chunk):
        idx = order[start:start + chunk]
        if shuffle:
            idx = idx[np.argsort(lengths[idx], kind="stable")]
        current, max_src, max_tgt = [], 0, 0
        for i in idx:
            s, t = max(max_src, src_len[i]), max(max_tgt, tgt_len[i])
            if current and (len(current) + 1) * (s + t) > batch_tokens:
                batches.append(np.array(current))
                current, s, t = [], src_len[i], tgt_len[i]
            current.append(i)
            max_src, max_tgt = s, t
        if current:
            batches.append(np.array(current))
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def collate(split: Split, idx: np.ndarray, pad_id: int, bos_id: int, eos_id: int):
    """(src, tgt_in, tgt_out) LongTensors: tgt_in = bos + target, tgt_out = target + eos."""
    src_rows = [split.src[i] for i in idx]
    tgt_rows = [split.tgt[i] for i in idx]
    S = max(1, max(len(r) for r in src_rows))
    T = max(len(r) for r in tgt_rows) + 1
    src = torch.full((len(idx), S), pad_id, dtype=torch.long)
    tgt_in = torch.full((len(idx), T), pad_id, dtype=torch.long)
    tgt_out = torch.full((len(idx), T), pad_id, dtype=torch.long)
    for row, (s, t) in enumerate(zip(src_rows, tgt_rows)):
        s, t = torch.from_numpy(s.astype(np.int64)), torch.from_numpy(t.astype(np.int64))
        src[row, :len(s)] = s
        tgt_in[row, 0] = bos_id
        tgt_in[row, 1:len(t) + 1] = t
        tgt_out[row, :len(t)] = t
        tgt_out[row, len(t)] = eos_id
    return src, tgt_in, tgt_out


def lm_stream(split: Split, eos_id: int) -> np.ndarray:
    """All documents of a language-modelling split as one in-memory stream, each ended by eos."""
    parts = []
    for t in split.tgt:
        parts.append(t)
        parts.append(np.array([eos_id], dtype=t.dtype if len(t) else np.int32))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def lm_token_file(shards: Path, manifest: dict, split: str, cache_dir: Path) -> np.ndarray:
    """The split's documents as one stream (each ended by eos), memory-mapped read-only.

    Same tokens as `lm_stream` over `load_split`. Built on the first call into
    `cache_dir/<split>-<key>.tokens` (uint16 when the vocabulary fits, else int32); the key hashes
    the manifest and each shard's size and mtime, so re-encoded shards get a new file.
    """
    shards, cache_dir = Path(shards), Path(cache_dir)
    dtype = np.dtype(np.uint16 if manifest["vocab_size"] <= 2 ** 16 else np.int32)
    files = [shards / name for name in manifest["splits"][split]["files"]]
    try:
        stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    except OSError as exc:
        raise ValueError(f"{exc.filename}: shard listed in the manifest is missing") from exc
    key = hashlib.sha256(json.dumps([manifest, stats, dtype.str], sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir / f"{split}-{key}.tokens"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        (cache_dir / ".gitignore").write_text("*\n")  # a rebuildable cache, never committed
        # Concurrent builders (DDP ranks, the grid's runs side by side, queued DVC experiments) each
        # write a temp file and rename it into place; the contents are identical, so whichever
        # rename lands last is fine. Another builder's temporary is never removed while it is
        # being written: only one untouched for STALE_TEMP_S (its writer was killed).
        with atomic_path(path, stale_after_s=STALE_TEMP_S) as tmp, open(tmp, "wb") as out:
            for name in files:
                for batch in _shard_batches(name, ["tgt_ids"]):
                    out.write(_with_eos(batch.column(0), manifest["eos_id"], dtype).tobytes())
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)  # mmap cannot map an empty file
    return np.memmap(path, dtype=dtype, mode="r")


def _shard_batches(path: Path, columns: list[str]) -> Iterator[pa.RecordBatch]:
    # Only the reading is guarded: an error while writing the cache (a full disk) is not the shard's.
    with reading_shard(path):
        yield from pq.ParquetFile(path).iter_batches(batch_size=8192, columns=columns)


def _with_eos(docs, eos_id: int, dtype: np.dtype) -> np.ndarray:
    """A list<int> arrow column as one flat array with eos after each document."""
    values = docs.flatten().to_numpy(zero_copy_only=False)
    lengths = np.diff(docs.offsets.to_numpy()) if len(docs) else np.zeros(0, dtype=np.int64)
    out = np.empty(len(values) + len(docs), dtype=dtype)
    eos_at = np.cumsum(lengths + 1) - 1
    keep = np.ones(len(out), dtype=bool)
    keep[eos_at] = False
    out[eos_at] = eos_id
    out[keep] = values
    return out


def lm_batches(stream_len: int, context: int, batch_size: int, seed: int, epoch: int,
               shuffle: bool = True, windows: str = "grid") -> list[np.ndarray]:
    """Start offsets of an epoch's windows, grouped into batches (the last partial one dropped).

    `grid`: the non-overlapping windows, shuffled. `random`: as many windows at uniformly random
    starts (any offset, overlaps allowed), drawn from (seed, epoch) so every variant of a seed gets
    the same ones."""
    n_windows = (stream_len - 1) // context
    rng = np.random.default_rng([seed, epoch])
    if windows == "random":
        starts = rng.integers(0, stream_len - context, size=n_windows)  # s + context + 1 <= stream_len
    else:
        starts = np.arange(n_windows) * context
        if shuffle:
            starts = starts[rng.permutation(n_windows)]
    return [starts[i:i + batch_size] for i in range(0, n_windows - batch_size + 1, batch_size)]


def lm_collate(stream: np.ndarray, starts: np.ndarray, context: int):
    """(None, tgt_in, tgt_out): windows of `context + 1` stream tokens, shifted by one.

    Only the rows of this batch are read from the (memory-mapped) stream.
    """
    rows = np.stack([np.asarray(stream[s:s + context + 1], dtype=np.int64) for s in starts])
    window = torch.from_numpy(rows)
    return None, window[:, :-1].contiguous(), window[:, 1:].contiguous()


# Inductor's CUDA lowering of the fused attention kernels (torch 2.10+, ir.is_aligned_realized_tensor)
# guards that the attention mask's strides and the kernel's per-query statistics are multiples of 8
# elements: with dynamic shapes, the first batch whose source or target length is (or is not) a
# multiple of 8 compiles the step again.
ATTENTION_ALIGN = 8


def pad_for_compile(batch: tuple, pad_id: int, multiple: int = 1, max_len: int | None = None) -> tuple:
    """A seq2seq batch with no dimension of size 1 and, given `multiple`, source and target lengths
    rounded up to a multiple of it (never past `max_len`), for a model compiled with dynamic shapes.

    torch.compile specialises any size of 0 or 1 even when told shapes are dynamic, so a batch of
    one example (a bucket's leftover, or an example longer than the cap) or a one-token side would
    compile the whole training step again (on a GPU, tens of seconds each; decoder-only models
    graph-break in packing, so several graphs each time). Lengths in multiples of ATTENTION_ALIGN
    keep inductor's CUDA attention alignment guards true for every batch. Padding is invisible to
    the loss: a second row repeats the first with every target position set to pad (ignored by the
    loss, so its gradient is exactly zero), and extra pad columns are masked out like any other
    padding (source keys by the key mask; target positions by causality and the loss's ignore_index).
    """
    src, tgt_in, tgt_out = batch
    if tgt_in.shape[0] == 1:
        src = None if src is None else src.repeat(2, 1)
        tgt_in, tgt_out = tgt_in.repeat(2, 1), torch.cat([tgt_out, torch.full_like(tgt_out, pad_id)])

    def widen(t: torch.Tensor) -> torch.Tensor:
        n = t.shape[1]
        want = -(-n // multiple) * multiple
        if max_len is not None:
            want = max(n, min(want, max_len))  # the model refuses positions past max_len
        want = max(want, 2)
        return torch.cat([t, t.new_full((t.shape[0], want - n), pad_id)], 1) if want > n else t
    return (None if src is None else widen(src)), widen(tgt_in), widen(tgt_out)
