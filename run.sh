#!/usr/bin/env bash
# One command for each job, on a fresh machine with Python 3.11, git and pip:
#   bash run.sh          set up .venv, then run the whole pipeline (offline): `python -m pipeline.grid`,
#                        the independent stages side by side through DVC (-j auto: the cores, or GPUs x
#                        runs per GPU); `bash run.sh repro -j 1` is a serial `dvc repro`; both serve
#                        each stage warm (pipeline/warm/; a plain `dvc repro` does too after its
#                        first stage, pipeline/warm/auto.py), `--cold` for new processes
#   bash run.sh test     set up .venv, then run the full CPU test suite (what CI runs)
#   bash run.sh test quick   the quick tier (pytest --quick -n auto): every stage function and the model,
#                        one pytest-xdist worker a core (each runs its tests in-process), under 2 minutes
#                        on 2 cores; no DVC repro, kill, browser or multi-process test
#   bash run.sh bench    set up .venv, then run the benchmarks (JSON on stdout)
#   bash run.sh decide   set up .venv, then run rounds until every ablation is decided (params decide;
#                        python -m pipeline.grid.decide): only open comparisons get more seeds
#   bash run.sh study P  set up .venv, then rerun preset P's committed study report from scratch
#   bash run.sh gpu      on a CUDA machine: GPU tests, 124M benchmark, a preset on the GPU; one JSON
#                        (scripts/gpu.sh; without CUDA it says so and exits 0 before any set-up)
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = gpu ]; then shift; exec bash scripts/gpu.sh "$@"; fi

python=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# Reinstall only when the pinned requirements change.
stamp=$(cat requirements.txt constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.installed 2>/dev/null)" != "$stamp" ]; then
  .venv/bin/python -m pip install --disable-pip-version-check -q -r requirements.txt -c constraints.txt
  echo "$stamp" > .venv/.installed
fi
export PATH="$PWD/.venv/bin:$PATH"

case "${1:-repro}" in
  setup) ;;
  repro) shift || true; python -m pipeline.grid "$@" ;;
  test) shift
    # A test file's tests stay together on one worker (--dist loadfile): its module fixtures build once.
    if [ "${1:-}" = quick ]; then shift; set -- --quick -n auto --dist loadfile "$@"; fi
    python -m pytest "$@" ;;
  bench) python -m benchmarks.model_speed && python -m benchmarks.train_loop ;;
  study) shift; bash scripts/study.sh "$@" ;;
  decide) shift; python -m pipeline.grid.decide "$@" ;;
  *) echo "usage: bash run.sh [repro|test|bench|study|decide|gpu|setup] [args...]" >&2; exit 2 ;;
esac
