"""The grid's training tasks, one per train stage, for job arrays (scripts/slurm_grid.sh).

    python -m scripts.grid_stages            # every task, one a line: "train@baseline-0 evaluate@baseline-0"
    python -m scripts.grid_stages --count    # how many (the array is 0..count-1)
    python -m scripts.grid_stages --index 3  # task 3's stages, for `dvc repro`
    python -m scripts.grid_stages --part 2/10  # machine 2 of 10: tasks 1, 11, 21, ... on one line

A task is one train stage (sweeps included) with the evaluate stage of the same run, which needs
its model and the same accelerator. The stages come from `dvc stage list`, so the mapping is DVC's
own matrix expansion, and every array task gets the same list from the same commit.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

TRAIN_STAGES = ("train", "train_lr", "train_scale")  # each has an evaluate* twin with the same items


def grid_tasks(stage_names: list[str]) -> list[list[str]]:
    """[[train stage, its evaluate stage], ...] from DVC's stage names, in their order."""
    names = set(stage_names)
    tasks = []
    for name in stage_names:
        family, at, item = name.partition("@")
        if at and family in TRAIN_STAGES:
            evaluate = "evaluate" + family.removeprefix("train") + "@" + item
            tasks.append([name, evaluate] if evaluate in names else [name])
    return tasks


def part(text: str) -> tuple[int, int]:
    """"K/N" -> (K, N), machine K of N (1-based, as people count machines)."""
    k, slash, n = text.partition("/")
    if not (slash and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise SystemExit(f"grid_stages: --part must be K/N with 1 <= K <= N (machine K of N), got {text!r}")
    return int(k), int(n)


def dvc_stage_names() -> list[str]:
    # This interpreter's DVC, whatever PATH the job started with.
    out = subprocess.run([sys.executable, "-m", "dvc", "stage", "list", "--name-only"], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise SystemExit(f"grid_stages: `dvc stage list` failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return out.stdout.split()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--count", action="store_true", help="print the number of tasks")
    what.add_argument("--index", type=int, help="print task INDEX's stages (0-based: SLURM_ARRAY_TASK_ID)")
    what.add_argument("--part", help="K/N: print the stages of every N-th task from task K-1, machine K of N")
    args = parser.parse_args(argv)
    tasks = grid_tasks(dvc_stage_names())
    if not tasks:
        raise SystemExit("grid_stages: dvc.yaml has no train stages (are `ablations` and `seeds` empty?)")
    if args.count:
        print(len(tasks))
    elif args.index is not None:
        if not 0 <= args.index < len(tasks):
            raise SystemExit(f"grid_stages: task {args.index} is out of range: the grid has {len(tasks)} tasks "
                             f"(0..{len(tasks) - 1})")
        print(" ".join(tasks[args.index]))
    elif args.part is not None:
        k, n = part(args.part)
        print(" ".join(stage for task in tasks[k - 1::n] for stage in task))
    else:
        sys.stdout.write("".join(" ".join(t) + "\n" for t in tasks))


if __name__ == "__main__":
    main()
