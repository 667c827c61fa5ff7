"""Example lengths for the filter stage: counted per record batch, in worker processes for
pre-tokens, and summarised as a histogram whose percentiles equal NumPy's on the whole list.

Lengths are counted with a cheap pre-tokenizer (words and punctuation marks), before any subword
model exists, so the limits bound the BPE length only roughly; or, with `filter.length_unit:
chars`, in characters.
"""
from __future__ import annotations

import os
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_PRETOKEN = re.compile(r"\w+|[^\w\s]")
# Processes counting pre-tokens, the stage's CPU-bound part: one per core, up to the 2 cores this
# project targets (the reading process feeds them too).
WORKERS = max(1, min(2, os.cpu_count() or 1))


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
