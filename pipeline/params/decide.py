"""The `decide` section, and the checks of its plan against the seeds and variants the study trains."""
from __future__ import annotations

import math
from collections.abc import Collection
from typing import Annotated, Literal

from pydantic import Field

from pipeline.params.section import Section


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
    # Written by `bash run.sh decide` (pipeline/grid/decide.py), never by hand: the runs it added beyond
    # `seeds`, `variant-seed: {variant, seed}`; dvc.yaml lays out a train_more / evaluate_more /
    # knockout_more stage for each.
    runs: dict[str, DecideRun] = {}

    def check_plan(self, seeds: list[int], variants: Collection[str]) -> None:
        """Raise ValueError, naming the key, where the looks or the added runs do not fit `seeds` and `variants`."""
        looks, runs = self.looks, self.runs
        if not looks:
            if runs:
                raise ValueError("decide.runs: runs added by `bash run.sh decide`, but decide.looks is empty (off)")
            return
        if any(b <= a for a, b in zip(looks, looks[1:])):
            raise ValueError(f"decide.looks: {looks} must increase (seed counts at each look)")
        if looks[0] != len(seeds):
            raise ValueError(f"decide.looks: the first look is at {looks[0]} seeds, but seeds lists {len(seeds)} "
                             "(every variant trains those; the first look must be at len(seeds))")
        if len(variants) < 2:
            raise ValueError("decide.looks: nothing to decide (ablations holds only the baseline)")
        if self.method == "median" and self.boundary != "bonferroni":
            raise ValueError(f"decide.boundary: {self.boundary} is calibrated for t statistics; "
                             "method median takes bonferroni")
        if self.method == "median":  # pipeline.deciding.rule: order statistics need enough seeds
            level = 1 - self.alpha / ((len(variants) - 1) * len(looks))
            need = math.ceil(1 - math.log2(1 - level))
            if looks[-1] < need:
                raise ValueError(f"decide.method: median decides nothing before {need} seeds at level {level:.4f}, "
                                 f"and the last look is at {looks[-1]}")
        top = max(seeds)
        more = set(range(top + 1, top + 1 + looks[-1] - len(seeds)))  # pipeline.deciding.rounds.seed_order
        for name, run in runs.items():
            if name != f"{run.variant}-{run.seed}":
                raise ValueError(f"decide.runs.{name}: the key must be variant-seed ({run.variant}-{run.seed})")
            if run.variant not in variants:
                raise ValueError(f"decide.runs.{name}: {run.variant!r} is not a variant in ablations")
            if run.seed not in more:
                raise ValueError(f"decide.runs.{name}: seed {run.seed} is not one the looks add after seeds "
                                 f"({min(more)}..{max(more)})" if more else f"decide.runs.{name}: the looks add no seeds")
