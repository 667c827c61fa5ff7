"""The filter stage's rows as Arrow tables: read from raw/ a record batch at a time, written to a
parquet file a row group at a time, and put in a permutation's order a bucket at a time.

Memory is a few record batches and one row group (or one bucket of the shuffled carve), not the
corpus. A file of at most ROW_GROUP_BYTES of text is one row group, byte-identical to what the
stage wrote when it held the corpus in memory (pandas' schema, one chunk).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

BATCH_BYTES = 4 << 20  # text per record batch read
ROW_GROUP_BYTES = 64 << 20  # text per row group written, and per bucket of the shuffled carve
# The schema pandas gave these files (its metadata included): small outputs stay byte-identical.
SCHEMA = pa.Schema.from_pandas(pd.DataFrame({"source": [""], "target": [""]}), preserve_index=False)

# One split's rows, batch by batch; called again for the second pass.
Reader = Callable[[], Iterable[pa.RecordBatch]]


def texts(batch: pa.RecordBatch | pa.Table) -> pa.Table:
    """source and target as SCHEMA's strings, a missing text as ""."""
    empty = pa.scalar("", pa.large_string())
    return pa.Table.from_arrays([pc.fill_null(batch.column(name).cast(pa.large_string()), empty)
                                 for name in ("source", "target")], schema=SCHEMA)


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
