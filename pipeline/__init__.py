"""DVC stages of Ablation Lab: one module per stage, named as in dvc.yaml, run as
`python -m pipeline.<stage>`.

Stages      check_params, download, filter, train_bpe, encode, train, evaluate, report
Not a stage preset (switch params.yaml to a preset)
Shared      params (the params.yaml schema), atomic (temp file + rename), tracking (MLflow store)
Rooms       sources/ (datasets, used by download), training/ (the engine of train and evaluate),
            scoring/ (task metrics and output checks of evaluate), reporting/ (the report's engine)
"""
