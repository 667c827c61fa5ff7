"""DVC stages of Ablation Lab: one module per stage, named as in dvc.yaml, run as
`python -m pipeline.<stage>`.

Stages      check_params, download, filter, train_bpe, encode, train, evaluate, report
Not a stage preset (switch params.yaml to a preset)
Shared      params (the params.yaml schema), atomic (temp file + rename), tracking (MLflow store),
            cpu_numerics (the same bits on every x86-64 CPU with AVX2: pinned here, before anything
            imports torch; engaged by each stage once it has)
Rooms       sources/ (datasets, used by download), training/ (the engine of train and evaluate),
            scoring/ (task metrics and output checks of evaluate), reporting/ (the report's engine)
"""
import sys as _sys

from pipeline.cpu_numerics import pin as _pin

_pin()  # before torch is imported anywhere in this process (and in the processes it starts)

if _sys.argv[:1] == ["-m"]:  # `python -m pipeline.<module>`, before the module runs (and imports torch)
    from pipeline.grid.auto import engage as _engage

    _engage()  # under `dvc repro`: served by a warm server, or starts one (pipeline/grid/auto.py)
