"""DVC stages of Ablation Lab: one module per stage, run as `python -m pipeline.<stage>`."""
