#!/usr/bin/env bash
# bash run.sh study PRESET: rerun a committed study report (reports/studies/PRESET/) from scratch.
# The preset runs in a scratch copy of the project (git + dvc initialised there), so the
# workspace's params.yaml, data/ and dvc.lock are left as they are. Afterwards the report, the
# params that made it and run.json (wall time, machine) replace reports/studies/PRESET/, and the
# README's study table is regenerated from the committed files.
set -euo pipefail
name=${1:?usage: bash run.sh study PRESET}
root=$PWD
[ -f "presets/$name.yaml" ] || { echo "study: no preset 'presets/$name.yaml'" >&2; exit 2; }
scratch=$(mktemp -d "${TMPDIR:-/tmp}/study-$name.XXXXXX")
mkdir -p "$scratch/data"
cp -r model pipeline dvc.yaml presets "$scratch/"
cp -r data/local "$scratch/data/"
cd "$scratch"
find . -name __pycache__ -prune -exec rm -rf {} +
git init -q && dvc init -q && dvc config core.analytics false
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$scratch/mlflow.db}
python -m pipeline.preset "$name"
start=$(date +%s)
dvc repro 2>&1 | tee "$scratch/repro.log"
wall=$(( $(date +%s) - start ))
out=$root/reports/studies/$name
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cp -r reports/report.md reports/report.html reports/metrics.json reports/figures reports/curves params.yaml "$out.tmp/"
python - "$out.tmp/run.json" "$wall" <<'PY'
import json, os, platform, sys, torch
path, wall = sys.argv[1], int(sys.argv[2])
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
run = {"wall_s": wall, "command": "dvc repro", "cpu_count": os.cpu_count(), "device": device,
       "torch": torch.__version__}
open(path, "w").write(json.dumps(run, indent=2) + "\n")
PY
rm -rf "$out" && mv "$out.tmp" "$out"
cd "$root"
python -m pipeline.report_studies
echo "study: $name took ${wall} s; report in reports/studies/$name/ (scratch project: $scratch)"
