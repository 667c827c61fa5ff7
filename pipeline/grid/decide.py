"""`bash run.sh decide`: rounds of the grid until every ablation is decided or its seed budget spent.

    python -m pipeline.grid.decide [--times FILE] [--restart] [grid options, e.g. -j 2]

The rounds, the record and the rule: docs/seeds-until-decided.md. Each round runs the grid
launcher (repro.py, in this process); until the record is done, the runs it asks for go into
params.yaml's decide.runs (with_runs). A kill anywhere is safe: rerun, and the grid picks up what
is missing. --times FILE: the rounds' stage times, summed (scripts/study.sh writes run.json from it).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pipeline.deciding import record
from pipeline.deciding.rounds import plan_fingerprint
from pipeline.grid import signals
from pipeline.grid.repro import repro
from pipeline.io.atomic import atomic_path
from pipeline.params import ParamsError, load_params, stage_error

RECORD = Path("reports/decisions.json")
RUNS_LINE = "  runs:{}  # written by `bash run.sh decide` (pipeline/grid/decide.py): the runs it added\n"


def with_runs(text: str, runs: Iterable[tuple[str, int]]) -> str:
    """params.yaml's text with decide.runs holding `runs` (variant, seed), every other line, comments
    included, as it was. decide must be a block mapping at the top level."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(r"decide:\s*(#.*)?$", line)), None)
    if start is None:
        raise ParamsError("params.yaml: decide: is not a block at the top level (write `decide:` and its keys "
                          "on their own lines)")
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and not lines[i].startswith((" ", "#"))), len(lines))
    body = lines[start + 1:end]
    at = next((i for i, line in enumerate(body) if line.startswith("  runs:")), None)
    entries = sorted((seed, f"{variant}-{seed}", variant) for variant, seed in runs)
    block = [RUNS_LINE.format("" if entries else " {}")]
    block += [f"    {name}: {{variant: {variant}, seed: {seed}}}\n" for seed, name, variant in entries]
    if at is None:  # appended to the block, before the blank lines that end it
        while body and not body[-1].strip():
            body.pop()
        body += block
    else:  # in place of the runs there were
        stop = next((i for i in range(at + 1, len(body)) if not body[i].startswith("    ")), len(body))
        body[at:stop] = block
    if end < len(lines) and body and body[-1].strip():
        body.append("\n")
    return "".join(lines[:start + 1] + body + lines[end:])


def add_runs(params_path: Path, runs: Iterable[tuple[str, int]]) -> None:
    """Add `runs` (variant, seed) to params.yaml's decide.runs, schema-checked before it is written."""
    text = params_path.read_text(encoding="utf-8")
    current = {(r.variant, r.seed) for r in load_params(params_path).decide.runs.values()}
    new = with_runs(text, current | set(runs))
    with atomic_path(params_path) as tmp:
        tmp.write_text(new, encoding="utf-8")
        load_params(tmp)  # a run the schema refuses never reaches params.yaml


def summed_times(rounds: Sequence[Mapping], command: str) -> dict:
    """One times record (pipeline.grid's --times format, spans left out) for rounds run one after
    another: walls and stage seconds add up; `rounds` keeps each round's wall and stage count."""
    stages: dict[str, float] = {}
    families: dict[str, float] = {}
    for times in rounds:
        for key, into in (("stages", stages), ("families", families)):
            for name, seconds in times[key].items():
                into[name] = round(into.get(name, 0.0) + seconds, 2)
    return {"command": command, "jobs": rounds[0]["jobs"], "warm": rounds[0]["warm"],
            "total_s": round(sum(t["total_s"] for t in rounds), 2),
            "before_first_stage_s": rounds[0]["before_first_stage_s"], "stages": stages, "families": families,
            "retries": sum(t["retries"] for t in rounds),
            "rounds": [{"total_s": t["total_s"], "stages": len(t["stages"])} for t in rounds]}


def fingerprint(params) -> str:
    """The plan params.yaml describes now, as the report stage's record fingerprints it."""
    return plan_fingerprint(baseline=params.report.baseline, variants=[str(v) for v in params.ablations],
                            seeds=params.seeds, looks=params.decide.looks, alpha=params.decide.alpha,
                            margin=params.decide.margin, metric=params.report.primary_metric,
                            method=params.decide.method, boundary=params.decide.boundary,
                            rho=params.decide.rho)


def changed_plan(params, was: str | None) -> str | None:
    """Why the study cannot go on under params.yaml's plan, or None. Once decide.runs holds runs,
    the last record's fingerprint `was` names the plan its looks were taken under; another plan
    would re-decide every look already taken, as if it had been the plan from the start."""
    if not params.decide.runs or was is None or was == fingerprint(params):
        return None
    return (f"decide: the plan in params.yaml is not the one this study's rounds ran under ({RECORD} fingerprint "
            f"{was}, params.yaml {fingerprint(params)}): a changed plan re-decides every look taken; start a new "
            "study (remove decide.runs), or pass --restart to go on under the new plan knowingly")


def last_fingerprint() -> str | None:
    """The fingerprint of the last round's record; None without one (decide off, no report yet)."""
    try:
        last = record.read(RECORD)
    except (OSError, ValueError, KeyError):
        return None
    return last.fingerprint if last else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--max-rounds", type=int, default=100, help="a guard, never reached by a valid plan")
    parser.add_argument("--times", type=Path, help="write the rounds' stage times, summed, here (grid's format)")
    parser.add_argument("--restart", action="store_true",
                        help="go on although params.yaml's plan changed since the last round (its looks re-decided)")
    args, grid_args = parser.parse_known_args(argv)
    rounds: list[dict] = []
    try:
        params = load_params(args.params)
    except ParamsError as e:
        raise stage_error("decide", e) from None
    if not params.decide.looks:
        print("decide: decide.looks is empty in params.yaml (off); set looks, e.g. [3, 5, 8, 12, 20], and run "
              "again", file=sys.stderr)
        return 2
    for round_ in range(args.max_rounds):
        why = changed_plan(params, last_fingerprint())
        if why and not (args.restart and round_ == 0):
            print(why, file=sys.stderr)
            return 2
        print(f"decide: round {round_ + 1}: {len(params.seeds)} seeds for every variant, "
              f"{len(params.decide.runs)} runs added", flush=True)
        code, times = repro(grid_args, timed=args.times is not None)
        if code != 0:
            return code
        if args.times is not None:  # written after every round: a kill keeps the rounds finished
            rounds.append(times)
            command = rounds[0]["command"].replace("pipeline.grid", "pipeline.grid.decide")
            with atomic_path(args.times) as tmp:
                tmp.write_text(json.dumps(summed_times(rounds, command), indent=2) + "\n")
        last = record.read(RECORD)
        if last is None:
            raise SystemExit(f"decide: {RECORD} says decide is off: the report stage read other params")
        if last.done:
            states = ", ".join(f"{name} {v.state} at n={v.looks[-1].n if v.looks else 0}"
                               for name, v in sorted(last.variants.items()))
            print(f"decide: done after {round_ + 1} round(s): {states}; the record is {RECORD}", flush=True)
            return 0
        more = last.next_runs()
        if not more:
            raise SystemExit(f"decide: {RECORD} is not done but asks for no runs (a broken record)")
        add_runs(args.params, more)
        params = load_params(args.params)
    raise SystemExit(f"decide: still open after {args.max_rounds} rounds")


if __name__ == "__main__":
    signals.install()  # before anything else: a signal at any point ends the study in order
    try:
        code = main()
    except signals.Stopped as exc:
        signals.end_by(exc.signum)
    sys.exit(code)
