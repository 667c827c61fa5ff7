"""Where a stage's fixed cost goes, per stage family: interpreter, imports, data loading, DVC.

Run: python -m benchmarks.stage_overhead [--repeats 3] [--params FILE] [--against CHECKOUT] [--keep DIR]
Prints one JSON object to stdout (the stages' own output goes to stderr).

A scratch project (the tests' tiny params with one knock-out seed, or --params) runs `dvc repro`
once; then each family's first stage is taken apart, each figure (wall_s and cpu_s) the median of
--repeats children: `python -c pass` (what ratios divide by), the module's import, the stage's
command as dvc.lock has it (`run`, outputs sent to scratch), seconds per package it imported, its
data reads, the training loop (train only; `fixed` = run - loop) and `dvc` = `dvc repro
--single-item --force` less run. --against CHECKOUT measures that checkout's code figure by figure
in turn with this one, so load falls on both alike. What it found:
docs/scaling-out-and-cost-plan.md#know-the-cost-first.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.stage_times import stage_times

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("check_params", "download", "filter", "train_bpe", "encode", "train", "evaluate", "knockout", "report")
# The packages a stage may pay for without using: reported whenever a run imports them.
PACKAGES = ("torch", "torch._dynamo", "mlflow", "pandas", "matplotlib", "scipy", "sklearn", "sacrebleu",
            "rouge_score", "nltk", "pyarrow", "pyarrow.dataset", "sentencepiece", "numpy", "pydantic", "yaml", "tqdm")
OUT_OPTIONS = ("--out", "--metrics", "--checkpoints", "--out-dir")  # where a stage writes: sent to scratch
# What each stage reads before its work (pipeline.training.batching), timed after its imports.
DATA_READS = {
    "train": "load_split(s, m, 'train'); load_split(s, m, 'validation')",
    "evaluate": ("load_split(s, m, 'validation'); load_split(s, m, 'test'); load_split(s, m, 'train', limit=1); "
                 "load_texts(s, m, 'test'); load_tokenizer(t)"),
    "knockout": ("load_split(s, m, 'validation'); load_split(s, m, 'train', limit=64); load_split(s, m, 'test', limit=64); "
                 "load_texts(s, m, 'test', limit=64); load_tokenizer(t)"),
}
DATA_SNIPPET = """
import time
import {module}
from pathlib import Path
from pipeline.train_bpe import load_tokenizer
from pipeline.training.batching import load_split, load_texts, read_manifest
start = time.perf_counter()
s, t = Path("data/shards"), Path("data/tokenizer")
m = read_manifest(s)
{reads}
print(time.perf_counter() - start)
"""


def child_cpu() -> float:
    usage = os.times()
    return usage.children_user + usage.children_system


def timed(args: list[str], cwd: Path, env: dict, stdout=subprocess.DEVNULL) -> dict:
    """Wall and CPU seconds of one child process (which must succeed), and its stdout/stderr."""
    cpu, start = child_cpu(), time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"stage_overhead: {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return {"wall_s": wall, "cpu_s": child_cpu() - cpu, "stdout": proc.stdout or "", "stderr": proc.stderr}


def median(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in ("wall_s", "cpu_s")}


def repeat(args: list[str], cwd: Path, env: dict, n: int) -> dict:
    return median([timed(args, cwd, env) for _ in range(n)])


def load() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError):
        return None


def package_of(module: str) -> str | None:
    """The most specific of PACKAGES that `module` belongs to (torch._dynamo.x -> torch._dynamo)."""
    found = [p for p in PACKAGES if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


def import_times(stderr: str) -> dict:
    """{package: seconds} of each of PACKAGES the process imported, and "all", from `python -X
    importtime` output (indented by depth; a module's line comes after its own imports' lines). A
    package's figure is the cumulative time of its lines that no line of the same package encloses:
    nltk is counted inside rouge_score too, and torch._dynamo is not inside torch."""
    pending: dict[int, list] = {}
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)", line)
        if m:
            depth = (len(m[3]) - 1) // 2
            pending.setdefault(depth, []).append((m[4], int(m[2]), pending.pop(depth + 1, [])))
    out: dict[str, float] = {}

    def walk(nodes: list, inside: frozenset) -> None:
        for name, cumulative, children in nodes:
            package = package_of(name)
            if package is not None and package not in inside:
                out[package] = out.get(package, 0.0) + cumulative / 1e6
            walk(children, inside | {package} if package else inside)

    roots = pending.get(0, [])
    walk(roots, frozenset())
    return {**{k: round(v, 3) for k, v in out.items()}, "all": round(sum(c for _, c, _ in roots) / 1e6, 3)}


def scratch_command(cmd: str, scratch: Path) -> list[str]:
    """The stage's command with every output path moved under `scratch` (the project's stay as DVC left them)."""
    words = shlex.split(cmd)
    for i, word in enumerate(words[:-1]):
        if word in OUT_OPTIONS:
            words[i + 1] = str(scratch / f"{word.strip('-')}-{Path(words[i + 1]).name}")
    return words


def make_project(path: Path, params: dict | None, code: Path) -> dict:
    """A scratch git + DVC project with `code`'s model/, pipeline/ and dvc.yaml; its environment."""
    from tests.tiny_project import make_project as tiny_project
    from tests.tiny_project import tiny_params

    env = tiny_project(path, params or tiny_params(knockout={"seeds": [0]}))
    env["ABLATION_LAB_WARM"] = "0"  # a cold stage's costs: no warm server (pipeline/warm/auto.py)
    if code != ROOT:
        for name in ("model", "pipeline"):
            shutil.rmtree(path / name)
            shutil.copytree(code / name, path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(code / "dvc.yaml", path / "dvc.yaml")
    sh = {"cwd": path, "env": env, "check": True, "capture_output": True}
    subprocess.run(["git", "add", "-A"], **sh)
    subprocess.run(["git", "commit", "-qm", "benchmark project"], **sh)
    return env


def repro(project: Path, env: dict) -> dict:
    """`dvc repro` of the project, timed per stage (benchmarks.stage_times)."""
    lines, start = [], time.perf_counter()
    with subprocess.Popen(["dvc", "repro"], cwd=project, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            lines.append((time.perf_counter(), line.rstrip("\n")))
            print(line, end="", file=sys.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"stage_overhead: `dvc repro` of {project} failed")
    return stage_times(lines, start, time.perf_counter())


def family_figures(family: str, stage: str, cmd: str, project: Path, env: dict, n: int, python: dict) -> dict:
    words = cmd.split()
    module = ".".join(words[words.index("-m") + 1:][:2])  # `python -m pipeline train ...`: pipeline.train
    out: dict = {"stage": stage}
    out["import"] = repeat([sys.executable, "-c", f"import {module}"], project, env, n)
    runs, loops = [], []
    for i in range(n):
        scratch = Path(tempfile.mkdtemp(prefix=f"{family}-", dir=project.parent))
        runs.append(timed(scratch_command(cmd, scratch), project, env))
        train_json = next(scratch.glob("out-*/train.json"), None)
        if train_json is not None:
            loops.append(json.loads(train_json.read_text())["wall_time_s"])
        shutil.rmtree(scratch)
    out["run"] = median(runs)
    scratch = Path(tempfile.mkdtemp(prefix=f"{family}-", dir=project.parent))
    traced = timed([sys.executable, "-X", "importtime", *scratch_command(cmd, scratch)[1:]], project, env)
    shutil.rmtree(scratch)
    out["imports_s"] = import_times(traced["stderr"])
    if family in DATA_READS:
        snippet = DATA_SNIPPET.format(module=module, reads=DATA_READS[family].replace("; ", "\n"))
        out["data_s"] = round(statistics.median(
            float(timed([sys.executable, "-c", snippet], project, env, subprocess.PIPE)["stdout"]) for _ in range(n)), 3)
    if loops:
        out["loop_s"] = round(statistics.median(loops), 3)
    out["fixed_s"] = round(out["run"]["wall_s"] - out.get("loop_s", 0.0), 3)
    forced = repeat(["dvc", "repro", "--single-item", "--force", stage], project, env, n)
    out["dvc_s"] = {k: round(forced[k] - out["run"][k], 3) for k in forced}
    for key in ("import", "run"):
        out[key]["ratio"] = round(out[key]["wall_s"] / python["wall_s"], 1)
    out["fixed_ratio"] = round(out["fixed_s"] / python["wall_s"], 1)
    return out


def measure(projects: dict[str, tuple[Path, dict]], n: int) -> dict:
    """Every figure for each project, the projects taking turns figure by figure."""
    out = {name: {"repro": repro(project, env)} for name, (project, env) in projects.items()}
    for name, (project, env) in projects.items():
        out[name]["python"] = repeat([sys.executable, "-c", "pass"], project, env, n)
        # Before any stage is forced to rerun below, while every stage is up to date.
        out[name]["dvc"] = {"status": repeat(["dvc", "status"], project, env, n),
                            "repro_single_item_up_to_date": repeat(["dvc", "repro", "--single-item", "report"],
                                                                   project, env, n)}
        for figures in out[name]["dvc"].values():
            figures["ratio"] = round(figures["wall_s"] / out[name]["python"]["wall_s"], 1)
        out[name]["families"] = {}
    for family in FAMILIES:
        for name, (project, env) in projects.items():
            lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
            stage = next((s for s in lock if s.split("@")[0] == family), None)
            if stage is not None:
                print(f"stage_overhead: {name} {stage}", file=sys.stderr)
                figures = family_figures(family, stage, lock[stage]["cmd"], project, env, n, out[name]["python"])
                figures["in_dvc_repro_s"] = out[name]["repro"]["stages"].get(stage)
                out[name]["families"][family] = figures
    for name, (project, env) in projects.items():
        out[name]["python_end"] = repeat([sys.executable, "-c", "pass"], project, env, n)
        out[name]["repro"] = {"total_s": out[name]["repro"]["total_s"], "families_s": out[name]["repro"]["families"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--params", type=Path, help="params.yaml for the scratch project (default: the tests' tiny "
                        "params with knockout.seeds [0])")
    parser.add_argument("--against", type=Path, help="another checkout (e.g. `git worktree add /tmp/before HEAD~1`): "
                        "its code measured the same way, turn about with this one's, and the ratios of the two")
    parser.add_argument("--keep", type=Path, help="build the scratch projects here and keep them")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="stage-overhead-"))
    params = yaml.safe_load(args.params.read_text()) if args.params else None
    load_start = load()
    try:
        codes = {"this": ROOT, **({"against": args.against.resolve()} if args.against else {})}
        projects = {}
        for name, code in codes.items():
            projects[name] = (root / name, make_project(root / name, params, code))
        results = measure(projects, args.repeats)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    out = {"machine": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
           "load": {"start": load_start, "end": load()}, "repeats": args.repeats,
           "params": str(args.params) if args.params else "tests.tiny_project (knockout.seeds [0])",
           **results["this"]}
    if args.against:
        out["against"] = {"code": str(args.against), **results["against"]}
        out["ratio_to_against"] = {f: {k: round(v[k]["wall_s"] / results["against"]["families"][f][k]["wall_s"], 2)
                                       for k in ("import", "run")}
                                   for f, v in results["this"]["families"].items() if f in results["against"]["families"]}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
