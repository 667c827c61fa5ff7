"""`python -m pipeline <stage> [ARGS..]`: a stage as dvc.yaml runs it. Under `dvc repro` it is served
by a warm server where it can be (pipeline/warm/auto.py); else it runs here as `python -m
pipeline.<stage> ARGS` runs it, which is always a new process of its own (cold)."""
import runpy
import sys

from pipeline.warm import auto
from pipeline.warm.shim import STAGES


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in STAGES:
        raise SystemExit(f"usage: python -m pipeline STAGE [ARGS..], STAGE one of {', '.join(sorted(STAGES))}")
    auto.engage()  # exits as the stage did if a warm server ran it; else it runs here
    stage = sys.argv.pop(1)
    runpy.run_module(f"pipeline.{stage}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
