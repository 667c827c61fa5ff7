"""The sections of the stages that score a trained model: `evaluate` and `knockout`."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.params.section import Section


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
    # modes, parts and attentions spell out model.knockout's MODES, PARTS and ATTENTIONS: pipeline.params
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


def knocks_out(selection: str | list[int], seed: int) -> bool:
    """Whether the knockout stage of trained seed `seed` runs under knockout.seeds = `selection`."""
    return selection == "all" or seed in selection


def knockout_seeds(selection: str | list[int], seeds: list[int]) -> list[int]:
    """The trained seeds whose baseline is knocked out, in the order of `seeds`."""
    return [s for s in seeds if knocks_out(selection, s)]
