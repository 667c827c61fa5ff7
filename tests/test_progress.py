"""pipeline.io.progress: log lines with rate and ETA when stderr is not a terminal."""
import io

from pipeline.io.progress import Progress, clock


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_log_lines_every_interval_with_eta():
    out, now = io.StringIO(), FakeClock()
    with Progress("filter", total=100, unit="rows", every_s=10, stream=out, clock_fn=now) as p:
        for _ in range(4):
            now.t += 5
            p.update(10)
    lines = out.getvalue().splitlines()
    # Logged at t=10 and t=20 (every 10 s), and once more on close because the loop ran >= 10 s.
    assert lines[0] == "filter: 20 rows/100 rows (20%) 2 rows/s elapsed 0:00:10 ETA 0:00:40"
    assert lines[1] == "filter: 40 rows/100 rows (40%) 2 rows/s elapsed 0:00:20 ETA 0:00:30"
    assert len(lines) == 3


def test_short_loop_is_silent_and_unknown_total_has_no_eta():
    out, now = io.StringIO(), FakeClock()
    with Progress("read", unit="B", stream=out, clock_fn=now) as p:
        p.update(3 << 20)
    assert out.getvalue() == ""
    now.t = 2
    assert p.line() == "read: 3.0 MB 1.5 MB/s elapsed 0:00:02"


def test_clock():
    assert clock(3725.4) == "1:02:05"
