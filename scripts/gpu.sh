#!/usr/bin/env bash
# bash run.sh gpu [OUT.json]: the whole GPU path in one run (benchmarks/gpu.py says what it runs).
# Without a CUDA device: one line, exit 0, nothing installed or run.
# Set-up, two ways:
#  - a machine with a package index: run.sh's own .venv (pip's torch==2.13.0 is the CUDA build there);
#  - an offline machine whose python3 already has a CUDA torch (the lent device): .venv-gpu sees
#    that torch and installs what it lacks from wheels carried in .whl/, which
#    `python scripts/gpu_carry.py` fetches here beforehand, with the corpus in .gpu-cache/.
set -euo pipefail
out=${1:-$PWD/gpu.json}
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu: no CUDA device on this machine (nvidia-smi finds none); nothing run"
  exit 0
fi
if [ -d .whl ] && python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  [ -x .venv-gpu/bin/python ] || python3 -m venv --system-site-packages .venv-gpu
  # --no-deps: the carried set is exactly what the image lacks (gpu_carry.py resolved it)
  .venv-gpu/bin/python -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile .whl/*.whl
  export PATH="$PWD/.venv-gpu/bin:$PATH"
else
  bash run.sh setup
  export PATH="$PWD/.venv/bin:$PATH"
fi
[ -d .gpu-cache ] && export ABLATION_LAB_CACHE="$PWD/.gpu-cache"
export PYTHONUNBUFFERED=1
python -m benchmarks.gpu --out "$out"
