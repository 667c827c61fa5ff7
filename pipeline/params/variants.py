"""A variant's full settings: the baseline's `model` and `train` with a scale's and the variant's
overrides merged in, and the ModelConfig they build."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any

from pydantic import ValidationError

from pipeline.params.file import Params
from pipeline.params.section import ParamsError, error_line, unknown_key
from pipeline.params.train import TrainParams

# ModelConfig fields that come from the tokenizer, not from params.yaml.
FROM_TOKENIZER = ("vocab_size", "pad_id", "bos_id", "eos_id")


def model_fields() -> dict[str, Any]:
    """ModelConfig's user-settable fields and their defaults (the model package owns them)."""
    from model import ModelConfig

    def default(f: dataclasses.Field) -> Any:
        return (f.default if f.default is not dataclasses.MISSING
                else f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    return {f.name: default(f) for f in dataclasses.fields(ModelConfig) if f.name not in FROM_TOKENIZER}


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
        raise ParamsError(error_line(exc, f"ablations.{variant}.train", TrainParams)) from exc
    return merged
