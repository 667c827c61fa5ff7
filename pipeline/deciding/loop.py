"""`bash run.sh decide`: run the study until every ablation is decided or the seed budget is spent.

    python -m pipeline.deciding [grid options, e.g. -j 2]   (bash run.sh decide)

Params: decide.looks (seed counts, fixed before any run), decide.alpha, decide.margin
(pipeline.params.DecideParams; the rule and its proof: pipeline.deciding.rule). Each round:
1. `python -m pipeline.grid` runs every stage params.yaml lays out, the report included, side by
   side; the report stage writes the sequential record (reports/decisions.json) from the eval files.
2. When the record says every comparison is decided or at its budget, stop.
3. Otherwise add the runs it asks for (open variants and the baseline, the seeds of their next look)
   to params.yaml's decide.runs, a text edit that keeps the file's comments, and go to 1.
Before each round the plan is checked against the last record's fingerprint (changed_plan): once
runs were added, other looks, α, δ, method, boundary, seeds, variants, baseline or metric are
refused in one line (--restart goes on under the new plan, knowingly).
DVC turns each added entry into train_more / evaluate_more stages; nothing already run reruns. A
kill anywhere is safe: run the command again and the grid picks up what is missing, and the record
is recomputed from the results, so it is the same however many rounds or restarts it took. At the
end `dvc repro` on the final params.yaml reruns nothing and reproduces the same record.

--times FILE: the grid's stage times (python -m pipeline.grid --times) summed over this command's
rounds, each round's wall beside them (scripts/study.sh writes a study's run.json from it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.atomic import atomic_path
from pipeline.deciding.rounds import plan_fingerprint
from pipeline.params import ParamsError, load_params, stage_error

RECORD = Path("reports/decisions.json")


def added_runs(record: Mapping) -> dict[str, dict[str, object]]:
    """The runs the record asks for next, `variant-seed: {variant, seed}`, baseline first."""
    wanted = [(record["baseline"]["name"], s) for s in record["baseline"]["needs"]]
    wanted += [(name, s) for name, v in sorted(record["variants"].items()) for s in v["needs"]]
    return {f"{v}-{s}": {"variant": v, "seed": int(s)} for v, s in wanted}


def with_runs(text: str, runs: Mapping[str, Mapping[str, object]]) -> str:
    """params.yaml's text with decide.runs holding `runs` (sorted by seed, then name); the rest of
    the file, its comments included, unchanged. decide must be a block mapping at the top level."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(r"decide:\s*(#.*)?$", line)), None)
    if start is None:
        raise ParamsError("params.yaml: decide: is not a block at the top level (write `decide:` and its keys "
                          "on their own lines)")
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].strip() and not lines[i].startswith((" ", "#"))), len(lines))
    body = lines[start + 1:end]
    at = next((i for i, line in enumerate(body) if re.match(r"  runs:", line)), None)
    entries = sorted(runs.items(), key=lambda kv: (kv[1]["seed"], kv[0]))
    block = ["  runs:  # written by `bash run.sh decide` (pipeline/deciding/loop.py): the runs it added\n" if entries
             else "  runs: {}  # written by `bash run.sh decide` (pipeline/deciding/loop.py): the runs it added\n"]
    block += [f"    {name}: {{variant: {r['variant']}, seed: {r['seed']}}}\n" for name, r in entries]
    if at is None:
        while body and not body[-1].strip():
            body.pop()
        body += block
    else:
        stop = next((i for i in range(at + 1, len(body)) if not body[i].startswith("    ")), len(body))
        body[at:stop] = block
    if end < len(lines) and body and body[-1].strip():
        body.append("\n")
    return "".join(lines[:start + 1] + body + lines[end:])


def add_runs(params_path: Path, runs: Mapping[str, Mapping[str, object]]) -> None:
    """Add `runs` to params.yaml's decide.runs, checked by the params schema before it is written."""
    text = params_path.read_text(encoding="utf-8")
    current = load_params(params_path).decide.runs
    merged = {name: {"variant": r.variant, "seed": r.seed} for name, r in current.items()} | dict(runs)
    new = with_runs(text, merged)
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


def changed_plan(params, record_path: Path = RECORD) -> str | None:
    """Why the study cannot go on under params.yaml's plan, or None. A study is under way once
    decide.runs holds runs this loop added; its last record names the plan its looks were taken
    under. Another plan (looks, α, margin, method, boundary, seeds, variants, baseline, metric) would
    re-decide every look already taken, as if it had been the plan from the start."""
    if not params.decide.runs or not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    was = record.get("fingerprint")
    if record.get("off") or was is None or was == fingerprint(params):
        return None
    return (f"decide: the plan in params.yaml is not the one this study's rounds ran under ({RECORD} fingerprint "
            f"{was}, params.yaml {fingerprint(params)}): a changed plan re-decides every look taken; start a new "
            "study (remove decide.runs), or pass --restart to go on under the new plan knowingly")


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
        why = changed_plan(params)
        if why and not (args.restart and round_ == 0):
            print(why, file=sys.stderr)
            return 2
        print(f"decide: round {round_ + 1}: {len(params.seeds)} seeds for every variant, "
              f"{len(params.decide.runs)} runs added", flush=True)
        times = [] if args.times is None else ["--times", str(args.times.with_suffix(".round.json"))]
        code = subprocess.call([sys.executable, "-m", "pipeline.grid", *grid_args, *times], env=os.environ)
        if code != 0:
            return code
        if args.times is not None:  # written after every round: a kill keeps the rounds finished
            rounds.append(json.loads(args.times.with_suffix(".round.json").read_text(encoding="utf-8")))
            command = rounds[0]["command"].replace("pipeline.grid", "pipeline.deciding")
            with atomic_path(args.times) as tmp:
                tmp.write_text(json.dumps(summed_times(rounds, command), indent=2) + "\n")
        record = json.loads(RECORD.read_text(encoding="utf-8"))
        if record.get("off"):
            raise SystemExit(f"decide: {RECORD} says decide is off: the report stage read other params")
        if record["done"]:
            states = ", ".join(f"{name} {v['state']} at n={v['looks'][-1]['n'] if v['looks'] else 0}"
                               for name, v in sorted(record["variants"].items()))
            print(f"decide: done after {round_ + 1} round(s): {states}; the record is {RECORD}", flush=True)
            return 0
        more = added_runs(record)
        if not more:
            raise SystemExit(f"decide: {RECORD} is not done but asks for no runs (a broken record)")
        add_runs(args.params, more)
        params = load_params(args.params)
    raise SystemExit(f"decide: still open after {args.max_rounds} rounds")

