"""params.yaml, validated once: the schema of every section and the ablation merge.

Only the stages' `main()` functions call `load_params`; workers receive plain values. Unknown keys
are errors (a typo in an ablation must not silently train the baseline again), reported as one line
that names the offending key path.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# The `report` section's schema (the reference point, the seed study's claims) and Section, every
# section's base: in their own module, which imports nothing of this one. Re-exported here.
from pipeline.params_report import (  # noqa: F401
    CLAIM_EXPECT, CLAIM_READS, Reference, ReportParams, SeedClaim, Section,
)

# Every dataset source; each real one keeps its options under `data.<name>` (pipeline/sources).
SOURCE_NAMES = ("synthetic", "cnn_dailymail", "tiny_shakespeare", "tinystories", "iwslt2017", "multi30k", "local")
ABLATABLE = ("model", "train")  # the sections an ablation may override
# A variant name becomes a DVC stage name and a directory (data/runs/<variant>-<seed>): no spaces,
# no slashes, nothing a shell or a path would read differently.
VARIANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def default_cache_dir() -> Path:
    """`$ABLATION_LAB_CACHE`, else `~/.cache/ablation-lab`: per-user state outside the repository
    (downloads, the CPU's measured peak). Here because every stage already depends on this module."""
    env = os.environ.get("ABLATION_LAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ablation-lab"


class ParamsError(ValueError):
    """A params.yaml problem; its message names the offending key."""


def stage_error(stage: str, exc: BaseException) -> SystemExit:
    """The one line a stage exits with on bad input or a full disk: the stage, then the error's first line."""
    from pipeline.atomic import disk_full  # a full disk's line: the file, the space, what to do

    lines = str(disk_full(exc, atomic=False) or exc).strip().splitlines() or [type(exc).__name__]
    return SystemExit(f"{stage}: {lines[0]}")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` (no dot) as a string; DVC (YAML 1.2) and users read a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
               r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


class SyntheticParams(Section):
    n_examples: int = Field(4000, gt=0)  # articles generated before filtering
    seed: int = 1234  # the generator's own seed: the dataset is fixed across training seeds


class DataParams(BaseModel):
    # Extra keys are allowed here, but only source names: data.<source> holds that source's options (its own schema).
    model_config = ConfigDict(extra="allow")
    source: Literal[SOURCE_NAMES] = "synthetic"
    cache_dir: str | None = None  # where real downloads are cached (default ~/.cache/ablation-lab)
    synthetic: SyntheticParams = SyntheticParams()

    @model_validator(mode="after")
    def _extras_are_sources(self) -> "DataParams":
        for key in self.model_extra or {}:
            if key not in SOURCE_NAMES:
                raise ValueError(unknown_key(f"data.{key}", key, [*type(self).model_fields, *SOURCE_NAMES]))
        return self


class FilterParams(Section):
    # The unit of the four limits: pre-tokens (words and punctuation; cheap, before any subword model) or
    # characters of the text (no tokenizer exists yet at this stage, so not its tokens).
    length_unit: Literal["pretokens", "chars"] = "pretokens"
    min_source_tokens: int = Field(0, ge=0)
    max_source_tokens: int | None = Field(1024, gt=0)  # None (null): no upper limit on this side
    min_target_tokens: int = Field(1, ge=0)
    max_target_tokens: int | None = Field(256, gt=0)  # None (null): no upper limit on this side
    subsample: float = Field(1.0, gt=0, le=1)  # fraction kept after the length filter
    val_fraction: float = Field(0.1, ge=0, lt=1)  # only used where the source has no such split
    test_fraction: float = Field(0.1, ge=0, lt=1)
    seed: int = 0

    @model_validator(mode="after")
    def _room_for_training(self) -> "FilterParams":
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(f"filter.val_fraction + filter.test_fraction = "
                             f"{self.val_fraction + self.test_fraction:g} leaves nothing to train on (must be < 1)")
        return self


class TrainBpeParams(Section):
    model_type: Literal["bpe", "char", "unigram"] = "bpe"
    vocab_size: int = Field(1000, gt=4)
    character_coverage: float = Field(1.0, gt=0, le=1)
    input_sentence_size: int = Field(1_000_000, gt=0)  # sentences sampled for training the tokenizer
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3


class EncodeParams(Section):
    shard_examples: int = Field(50_000, gt=0)  # rows per parquet shard
    max_source_tokens: int | None = Field(None, gt=0)  # keep each source's first N tokens; None: all
    max_target_tokens: int | None = Field(None, gt=0)  # keep each target's first N tokens; None: all


class TrainParams(Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    budget_tokens: int = Field(1_000_000, gt=0)  # target tokens seen by every variant (fair budget)
    budget_steps: int | None = Field(None, gt=0)  # if set, train this many optimizer steps instead
    # If set, every run trains to this many training FLOPs (pipeline.train.flops_per_target_token, the
    # count behind MFU) instead: a variant cheaper per token sees more tokens.
    budget_flops: float | None = Field(None, gt=0)
    batch_tokens: int = Field(4096, gt=0)  # seq2seq: cap on padded tokens per batch
    batch_size: int = Field(32, gt=0)  # language modelling: windows per batch
    context: int = Field(256, gt=1)  # language modelling: window length
    # language modelling: `grid`, non-overlapping windows shuffled each epoch; `random`, as many at random
    # starts (nanoGPT's sampling): over many epochs a model overfits a fixed grid's windows.
    lm_windows: Literal["grid", "random"] = "grid"
    grad_accum: int = Field(1, gt=0)
    lr: float = Field(1e-3, gt=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.98)  # AdamW
    eps: float = Field(1e-9, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    decay_embeddings: bool = False  # decay embedding tables too (nanoGPT's rule); default: exempt
    schedule: Literal["constant", "cosine", "inverse_sqrt", "linear"] = "cosine"
    warmup_steps: int = Field(100, ge=0)
    # The warmup's first step: one, lr * (step + 1) / warmup_steps (the first step trains at lr / warmup_steps);
    # zero, lr * step / warmup_steps (the first step at lr 0: nanoGPT's get_lr at commit 23a8e701). step from 0.
    warmup_start: Literal["one", "zero"] = "one"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)  # cosine/linear floor as a fraction of lr
    clip_grad_norm: float | None = Field(1.0, gt=0)
    eval_every: int = Field(100, gt=0)  # steps between validation passes
    eval_examples: int = Field(256, gt=0)  # validation examples / LM windows of each in-loop estimate
    # Language modelling: which windows the in-loop estimate scores. first: the split's first
    # eval_examples non-overlapping windows, the same at every evaluation (a low-noise curve for
    # comparing variants). random: eval_examples windows at random starts over the whole split,
    # drawn anew at every evaluation from (seed, step): nanoGPT's estimate of the whole-split loss.
    eval_windows: Literal["first", "random"] = "first"
    # The model the stage hands on (model.pt): last, the final step's (equal budgets for every
    # variant); best, the one with the lowest in-loop estimate (nanoGPT keeps its best checkpoint).
    keep: Literal["last", "best"] = "last"
    log_every: int = Field(20, gt=0)
    checkpoint_every: int = Field(200, gt=0)
    keep_checkpoints: int = Field(2, gt=0)
    compile: bool = False  # torch.compile (inductor) of the training step, on CUDA or CPU (needs a C++ compiler)
    # bf16 autocast or float32. auto: bf16 on CUDA, fp32 on CPU (bit-identical to earlier CPU
    # results). bf16 on CPU also takes the fused AdamW kernel (pipeline.training.optim says why).
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    threads: int = Field(0, ge=0)  # CPU threads for torch; 0 = auto: the cores free when the stage starts
    # Runs sharing a GPU, each under a slot lock (pipeline.training.gpu_lock): auto = as many as its memory
    # holds by the run's estimated peak, at most one per CPU core of the GPU's share and 16. Reruns training.
    runs_per_gpu: int | str = "auto"

    @field_validator("runs_per_gpu", mode="before")
    @classmethod
    def _runs_per_gpu(cls, value: Any) -> int | str:
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            return value
        raise ValueError("must be auto or a whole number of runs, at least 1")

    @model_validator(mode="after")
    def _one_budget(self) -> "TrainParams":
        if self.budget_flops is not None and self.budget_steps is not None:
            raise ValueError("train.budget_flops and train.budget_steps are both set; keep one "
                             "(budget_tokens is the default when neither is)")
        return self


class EvaluateParams(Section):
    max_examples: int = Field(200, gt=0)  # test examples decoded for the task metric
    decode: Literal["greedy", "beam", "sample"] = "greedy"
    beam_size: int = Field(4, gt=0)
    length_penalty: float = 1.0
    temperature: float = Field(1.0, gt=0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, gt=0)
    n_samples: int = Field(5, ge=0)  # sample outputs shown in the report
    prompt_tokens: int = Field(32, gt=0)  # language modelling: prompt length of the continuations
    batch_size: int = Field(32, gt=0)
    # Target tokens scored for val/test loss, per split: None scores the whole split; a cap scores
    # evenly spaced LM windows / examples (the same ones for every seed; pipeline.evaluate).
    max_loss_tokens: int | None = Field(None, gt=0)


class KnockoutParams(Section):
    """Parts knocked out of the trained baseline at evaluation time (stage `knockout`, model.knockout)."""
    # modes, parts and attentions spell out model.knockout's MODES, PARTS and ATTENTIONS: params.py
    # imports no model code (stages that never build a model would then depend on model/), so
    # tests/test_one_place.py checks the two stay equal.
    # Whose trained report.baseline run parts are knocked out of (no retraining): `all`, every seed
    # of `seeds`; a list, those of its seeds that are trained; [], none (off). dvc.yaml lays out one
    # `knockout@<seed>` stage per entry of `seeds`, so editing `seeds` never means editing this too.
    seeds: Literal["all"] | list[Annotated[int, Field(ge=0, lt=2**32)]] = "all"
    modes: list[Literal["zero", "mean"]] = ["zero", "mean"]  # zero: output set to 0; mean: to its held-out mean
    # What to knock out; None: every part the baseline has (heads, attention, ffn, positional, residual).
    parts: list[Literal["heads", "attention", "ffn", "positional", "residual"]] | None = None
    attentions: list[Literal["self", "cross"]] | None = None  # heads/attention knocked in; None: all the model has
    heads: list[Annotated[int, Field(ge=0)]] | None = None  # head indices knocked one at a time; None: all
    max_loss_tokens: int = Field(1024, gt=0)  # validation target tokens each knock-out's val_loss is measured on
    # Test examples decoded for the task metric (seq2seq), for the counterparts of train-time ablations only; 0: none.
    max_examples: int = Field(32, ge=0)
    mean_examples: int = Field(32, gt=0)  # training examples whose activations give the mean-ablation means


class DecideRun(Section):
    """One run `bash run.sh decide` added beyond `seeds` (its key in decide.runs is variant-seed)."""
    variant: str
    seed: int = Field(ge=0, lt=2**32)


class DecideParams(Section):
    """Seeds until decided (pipeline.deciding, docs/seeds-until-decided.md): off while `looks` is empty.
    Each comparison with the baseline is looked at when it has looks[k] paired seeds, at the level
    1 - alpha / (comparisons x looks); it stops when its interval excludes 0 or (with a margin)
    lies inside (-margin, margin), and only open comparisons get more seeds, up to looks[-1]."""
    # Seed counts of the looks, fixed before any run: the first is len(seeds) (every variant trains
    # `seeds`), the last is the budget.
    looks: list[Annotated[int, Field(ge=2)]] = []
    alpha: float = Field(0.05, gt=0, lt=1)  # the family-wise error over every comparison and look
    # In the primary metric's units: |Δ| inside (-margin, margin) counts as "equivalent". Declare it
    # before the first run; None decides only the sign.
    margin: float | None = Field(None, gt=0)
    # t: t-intervals for the mean difference (assume normal per-seed differences); median: the
    # order-statistic interval for the median difference (no normality; decides from a later look).
    method: Literal["t", "median"] = "t"
    # How each comparison's error α/m is shared among the looks: bonferroni (α/(m·K) at every look),
    # or a Lan–DeMets spending function with exact t boundaries (method t only): obf (O'Brien–Fleming-
    # type: the most power at the budget, nothing decided at the first look), pocock, rho (α·τ^rho).
    boundary: Literal["bonferroni", "obf", "pocock", "rho"] = "bonferroni"
    rho: float = Field(1.0, gt=0)  # boundary rho's exponent
    # Written by `bash run.sh decide` (pipeline/deciding/loop.py), never by hand: the runs it added beyond
    # `seeds`, `variant-seed: {variant, seed}`; dvc.yaml lays out a train_more / evaluate_more /
    # knockout_more stage for each.
    runs: dict[str, DecideRun] = {}


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
        looks, runs = self.decide.looks, self.decide.runs
        if not looks:
            if runs:
                raise ValueError("decide.runs: runs added by `bash run.sh decide`, but decide.looks is empty (off)")
            return self
        if any(b <= a for a, b in zip(looks, looks[1:])):
            raise ValueError(f"decide.looks: {looks} must increase (seed counts at each look)")
        if looks[0] != len(self.seeds):
            raise ValueError(f"decide.looks: the first look is at {looks[0]} seeds, but seeds lists {len(self.seeds)} "
                             "(every variant trains those; the first look must be at len(seeds))")
        if len(self.ablations) < 2:
            raise ValueError("decide.looks: nothing to decide (ablations holds only the baseline)")
        if self.decide.method == "median" and self.decide.boundary != "bonferroni":
            raise ValueError(f"decide.boundary: {self.decide.boundary} is calibrated for t statistics; "
                             "method median takes bonferroni")
        if self.decide.method == "median":  # pipeline.deciding.rule: order statistics need enough seeds
            level = 1 - self.decide.alpha / ((len(self.ablations) - 1) * len(looks))
            need = math.ceil(1 - math.log2(1 - level))
            if looks[-1] < need:
                raise ValueError(f"decide.method: median decides nothing before {need} seeds at level {level:.4f}, "
                                 f"and the last look is at {looks[-1]}")
        top = max(self.seeds)
        more = set(range(top + 1, top + 1 + looks[-1] - len(self.seeds)))  # pipeline.deciding.rounds.seed_order
        for name, run in runs.items():
            if name != f"{run.variant}-{run.seed}":
                raise ValueError(f"decide.runs.{name}: the key must be variant-seed ({run.variant}-{run.seed})")
            if run.variant not in self.ablations:
                raise ValueError(f"decide.runs.{name}: {run.variant!r} is not a variant in ablations")
            if run.seed not in more:
                raise ValueError(f"decide.runs.{name}: seed {run.seed} is not one the looks add after seeds "
                                 f"({min(more)}..{max(more)})" if more else f"decide.runs.{name}: the looks add no seeds")
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


def knocks_out(selection: str | list[int], seed: int) -> bool:
    """Whether the knockout stage of trained seed `seed` runs under knockout.seeds = `selection`."""
    return selection == "all" or seed in selection


def knockout_seeds(selection: str | list[int], seeds: list[int]) -> list[int]:
    """The trained seeds whose baseline is knocked out, in the order of `seeds`."""
    return [s for s in seeds if knocks_out(selection, s)]


# ModelConfig fields that come from the tokenizer, not from params.yaml.
FROM_TOKENIZER = ("vocab_size", "pad_id", "bos_id", "eos_id")


def model_fields() -> dict[str, Any]:
    """ModelConfig's user-settable fields and their defaults (the model package owns them)."""
    from model import ModelConfig

    def default(f: dataclasses.Field) -> Any:
        return (f.default if f.default is not dataclasses.MISSING
                else f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    return {f.name: default(f) for f in dataclasses.fields(ModelConfig) if f.name not in FROM_TOKENIZER}


def unknown_key(path: str, key: str, known: list[str]) -> str:
    """`path: unknown key (did you mean 'x'?)`: the message for every misspelt key."""
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return f"{path}: unknown key ({hint})"


def fields_at(model: type[BaseModel], path: tuple | list) -> list[str]:
    """Field names of the (nested) pydantic model at `path` below `model`, or [] if none is there."""
    for name in path:
        if isinstance(name, int):  # an item of a list: the list's own model, already taken
            continue
        field = model.model_fields.get(name)
        model = field.annotation if field else None
        # list[X] and X | None: their model X
        model = next((a for a in get_args(model) if isinstance(a, type) and issubclass(a, BaseModel)), model)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def _error_line(exc: ValidationError, source: str) -> str:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    where = ".".join(str(p) for p in loc)
    if err["type"] == "extra_forbidden":
        return f"{source}: {unknown_key(where, str(loc[-1]), fields_at(Params, loc[:-1]))}"
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith(where):  # our own validators name the key themselves
        return f"{source}: {msg}"
    got = f" (got {err['input']!r})" if not isinstance(err["input"], dict) else ""
    return f"{source}: {where}: {msg}{got}"


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
        raise ParamsError(_error_line(exc, str(path))) from exc


def decided_run(params: Params, name: str) -> tuple[str, int]:
    """The variant and seed of decide.runs[name] (a run `bash run.sh decide` added)."""
    if name not in params.decide.runs:
        raise ParamsError(f"decide.runs: no run named {name!r}")
    run = params.decide.runs[name]
    return run.variant, run.seed


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any], where: str = "") -> dict[str, Any]:
    """Return `base` with `overrides` applied recursively; every override key must exist in base."""
    merged = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        path = f"{where}.{key}" if where else str(key)
        if key not in merged:
            raise ParamsError(unknown_key(path, key, list(merged)))
        if isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge_overrides(merged[key], value, path)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def model_config(model_section: dict[str, Any], tokenizer: dict[str, Any], where: str):
    """ModelConfig of merged `model` settings and the tokenizer's ids; its error names `where`."""
    from model import ModelConfig

    try:
        return ModelConfig(**model_section, **{key: tokenizer[key] for key in FROM_TOKENIZER})
    except (TypeError, ValueError) as exc:
        raise ParamsError(f"{where}: {exc}") from exc


def resolve_variant(params: Params, variant: str, scale: str | None = None,
                    lr: float | None = None) -> dict[str, dict[str, Any]]:
    """The full `model` and `train` settings of one variant: baseline defaults + its overrides.

    `scale` (a key of `scales`) applies that scale's overrides to the baseline first, so the
    variant's own overrides win; `lr` (a point of `lr_sweep`) replaces the learning rate last.
    """
    if variant not in params.ablations:
        raise ParamsError(f"ablations: no variant named {variant!r} (have: {', '.join(params.ablations)})")
    if scale is not None and scale not in params.scales:
        raise ParamsError(f"scales: no scale named {scale!r} (have: {', '.join(params.scales) or 'none'})")
    known = model_fields()
    for key in params.model:
        if key not in known:
            raise ParamsError(unknown_key(f"model.{key}", key, sorted(known)))
    base = {"model": {**known, **params.model}, "train": params.train.model_dump()}
    if scale is not None:
        base = merge_overrides(base, params.scales[scale], where=f"scales.{scale}")
    merged = merge_overrides(base, params.ablations[variant], where=f"ablations.{variant}")
    if lr is not None:
        merged["train"]["lr"] = lr
    try:
        merged["train"] = TrainParams.model_validate(merged["train"]).model_dump()
    except ValidationError as exc:
        raise ParamsError(_error_line(exc, f"ablations.{variant}.train")) from exc
    return merged
