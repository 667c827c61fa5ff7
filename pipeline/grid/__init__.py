"""The study's drivers, on the top floor: the grid launcher (`python -m pipeline.grid`, repro.py)
and the rounds loop of seeds until decided (`python -m pipeline.grid.decide`)."""
