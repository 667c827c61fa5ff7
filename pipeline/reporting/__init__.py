"""The report stage's engine: only `pipeline.report` depends on this folder. Its modules, one line
each: the layout map in docs/pipeline-and-params.md."""
