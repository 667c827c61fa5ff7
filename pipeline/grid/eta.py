"""The grid's ETA: the tasks left, laid out on the job slots the way the launcher starts them.

Each task is timed by the finished tasks of its kind (its stage names without their @item), as
kinds differ tenfold (a run's train + evaluate against the report); a kind not timed yet takes the
shortest timed kind's mean, since those that come last (knock-outs, the report) are the short ones.
A running task needs what its kind's mean leaves after its elapsed time; a pending one starts on
the first free slot once the stages it needs are done, as `Launcher.run` starts them.
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

from pipeline.grid.dag import Task


def kind(task: Task) -> tuple[str, ...]:
    return tuple(stage.split("@")[0] for stage in task.stages)


def eta(running: Iterable[tuple[Task, float]], pending: Sequence[Task], timed: Mapping[tuple[str, ...], list[float]],
        jobs: int) -> float | None:
    """Seconds until the last task ends: `running` as (task, seconds elapsed), `pending` in the
    launcher's order, `timed` the finished tasks' seconds by kind. None before any task finished."""
    means = {k: sum(v) / len(v) for k, v in timed.items() if v}
    if not means:
        return None
    fallback = min(means.values())

    def took(task: Task) -> float:
        return means.get(kind(task), fallback)

    ends: dict[str, float] = {}
    slots: list[float] = []  # when each busy slot frees, seconds from now
    for task, elapsed in running:
        end = max(took(task) - elapsed, 0.0)
        ends.update(dict.fromkeys(task.stages, end))
        slots.append(end)
    slots += [0.0] * max(0, jobs - len(slots))
    heapq.heapify(slots)
    last = max(slots, default=0.0)
    for task in pending:
        free = heapq.heappop(slots)
        start = max([free] + [ends[s] for s in task.needs if s in ends])
        end = start + took(task)
        ends.update(dict.fromkeys(task.stages, end))
        heapq.heappush(slots, end)
        last = max(last, end)
    return last
