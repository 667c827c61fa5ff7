"""Stage `check_params`: every key of params.yaml checked before any other stage runs.

    python -m pipeline.check_params --out data/params.checked --local-root data/local

dvc.yaml makes this stage depend on the whole of params.yaml and every other stage depend on its
output, so any edit (even a key no stage reads, like `seed:` for `seeds:`) runs it first, and a
bad value stops `dvc repro` before DVC deletes any stage's outputs. It checks what can be known
without data: the schema of every section, each source's options, each variant's merged model
and train settings. Checks that need the corpus (the tokenizer's vocabulary) stay in their stage.

The output never changes while the params are valid, so stages downstream rerun only for the
params they list themselves.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.io.atomic import DiskFull, atomic_write_text
from pipeline.params import Params, ParamsError, load_params, model_config, model_fields, resolve_variant, stage_error
from pipeline.params.data import check_source_paths

STAMP = "params.yaml: every key valid (pipeline/check_params.py)\n"


def check(params: Params, local_root: Path) -> None:
    """Raise ParamsError/ValueError naming the first bad key."""
    from pipeline.sources import SOURCES
    from pipeline.sources.common import parse_options

    for name, options in (params.data.model_extra or {}).items():
        parse_options(SOURCES[name].Options, options, name)
        if isinstance(options, dict):
            check_source_paths(name, options, local_root)
    merged = {variant: resolve_variant(params, variant) for variant in params.ablations}
    tokenizer = params.train_bpe.model_dump()
    # The shared `model` section first: its error is the user's `model` key, not every variant's.
    model_config({**model_fields(), **params.model}, tokenizer, "model")
    for variant, settings in merged.items():
        model_config(settings["model"], tokenizer, f"ablations.{variant}")
    check_knockout(params, merged[params.report.baseline]["model"], tokenizer)
    for scale in params.scales:  # every variant is trained at every scale
        model_config(resolve_variant(params, params.report.baseline, scale)["model"], tokenizer, f"scales.{scale}")
        for variant in params.ablations:
            settings = resolve_variant(params, variant, scale)
            model_config(settings["model"], tokenizer, f"ablations.{variant} at scales.{scale}")
    check_loss_cap(params)


def source_task(params: Params) -> str | None:
    """The task the data source gives, as far as params tell it (`local` names it in its options)."""
    from pipeline.sources import SOURCES

    name = params.data.source
    if name == "synthetic":
        return "summarization"
    if name == "local":
        options = (params.data.model_extra or {}).get("local")
        return options.get("task") if isinstance(options, dict) else None
    return SOURCES[name].task


def check_loss_cap(params: Params) -> None:
    """evaluate.max_loss_tokens scores whole LM windows (train.context tokens each, per variant and
    scale): a cap below one would score nothing. Seq2seq examples' lengths need the data: the
    evaluate stage checks those."""
    cap = params.evaluate.max_loss_tokens
    if cap is None or source_task(params) != "language_modeling":
        return
    where = [(f"ablations.{v}", resolve_variant(params, v)) for v in params.ablations]
    where += [(f"ablations.{v} at scales.{s}", resolve_variant(params, v, s)) for s in params.scales
              for v in params.ablations]
    for name, settings in where:
        context = settings["train"]["context"]
        if cap < context:
            raise ParamsError(f"evaluate.max_loss_tokens: {cap:,} is below one evaluation window of {name} "
                              f"(train.context {context:,} tokens); raise it or leave it unset")


def check_knockout(params: Params, baseline_model: dict, tokenizer: dict) -> None:
    """The knockout section names only parts the baseline has (checked even while it is off, so
    turning it on cannot fail on a typo made earlier)."""
    from model.knockout_plan import plan  # no torch: this stage never imports it

    k = params.knockout
    cfg = model_config(baseline_model, tokenizer, f"ablations.{params.report.baseline}")
    try:
        plan(cfg, k.parts, k.attentions, k.heads, k.modes)
    except ValueError as exc:  # its message starts with the argument, which is the key's name
        raise ParamsError(f"knockout.{exc} (the baseline, ablations.{params.report.baseline})") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True)
    parser.add_argument("--local-root", default="data/local")
    args = parser.parse_args(argv)
    try:
        check(load_params(args.params), Path(args.local_root))
        out = Path(args.out)
        if not out.is_file() or out.read_text(encoding="utf-8") != STAMP:
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out, STAMP)
    except (ParamsError, ValueError, DiskFull) as exc:
        raise stage_error("check_params", exc) from None


if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
