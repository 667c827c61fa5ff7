#!/usr/bin/env bash
# bash run.sh study PRESET: rerun a committed study report (reports/studies/PRESET/) from scratch.
# The preset runs in a scratch copy of the project (git + dvc initialised there), so the
# workspace's params.yaml, data/ and dvc.lock are left as they are. Afterwards the report, the
# params that made it and run.json (wall time, machine) replace reports/studies/PRESET/, and the
# study table in docs/datasets-and-presets.md is regenerated from the committed files. STUDY_OUT=DIR puts
# the result in DIR instead and leaves reports/studies/ and the docs alone (`bash run.sh gpu` does this).
# STUDY_PRESET_FILE=FILE runs FILE as presets/PRESET.yaml of the scratch copy (a generated preset:
# benchmarks/gpu_spread.py's spread study).
set -euo pipefail
name=${1:?usage: bash run.sh study PRESET}
started=$(date +%s.%N)  # the scratch project's set-up: from here to the launcher's start
root=$PWD
preset=${STUDY_PRESET_FILE:-presets/$name.yaml}
[ -f "$preset" ] || { echo "study: no preset '$preset'" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/study-$name.XXXXXX")
mkdir -p "$scratch/data"
cp -r model pipeline benchmarks dvc.yaml presets "$scratch/"
[ -z "${STUDY_PRESET_FILE:-}" ] || cp "$STUDY_PRESET_FILE" "$scratch/presets/$name.yaml"
cp -r data/local "$scratch/data/"
cd "$scratch"
find . -name __pycache__ -prune -exec rm -rf {} +
git init -q && dvc init -q && dvc config core.analytics false
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$scratch/mlflow.db}
python -m pipeline.preset "$name"
# The grid launcher: every core (or GPU slot) busy; STUDY_JOBS=1 is the serial `dvc repro`, timed.
# STUDY_GRID_ARGS passes --warm or --cold on. $scratch/clock holds the set-up's start and the
# launcher's start (seconds since the epoch): benchmarks/gpu.py times launch to report.md from it.
echo "$started $(date +%s.%N)" > "$scratch/clock"
# A preset with decide.looks runs seeds until decided (`bash run.sh decide`: rounds of the grid, each
# adding the seeds open comparisons need to params.yaml); its times are the rounds' summed.
launcher=pipeline.grid
python -c "import sys; from pipeline.params import load_params; sys.exit(not load_params('params.yaml').decide.looks)" \
  && launcher=pipeline.grid.decide
# shellcheck disable=SC2086  # STUDY_GRID_ARGS: words
python -m $launcher -j "${STUDY_JOBS:-auto}" ${STUDY_GRID_ARGS:-} --times "$scratch/stage_times.json" 2>&1 | tee "$scratch/repro.log"
out=${STUDY_OUT:-$root/reports/studies/$name}
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cp -r reports/report.md reports/report.html reports/metrics.json reports/details.json reports/fingerprint.json reports/decisions.json reports/figures reports/curves params.yaml "$out.tmp/"
python - "$out.tmp/run.json" "$scratch/stage_times.json" <<'PY'
import json, os, platform, sys, torch
from pipeline.training.device import _cpu_model
path, times = sys.argv[1], json.load(open(sys.argv[2]))
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
# stage_s: seconds per stage family, summed over its stages; with jobs > 1 they overlap (busy time).
run = {"wall_s": round(times["total_s"]), "command": times["command"], "jobs": times["jobs"], "warm": times["warm"],
       "cpu_count": os.cpu_count(), "device": device, "cpu": _cpu_model(), "torch": torch.__version__,
       "stage_s": times["families"]}
if "rounds" in times:  # seeds until decided: each round's wall (its grid run) and stages
    run["rounds"] = times["rounds"]
open(path, "w").write(json.dumps(run, indent=2) + "\n")
PY
rm -rf "$out" && mv "$out.tmp" "$out"
cd "$root"
[ -n "${STUDY_OUT:-}" ] || python -m scripts.report_studies
echo "study: $name took $(python -c "import json,sys; print(json.load(open(sys.argv[1]))['wall_s'])" "$out/run.json") s; report in $out (scratch project: $scratch)"
