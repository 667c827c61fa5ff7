"""Wall time per DVC stage: run `dvc repro` (or any command), timestamp its output, sum per stage.

Run: python -m benchmarks.stage_times [--json OUT] -- dvc repro [args]
The command's output passes through unchanged; afterwards a table of seconds per stage and per
stage family (`train@baseline-0` counts towards `train`) goes to stderr, and with --json to OUT.
Exits with the command's exit code.

A stage's time runs from its "Running stage 'x':" line to the next stage's (or the end), so it
includes DVC's own work around the stage (hashing outputs, writing the lock file): what a user waits.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from pipeline.io.atomic import atomic_path


def stage_times(lines: list[tuple[float, str]], start: float, end: float) -> dict:
    """{"total_s", "before_first_stage_s", "stages": {name: s}, "families": {name: s}} from timestamped lines."""
    marks = [(t, line.split("'")[1]) for t, line in lines if line.startswith("Running stage '")]
    stages: dict[str, float] = {}
    for (t, name), (t_next, _) in zip(marks, marks[1:] + [(end, "")]):
        stages[name] = round(stages.get(name, 0.0) + t_next - t, 2)
    families: dict[str, float] = {}
    for name, seconds in stages.items():
        family = name.split("@")[0]
        families[family] = round(families.get(family, 0.0) + seconds, 2)
    return {"total_s": round(end - start, 2),
            "before_first_stage_s": round((marks[0][0] if marks else end) - start, 2),
            "stages": stages, "families": families}


def run(command: list[str]) -> tuple[int, dict]:
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            lines.append((time.perf_counter(), line.rstrip("\n")))
            sys.stdout.write(line)
            sys.stdout.flush()
    return proc.returncode, stage_times(lines, start, time.perf_counter())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="also write the times here")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command (default: dvc repro)")
    args = p.parse_args()
    command = (args.command[1:] if args.command[:1] == ["--"] else args.command) or ["dvc", "repro"]
    rc, times = run(command)
    width = max((len(n) for n in times["families"]), default=5)
    print(f"{'stage':<{width}}  seconds", file=sys.stderr)
    for name, seconds in times["families"].items():
        print(f"{name:<{width}}  {seconds:7.1f}", file=sys.stderr)
    print(f"{'total':<{width}}  {times['total_s']:7.1f}", file=sys.stderr)
    if args.json:
        with atomic_path(args.json) as tmp:
            tmp.write_text(json.dumps(times, indent=2) + "\n")
    sys.exit(rc)


if __name__ == "__main__":
    main()
