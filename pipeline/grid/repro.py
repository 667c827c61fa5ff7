"""The grid side by side: a study's independent stages run at the same time, each run by DVC.
`repro` is one run of it: `python -m pipeline.grid` runs it once, pipeline/grid/decide.py each round.

    python -m pipeline.grid                  # -j auto: every core, or GPUs x runs per GPU (at most the cores)
    python -m pipeline.grid -j 4 [TARGET..]  # at most 4 stages at once; targets as `dvc repro` takes them
    python -m pipeline.grid -j 1 [ARGS..]    # a serial `dvc repro ARGS` (warm starts)
    python -m pipeline.grid --times t.json   # also write each stage's start and end (seconds) as JSON
    python -m pipeline.grid --cold           # each stage a new Python process (no warm server)
    python -m pipeline.grid --warm           # warm starts (the default, on a GPU machine too)

What it does and how a study stops: docs/scaling-out-and-cost-plan.md#running-the-grid-in-parallel.
A thin layer, not a scheduler: DVC decides whether a stage runs and records it, so dvc.lock and the
caches end as a serial `dvc repro` leaves them. The stages: dag.py; the processes: launch.py; warm
starts: warm.py; nothing outlives the launcher: signals.py, lifeline.py; one per workspace: lock.py.
Each stage gets $ABLATION_LAB_THREADS = cores / stages running, not a param, so dvc.lock is the
same whatever -j was.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.grid import lock, signals
from pipeline.grid.dag import Task, plan_tasks, read_pipeline, shared_stages, stale_stages
from pipeline.grid.eta import read_prior, write_times
from pipeline.grid.launch import DVC, Launcher
from pipeline.grid.lifeline import Lifeline
from pipeline.grid.warm import warm_starts
from pipeline.io.atomic import atomic_path

LOG_DIR = Path(".dvc/tmp/grid")  # DVC keeps .dvc/tmp out of git
TIMES = Path(".dvc/tmp/grid_times.json")  # each kind's task seconds in the last study, for the next ETA
THREADS_ENV = "ABLATION_LAB_THREADS"  # pipeline.training.device reads it (not imported: no torch here)
MAX_RUNS_PER_GPU = 16  # pipeline.training.gpu_lock's cap; the slot locks decide the rest


def warm_wanted(cold: bool, warm: bool, dvc_yaml: str) -> bool:
    """Warm starts where a stage runs our code (not in a project of shell stages), on a CPU or a
    GPU machine alike (measured there: docs/gpu.md), unless --cold; --warm asks for the default."""
    return not cold and "python -m pipeline " in dvc_yaml  # dvc.yaml's form of a stage of ours


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def auto_jobs(params: Path = Path("params.yaml")) -> tuple[int, str]:
    """-j auto: the cores on a CPU machine; GPUs x runs per GPU (train.runs_per_gpu, or 16 for
    `auto`, whose memory limit the GPU slot locks enforce) on a GPU machine, at most the cores."""
    n = cores()
    try:
        from pipeline.params import load_params

        train = load_params(params).train
        device, per_gpu = train.device, train.runs_per_gpu
    except (ValueError, OSError):  # check_params, the first stage, says what is wrong
        device, per_gpu = "auto", "auto"
    gpus = 0
    if device != "cpu" and (os.environ.get("ABLATION_LAB_GPU_COUNT") or Path("/proc/driver/nvidia/gpus").is_dir()):
        from pipeline.training.gpu_lock import visible_gpus  # imports torch: only where a GPU may be

        gpus = len(visible_gpus())
    if not gpus:
        return n, f"{n} CPU cores"
    k = MAX_RUNS_PER_GPU if per_gpu == "auto" else per_gpu
    jobs = max(1, min(n, gpus * k))
    return jobs, f"{gpus} GPUs x {per_gpu} runs per GPU, at most {n} CPU cores"


def times_record(launcher: Launcher, jobs: int, end: float, warm: bool) -> dict:
    spans = launcher.out.spans
    stages = {name: round(b - a, 2) for name, (a, b) in spans.items()}
    families: dict[str, float] = {}
    for name, seconds in stages.items():
        family = name.split("@")[0]
        families[family] = round(families.get(family, 0.0) + seconds, 2)
    first = min((a for a, _ in spans.values()), default=end - launcher.t0)
    # Stage seconds overlap when jobs > 1: a family's sum is busy time, not a share of the wall.
    return {"command": f"python -m pipeline.grid -j {jobs}" + ("" if warm else " --cold"), "jobs": jobs, "warm": warm,
            "total_s": round(end - launcher.t0, 2),
            "before_first_stage_s": round(first, 2), "stages": stages, "families": families, "spans": spans,
            "retries": launcher.out.retries}


def summary(launcher: Launcher, jobs: int, took: float) -> list[str]:
    out = launcher.out
    retried = f", {out.retries} start(s) retried after DVC's lock was taken" if out.retries else ""
    lines = [f"grid: {len(out.spans)} stages run in {took:.0f} s with -j {jobs}{retried}; logs in {LOG_DIR}/"]
    for stage, (log, last) in out.failed.items():
        lines.append(f"grid: FAILED {stage} (log {log}); its last lines:")
        lines += [f"    {line}" for line in last]
    if out.skipped:
        lines.append(f"grid: not run, downstream of a failed stage: {' '.join(out.skipped)}")
    return lines


def repro(argv: list[str] | None, timed: bool = False) -> tuple[int, dict | None]:
    """One run of the launcher: its exit status and (--times or `timed`) its times record. A stop
    signal ends this process by that signal once what it started has ended."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", default="auto", help="stages at once: a number or auto (default)")
    parser.add_argument("--times", type=Path, help="write each stage's start/end and per-family seconds here")
    parser.add_argument("--cold", action="store_true", help="no warm server: each stage imports what it uses")
    parser.add_argument("--warm", action="store_true", help="warm starts (the default; kept for scripts that ask)")
    parser.add_argument("targets", nargs="*", help="stages to bring up to date (default: all)")
    args, extra = parser.parse_known_args(argv)
    if args.jobs == "auto":
        jobs, why = auto_jobs()
    elif args.jobs.isdigit() and int(args.jobs) > 0:
        jobs, why = int(args.jobs), "-j"
    else:
        raise SystemExit(f"grid: -j must be a number of stages (at least 1) or auto, got {args.jobs!r}")
    if not Path("dvc.yaml").is_file():
        raise SystemExit("grid: no dvc.yaml here; run it in the project's root")
    if extra and jobs > 1:
        raise SystemExit(f"grid: {extra[0]} is a `dvc repro` option: give it with -j 1 (a plain dvc repro)")
    if args.cold and args.warm:
        raise SystemExit("grid: --cold and --warm: give one of them")
    serial = [sys.executable, "-m", "dvc", "repro", *extra, *args.targets]
    cold = not warm_wanted(args.cold, args.warm, Path("dvc.yaml").read_text(encoding="utf-8"))
    timed = timed or args.times is not None
    direct = jobs == 1 and not timed  # a plain serial run, its output straight to this terminal
    held = lock.hold(LOG_DIR)
    try:
        lock.clear(LOG_DIR)
        lock.repair_dvc_rwlock()  # a launcher killed mid-write last time
        if not direct:
            print(f"grid: -j {jobs} ({why}){'' if cold else ', warm starts'}", flush=True)
        lifeline = Lifeline(keep_fds=(held,))  # the guard holds the workspace lock until it is done
        lifeline.workspace(os.getcwd())
        launcher = Launcher(jobs, LOG_DIR, cores(), THREADS_ENV, lifeline=lifeline, prior=read_prior(TIMES))
        signals.install(forward=launcher.signal_all)
        code, stopped = run_stages(launcher, serial if jobs == 1 else args.targets, direct, cold)
        write_times(TIMES, launcher.timed)
        if stopped:
            lock.repair_dvc_rwlock()  # the DVC processes just ended may have been writing it
    finally:
        os.close(held)
    if stopped:
        signals.end_by(stopped)
    if direct:
        if code < 0:  # DVC itself ended by a signal: so does this command
            signals.end_by(-code)
        return code, None
    end = time.monotonic()
    times = times_record(launcher, jobs, end, not cold) if timed else None
    if args.times:
        with atomic_path(args.times) as tmp:
            tmp.write_text(json.dumps(times, indent=2) + "\n")
    print("\n".join(summary(launcher, jobs, end - launcher.t0)), flush=True)
    return (1 if code else 0), times


