"""What every stage shares to leave its outputs and show its progress: atomic writes (temp file +
rename: no half-written output) and progress lines (tqdm on a terminal, log lines with an ETA
under DVC and CI)."""
