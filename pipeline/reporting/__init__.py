"""The report stage's engine (only `report` depends on this folder).

inputs         reading the run files of the train and evaluate stages and the filter metrics
stats          mean, t-interval, paired deltas, power and Holm over seeds (pure functions)
formatting     how a number is written (one place, so every table and the docs' study table agree)
results        each variant's summary and tested Δ vs the baseline: the numbers behind it all
verdict        the report's answer first: one line per ablation on the primary metric
claims         the seed study's claims beside ours (report.seed_claims), checked by our verdict
tables         the report's result, setup, sample and per-run tables
cost           the training-cost table and what counts as a contended timing
data_tables    what the download and filter stages did to the examples
loss_budget    whether val/test loss was scored on a subset (evaluate.max_loss_tokens)
notes          the data as run, and the preset author's notes checked against it
knockout       the knock-out section: what the trained baseline uses
sweeps         each variant at its own best learning rate, and the effects across model sizes
figures        which figures the report shows, from which run files
plots          the drawing of those figures (matplotlib)
render         the report as blocks, rendered to Markdown and self-contained HTML
dvc_files      what DVC reads back: reports/metrics.json (the verdict's numbers), details.json, the curves
mlflow_mirror  every run and the report mirrored to MLflow
mlflow_view    the experiment's saved view "Compare variants" in `mlflow ui`
"""
