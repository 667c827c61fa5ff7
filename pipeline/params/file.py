"""params.yaml as a whole: Params (its sections, the study's own keys and the checks across them),
read and validated once by `load_params`."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.params.data import DataParams, EncodeParams, FilterParams, TrainBpeParams
from pipeline.params.decide import DecideParams
from pipeline.params.evaluate import EvaluateParams, KnockoutParams
from pipeline.params.report import ReportParams
from pipeline.params.section import ParamsError, Section, error_line, read_yaml
from pipeline.params.train import TrainParams

ABLATABLE = ("model", "train")  # the sections an ablation may override
# A variant name becomes a DVC stage name and a directory (data/runs/<variant>-<seed>): no spaces,
# no slashes, nothing a shell or a path would read differently.
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Params(Section):
    data: DataParams = DataParams()
    filter: FilterParams = FilterParams()
    train_bpe: TrainBpeParams = TrainBpeParams()
    encode: EncodeParams = EncodeParams()
    model: dict[str, Any] = {}
    train: TrainParams = TrainParams()
    evaluate: EvaluateParams = EvaluateParams()
    report: ReportParams = ReportParams()
    # Training seeds (numpy's seeds are unsigned 32-bit); each one trains every variant.
    seeds: list[Annotated[int, Field(ge=0, lt=2**32)]] = Field([0], min_length=1)
    ablations: dict[str, dict[str, Any] | None] = {"baseline": {}}
    # Off by default: each costs training time. lr_sweep: every variant x seed also trains at each
    # of these learning rates (train_lr stages), and the report compares the variants each at its
    # own best rate on the validation split. scales: name -> overrides of the baseline's `model`
    # (and `train`), each variant trained at each (train_scale stages), for Δ vs parameter count.
    lr_sweep: list[Annotated[float, Field(gt=0)]] = []
    scales: dict[str, dict[str, Any] | None] = {}
    knockout: KnockoutParams = KnockoutParams()
    decide: DecideParams = DecideParams()

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            dup = next(s for s in seeds if seeds.count(s) > 1)
            raise ValueError(f"seeds: {dup} is listed twice (each seed trains every variant once)")
        return seeds

    @field_validator("ablations", "scales")
    @classmethod
    def _names(cls, entries: dict[str, dict[str, Any] | None], info) -> dict[str, dict[str, Any]]:
        """A variant's or a scale's name names DVC stages and directories; its overrides may touch
        only the ABLATABLE sections. A scale is a size other than the baseline's own."""
        key = info.field_name
        for name, overrides in entries.items():
            if not VARIANT_NAME.match(str(name)):
                raise ValueError(f"{key}.{name!r}: {'a variant' if key == 'ablations' else 'a scale'} name must be "
                                 "letters, digits, '_', '.' or '-' (it names DVC stages and directories)")
            for section in overrides or {}:
                if section not in ABLATABLE:
                    raise ValueError(f"{key}.{name}.{section}: unknown section (allowed: {', '.join(ABLATABLE)})")
            if key == "scales" and (not overrides or name == "params.yaml"):
                raise ValueError(f"scales.{name}: the baseline's own size (the report calls it params.yaml) is "
                                 "the first point of every scale comparison already; give overrides and another name")
        return {name: overrides or {} for name, overrides in entries.items()}

    @model_validator(mode="after")
    def _baseline_exists(self) -> "Params":
        if self.report.baseline not in self.ablations:
            raise ValueError(f"report.baseline: {self.report.baseline!r} is not a variant in ablations "
                             f"(have: {', '.join(self.ablations)})")
        return self

    @model_validator(mode="after")
    def _claims_name_variants(self) -> "Params":
        for i, claim in enumerate(self.report.seed_claims):
            for key in ("variant", "versus"):
                if getattr(claim, key) is not None and getattr(claim, key) not in self.ablations:
                    raise ValueError(f"report.seed_claims.{i}.{key}: {getattr(claim, key)!r} is not a variant in "
                                     f"ablations (have: {', '.join(self.ablations)})")
        return self

    @model_validator(mode="after")
    def _knockout_seeds_trained(self) -> "Params":
        chosen = self.knockout.seeds
        if chosen == "all":
            return self
        if twice := [seed for i, seed in enumerate(chosen) if seed in chosen[:i]]:
            raise ValueError(f"knockout.seeds: {twice[0]} is listed twice")
        # A listed seed that `seeds` no longer trains is skipped (shrinking `seeds` for a quick try
        # must not need a second edit), but a list naming none of them is a mistake, not "off".
        if chosen and not set(chosen) & set(self.seeds):
            raise ValueError(f"knockout.seeds: none of {chosen} is in seeds {self.seeds} (only those train the "
                             "baseline the knock-outs start from); use all, [] for off, or trained seeds")
        return self

    @model_validator(mode="after")
    def _decide_plan(self) -> "Params":
        self.decide.check_plan(self.seeds, self.ablations)
        return self

    @model_validator(mode="after")
    def _sweep_adds_rates(self) -> "Params":
        # The main runs are the sweep's point at train.lr: training it again would cost a run per
        # variant x seed for identical numbers.
        for i, lr in enumerate(self.lr_sweep):
            if lr in self.lr_sweep[:i]:
                raise ValueError(f"lr_sweep: {lr:g} is listed twice")
            if lr == self.train.lr:
                raise ValueError(f"lr_sweep: {lr:g} is train.lr; the main runs train at it already "
                                 "(list only the other rates)")
        return self


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    try:
        raw = read_yaml(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ParamsError(f"{path}: cannot read: {exc}".splitlines()[0]) from exc
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(error_line(exc, str(path), Params)) from exc


def decided_run(params: Params, name: str) -> tuple[str, int]:
    """The variant and seed of decide.runs[name] (a run `bash run.sh decide` added)."""
    if name not in params.decide.runs:
        raise ParamsError(f"decide.runs: no run named {name!r}")
    run = params.decide.runs[name]
    return run.variant, run.seed