def run_stages(launcher: Launcher, what: list[str], direct: bool, cold: bool) -> tuple[int, int | None]:
    """Run the study (`what`: the serial command with -j 1, else the targets), warm unless `cold`,
    everything started ended whatever happens; its exit status and the stop signal that came, if any."""
    code, stopped = 0, None
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(launcher.lifeline.close)
            if not cold:
                log = stack.enter_context(open(LOG_DIR / "warm.log", "w", encoding="utf-8"))
                stack.enter_context(warm_starts(log, launcher.lifeline))
            try:
                if direct:
                    code = run_direct(launcher, what)
                elif launcher.jobs == 1:  # --times asked for: the serial run, timed
                    code = 0 if launcher.run_one(Task(["dvc repro"]), what, echo=True) else 1
                else:
                    code = 0 if run_grid(launcher, what) else 1
            except signals.Stopped as exc:
                stopped = exc.signum
                running = len(launcher.running)
                launcher.stop(stopped)
                with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) takes no more lines
                    print(f"grid: {exc}; {running} DVC process(es) that were running ended, "
                          f"rerun to go on (DVC reruns what was not recorded)", file=sys.stderr, flush=True)
            finally:
                launcher.stop()
    except signals.Stopped as exc:  # during the clean-up above or the warm server's start
        stopped = stopped or exc.signum
    return code, stopped


