"""A study's wall against its training loops: serial `dvc repro`, cold and warm, and the grid launcher.

Run: python -m benchmarks.grid_wall [--params params.yaml] [--jobs auto] [--modes cold,serial,grid] [--out FILE.json]

Each mode (docs/tests-and-benchmarks.md#a-studys-time-stage-by-stage) runs the whole study from
scratch in its own scratch project, one after the other; serial and grid pass the launcher --warm.
Printed JSON: each mode's wall, summed training loops (train.json) and per-family seconds, a serial
wall over its own loops, and the grid's wall over a *serial* run's loops (the quiet reference: the
grid's own loops are slower, its runs sharing the cores). `fast_exit` says whether every stage of
the measured code ends through pipeline.warm.exit.run_main. What it measured:
docs/scaling-out-and-cost-plan.md#running-the-grid-in-parallel.
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
from pipeline.io.atomic import atomic_path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("repro", "cold", "serial", "grid")
# Targets of wall over loops: a plain `dvc repro`, `bash run.sh repro -j 1`; the grid's is below.
TARGETS = {"repro": 1.5, "serial": 1.4}
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


def fast_exit() -> bool:
    """Whether every stage module ends through pipeline.warm.exit.run_main (os._exit, no teardown)."""
    stages = ("check_params", "download", "filter", "train_bpe", "encode", "train", "evaluate", "knockout", "report")
    return all("run_main(main)" in (ROOT / "pipeline" / f"{s}.py").read_text(encoding="utf-8") for s in stages)


def run_walls(project: Path) -> list[tuple[str, float]]:
    """(variant, training loop seconds) of each run of a finished study (train.json)."""
    runs = [json.loads(p.read_text()) for p in sorted((project / "data" / "runs").glob("*/train.json"))]
    return [(run["variant"], run["wall_time_s"]) for run in runs]


def summed_loops(project: Path) -> tuple[float, int]:
    walls = [wall for _, wall in run_walls(project)]
    return round(sum(walls), 2), len(walls)


def variant_loops(project: Path) -> dict[tuple[str, None], float]:
    """{(variant, None): its runs' mean training loop} of a finished study."""
    walls: dict[str, list[float]] = {}
    for variant, wall in run_walls(project):
        walls.setdefault(variant, []).append(wall)
    return {(v, None): sum(w) / len(w) for v, w in walls.items()}


def planned_wall(params: Path, loops: dict, jobs: int, warm: bool, shards: Path) -> dict:
    """What `python -m pipeline.plan` predicts for this study's stages on the quiet serial run's
    measured loops: it checks the stage costs and the schedule (each loop slowed side by side by
    the part of it its threads split, as the time model reads it), not the training time."""
    from pipeline import cpu_numerics
    from pipeline.params import load_params
    from pipeline.planning.calibration import calibrate
    from pipeline.planning.estimate import plan, ram_bytes, read_manifest
    from pipeline.planning.study import fit_costs, loop_slowdown, schedule, study_stages

    loaded = load_params(params)
    costs = fit_costs(sorted(p.parent for p in (ROOT / "reports" / "studies").glob("*/run.json")), warm)
    cal = calibrate(sorted((ROOT / "reports").rglob("report.md")), cpu_numerics.wanted())  # as the runs trained
    rows, _ = plan(loaded, read_manifest(shards), "cpu", cal.peak, cal, ram_bytes(), shards)
    slowdown = {(r.variant, r.scale): loop_slowdown(jobs, loaded.train.threads, os.cpu_count() or 1, r.parallel_share)
                for r in rows}
    return {"wall_s": round(schedule(study_stages(loaded, loops, costs, slowdown), jobs), 1),
            "loop_slowdown": round(max(slowdown.values()), 3), "costs": costs.describe()}


def run_mode(name: str, project: Path, jobs: str) -> dict:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}"}
    env.pop("ABLATION_LAB_THREADS", None)
    times = project / "grid-times.json"
    if name == "cold":
        env["ABLATION_LAB_WARM"] = "0"
    else:
        env.pop("ABLATION_LAB_WARM", None)
    command = ([sys.executable, "-m", "dvc", "repro"] if name in ("repro", "cold")
               else [sys.executable, "-m", "pipeline.grid", "-j", "1" if name == "serial" else jobs,
                     "--times", str(times), "--warm"])
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
    if name in ("repro", "cold"):
        out["stage_s"] = stage_times["families"]
        log = project / ".dvc" / "tmp" / "warm.log"  # the server a repro's first stage started
        out["stages_served_warm"] = log.read_text().count("warm: served ") if log.exists() else 0
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
    p.add_argument("--modes", default=",".join(MODES), help=f"which of {', '.join(MODES)} to run (in this order)")
    args = p.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",")]
    if not modes or set(args.modes.split(",")) - set(modes):
        raise SystemExit(f"grid_wall: --modes takes {', '.join(MODES)}, got {args.modes!r}")
    scratch = Path(tempfile.mkdtemp(prefix="grid-wall-"))
    load_before = os.getloadavg()[0]
    result = {"cpu_count": os.cpu_count(), "load_1min_before": round(load_before, 2),
              "params": str(args.params), "fast_exit": fast_exit()}
    projects = {name: scratch_project(scratch / name, args.params) for name in modes}  # same code
    for name, project in projects.items():
        result[name] = run_mode(name, project, args.jobs)
    targets = {}
    for name in ("repro", "cold", "serial"):
        if name in result:
            ratio = result[name]["wall_over_own_loops"]
            result[f"{name}_wall_over_loops"] = ratio
            if name in TARGETS:
                targets[f"{name}_wall_over_loops"] = {"target": f"<= {TARGETS[name]}", "met": ratio <= TARGETS[name]}
    reference = result.get("serial") or result.get("repro") or result.get("cold")
    if "grid" in result and reference:
        grid = result["grid"]
        result["grid_reference"] = next(m for m in ("serial", "repro", "cold") if m in result)
        result["grid_wall_over_serial_loops"] = round(grid["wall_s"] / reference["training_loops_s"], 3)
        result["grid_over_serial_wall"] = round(grid["wall_s"] / reference["wall_s"], 3)
        targets["grid_wall_over_serial_loops"] = {"target": "<= 1.2",
                                                  "met": result["grid_wall_over_serial_loops"] <= 1.2}
    result["targets"] = targets
    quiet = projects["serial"] if "serial" in projects else projects[modes[0]]
    loops = variant_loops(quiet)
    for name in modes:
        jobs = result[name].get("jobs") or 1
        # repro: warm after its first stage
        plan = planned_wall(args.params, loops, jobs, warm=name != "cold", shards=quiet / "data" / "shards")
        plan["measured_over_plan"] = round(result[name]["wall_s"] / plan["wall_s"], 3)
        result[name]["plan"] = plan
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
