"""Warm starts: a stage's process forked from a server that has already imported torch and the rest
(server.py), engaged by `python -m pipeline <stage>` under `dvc repro` (auto.py) or by the grid
launcher's `python` on PATH (shim.py); every stage ends through exit.py, warm or cold."""