@contextlib.contextmanager
def store_made(lifeline: Lifeline):
    """The MLflow store the report stage would make at the study's end (its table migrations, 1-2 s)
    made beside the runs instead, at the lowest priority (pipeline.tracking.make_store; it exits at
    once where there is nothing to make). Not beside the shared stages: on 2 cores it slowed them
    by 1-2 s (benchmarks/study_start.py). Built aside and linked whole, so ending it is safe."""
    with signals.held():
        proc = subprocess.Popen([sys.executable, "-m", "pipeline.tracking", "--make-store"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        lifeline.group(proc.pid)
    try:
        yield
    finally:
        if proc.poll() is None:  # a study stopped early: it removes its part-made file as it ends
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        proc.wait()
        lifeline.ended(proc.pid)


def run_direct(launcher: Launcher, command: list[str]) -> int:
    """A plain serial `dvc repro`, its output straight to this terminal; its exit status
    (negative: the signal that ended it)."""
    p = launcher.start(Task(["dvc repro"]), command, None, direct=True)
    code = p.proc.wait()
    launcher.running.remove(p)
    launcher._ended(p)
    return code


def run_grid(launcher: Launcher, targets: list[str]) -> bool:
    pipeline, selected = read_pipeline(targets)
    shared = shared_stages(pipeline, selected)
    stale = stale_stages(pipeline, selected, shared)
    if stale & shared:
        order = [n for n in pipeline.order if n in shared]
        print(f"grid: the shared stages first, in one `dvc repro`: {' '.join(order)}", flush=True)
        if not launcher.run_one(Task(order), [*DVC, "repro", *order]):
            return False
    # Everything downstream of a stale stage is started without asking `dvc status` again after the
    # shared stages (3-5 s before the first training step): its `dvc repro --single-item` skips
    # a stage the shared stages left up to date ("didn't change"), as DVC decides every stage anyway.
    needed = (stale | pipeline.descendants(stale)) & selected - shared
    if not needed:
        print("grid: every stage is up to date", flush=True)
        return True
    tasks = plan_tasks(pipeline, needed)
    what = "stages to run" if not stale & shared else "stages to run or skip (DVC decides)"
    print(f"grid: {len(needed)} {what} in {len(tasks)} processes, at most {launcher.jobs} at once", flush=True)
    with store_made(launcher.lifeline):
        return launcher.run(tasks, lambda task: [*DVC, "repro", "--single-item", *task.stages])


