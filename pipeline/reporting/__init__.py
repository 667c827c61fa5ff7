"""The report stage's engine (only `report` depends on this folder).

inputs         reading the run files of the train and evaluate stages and the filter metrics
stats          mean, t-interval, paired deltas, power and Holm over seeds (pure functions)
tables         the report's tables and its verdicts, every number read from a run file
sweeps         each variant at its own best learning rate, and the effects across model sizes
figures        which figures the report shows, from which run files
plots          the drawing of those figures (matplotlib)
render         the report as blocks, rendered to Markdown and self-contained HTML
dvc_files      what DVC reads back: reports/metrics.json and the curve tables
mlflow_mirror  every run and the report mirrored to MLflow
"""
