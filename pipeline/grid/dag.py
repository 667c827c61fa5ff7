"""What the grid launcher runs, read from DVC itself: the stages, their order, what each one
needs, and which of them are out of date. The graph is DVC's own (`Repo.index.graph`), so the
launcher follows dvc.yaml's matrix expansion, not a copy of it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Pipeline:
    """The stages in dvc.yaml's order and, for each, the stages it reads the outputs of."""
    order: list[str]
    upstream: dict[str, set[str]]

    def ancestors(self, names: set[str]) -> set[str]:
        seen, todo = set(), list(names)
        while todo:
            for up in self.upstream[todo.pop()]:
                if up not in seen:
                    seen.add(up)
                    todo.append(up)
        return seen

    def descendants(self, names: set[str]) -> set[str]:
        down: dict[str, set[str]] = {n: set() for n in self.order}
        for n, ups in self.upstream.items():
            for up in ups:
                down[up].add(n)
        seen, todo = set(), list(names)
        while todo:
            for d in down[todo.pop()]:
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen


@dataclass
class Task:
    """Stages run by one `dvc repro --single-item` process, in order (a run's train, then its
    evaluate: one DVC start-up instead of two), and the stages outside it that must finish first."""
    stages: list[str]
    needs: set[str] = field(default_factory=set)
    attempts: int = 0
    not_before: float = 0.0  # a retry's backoff


def _open_repo():
    from dvc.repo import Repo

    return Repo()


def _locked(call, wait_s: float = 600.0):
    """`call()`, waiting while another DVC process holds the repository's lock."""
    from dvc.lock import LockError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return call()
        except LockError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def read_pipeline(targets: list[str]) -> tuple[Pipeline, set[str]]:
    """DVC's stage graph, and the stages `targets` select with everything they depend on
    (all stages when no target is given)."""
    with _open_repo() as repo:
        graph = repo.index.graph  # an edge runs from a stage to a stage whose outputs it reads
        stages = [s for s in repo.index.stages if s.cmd]
        names = {s: s.addressing for s in stages}
        upstream = {names[s]: {names[u] for u in graph.successors(s) if u in names} for s in stages}
        pipeline = Pipeline([names[s] for s in stages], upstream)
        if not targets:
            return pipeline, set(pipeline.order)
        chosen = set()
        for target in targets:
            chosen |= {s.addressing for s in repo.stage.collect(target) if s.cmd}
    return pipeline, chosen | pipeline.ancestors(chosen)


def out_of_date(targets: set[str]) -> set[str]:
    """The stages `dvc status` reports (changed deps, params, outputs or command; never run)."""
    with _open_repo() as repo:
        status = _locked(lambda: repo.status(targets=sorted(targets)) if targets else repo.status())
    return {name.split(":")[-1] if name.startswith("dvc.yaml:") else name for name in status}


def stale_stages(pipeline: Pipeline, selected: set[str], shared: set[str], status=out_of_date) -> set[str]:
    """The selected stages `status` (out_of_date) finds stale, asked of the shared stages first.
    Where one of those is stale everything below it is run anyway (each `dvc repro --single-item`
    skips what did not change), so only the stages outside its reach are asked about: `dvc status`
    takes minutes on 100+ stages, and each round of seeds until decided makes check_params stale."""
    stale = status(shared) if shared else set()
    if not stale:
        return status(selected)
    rest = selected - shared - pipeline.descendants(stale)
    return stale | (status(rest) if rest else set())


def shared_stages(pipeline: Pipeline, selected: set[str]) -> set[str]:
    """The stages every grid item waits for (check_params ... encode): the non-matrix stages
    upstream of the matrix stages (`train@...`). One plain `dvc repro` runs them."""
    grid = {n for n in selected if "@" in n}
    return {n for n in pipeline.ancestors(grid) if "@" not in n} & selected


def plan_tasks(pipeline: Pipeline, needed: set[str]) -> list[Task]:
    """The needed stages as tasks: a stage whose only needed upstream stage ends a task joins that
    task (train@x, then evaluate@x); every other stage starts its own."""
    task_of: dict[str, Task] = {}
    tasks: list[Task] = []
    for name in pipeline.order:  # dvc.yaml's order is a topological one
        if name not in needed:
            continue
        ups = pipeline.upstream[name] & needed
        if len(ups) == 1 and task_of[min(ups)].stages[-1] == min(ups):  # its only needed upstream ends a task
            task = task_of[min(ups)]
            task.stages.append(name)
            task_of[name] = task
            continue
        task = Task([name])
        tasks.append(task)
        task_of[name] = task
    for task in tasks:
        inside = set(task.stages)
        task.needs = {u for s in task.stages for u in pipeline.upstream[s] & needed} - inside
    return tasks
