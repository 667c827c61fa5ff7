"""Repository upkeep run by hand or by run.sh, never by `dvc repro`: the GPU carry, the study
runner and the README's table of committed studies."""
