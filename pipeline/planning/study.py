"""A study's wall time: the stages dvc.yaml lays out for one params.yaml, each one's predicted
seconds, scheduled on `jobs` slots as the grid launcher runs them.

    stage seconds = its family's fixed cost + its work

The model: docs/scaling-out-and-cost-plan.md#know-the-cost-first ("What a study costs"). Each
figure is the median over the committed studies run the same way (run.json `warm`; one busy day
moves it little), a family no study run that way timed taking the others' (said so: for a warm
plan an upper bound, for a cold one a lower bound). A train stage's fixed cost is
its measured seconds (`stage_s`) less its run's measured loop; every other family's figure is its
measured seconds per stage, work included (an evaluation's work depends on what the model
generates), knockout taking evaluate's where no study timed one. On a CPU the part of a loop its
threads split runs max(1, jobs x threads / cores) times as long (loop_slowdown); the rest of it and
the fixed costs, mostly one thread, do not. Seeds until decided:
the rounds run one after another, a run decide.runs added in the round of its look, each later
round rerunning check_params and the report (rounds).
"""
from __future__ import annotations

import heapq
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.params import Params, knocks_out, knockout_seeds, load_params
from pipeline.planning.calibration import markdown_table, number
from pipeline.planning.estimate import PlanError

DATA = ("check_params", "download", "filter", "train_bpe", "encode")
FIXED = (*DATA, "evaluate", "knockout", "report")  # families timed per stage as measured
TRAINS = ("train", "train_lr", "train_scale", "train_more")
EVALS = ("evaluate", "evaluate_lr", "evaluate_scale", "evaluate_more")


@dataclass(frozen=True)
class Stage:
    name: str  # as dvc.yaml names it: train@baseline-0, evaluate_lr@baseline-0-0.01, knockout@0
    family: str  # the dvc.yaml stage it is an item of
    seconds: float
    deps: tuple[str, ...] = ()
    loop_s: float = 0.0  # of `seconds`, the training loop (train families only)


@dataclass
class StageCosts:
    """Seconds per stage, measured in the committed studies (module docstring)."""
    per_stage: dict[str, float]  # family in FIXED -> seconds per stage
    train_fixed_s: float  # a train stage's seconds besides its training loop
    studies: list[str] = field(default_factory=list)
    warm: bool = False  # the stages served warm (the grid launcher) or each a new process (`dvc repro`)
    borrowed: list[str] = field(default_factory=list)  # families only studies run the other way timed

    def describe(self) -> str:
        way, other, bound = ("warm", "cold", "an upper bound") if self.warm else ("cold", "warm", "a lower bound")
        if not self.borrowed:
            source = f"{len(self.studies)} committed serial studies run {way} ({', '.join(self.studies)})"
        else:
            source = (f"committed serial studies ({', '.join(self.studies)}); as no study run {way} timed them, "
                      f"{', '.join(self.borrowed)} as run {other}, {bound}")
        return (f"per-stage costs measured in {source}: train stage {self.train_fixed_s:.2g} s + its loop, evaluate "
                f"{self.per_stage['evaluate']:.2g} s, knockout {self.per_stage['knockout']:.2g} s, report "
                f"{self.per_stage['report']:.2g} s, data stages {sum(self.per_stage[f] for f in DATA):.2g} s")


def stage_counts(params: Params) -> dict[str, int]:
    """How many stages of each dvc.yaml family `params` lays out."""
    runs = len(params.ablations) * len(params.seeds)
    counts = {f: 1 for f in (*DATA, "report")}
    for train, evaluate, n in (("train", "evaluate", runs), ("train_lr", "evaluate_lr", runs * len(params.lr_sweep)),
                               ("train_scale", "evaluate_scale", runs * len(params.scales))):
        counts[train] = counts[evaluate] = n
    counts["knockout"] = len(knockout_seeds(params.knockout.seeds, params.seeds))  # those that knock out
    counts["train_more"] = counts["evaluate_more"] = len(params.decide.runs)  # seeds until decided's rounds
    return counts


def measured_loops(report: Path) -> list[float]:
    """Every main run's training-loop wall, from report.md's per-run table (contended ones too:
    they were part of the study's wall)."""
    return [number(r["wall time (s)"].replace("⚠", "").strip()) for r in markdown_table(
        report.read_text(encoding="utf-8"), "Per-run values") if r.get("wall time (s)", "—") not in ("", "—")]


