"""Batches for training and evaluation, deterministic given the seed.

Seq2seq: examples are bucketed by length and packed under a cap on *padded* tokens per batch, so
padding stays low and memory is bounded whatever the length mix. The order of an epoch is a pure
function of (seed, epoch): resuming needs only (epoch, index), and every variant trained with the
same seed sees exactly the same batches, hence the same tokens.

Language modelling: contiguous windows of `context + 1` tokens from the concatenated stream.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch


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


def load_split(shards: Path, manifest: dict, split: str, limit: int | None = None) -> Split:
    src, tgt = [], []
    for name in manifest["splits"][split]["files"]:
        # memory_map: pages come from the OS cache instead of a second copy in Python's heap.
        table = pq.read_table(Path(shards) / name, memory_map=True)
        for column, out in (("src_ids", src), ("tgt_ids", tgt)):
            col = table.column(column).combine_chunks()
            values = col.values.to_numpy(zero_copy_only=False)
            offsets = col.offsets.to_numpy()
            out.extend(values[offsets[i]:offsets[i + 1]] for i in range(len(col)))
        if limit is not None and len(src) >= limit:
            break
    if limit is not None:
        src, tgt = src[:limit], tgt[:limit]
    return Split(src, tgt)


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
    """All documents of a language-modelling split as one stream, each ended by eos."""
    parts = []
    for t in split.tgt:
        parts.append(t)
        parts.append(np.array([eos_id], dtype=t.dtype if len(t) else np.int32))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def lm_batches(stream_len: int, context: int, batch_size: int, seed: int, epoch: int,
               shuffle: bool = True) -> list[np.ndarray]:
    """Start offsets of non-overlapping windows, grouped into batches (the last partial one dropped)."""
    n_windows = (stream_len - 1) // context
    rng = np.random.default_rng([seed, epoch])
    starts = np.arange(n_windows) * context
    if shuffle:
        starts = starts[rng.permutation(n_windows)]
    return [starts[i:i + batch_size] for i in range(0, n_windows - batch_size + 1, batch_size)]


def lm_collate(stream: np.ndarray, starts: np.ndarray, context: int, bos_id: int):
    """(None, tgt_in, tgt_out): windows of the stream shifted by one."""
    rows = np.stack([stream[s:s + context + 1] for s in starts])
    window = torch.from_numpy(rows)
    return None, window[:, :-1].contiguous(), window[:, 1:].contiguous()
