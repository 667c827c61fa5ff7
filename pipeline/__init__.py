"""Ablation Lab's DVC pipeline: one module per stage, run by dvc.yaml as `python -m pipeline <stage>`.
Where everything lives: the layout map in docs/pipeline-and-params.md."""
from pipeline.cpu_numerics import pin as _pin

_pin()  # before torch is imported anywhere in this process (and in the processes it starts)
