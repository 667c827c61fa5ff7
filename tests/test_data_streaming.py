"""The data stages stream: what filter computes batch by batch equals what it computed on the whole
corpus (percentiles, subsample draws, carved splits in permuted order), however it is cut up; and
train_bpe reads every line whatever the row groups and batches."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import pipeline.filter as flt
from pipeline.filtering import tables
from pipeline.filtering.lengths import Histogram, percentiles
from pipeline.params import FilterParams


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentiles_from_histogram_equal_numpy(n):
    rng = np.random.default_rng(n)
    for high in (5, 300, 3 * Histogram.DENSE):  # the last puts values in the sparse part
        lengths = rng.integers(0, high, size=n)
        hist = Histogram()
        for part in np.array_split(lengths, 3):
            hist.add(part)
        q = np.percentile(lengths, [50, 90, 99])
        assert percentiles(hist) == {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
                                         "max": float(lengths.max())}
    assert percentiles(Histogram())["p50"] is None


def raw_frames(n: int = 600) -> dict[str, pd.DataFrame]:
    words = [" ".join(["w"] * (1 + i % 17)) for i in range(n)]
    return {"train": pd.DataFrame({"source": words, "target": [f"t {i} ." for i in range(n)]})}


@pytest.mark.multiprocess
@pytest.mark.parametrize("task", [None, "language_modeling"])
def test_filter_is_the_same_in_small_batches_and_worker_processes(task):
    cfg = FilterParams(max_source_tokens=12, subsample=0.6, val_fraction=0.1, test_fraction=0.15, seed=3)
    whole, whole_stats = flt.filter_splits(raw_frames(), cfg, task)
    cut, cut_stats = flt.filter_splits(raw_frames(), cfg, task, batch_rows=7, workers=2)
    assert whole_stats == cut_stats and whole_stats["splits"]["train"]["dropped_subsample"] > 0
    for split in flt.SPLITS:
        assert whole[split].equals(cut[split])


@pytest.mark.multiprocess
def test_shuffled_carve_keeps_the_permuted_order_when_train_spills_to_buckets(monkeypatch, tmp_path):
    cfg = FilterParams(max_source_tokens=12, val_fraction=0.1, test_fraction=0.1, seed=5)
    frames = raw_frames()
    whole, _ = flt.filter_splits(frames, cfg)
    raw = tmp_path / "raw"
    raw.mkdir()
    frames["train"].to_parquet(raw / "train.parquet")
    # A few kB a bucket and a row group: train is carved through ~10 bucket files, written in
    # several row groups.
    monkeypatch.setattr(tables, "ROW_GROUP_BYTES", 2000)
    monkeypatch.setattr(tables, "BATCH_BYTES", 500)
    stats = flt.filter_files(raw, tmp_path / "out", cfg)
    assert stats["carve"] == "shuffled"
    for split in flt.SPLITS:
        assert pd.read_parquet(tmp_path / "out" / f"{split}.parquet").equals(whole[split])
    assert not (tmp_path / "out" / ".carve").exists()


def test_train_bpe_reads_every_line_batch_by_batch(monkeypatch, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import pipeline.train_bpe as train_bpe

    frame = pd.DataFrame({"source": [f"a {i}\n\nb {i}" if i % 3 else "" for i in range(50)],
                          "target": [f"t {i}\n " for i in range(50)]})
    pq.write_table(pa.Table.from_pandas(frame), tmp_path / "train.parquet", row_group_size=7)
    monkeypatch.setattr(train_bpe, "BATCH_ROWS", 4)
    expected = [line for column in ("source", "target") for text in frame[column]
                for line in text.split("\n") if line.strip()]
    assert list(train_bpe.corpus_lines(tmp_path / "train.parquet")) == expected
