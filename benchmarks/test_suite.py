"""How long the tests take: the quick tier as `bash run.sh test quick` runs it (pytest-xdist, a
worker a core) against the same tier in one process, in turn; or the full suite as CI runs it.

Run: python -m benchmarks.test_suite quick [--rounds 2]    (in this checkout; a few minutes a round)
     python -m benchmarks.test_suite suite                 (a fresh clone of HEAD: `bash .ci/run`)
     python -m benchmarks.test_suite suite --junit FILE --commit C   (a CI run already made: the
                                                           JUnit XML `.ci/run` wrote, C its commit)
     [--out reports/benchmarks/test_suite.json]            (merges this part into the file)
Prints one JSON object. The quick tier's two ways alternate round by round, so that a slow spell
of the machine falls on both; read `ratio` (workers ÷ one process). Each trial records its
`steal_share` (/proc/stat: the CPU time a shared host's hypervisor gave other guests meanwhile).
The suite's part clones HEAD into a scratch folder (its own .venv: the install is in wall_s, as on CI).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from pipeline.training.device import _cpu_model as cpu_model

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"=* ?(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<seconds>[0-9.]+)s")
WAYS = {"workers": ["bash", "run.sh", "test", "quick", "-q", "-p", "no:cacheprovider"],
        "one_process": [".venv/bin/python", "-m", "pytest", "--quick", "-q", "-p", "no:cacheprovider"]}


def summary(output: str) -> dict:
    """pytest's last line: its counts ({"passed": 2066, ...}) and its own total in seconds."""
    found = list(SUMMARY.finditer(output))
    if not found:
        raise SystemExit(f"test_suite: no pytest summary line in the output:\n{output[-2000:]}")
    last = found[-1]
    counts = {word: int(n) for n, word in (c.split() for c in last["counts"].split(", "))}
    return {"counts": counts, "pytest_s": float(last["seconds"])}


def ticks_of(line: str) -> tuple[int, int] | None:
    """/proc/stat's `cpu` line: (all ticks, steal ticks); None if it has not the eight fields."""
    fields = line.split()[1:9]
    if len(fields) < 8 or not all(f.isdigit() for f in fields):
        return None
    ticks = [int(f) for f in fields]
    return sum(ticks), ticks[7]


def cpu_ticks() -> tuple[int, int] | None:
    try:
        return ticks_of(Path("/proc/stat").read_text().split("\n", 1)[0])
    except OSError:  # no /proc
        return None


def timed(command: list[str], cwd: Path) -> dict:
    ticks = cpu_ticks()
    t0 = time.monotonic()
    run = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    out = run.stdout + run.stderr
    if run.returncode:
        raise SystemExit(f"test_suite: `{' '.join(command)}` exited {run.returncode}:\n{out[-3000:]}")
    result = {**summary(out), "wall_s": round(wall, 1)}
    after = cpu_ticks()
    if ticks and after and after[0] > ticks[0]:
        # the share of the machine's CPU time the hypervisor gave to other guests meanwhile: one
        # cause of a slow trial on a shared host that it can name (not the only one)
        result["steal_share"] = round((after[1] - ticks[1]) / (after[0] - ticks[0]), 3)
    return result


def quick(rounds: int) -> dict:
    subprocess.run(["bash", "run.sh", "setup"], cwd=ROOT, check=True)  # the install is not a test's time
    trials: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(rounds):
        for way in (WAYS if r % 2 == 0 else reversed(list(WAYS))):
            trials[way].append(timed(WAYS[way], ROOT))
            print(f"test_suite: round {r + 1}/{rounds} {way}: {trials[way][-1]['wall_s']} s", file=sys.stderr)
    walls = {way: round(statistics.median(t["wall_s"] for t in trials[way]), 2) for way in WAYS}
    return {"commands": {way: " ".join(c) for way, c in WAYS.items()}, "rounds": rounds,
            "median_wall_s": walls, "ratio": round(walls["workers"] / walls["one_process"], 3),
            "tests": trials["workers"][0]["counts"], "trials": trials, "cpu": cpu_model(), "cores": os.cpu_count()}


def suite() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="test-suite-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        result = timed(["bash", ".ci/run"], clone)
    return {"command": "bash .ci/run (a fresh clone, its install included in wall_s)", "commit": commit,
            **result, "cpu": cpu_model(), "cores": os.cpu_count()}


def from_junit(path: Path, commit: str) -> dict:
    """A suite run already made, read from the JUnit XML pytest wrote (`.ci/run`: /tmp/ci-junit.xml):
    each test's outcome, pytest's own total, and how many browser tests passed (CI prints that too)."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts: Counter = Counter()
    browser = 0
    for case in suite.iter("testcase"):
        skipped = case.find("skipped")
        outcome = ("xfailed" if skipped.get("type") == "pytest.xfail" else "skipped") if skipped is not None \
            else "failed" if case.find("failure") is not None else "error" if case.find("error") is not None \
            else "passed"
        counts[outcome] += 1
        browser += outcome == "passed" and "test_screenshots" in case.get("classname", "")
    return {"command": "bash .ci/run (a fresh clone)", "commit": commit, "counts": dict(counts),
            "pytest_s": float(suite.get("time")), "browser_passed": browser, "started": suite.get("timestamp"),
            "from": f"{path.name} (JUnit XML)"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["quick", "suite"])
    p.add_argument("--rounds", type=int, default=2, help="quick: rounds of both ways, alternating")
    p.add_argument("--junit", type=Path, help="suite: read this CI run's JUnit XML instead of running one")
    p.add_argument("--commit", help="suite --junit: the commit that CI run tested")
    p.add_argument("--out", type=Path, help="a JSON file to merge this part into (written atomically)")
    args = p.parse_args(argv)
    if args.junit and not args.commit:
        p.error("--junit needs --commit (the commit that run tested)")
    result = quick(args.rounds) if args.part == "quick" else \
        from_junit(args.junit, args.commit) if args.junit else suite()
    if args.out:
        merged = json.loads(args.out.read_text()) if args.out.exists() else {}
        merged[args.part] = result
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=1) + "\n")
        tmp.replace(args.out)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
