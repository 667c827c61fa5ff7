#!/usr/bin/env bash
# bash scripts/gpu_env.sh PYTHON WHEELS DEST: make PYTHON (an interpreter that already imports a CUDA
# torch, e.g. a GPU image's python3) see the wheels in WHEELS, without a new virtual environment.
# Why not `PYTHON -m venv --system-site-packages`: when PYTHON is itself a venv's interpreter (the lent
# GPU image's is), the new venv builds on the *base* interpreter and sees none of PYTHON's packages,
# torch included. Instead the wheels are unpacked into DEST/site (pip --target: no interpreter of its
# own) and DEST/bin holds a `python` that execs PYTHON by its own path (a symlink would not do: Python
# finds its venv from the path it was started by). The caller then sets
#   PATH=DEST/bin:DEST/site/bin:$PATH  PYTHONPATH=DEST/site
# DEST/site/bin holds the wheels' console scripts (dvc), whose #! line is PYTHON.
# Done again only when the wheel set or PYTHON changes (DEST/.stamp).
set -euo pipefail
py=$(command -v "${1:?usage: gpu_env.sh PYTHON WHEELS DEST}")
wheels=${2:?} dest=${3:?}
case $py in /*) ;; *) py=$PWD/$py ;; esac
stamp=$( (echo "$py"; ls "$wheels") | sha256sum | cut -c1-16)
if [ "$(cat "$dest/.stamp" 2>/dev/null)" = "$stamp" ]; then exit 0; fi
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp/bin"
# --no-deps: the carried set is exactly what the image lacks (scripts/gpu_carry.py resolved it);
# --no-compile: bytecode is written on first import, which saves set-up time on the lent machine.
"$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
  --target "$dest.tmp/site" "$wheels"/*.whl
for name in python python3; do
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$py" > "$dest.tmp/bin/$name"
  chmod +x "$dest.tmp/bin/$name"
done
echo "$stamp" > "$dest.tmp/.stamp"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
