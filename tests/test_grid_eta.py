"""The grid's ETA (pipeline/grid/eta.py), on a launcher simulated in time: tasks of known length per kind."""
from __future__ import annotations

import pytest

from pipeline.grid.dag import Task
from pipeline.grid.eta import eta, kind


def study(runs: int = 12, knockouts: int = 3) -> list[Task]:
    """A study as the launcher gets it: each run's train + evaluate, the knock-outs after their
    seed's baseline, the report after everything (dvc.yaml's order)."""
    tasks = [Task([f"train@v{i}", f"evaluate@v{i}"]) for i in range(runs)]
    tasks += [Task([f"knockout@{s}"], {f"evaluate@v{s}"}) for s in range(knockouts)]
    everything = {s for t in tasks for s in t.stages}
    return tasks + [Task(["report"], everything)]


def simulate(tasks: list[Task], seconds: dict[tuple[str, ...], float], jobs: int) -> list[tuple[float, float]]:
    """Run the tasks as Launcher.run does (ready ones in order, at most `jobs` at once); after each
    finish, (time, the ETA's projected end = time + ETA) while tasks are left."""
    pending, running, done, timed, said = list(tasks), [], set(), {}, []
    now = 0.0
    while pending or running:
        for task in [t for t in pending if t.needs <= done]:
            if len(running) < jobs:
                pending.remove(task)
                running.append((task, now))
        task, started = min(running, key=lambda r: r[1] + seconds[kind(r[0])])
        now = started + seconds[kind(task)]
        running.remove((task, started))
        done |= set(task.stages)
        timed.setdefault(kind(task), []).append(now - started)
        if pending or running:
            left = eta([(t, now - s) for t, s in running], pending, timed, jobs)
            said.append((now, now + left))
    return said


SECONDS = {("train", "evaluate"): 48.0, ("knockout",): 14.0, ("report",): 12.0}  # the H200's run 9, rounded


@pytest.mark.parametrize("jobs", [16, 4, 1])
def test_the_projected_end_never_grows_as_stages_finish(jobs):
    said = simulate(study(), SECONDS, jobs)
    ends = [end for _, end in said]
    assert all(b <= a + 1e-9 for a, b in zip(ends, ends[1:])), said
    # and the last word before the report is at most a knock-out's time away from the truth
    assert said[-1][1] - said[-1][0] <= SECONDS[("knockout",)]


def test_the_report_is_not_timed_as_a_training_run():
    """Run 8's log: with 25 of 26 stages done the old ETA said 5 minutes (the mean of every finished
    task, training runs of ~450 s among them) for a report of ~12 s."""
    tasks = study(runs=10, knockouts=5)
    timed = {("train", "evaluate"): [450.0] * 10, ("knockout",): [15.0] * 4}
    left = eta([(tasks[-2], 10.0)], [tasks[-1]], timed, jobs=16)
    assert left == pytest.approx(5.0 + 15.0)  # the last knock-out's 5 s, then the report at a knock-out's time


def test_a_running_task_counts_what_its_kind_leaves_and_nothing_is_said_before_the_first_finish():
    tasks = study(runs=2, knockouts=0)
    assert eta([(tasks[0], 5.0)], tasks[1:], {}, jobs=2) is None
    timed = {("train", "evaluate"): [40.0]}
    assert eta([(tasks[1], 30.0)], [tasks[2]], timed, jobs=2) == pytest.approx(10.0 + 40.0)
    assert eta([(tasks[1], 55.0)], [], timed, jobs=2) == 0.0  # past its kind's mean: no time left is claimed