def measured_study(folder: Path) -> dict | None:
    """{family: seconds per stage, "train_fixed": ...} of one committed study folder (run.json with
    stage_s, params.yaml, report.md); None where run.json has no per-stage times."""
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    if not run.get("stage_s") or run.get("jobs", 1) != 1 or not run.get("device", "cpu").startswith("cpu"):
        return None  # serial CPU studies only: stages side by side or on a GPU cost something else
    stage_s, counts = run["stage_s"], stage_counts(load_params(folder / "params.yaml"))
    counts["check_params"] = counts["report"] = len(run.get("rounds") or [0])  # once per round (decide)
    # knockout_more (seeds until decided) is a family of its own in stage_s, mostly off markers: not used.
    out = {f: stage_s[f] / counts[f] for f in (*DATA, "knockout", "report") if counts[f] and f in stage_s}
    out["warm"] = bool(run.get("warm"))
    evals = sum(counts[f] for f in EVALS if f in stage_s)
    if evals:
        out["evaluate"] = sum(stage_s[f] for f in EVALS if f in stage_s) / evals
    loops = measured_loops(folder / "report.md")
    trains = counts["train"] + counts["train_more"]  # the per-run table lists the added runs too
    if "train" in stage_s and len(loops) == trains:
        out["train_fixed"] = (stage_s["train"] + stage_s.get("train_more", 0.0) - sum(loops)) / trains
    return out


def fit_costs(folders: list[Path], warm: bool = False) -> StageCosts:
    """The median per-stage figures over the committed studies in `folders` run warm (or cold); a
    family no study run that way timed takes the others' figure (module docstring)."""
    every = {f.name: m for f in folders if (f / "run.json").is_file() and (m := measured_study(f))}
    if not every:
        raise PlanError("no committed study has a run.json with per-stage times (stage_s) to time the stages on")
    same = {n: m for n, m in every.items() if m["warm"] == warm}
    other = {n: m for n, m in every.items() if m["warm"] != warm}

    def med(key: str, studies: dict) -> float | None:
        values = [m[key] for m in studies.values() if key in m]
        return statistics.median(values) if values else None

    borrowed = []

    def figure(key: str) -> float | None:
        value = med(key, same)
        if value is None and med(key, other) is not None:
            borrowed.append(key.removesuffix("_fixed"))
            value = med(key, other)
        return value

    per_stage = {f: figure(f) for f in FIXED}
    train_fixed = figure("train_fixed")
    if per_stage["evaluate"] is None or train_fixed is None:
        raise PlanError(f"the committed studies ({', '.join(every)}) time no evaluate or train stage")
    per_stage = {f: v if v is not None else per_stage["evaluate"] if f == "knockout" else 0.0
                 for f, v in per_stage.items()}
    used = same if not borrowed else {**same, **other}
    return StageCosts(per_stage, train_fixed, sorted(used), warm, borrowed)


def loop_slowdown(jobs: int, threads: int, cores: int, parallel: float = 1.0) -> float:
    """How much longer a CPU training loop of `threads` threads (0: auto, every free core) takes
    when `jobs` stages share `cores` cores: the part its threads split (`parallel`, a share of
    its time: Calibration.parallel_share) takes as much longer as each has fewer threads, the
    rest not (its one thread's work is one thread's either way)."""
    return 1.0 + (max(1.0, jobs * (threads or cores) / cores) - 1.0) * parallel


def study_stages(params: Params, loop_s: dict[tuple[str, str | None], float], costs: StageCosts,
                 slowdown: float | Mapping[tuple[str, str | None], float] = 1.0) -> list[Stage]:
    """Every stage of `params` with its seconds; `loop_s[(variant, scale)]` is one run's predicted
    training loop (scale None: the main size), `slowdown` what sharing the machine does to it
    (one for all, or each loop's by the same keys)."""
    fixed = costs.per_stage
    stages = [Stage(f, f, fixed[f], (DATA[i - 1],) if i else ()) for i, f in enumerate(DATA)]
    ends = []  # what the report waits for
    loop_s = {key: loop * (slowdown[key] if isinstance(slowdown, Mapping) else slowdown) for key, loop in loop_s.items()}

    def run(family: str, key: str, loop: float, evaluate: str) -> None:
        stages.append(Stage(f"{family}@{key}", family, costs.train_fixed_s + loop, ("encode",), loop))
        stages.append(Stage(f"{evaluate}@{key}", evaluate, fixed["evaluate"], (f"{family}@{key}",)))
        ends.extend(s.name for s in stages[-2:])

    for variant in params.ablations:
        for seed in params.seeds:
            run("train", f"{variant}-{seed}", loop_s[(variant, None)], "evaluate")
            for lr in params.lr_sweep:
                run("train_lr", f"{variant}-{seed}-{lr:g}", loop_s[(variant, None)], "evaluate_lr")
            for scale in params.scales:
                run("train_scale", f"{variant}-{seed}-{scale}", loop_s[(variant, scale)], "evaluate_scale")
    # dvc.yaml lays out knockout@<seed> for every trained seed; one that knockout.seeds leaves out only
    # writes its off marker: a stage with next to no work, costed as the cheapest data stage.
    off = min(fixed[f] for f in DATA)
    for seed in params.seeds:
        cost = fixed["knockout"] if knocks_out(params.knockout.seeds, seed) else off
        stages.append(Stage(f"knockout@{seed}", "knockout", cost, (f"train@{params.report.baseline}-{seed}",)))
        ends.append(stages[-1].name)
    # Seeds until decided: the runs the rounds so far added (decide.runs), each with its knock-out
    # stage (the baseline's knocks out; a variant's writes its off marker).
    for name, more in params.decide.runs.items():
        run("train_more", name, loop_s[(more.variant, None)], "evaluate_more")
        knocks = more.variant == params.report.baseline and knocks_out(params.knockout.seeds, more.seed)
        stages.append(Stage(f"knockout_more@{name}", "knockout", fixed["knockout"] if knocks else off,
                            (f"train_more@{name}",)))
        ends.append(stages[-1].name)
    stages.append(Stage("report", "report", fixed["report"], tuple(ends)))
    return stages


