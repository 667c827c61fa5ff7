"""Repository upkeep run by hand or by run.sh, never by `dvc repro`: the GPU carry, the study
runner and the docs' generated tables (committed studies, preset costs)."""
