"""The grid launcher: `python -m pipeline.grid` runs a study's independent DVC stages side by side."""
