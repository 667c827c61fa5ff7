"""A study's fixed cost before it trains: the grid launcher's start to its shared data stages done,
to the first train stage started, and to the first training step (the train stage's "training N
steps" line, printed as its loop begins), cold and warm.

Run: python -m benchmarks.study_start [--preset nanogpt_shakespeare_char] [--modes cold,warm]
                                      [--repeats 2] [--against CHECKOUT]
Prints one JSON object. Each trial is a scratch project made as scripts/study.sh makes one, whose
launcher is stopped with a Ctrl-C once the first training step is seen, so a trial costs seconds,
not the study. --against CHECKOUT times that checkout's code trial for trial in turn with this one,
so load falls on both alike. The preset's corpus must be in the download cache (offline).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKS = ("shared_done_s", "first_train_start_s", "first_step_s")
TIMEOUT_S = 300


def scratch(code: Path, preset: str, where: Path) -> Path:
    project = Path(tempfile.mkdtemp(prefix="study-start.", dir=where))
    for name in ("model", "pipeline", "benchmarks", "presets"):
        shutil.copytree(code / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(code / "dvc.yaml", project)
    shutil.copytree(code / "data" / "local", project / "data" / "local")
    quiet = {"cwd": project, "check": True, "capture_output": True}
    subprocess.run(["git", "init", "-q"], **quiet)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], **quiet)
    subprocess.run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], **quiet)
    subprocess.run([sys.executable, "-m", "pipeline.preset", preset], **quiet)
    return project


def trial(project: Path, mode: str) -> dict:
    """Seconds from the launcher's start to each mark; the launcher stopped after the last one."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "pipeline.grid", "-j", "auto", *(["--cold"] if mode == "cold" else [])]
    t0 = time.monotonic()
    proc = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    seen: dict[str, float] = {}

    def read() -> None:
        for line in proc.stdout:
            now = round(time.monotonic() - t0, 2)
            if line.startswith("grid: done  check_params"):
                seen.setdefault("shared_done_s", now)
            elif line.startswith("grid: start train@"):
                seen.setdefault("first_train_start_s", now)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    logs = project / ".dvc" / "tmp" / "grid"
    while "first_step_s" not in seen and proc.poll() is None and time.monotonic() - t0 < TIMEOUT_S:
        for log in logs.glob("train@*.log"):
            if "\ntraining " in log.read_text(errors="replace"):
                seen["first_step_s"] = round(time.monotonic() - t0, 2)
                break
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # the launcher ends its stages and the server
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    return {mark: seen.get(mark) for mark in MARKS}


def commit(code: Path) -> str | None:
    """The checkout's commit, and "+changes" where its tree differs from it."""
    run = subprocess.run(["git", "-C", str(code), "describe", "--always", "--dirty=+changes", "--abbrev=12"],
                         capture_output=True, text=True)
    return run.stdout.strip() or None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="nanogpt_shakespeare_char")
    p.add_argument("--modes", default="cold,warm")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--against", type=Path, help="another checkout, timed in turn with this one")
    args = p.parse_args()
    codes = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
    modes = args.modes.split(",")
    runs: dict[str, dict[str, list[dict]]] = {c: {m: [] for m in modes} for c in codes}
    with tempfile.TemporaryDirectory(prefix="study-start.") as tmp:
        for _ in range(args.repeats):
            for mode in modes:
                for name, code in codes.items():
                    project = scratch(code, args.preset, Path(tmp))
                    runs[name][mode].append(trial(project, mode))
                    print(f"study_start: {name} {mode}: {runs[name][mode][-1]}", file=sys.stderr, flush=True)
                    shutil.rmtree(project, ignore_errors=True)
    out: dict = {"preset": args.preset, "repeats": args.repeats, "cpu_count": os.cpu_count(),
                 "commits": {name: commit(code) for name, code in codes.items()}, "runs": runs,
                 "median": {}, "load": os.getloadavg()[0]}
    for name in codes:
        out["median"][name] = {mode: {mark: statistics.median(v) if (v := [r[mark] for r in runs[name][mode]
                                                                             if r[mark] is not None]) else None
                                      for mark in MARKS} for mode in modes}
    if args.against:
        out["ratio_to_against"] = {mode: {mark: round(a / b, 3) if (a := out["median"]["this"][mode][mark]) and
                                          (b := out["median"]["against"][mode][mark]) else None for mark in MARKS}
                                   for mode in modes}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
