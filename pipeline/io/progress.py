"""Progress for any loop that can outlast ~10 s: a tqdm bar on a terminal, and under DVC or CI
(stderr is a file or a pipe) a log line at most every `every_s` seconds with the rate and an ETA.

    with Progress("filter", total=n_bytes, unit="B") as progress:
        for batch in batches:
            ...
            progress.update(batch.nbytes)

`total` may be None (unknown): the log lines then give the count and rate without an ETA.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


def clock(seconds: float) -> str:
    """h:mm:ss, as the train stage's log lines print it."""
    seconds = int(round(max(seconds, 0)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _amount(n: float, unit: str) -> str:
    if unit == "B":
        for scale, name in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "kB")):
            if n >= scale:
                return f"{n / scale:.1f} {name}"
        return f"{n:.0f} B"
    return f"{n:,.0f} {unit}"


class Progress:
    """One loop's progress; `stream` defaults to stderr (stdout stays for a stage's summary)."""

    def __init__(self, what: str, total: float | None = None, unit: str = "it", every_s: float = 10.0,
                 stream: TextIO | None = None, clock_fn=time.monotonic):
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.stream = stream or sys.stderr
        self.now = clock_fn
        self.done = 0.0
        self.start = self.last_log = self.now()
        self.bar = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit=unit, unit_scale=unit == "B",
                            dynamic_ncols=True, file=self.stream)

    def update(self, n: float = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)  # tqdm's own "elapsed<remaining" is the ETA
            return
        now = self.now()
        if now - self.last_log >= self.every_s:
            self.last_log = now
            self._log(now)

    def line(self, now: float | None = None) -> str:
        """What the log line says now: done/total (percent), rate, elapsed and ETA."""
        now = self.now() if now is None else now
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        rate_s = f"{_amount(rate, self.unit)}/s"
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta_s = clock(eta) if eta != float("inf") else "?"
            return (f"{self.what}: {_amount(self.done, self.unit)}/{_amount(self.total, self.unit)} "
                    f"({100 * self.done / self.total:.0f}%) {rate_s} elapsed {clock(elapsed)} ETA {eta_s}")
        return f"{self.what}: {_amount(self.done, self.unit)} {rate_s} elapsed {clock(elapsed)}"

    def _log(self, now: float) -> None:
        print(self.line(now), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.now() - self.start >= self.every_s:  # a long loop says it finished
            self._log(self.now())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
