"""The whole GPU path in one run, one JSON (`bash run.sh gpu`), that reports even when cut short.

Parts run in the order --parts names them, each a child process whose output streams to PART.log
beside the JSON: spread, recipe, study (cold), study_warm, bench (benchmarks/gpu_bench.py), tests
(the `gpu` marker), seed; the default is study, study_warm, bench, tests. What each measures:
docs/gpu.md#running-it. A study's clock runs from the grid launcher's start to report.md written;
the scratch project's set-up before it is its own figure (PART_setup_s). A part past its limit
(--limits) or the deadline (--deadline) is killed with its whole process tree. The JSON is
rewritten atomically before and after each part, so a run stopped at any point leaves what it
measured; the study outputs go to studies.tar.gz beside it.

Run: python -m benchmarks.gpu [--out gpu.json] [--parts tests,bench] [--limits tests=60,bench=110]
Without CUDA it prints one line and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import gpu_spread
from pipeline.io.atomic import atomic_path

ROOT = Path(__file__).resolve().parents[1]
# The parts that run a whole study: (preset, the grid launcher's options, the output folder's name).
# study and study_warm: the same study cold and warm in one call: each GPU checks the warm default.
STUDY_PARTS = {"spread": (gpu_spread.NAME, "", gpu_spread.NAME),  # a generated preset (STUDY_PRESET_FILE)
               "recipe": ("nanogpt_shakespeare_char_gpu", "", "nanogpt_shakespeare_char_gpu"),
               "study": ("nanogpt_shakespeare_char", "--cold", "nanogpt_shakespeare_char"),
               "study_warm": ("nanogpt_shakespeare_char", "--warm", "nanogpt_shakespeare_char_warm"),
               "seed": ("tiny_shakespeare", "", "tiny_shakespeare")}
# Seconds per part, in the default order, and for all parts: with set-up and start-up `bash run.sh
# gpu` stays under 9 minutes, inside a 15-minute device window; the tests go last, so a cut log
# still says which passed. Measured (runs 8, 12-14): spread ~492 s (a call of its own), study ~78 s
# cold and ~69 s warm, bench ~122 s (before its fourth runner at the large batch, ours_fused_ce),
# tests 72-97 s, seed ~105 s.
LIMITS = {"spread": 500, "recipe": 200, "study": 110, "study_warm": 100, "bench": 160, "tests": 130, "seed": 150}
DEFAULT_PARTS = ("study", "study_warm", "bench", "tests")
DEADLINE_S = 500
# nanoGPT README, train_shakespeare_char on one A100: the best in-loop estimate of one run, compared
# with ours measured the same way.
NANOGPT_VAL_LOSS = 1.4697
TARGETS = {  # figure: (comparison, threshold)
    "setup_s": ("<=", 30),
    "tests_not_passed": ("<=", 0),
    "mfu_compiled": (">=", 0.50),
    "ours_over_nanogpt_style_step": ("<=", 1.0),
    "ours_over_reference_step": ("<=", 0.9),
    "compiled_over_eager_step": ("<=", 0.8),
    "study_launch_to_report_s": ("<=", 60),
    "study_warm_launch_to_report_s": ("<=", 60),
    "recipe_best_estimate": ("<=", NANOGPT_VAL_LOSS),
    "recipe_wall_s": ("<=", 180),
}
# Figures copied to the JSON's "figures" beside those with a target: each study's own clocks.
STUDY_CLOCKS = ("launch_to_report_s", "setup_s", "wall_s")
REPORTED = set(TARGETS) | {f"{part}_{clock}" for part in STUDY_PARTS for clock in STUDY_CLOCKS} | {
    f"spread_{arm}_{q}_mean" for arm in gpu_spread.ARMS for q in ("best_estimate", "whole_split_val_loss")}
TAIL_LINES = 25


@dataclass
class Part:
    """A child process and how to read its figures afterwards, also when it was cut short."""
    name: str
    argv: list[str]
    figures: Callable[[str], dict] = lambda log: {}
    env: dict = field(default_factory=dict)


def parse_limits(text: str) -> dict[str, float]:
    limits = dict(LIMITS)
    for item in filter(None, text.split(",")):
        name, _, seconds = item.partition("=")
        try:
            limits[name.strip()] = float(seconds)
        except ValueError:
            raise SystemExit(f"gpu: --limits: '{item}' is not NAME=SECONDS") from None
    return limits


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), so children that left the process group die too."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM the child's process group and every descendant, then SIGKILL what is left."""
    pids = [proc.pid, *descendants(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with_group = [(os.killpg, proc.pid)] + [(os.kill, p) for p in pids]
        for kill, target in with_group:
            try:
                kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=grace_s)
            if sig == signal.SIGTERM and not any(Path(f"/proc/{p}").exists() for p in pids[1:]):
                return
        except subprocess.TimeoutExpired:
            pass
    proc.wait()


def tail(path: Path, n: int = TAIL_LINES) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def run_part(part: Part, limit: float, log_path: Path) -> dict:
    """Run one part with its output streaming to `log_path`; kill it (and its tree) at `limit`."""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(part.argv, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **part.env},
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # its own process group, killed as one
        try:
            proc.wait(timeout=limit)
            cut = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            cut = True
    out = {"exit_code": proc.returncode, "wall_s": round(time.monotonic() - start, 1), "limit_s": limit,
           "cut": cut, "log": log_path.name}
    if cut or proc.returncode:
        out["log_tail"] = tail(log_path)
    return out


def run_parts(parts: list[Part], limits: dict[str, float], deadline_s: float, out: Path, base: dict,
              after: Callable[[str], None] = lambda name: None) -> dict:
    """Run `parts` in order into `out` (the JSON) and logs beside it; return the final result."""
    logs = out.parent
    logs.mkdir(parents=True, exist_ok=True)
    result = {**base, "limits_s": {p.name: limits.get(p.name) for p in parts}, "deadline_s": deadline_s,
              "parts": {}, "running": None}
    figures = dict(base.get("figures", {}))
    t0 = time.monotonic()

    def write() -> None:
        result["figures"] = figures
        result["targets"] = verdicts(figures)
        compared = warm_vs_cold(figures)
        if compared:
            result["warm_vs_cold"] = compared
        with atomic_path(out) as tmp:
            tmp.write_text(json.dumps(result, indent=2) + "\n")

    for part in parts:
        elapsed = time.monotonic() - t0
        limit = min(limits.get(part.name, deadline_s), deadline_s - elapsed)
        if deadline_s - elapsed < 5:  # too little left to start anything
            result["parts"][part.name] = {"skipped": f"the deadline of {deadline_s:.0f} s was reached"}
            write()
            continue
        result["running"] = {"part": part.name, "started_at_s": round(elapsed, 1), "limit_s": round(limit, 1)}
        write()
        record = run_part(part, round(limit, 1), logs / f"{part.name}.log")
        if record["cut"]:
            record["cut_at_s"] = round(time.monotonic() - t0, 1)  # since the first part started
        try:
            found = part.figures(Path(logs / f"{part.name}.log").read_text(errors="replace"))
        except Exception as exc:  # noqa: BLE001 - a part's figures missing is recorded, the others go on
            found = {"figures_error": f"{type(exc).__name__}: {exc}"}
        record.update(found)
        figures.update({k: v for k, v in found.items() if k in REPORTED})
        result["parts"][part.name] = record
        result["running"] = None
        after(part.name)
        write()
    result["total_s"] = round(time.monotonic() - t0, 1)
    write()
    return result


def verdicts(figures: dict) -> dict:
    out = {}
    for key, (op, threshold) in TARGETS.items():
        value = figures.get(key)
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        out[key] = {"value": value, "target": f"{op} {threshold}", "met": met}
    return out


def warm_vs_cold(figures: dict) -> dict:
    """The study cold and warm from the same call, on both clocks, where both were measured."""
    out = {}
    for clock in ("launch_to_report_s", "wall_s"):
        cold, warm = figures.get(f"study_{clock}"), figures.get(f"study_warm_{clock}")
        if cold is not None and warm is not None:
            out[clock] = {"cold": cold, "warm": warm, "warm_minus_cold": round(warm - cold, 1)}
    return out


def gpu_test_counts(log: str) -> dict:
    """Counts from pytest -v's own lines, so a run cut mid-way still says what passed. Only the
    tests pytest selected count: `-m gpu` deselects the files' other tests, which never ran."""
    status = dict(re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", log, re.M))
    started = re.findall(r"^(tests/\S+::\S+) ", log, re.M)
    passed = [t for t, s in status.items() if s == "PASSED"]
    n = deselected = None
    collected = re.search(r"\bcollected (\d+) items?([^\n]*)", log)
    if collected:
        rest = collected.group(2)  # e.g. " / 1 error / 10 deselected / 6 selected"
        found = {word: int(count) for count, word in re.findall(r"\b(\d+) (deselected|selected)\b", rest)}
        deselected = found.get("deselected", 0)
        n = found.get("selected", int(collected.group(1)) - deselected)
    return {"collected": n, "deselected": deselected, "passed": len(passed),
            "failed": [t for t, s in status.items() if s in ("FAILED", "ERROR")],
            "skipped_tests": [t for t, s in status.items() if s == "SKIPPED"],
            "unfinished": [t for t in dict.fromkeys(started) if t not in status],
            "tests_not_passed": None if n is None else max(0, n - len(passed))}


def bench_figures(result: Path) -> Callable[[str], dict]:
    def read(log: str) -> dict:
        return json.loads(result.read_text()) if result.exists() else {}
    return read


def study_clock(tmp: Path) -> dict:
    """The study's clocks from its scratch project under `tmp`, also when the part was cut before
    run.json: scripts/study.sh's `clock` file holds the set-up's and the launcher's start, and
    report.md's mtime ends the study's time."""
    clocks = sorted(tmp.glob("study-*/clock"))
    if not clocks:
        return {}
    started, launched = map(float, clocks[-1].read_text().split())
    found = {"setup_s": round(launched - started, 1)}
    report = clocks[-1].parent / "reports" / "report.md"
    if report.exists():
        found["launch_to_report_s"] = round(report.stat().st_mtime - launched, 1)
    return found


def study_figures(out: Path, prefix: str, tmp: Path | None = None) -> Callable[[str], dict]:
    """The study's clocks (study_clock; run.json's wall_s) and the baseline's validation loss."""
    def read(log: str) -> dict:
        found = {"stages_started": len(re.findall(r"Running stage '", log))}
        if tmp is not None:
            found.update({f"{prefix}_{k}": v for k, v in study_clock(tmp).items()})
        if (out / "run.json").exists():
            run = json.loads((out / "run.json").read_text())
            found.update({f"{prefix}_wall_s": run["wall_s"], "stage_s": run["stage_s"], "warm": run.get("warm")})
        if (out / "details.json").exists():  # the report's whole summary (metrics.json holds the verdict's keys)
            details = json.loads((out / "details.json").read_text())
            found["val_loss"] = {name: v["val_loss"]["mean"] for name, v in details["variants"].items()}
            found[f"{prefix}_val_loss"] = found["val_loss"].get("baseline")  # whole split, the kept model
            ours = (details.get("reference") or {}).get("ours") or {}
            if (details.get("reference") or {}).get("quantity") == "best_estimate":
                found[f"{prefix}_best_estimate"] = ours.get("mean")  # nanoGPT's quantity
                last = details["reference"].get("ours_whole_split_last_step") or {}
                found[f"{prefix}_val_loss_last_step"] = last.get("mean")  # whole split, the last step's model
        return found
    return read


def gpu_parts(scratch: Path, args) -> list[Part]:
    py = sys.executable
    bench_json = scratch / "bench.json"
    parts = {
        "tests": Part("tests", [py, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "--durations=0",
                                "tests/test_gpu.py", "tests/test_warm.py"], gpu_test_counts),
        "bench": Part("bench", [py, "-m", "benchmarks.gpu_bench", "--result", str(bench_json),
                                "--batch", str(args.batch), "--large-batch", str(args.large_batch),
                                "--steps", str(args.steps), "--repeats", str(args.repeats)], bench_figures(bench_json)),
    }
    for part, (preset, grid_args, name) in STUDY_PARTS.items():  # each a whole study (scripts/study.sh)
        out, tmp = scratch / "studies" / name, scratch / part  # its scratch project goes under tmp
        tmp.mkdir(parents=True, exist_ok=True)
        env = {"STUDY_OUT": str(out), "TMPDIR": str(tmp), "STUDY_GRID_ARGS": grid_args}
        figures = study_figures(out, part, tmp)
        if part == "spread":  # the two recipes' presets made into one study of two arms
            preset_file = scratch / f"{preset}.yaml"
            preset_file.write_text(gpu_spread.spread_preset(ROOT), encoding="utf-8")
            env["STUDY_PRESET_FILE"] = str(preset_file)
            figures = spread_part_figures(figures, tmp)
        parts[part] = Part(part, ["bash", "scripts/study.sh", preset], figures, env)
    return [parts[name] for name in LIMITS]


def named_parts(spec: str) -> list[str]:
    """--parts as a list in the order named, each once: a short device window runs first what it most
    needs measured."""
    wanted = list(dict.fromkeys(n.strip() for n in spec.split(",") if n.strip()))
    unknown = sorted(set(wanted) - set(LIMITS))
    if unknown:
        raise SystemExit(f"gpu: --parts: unknown part(s) {', '.join(unknown)} (known: {', '.join(LIMITS)})")
    return wanted


def spread_part_figures(study: Callable[[str], dict], tmp: Path) -> Callable[[str], dict]:
    """The study's clocks and the spread's statistics, read from its scratch project also when the
    part was cut."""
    def read(log: str) -> dict:
        projects = sorted((p for p in tmp.glob("study-*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        return {**study(log), **gpu_spread.spread_figures(projects[-1] if projects else None, NANOGPT_VAL_LOSS)}
    return read


def pack_studies(scratch: Path, dest: Path) -> None:
    """The study outputs so far (reports, metrics, run.json) as one file beside the JSON."""
    for log in scratch.glob("*/study-*/.dvc/tmp/grid/warm.log"):  # what the warm server served, or why not
        shutil.copy(log, dest.parent / f"{log.parents[4].name}_warm.log")  # PART_warm.log
    studies = scratch / "studies"
    if not studies.exists():
        return
    with atomic_path(dest) as tmp, tarfile.open(tmp, "w:gz") as tar:
        for path in sorted(studies.iterdir()):
            tar.add(path, arcname=path.name)


def summary(result: dict) -> str:
    lines = [f"gpu: {result['environment'].get('device')}, torch {result['environment'].get('torch')}; "
             f"set-up {result['figures'].get('setup_s')} s"]
    for name, part in result["parts"].items():
        if "skipped" in part:
            lines.append(f"  {name:7} skipped ({part['skipped']})")
            continue
        state = "CUT" if part["cut"] else ("ok" if part["exit_code"] == 0 else f"exit {part['exit_code']}")
        lines.append(f"  {name:7} {state:7} {part['wall_s']:6.1f} s of {part['limit_s']:.0f} s   log {part['log']}")
    for key, v in result["targets"].items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[v["met"]]
        lines.append(f"  {key:30} {str(v['value']):>10}  target {v['target']:>9}  {verdict}")
    for part in STUDY_PARTS:
        if f"{part}_setup_s" in result["figures"]:
            lines.append(f"  {part + '_setup_s':30} {result['figures'][part + '_setup_s']:>10}  (the scratch project, "
                         "outside the study's clock)")
    lines += gpu_spread.summary_lines(result["parts"].get("spread", {}))
    for clock, v in result.get("warm_vs_cold", {}).items():
        lines.append(f"  study {clock}: cold {v['cold']} s, warm {v['warm']} s (warm - cold {v['warm_minus_cold']} s)")
    return "\n".join(lines)


def environment() -> dict:
    import torch

    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "python_path": sys.executable, "cpu_count": os.cpu_count(), "machine": platform.machine()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "gpu.json", help="the JSON; logs go beside it")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma-separated, from {', '.join(LIMITS)}, run in the order named (default {','.join(DEFAULT_PARTS)})")
    p.add_argument("--limits", default="", help="NAME=SECONDS,... per part (default " +
                   ",".join(f"{k}={v}" for k, v in LIMITS.items()) + ")")
    p.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for all parts together")
    p.add_argument("--setup-s", type=float, default=None, help="set-up time, from scripts/gpu.sh")
    p.add_argument("--setup-exit", type=int, default=None, help="set-up exit status, from scripts/gpu.sh")
    p.add_argument("--batch", type=int, default=16, help="124M benchmark: sequences of 1024 tokens per step")
    p.add_argument("--steps", type=int, default=10, help="124M benchmark: optimizer steps per timing")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--large-batch", type=int, default=32, help="124M benchmark: compiled again at this batch (0: not)")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"gpu: no CUDA device visible to torch {torch.__version__}; nothing run")
        return
    limits = parse_limits(args.limits)
    wanted = named_parts(args.parts)
    out = args.out.resolve()
    base = {"environment": environment(),
            "setup": {"wall_s": args.setup_s, "exit_code": args.setup_exit, "log": "setup.log"},
            "figures": {"setup_s": args.setup_s} if args.setup_s is not None else {}}
    with tempfile.TemporaryDirectory(prefix="gpu-run-") as tmp:
        scratch = Path(tmp)
        by_name = {part.name: part for part in gpu_parts(scratch, args)}
        parts = [by_name[name] for name in wanted]

        def after(name: str) -> None:
            if name in STUDY_PARTS:
                pack_studies(scratch, out.parent / "studies.tar.gz")
        result = run_parts(parts, limits, args.deadline, out, base, after)
    print(summary(result))
    print(f"gpu: JSON {out}; logs beside it")


if __name__ == "__main__":
    main()
