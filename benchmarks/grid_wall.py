"""A study's wall against its training loops: serial `dvc repro` and the grid launcher, side by side.

Run: python -m benchmarks.grid_wall [--params params.yaml] [--jobs auto] [--out FILE.json]

Each mode runs the whole study from scratch in its own scratch project (git + DVC initialised, an
MLflow store of its own), one after the other on this machine in the same run:
  serial  `dvc repro`                      (what `bash run.sh repro -j 1` runs)
  grid    `python -m pipeline.grid -j N`   (what `bash run.sh` runs)
and the summed training loops of its runs (train.json `wall_time_s`) are read back. Printed JSON:
each mode's wall, loops and per-stage-family seconds, and the two ratios the grid issue asks for:
serial wall / its own loops, and grid wall / the *serial* run's loops (the quiet reference: the
grid's own loops are slower, since its runs share the cores).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.stage_times import run as timed_run
from pipeline.atomic import atomic_path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("model", "pipeline", "benchmarks", "dvc.yaml", "presets", ".dvcignore")


def scratch_project(folder: Path, params: Path) -> Path:
    """A copy of the project's code and `params` as params.yaml, with git and DVC initialised."""
    folder.mkdir(parents=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, folder / name)
    shutil.copytree(ROOT / "data" / "local", folder / "data" / "local")
    shutil.copy2(params, folder / "params.yaml")
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"],
                [sys.executable, "-m", "dvc", "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=folder, check=True)
    return folder


def summed_loops(project: Path) -> tuple[float, int]:
    walls = [json.loads(p.read_text())["wall_time_s"] for p in sorted((project / "data" / "runs").glob("*/train.json"))]
    return round(sum(walls), 2), len(walls)


def run_mode(name: str, project: Path, jobs: str) -> dict:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"}
    env.pop("ABLATION_LAB_THREADS", None)
    times = project / "grid-times.json"
    command = ([sys.executable, "-m", "dvc", "repro"] if name == "serial"
               else [sys.executable, "-m", "pipeline.grid", "-j", jobs, "--times", str(times)])
    print(f"grid_wall: {name}: {' '.join(command[1:])} in {project}", file=sys.stderr, flush=True)
    old, start = Path.cwd(), time.perf_counter()
    os.chdir(project)
    saved, stdout = dict(os.environ), sys.stdout
    os.environ.update(env)
    sys.stdout = sys.stderr  # the study's own output goes to stderr: stdout is the JSON alone
    try:
        rc, stage_times = timed_run(command)
    finally:
        sys.stdout = stdout
        os.chdir(old)
        os.environ.clear()
        os.environ.update(saved)
    wall = round(time.perf_counter() - start, 2)
    if rc:
        raise SystemExit(f"grid_wall: {name} run failed (exit {rc}); its project: {project}")
    loops, runs = summed_loops(project)
    out = {"command": " ".join(command[1:]), "wall_s": wall, "training_loops_s": loops, "runs": runs,
           "wall_over_own_loops": round(wall / loops, 3)}
    if name == "serial":
        out["stage_s"] = stage_times["families"]
    else:
        grid = json.loads(times.read_text())
        out.update(jobs=grid.get("jobs"), stage_s=grid.get("families", {}))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    p.add_argument("--jobs", default="auto", help="the launcher's -j")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    p.add_argument("--keep", action="store_true", help="keep the scratch projects")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="grid-wall-"))
    load_before = os.getloadavg()[0]
    result = {"cpu_count": os.cpu_count(), "load_1min_before": round(load_before, 2),
              "params": str(args.params)}
    projects = {name: scratch_project(scratch / name, args.params) for name in ("serial", "grid")}  # same code
    for name, project in projects.items():
        result[name] = run_mode(name, project, args.jobs)
    serial, grid = result["serial"], result["grid"]
    result["serial_wall_over_loops"] = serial["wall_over_own_loops"]
    result["grid_wall_over_serial_loops"] = round(grid["wall_s"] / serial["training_loops_s"], 3)
    result["grid_over_serial_wall"] = round(grid["wall_s"] / serial["wall_s"], 3)
    result["targets"] = {"serial_wall_over_loops": {"target": "<= 1.5", "met": serial["wall_over_own_loops"] <= 1.5},
                         "grid_wall_over_serial_loops": {"target": "<= 1.2",
                                                         "met": result["grid_wall_over_serial_loops"] <= 1.2}}
    result["load_1min_after"] = round(os.getloadavg()[0], 2)
    text = json.dumps(result, indent=2)
    if args.out:
        with atomic_path(args.out) as tmp:
            tmp.write_text(text + "\n")
    print(text)
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
