"""Tools run by hand or by run.sh, never by `dvc repro`: whether a rerun reproduced the committed
study (`python -m scripts.reproduced`), the GPU carry, the study runner and the docs' generated
tables (committed studies, preset costs)."""
