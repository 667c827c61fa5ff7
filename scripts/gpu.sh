#!/usr/bin/env bash
# bash run.sh gpu [OUT.json]: the whole GPU path in one run (benchmarks/gpu.py says what it runs).
# Without a CUDA device: one line, exit 0, nothing installed or run.
# Each part's log (setup.log, study.log, study_warm.log, bench.log, tests.log; spread.log, recipe.log and
# seed.log when named) and studies.tar.gz go beside OUT.json, which is rewritten after every part, so a run
# cut short still reports. The set-up's time here is the machine's (setup_s); each study part times
# its own scratch set-up apart from its launch-to-report clock (benchmarks/gpu.py).
# Set-up, two ways:
#  - an offline machine whose python3 already imports a CUDA torch (the lent device, where python3
#    is itself a venv's interpreter): scripts/gpu_env.sh makes that python3 see the wheels carried
#    in .whl/ (`python scripts/gpu_carry.py` fetches them beforehand, with the corpus in .gpu-cache/);
#  - any other CUDA machine with a package index: run.sh's own .venv (pip's torch is a CUDA build).
set -uo pipefail
out=$(realpath -m "${1:-$PWD/gpu.json}")
logs=$(dirname "$out")
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu: no CUDA device on this machine (nvidia-smi finds none); nothing run"
  exit 0
fi
mkdir -p "$logs"
start=$(date +%s.%N)
rc=0
{
  if [ -d .whl ] && python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "set-up: $(command -v python3) imports a CUDA torch; adding the carried wheels of .whl/ to it"
    timeout 120 bash scripts/gpu_env.sh python3 .whl .gpu-env || rc=$?
    export PATH="$PWD/.gpu-env/bin:$PWD/.gpu-env/site/bin:$PATH"
    export PYTHONPATH="$PWD/.gpu-env/site${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "set-up: run.sh's .venv from the package index"
    bash run.sh setup || rc=$?
    export PATH="$PWD/.venv/bin:$PATH"
  fi
  python -c 'import torch, dvc, mlflow; print("set-up: python", __import__("sys").executable, "torch", torch.__version__)' || rc=$?
} > "$logs/setup.log" 2>&1
setup_s=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$start")
echo "gpu: set-up took $setup_s s (exit $rc; $logs/setup.log)"
[ -d .gpu-cache ] && export ABLATION_LAB_CACHE="$PWD/.gpu-cache"
export PYTHONUNBUFFERED=1
# `python` if set-up made one, else the image's own python3 records the failed set-up.
py=$(command -v python || command -v python3)
exec "$py" -m benchmarks.gpu --out "$out" --setup-s "$setup_s" --setup-exit "$rc" ${GPU_ARGS:-}
