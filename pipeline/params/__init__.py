"""params.yaml, validated once: the schema of every section and the ablation merge.

Only the stages' `main()` functions call `load_params`; workers receive plain values. An error is one
line that names the offending key path. Each section's schema is in the module named for it; Section
and the shared YAML and error helpers in section.py; Params, the whole file, in file.py; the merge of
a variant's overrides in variants.py.
"""
from pipeline.params.data import SOURCE_NAMES, FilterParams, TrainBpeParams, default_cache_dir
from pipeline.params.decide import DecideParams
from pipeline.params.evaluate import EvaluateParams, KnockoutParams, knockout_seeds, knocks_out
from pipeline.params.file import Params, decided_run, load_params
from pipeline.params.report import Reference, ReportParams
from pipeline.params.section import ParamsError, fields_at, read_yaml, stage_error
from pipeline.params.train import TrainParams
from pipeline.params.variants import FROM_TOKENIZER, merge_overrides, model_config, model_fields, resolve_variant

__all__ = ["SOURCE_NAMES", "FilterParams", "TrainBpeParams", "default_cache_dir", "DecideParams", "EvaluateParams",
           "KnockoutParams", "knockout_seeds", "knocks_out", "Params", "decided_run", "load_params", "Reference",
           "ReportParams", "ParamsError", "fields_at", "read_yaml", "stage_error", "TrainParams", "FROM_TOKENIZER",
           "merge_overrides", "model_config", "model_fields", "resolve_variant"]