def decide_bounds(params: Params) -> tuple[Params, Params] | None:
    """Seeds until decided: `params` as at the first look (no run added) and at the budget (every
    variant at every seed of the looks), the two ends of what the study can cost; None when off."""
    from pipeline.deciding.rounds import seed_order

    looks = params.decide.looks
    if not looks:
        return None
    extra = seed_order(params.seeds, looks[-1])[len(params.seeds):]
    every = {f"{v}-{s}": {"variant": v, "seed": s} for s in extra for v in params.ablations}
    first = params.model_copy(update={"decide": params.decide.model_copy(update={"runs": {}})})
    budget = Params.model_validate({**params.model_dump(), "decide": {**params.decide.model_dump(), "runs": every}})
    return first, budget


def rounds(stages: list[Stage], params: Params) -> list[list[Stage]]:
    """The stages of each round of seeds until decided, in order: round 1 every stage but the added
    runs'; a later round its added runs', check_params and the report. Earlier rounds' deps are met."""
    from pipeline.deciding.rounds import seed_order

    runs = params.decide.runs
    if not runs:
        return [stages]
    looks = params.decide.looks
    place = {s: i for i, s in enumerate(seed_order(params.seeds, looks[-1]))}
    of = {name: max(1, sum(1 for n in looks if n <= place[r.seed])) for name, r in runs.items()}
    out: list[list[Stage]] = [[] for _ in range(max(of.values()) + 1)]
    for stage in stages:
        out[of.get(stage.name.partition("@")[2], 0) if stage.family in ("train_more", "evaluate_more")
            or stage.name.startswith("knockout_more@") else 0].append(stage)
    by_name = {s.name: s for s in stages}
    for later in out[1:]:
        if later:
            later[:0] = [by_name["check_params"]]
            later.append(by_name["report"])
    kept = []
    for k, r in enumerate(out):
        names = {s.name for s in r}
        deps = {s.name: tuple(d for d in s.deps if d in names) for s in r}
        if k:  # a later round's runs wait for check_params, as their data stages (up to date) do
            deps = {n: d or (("check_params",) if n != "check_params" else ()) for n, d in deps.items()}
        if r:
            kept.append([replace(s, deps=deps[s.name]) for s in r])
    return kept


def rounds_wall(stages: list[Stage], params: Params, jobs: int) -> float:
    """The study's wall on `jobs` slots: one schedule, or the rounds' schedules one after another."""
    return sum(schedule(r, jobs) for r in rounds(stages, params))


def schedule(stages: list[Stage], jobs: int) -> float:
    """The wall time of running `stages` on `jobs` slots: whenever a slot is free it takes the first
    ready stage, evaluations and knock-outs before new trains, else in dvc.yaml's order."""
    if jobs < 1:
        raise PlanError(f"--jobs: {jobs} is not a positive number of slots")
    waiting = {s.name: set(s.deps) for s in stages}
    users: dict[str, list[Stage]] = {}
    for s in stages:
        for dep in s.deps:
            users.setdefault(dep, []).append(s)
    order = {s.name: (s.family in TRAINS, i) for i, s in enumerate(stages)}
    ready = [(order[s.name], s) for s in stages if not s.deps]
    heapq.heapify(ready)
    running: list[tuple[float, int, Stage]] = []
    now, started = 0.0, 0
    while ready or running:
        while ready and len(running) < jobs:
            _, stage = heapq.heappop(ready)
            heapq.heappush(running, (now + stage.seconds, started, stage))
            started += 1
        now, _, stage = heapq.heappop(running)
        for user in users.get(stage.name, []):
            waiting[user.name].discard(stage.name)
            if not waiting[user.name]:
                heapq.heappush(ready, (order[user.name], user))
    if started != len(stages):
        raise PlanError("the stages' dependencies form a circle")  # dvc.yaml's never do
    return now


def families(stages: list[Stage]) -> dict[str, dict]:
    """Per family group (data, train, evaluate, knockout, report): stages and serial seconds; the
    train group also its loops' seconds."""
    group = {**{f: "data" for f in DATA}, **{f: "train" for f in TRAINS}, **{f: "evaluate" for f in EVALS},
             "knockout": "knockout", "report": "report"}
    out: dict[str, dict] = {}
    for s in stages:
        g = out.setdefault(group[s.family], {"stages": 0, "seconds": 0.0, "loop_seconds": 0.0})
        g["stages"] += 1
        g["seconds"] += s.seconds
        g["loop_seconds"] += s.loop_s
    return out
