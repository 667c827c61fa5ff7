"""The grid's ETA: the tasks left, laid out on the job slots the way the launcher starts them.

Each task is timed by the tasks of its kind (its stage names without their @item), as kinds differ
tenfold (a run's train + evaluate against the report). A kind not timed yet in this study takes the
longest it took in this workspace's last study (`prior`, from `read_prior`); in a new workspace, the
figures of the stages that have ended (`from_stages`: a knock-out and the report at evaluate's, as
each reads what trained and writes a few files). Timed as a training run, the knock-outs and the
report put the first ETAs of the H200's studies at 1.9-3.4x their wall; each log replayed after the
one before it, 0.85-1.41x; by the ended stages alone, 0.91-1.40x (tests/test_grid_eta.py). Only a
task whose every stage DVC ran times its kind: one DVC found up to date ends in a second, timing
nothing.
A pending task starts on the first free slot once the stages it needs are done, as `Launcher.run`
starts them.

Runs started together finish in order of length, so the first to finish are a kind's shortest: their
mean alone says the rest are nearly done, and the projected end then moved later with each finish.
Instead a kind's finished and running tasks are read as one sample of which the running ones are the
longest (regression on normal order statistics, Blom's positions), the longest-running at the
next position still open (a slot frees then), and a spread of at least SPREAD of the mean assumed
while too few have finished to show it. Which running task holds which position is not known, so
what waits for one (a knock-out for its seed's run) is laid out after the last of them.
"""
from __future__ import annotations

import contextlib
import heapq
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist, fmean

from pipeline.grid.dag import Task
from pipeline.io.atomic import atomic_path

# The least spread assumed within a kind, as a share of its mean: the train + evaluate runs started
# together in the H200's study and seed logs (reports/gpu/*.log, 9 of them) spread 6-13%.
SPREAD = 0.10


def kind(task: Task) -> tuple[str, ...]:
    return tuple(stage.split("@")[0] for stage in task.stages)


def fit(finished: Sequence[float], running: int) -> tuple[float, list[float]]:
    """A kind's mean and the expected lengths of its `running` tasks, ascending, from its `finished`
    lengths, the shortest of len(finished) + running."""
    n = len(finished) + running
    z = [NormalDist().inv_cdf((i + 0.625) / (n + 0.25)) for i in range(n)]
    done, seen = sorted(finished), z[:len(finished)]
    mz, md = fmean(seen), fmean(done)
    spread = 0.0
    if len(done) > 1:
        spread = max(sum((a - mz) * (b - md) for a, b in zip(seen, done)) / sum((a - mz) ** 2 for a in seen), 0.0)
    mean = md - spread * mz
    if spread < SPREAD * mean:  # md = mean + SPREAD * mean * mz
        mean = md / (1 + SPREAD * mz)
        spread = SPREAD * mean
    return mean, [mean + spread * zi for zi in z[len(finished):]]


def from_stages(k: tuple[str, ...], stages: Mapping[str, list[float]]) -> float | None:
    """A kind no task of which has ended, from the stages that have: each of its stages at its
    family's mean; a family not run yet at the one its name extends (train_lr, train_more and
    train_scale at train's, evaluate_lr at evaluate's), else at the shortest family's (a knock-out and
    the report beside evaluate: each reads what trained and writes a few files); plus the mean
    seconds a task spent outside its stages (key "": DVC's start and its bookkeeping). None before
    a stage has ended."""
    families = {f: fmean(v) for f, v in stages.items() if f and v}
    if not families:
        return None
    shortest = min(families.values())
    return fmean(stages.get("") or [0.0]) + sum(families.get(f, families.get(f.split("_")[0], shortest)) for f in k)


def eta(running: Iterable[tuple[Task, float]], pending: Sequence[Task], timed: Mapping[tuple[str, ...], list[float]],
        jobs: int, prior: Mapping[tuple[str, ...], float] | None = None,
        stages: Mapping[str, list[float]] | None = None) -> float | None:
    """Seconds until the last task ends: `running` as (task, seconds elapsed), `pending` in the
    launcher's order, `timed` the finished tasks' seconds by kind, `prior` each kind's seconds in
    the last study, `stages` the ended stages' seconds by family (from_stages). None while none of
    them times anything."""
    running = sorted(running, key=lambda r: -r[1])  # the longest-running takes a kind's next position
    means, expected = {}, {}
    for k, lengths in timed.items():
        if lengths:
            means[k], expected[k] = fit(lengths, sum(kind(t) == k for t, _ in running))
    if not means and not prior:
        return None
    fallback = min(means.values()) if means else min(prior.values())

    def took(task: Task) -> float:
        k = kind(task)
        if k in means:
            return means[k]
        if prior and k in prior:
            return prior[k]
        guess = from_stages(k, stages or {})
        return fallback if guess is None else guess

    ends: dict[str, float] = {}
    slots: list[float] = []  # when each busy slot frees, seconds from now
    left: dict[tuple[str, ...], list[float]] = {}
    for task, elapsed in running:
        queue = expected.get(kind(task))
        end = max((queue.pop(0) if queue else took(task)) - elapsed, 0.0)
        left.setdefault(kind(task), []).append(end)
        slots.append(end)
    for task, _ in running:  # which of a kind's running tasks ends last is not known: each, at worst
        ends.update(dict.fromkeys(task.stages, max(left[kind(task)])))
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


def steady(shown: float | None, now: float, projected: float) -> float:
    """The end to print at a finish: the end `projected` now (`now` + `eta`) where it is sooner than
    the end printed last (`shown`), or that end has passed; else the end printed last.

    `eta` errs long by design (the longest-running at a kind's next position, each running task at
    its kind's worst), so a projection later than the one before is more often that error than news,
    and the sooner of the two is the better figure. Replayed on the H200's 11 logs, the printed end
    moved later at 1 of 177 finishes (each projection printed as it came: 41) and lay nearer the end
    (a study's mean error 18.6% of its wall, against 19.8%); nearer too on simulated studies whose
    runs slow by 3% a run or speed up by 2%, on 2 slots and on 16 (tests/test_grid_eta.py). An end
    that has passed was wrong, and the projection replaces it however late."""
    return projected if shown is None or projected < shown or now >= shown else shown


def read_prior(path: Path) -> dict[tuple[str, ...], float]:
    """Each kind's longest task in the study `write_times` recorded last ({} where none was, or the
    file is not one it wrote: a figure for the ETA, never worth stopping a study for)."""
    try:
        kinds = json.loads(path.read_text(encoding="utf-8"))["kinds"]
        return {tuple(name.split()): max(map(float, seconds)) for name, seconds in kinds.items() if seconds}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}


def write_times(path: Path, timed: Mapping[tuple[str, ...], list[float]]) -> None:
    """Record this study's timed tasks by kind for the next study's `read_prior`; a kind this study
    did not time keeps its last figure (an edit that reruns a few trains leaves the report's)."""
    if not timed:
        return
    try:
        kinds = json.loads(path.read_text(encoding="utf-8"))["kinds"]
        kinds = kinds if isinstance(kinds, dict) else {}
    except (OSError, ValueError, TypeError, KeyError):
        kinds = {}
    kinds.update({" ".join(k): [round(s, 2) for s in seconds] for k, seconds in timed.items() if seconds})
    with contextlib.suppress(OSError), atomic_path(path) as tmp:  # a full disk costs the next ETA, not this study
        tmp.write_text(json.dumps({"kinds": kinds}, indent=1) + "\n", encoding="utf-8")
