"""Switch the project to a preset: one seed study as a complete params file in presets/<name>.yaml.

    python -m pipeline.preset --list          # the presets and what each reproduces
    python -m pipeline.preset tinystories     # validate presets/tinystories.yaml, copy it over params.yaml
    dvc repro                                 # then run it (or `dvc exp run` to keep it as an experiment)

params.yaml stays the one file DVC reads: a preset is copied over it whole, comments included
(docs/datasets-and-presets.md#presets-the-seed-studies-rerunnable). It is first validated with the
pipeline's schema plus what would otherwise fail only mid-run (`validate`); the write is atomic,
and the changed sections are printed so the user sees which stages `dvc repro` will rerun.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from pipeline.io.atomic import atomic_write_text
from pipeline.params import Params, ParamsError, load_params, resolve_variant

SECTIONS = tuple(Params.model_fields)
# Keys dvc.yaml's matrices read: DVC stops with "Could not find" when params.yaml lacks one.
DVC_READS = ("seeds", "ablations", "lr_sweep", "scales", "knockout", "decide")
OFF = {"lr_sweep": "[]", "knockout": "{seeds: []}", "decide": "{runs: {}}"}  # how each sweep key is written when off


def available(presets_dir: Path) -> list[str]:
    return sorted(p.stem for p in Path(presets_dir).glob("*.yaml"))


def preset_file(name: str, presets_dir: Path) -> Path:
    path = Path(presets_dir) / f"{name}.yaml"
    if Path(name).name != name or not path.is_file():
        names = ", ".join(available(presets_dir)) or "none"
        raise ParamsError(f"no preset {name!r} in {presets_dir}/ (available: {names})")
    return path


def summary(path: Path) -> str:
    """The preset's first comment line: what it reproduces."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def source_task(params: Params) -> str:
    """The task of the configured source, validating its `data.<source>` options on the way
    (a typo there would otherwise surface only when the download stage runs)."""
    source = params.data.source
    if source == "synthetic":
        return "summarization"
    from pipeline.sources import get_source
    from pipeline.sources.common import parse_options

    module = get_source(source)
    opts = parse_options(module.Options, dict(params.data.model_extra or {}).get(source), source)
    return module.task or opts.task  # `local` has no fixed task: it is one of its options


def validate(path: Path) -> Params:
    """Load `path` as params.yaml and check every variant is buildable for the source's task."""
    from model import ModelConfig

    params = load_params(path)
    for key in DVC_READS:
        if key not in params.model_fields_set:  # written in the file, not a default
            raise ParamsError(f"{path}: {key}: missing; dvc.yaml lays out its stages from it "
                              f"(write `{key}: {OFF.get(key, '{}')}` to leave it off)")
    try:
        task = source_task(params)
    except ValueError as exc:
        raise ParamsError(f"{path}: {exc}") from exc
    tok = params.train_bpe
    # The vocabulary is known only after train_bpe; any size holding the special ids will do here.
    ids = {"vocab_size": max(tok.vocab_size, tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) + 1,
           "pad_id": tok.pad_id, "bos_id": tok.bos_id, "eos_id": tok.eos_id}
    for variant, scale in [(v, s) for s in (None, *params.scales) for v in params.ablations]:
        where = f"{path}: ablations.{variant}" + (f" at scales.{scale}" if scale else "")
        try:
            resolved = resolve_variant(params, variant, scale)
        except ParamsError as exc:
            raise ParamsError(f"{path}: {exc}") from exc
        if task == "language_modeling" and resolved["model"]["arch"] == "encoder_decoder":
            raise ParamsError(f"{where}: model.arch encoder_decoder needs a source text, but "
                              f"{params.data.source} is a language_modeling source "
                              "(use decoder_only or prefix_lm)")
        try:
            cfg = ModelConfig(**resolved["model"], **ids)
        except (TypeError, ValueError) as exc:
            raise ParamsError(f"{where}: {exc}") from exc
        if task == "language_modeling" and resolved["train"]["context"] > cfg.max_len:
            raise ParamsError(f"{where}: train.context {resolved['train']['context']} exceeds "
                              f"model.max_len {cfg.max_len}")
    if task == "language_modeling" and params.evaluate.decode == "beam":
        raise ParamsError(f"{path}: evaluate.decode: beam is not supported for language-model "
                          "continuations (use greedy or sample)")
    return params


def changed_sections(old_text: str | None, new_text: str) -> list[str]:
    """Top-level sections whose values differ (comments and layout do not count)."""
    try:
        old = yaml.safe_load(old_text) if old_text is not None else None
    except yaml.YAMLError:
        old = None
    if not isinstance(old, dict):
        return list(yaml.safe_load(new_text))
    new = yaml.safe_load(new_text)
    extra = sorted((set(old) | set(new)) - set(SECTIONS))  # invalid in params.yaml, but say so
    keys = [k for k in SECTIONS if k in old or k in new] + extra
    return [k for k in keys if old.get(k) != new.get(k)]


def apply(name: str, params_path: Path, presets_dir: Path) -> list[str]:
    """Validate presets/<name>.yaml and write it over `params_path`; return the changed sections."""
    path = preset_file(name, presets_dir)
    validate(path)
    text = path.read_text(encoding="utf-8")
    old = params_path.read_text(encoding="utf-8") if params_path.exists() else None
    changed = changed_sections(old, text)
    atomic_write_text(params_path, text)
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="preset to switch to (see --list)")
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--presets-dir", type=Path, default=Path("presets"))
    args = parser.parse_args(argv)
    if args.list:
        names = available(args.presets_dir)
        width = max(map(len, names), default=0)
        for name in names:
            print(f"{name:<{width}}  {summary(args.presets_dir / f'{name}.yaml')}")
        return
    if args.name is None:
        parser.error("give a preset NAME (see --list)")
    try:
        changed = apply(args.name, args.params, args.presets_dir)
    except (ParamsError, ValueError, OSError) as exc:
        raise SystemExit(f"preset: {str(exc).splitlines()[0]}")
    what = ", ".join(changed) if changed else "none (already this preset)"
    print(f"{args.params} <- {args.presets_dir / args.name}.yaml; changed sections: {what}")
    if changed:
        print("next: `dvc repro` (or `dvc exp run -n <name>` to record it as an experiment)")


if __name__ == "__main__":
    main()
