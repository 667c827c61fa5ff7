"""`python -m pipeline.grid [-j N|auto] [--times FILE] [--cold] [TARGET..]`: the grid launcher, one
run (pipeline/grid/repro.py says what it does)."""
import sys

from pipeline.grid import signals
from pipeline.grid.repro import repro

signals.install()  # before anything else: a signal at any point ends the study in order
try:
    code, _ = repro(sys.argv[1:])
except signals.Stopped as exc:  # before anything was started, or after it all was ended
    signals.end_by(exc.signum)
sys.exit(code)
