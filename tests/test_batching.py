"""Language-model batching: the token files (memory-mapped, cached, safe beside concurrent
builders) and the training windows drawn from them (grid and random)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.training.batching import lm_batches, lm_collate, lm_stream, lm_token_file, load_split, read_manifest


def lm_shards(path: Path, vocab: int = 60) -> Path:
    """A tiny language-modelling shard set: two train shards, documents of 0..40 tokens."""
    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    splits = {}
    for split, sizes in {"train": (40, 35), "validation": (15,)}.items():
        files = []
        for i, n in enumerate(sizes):
            docs = [rng.integers(4, vocab, rng.integers(0, 41)).tolist() for _ in range(n)]
            pq.write_table(pa.table({"src_ids": pa.array([[]] * n, pa.list_(pa.int32())),
                                     "tgt_ids": pa.array(docs, pa.list_(pa.int32()))}), path / f"{split}-{i:05d}.parquet")
            files.append(f"{split}-{i:05d}.parquet")
        splits[split] = {"files": files, "examples": sum(sizes), "src_tokens": 0, "tgt_tokens": 0}
    (path / "manifest.json").write_text(json.dumps({
        "task": "language_modeling", "vocab_size": vocab, "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3,
        "tokenizer_sha256": "test", "splits": splits}))
    return path


def test_lm_token_file_is_the_document_stream_memory_mapped_and_cached(tmp_path):
    shards = lm_shards(tmp_path / "shards")
    manifest = read_manifest(shards)
    stream = lm_token_file(shards, manifest, "train", tmp_path / "cache")
    assert isinstance(stream, np.memmap) and stream.dtype == np.uint16
    assert np.array_equal(stream, lm_stream(load_split(shards, manifest, "train"), eos_id=3))
    built = sorted((tmp_path / "cache").glob("train-*.tokens"))
    assert len(built) == 1 and (tmp_path / "cache" / ".gitignore").read_text() == "*\n"
    stamp = built[0].stat().st_mtime_ns
    assert np.array_equal(lm_token_file(shards, manifest, "train", tmp_path / "cache"), stream)
    assert built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt
    pq.write_table(pa.table({"src_ids": pa.array([[]], pa.list_(pa.int32())),
                             "tgt_ids": pa.array([[5, 6, 7]], pa.list_(pa.int32()))}), shards / "train-00001.parquet")
    changed = lm_token_file(shards, manifest, "train", tmp_path / "cache")  # re-encoded shard: a new file
    assert len(list((tmp_path / "cache").glob("train-*.tokens"))) == 2 and changed[-4:].tolist() == [5, 6, 7, 3]


def test_building_the_token_cache_leaves_a_concurrent_builders_temporary_alone(tmp_path):
    """Runs side by side (the grid on a GPU) build the same cache file at once: one must not delete
    the temporary another is still writing (seen on an H200: a run failed renaming it); a
    temporary nobody has touched for STALE_TEMP_S was left by a killed builder and goes."""
    from pipeline.training.batching import STALE_TEMP_S

    shards, cache = lm_shards(tmp_path / "shards"), tmp_path / "cache"
    manifest = read_manifest(shards)
    built = Path(lm_token_file(shards, manifest, "train", cache).filename)
    built.unlink()
    writing, killed = cache / f".{built.name}.abc123.tmp", cache / f".{built.name}.old999.tmp"
    writing.write_bytes(b"half")
    killed.write_bytes(b"half")
    old = killed.stat().st_mtime - 2 * STALE_TEMP_S
    os.utime(killed, (old, old))
    stream = lm_token_file(shards, manifest, "train", cache)
    assert np.array_equal(stream, lm_stream(load_split(shards, manifest, "train"), eos_id=3))
    assert writing.read_bytes() == b"half" and not killed.exists()


def test_lm_windows_are_contiguous_disjoint_and_deterministic(tmp_path):
    shards = lm_shards(tmp_path / "shards")
    stream = lm_token_file(shards, read_manifest(shards), "train", tmp_path / "cache")
    context, batch_size = 16, 4
    plan = lm_batches(len(stream), context, batch_size, seed=1, epoch=0)
    again = lm_batches(len(stream), context, batch_size, seed=1, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(plan, again))
    assert not all(np.array_equal(a, b) for a, b in zip(plan, lm_batches(len(stream), context, batch_size, 1, 1)))
    starts = np.concatenate(plan)
    assert len(set(starts.tolist())) == len(starts) and all(s % context == 0 for s in starts)  # disjoint windows
    assert starts.max() + context + 1 <= len(stream)
    _, tgt_in, tgt_out = lm_collate(stream, plan[0], context)
    for row, start in enumerate(plan[0]):
        assert tgt_in[row].tolist() == stream[start:start + context].tolist()
        assert tgt_out[row].tolist() == stream[start + 1:start + context + 1].tolist()


def test_random_lm_windows_start_anywhere_deterministically_and_stay_in_the_stream():
    stream_len, context, batch_size = 1000, 16, 4
    plan = lm_batches(stream_len, context, batch_size, seed=3, epoch=0, windows="random")
    starts = np.concatenate(plan)
    assert len(plan) == ((stream_len - 1) // context) // batch_size  # as many windows as the grid
    assert starts.min() >= 0 and starts.max() + context + 1 <= stream_len
    assert (starts % context != 0).any()  # off the grid
    again = lm_batches(stream_len, context, batch_size, seed=3, epoch=0, windows="random")
    assert all(np.array_equal(a, b) for a, b in zip(plan, again))
    other = np.concatenate(lm_batches(stream_len, context, batch_size, seed=3, epoch=1, windows="random"))
    assert not np.array_equal(starts, other)
