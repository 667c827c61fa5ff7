"""The rounds of a seeds-until-decided study: from the results so far, what each comparison decided
at which look, and which seeds each variant and the baseline run next.

Pure functions over plain dicts (variant -> {seed: metric}); the record they return
(pipeline.deciding.record) is the same for the same inputs. Design decisions:
- One seed order, fixed before the study: the user's `seeds` as listed, then the next integers
  above the largest, up to the budget. Look k uses the first looks[k] seeds of it, so a look's
  seeds never depend on earlier results (the proof in pipeline.deciding.rule needs this); seeds
  are never dropped, reordered or rerun.
- Paired runs only: a comparison takes a look when the variant and the baseline both have every
  seed of it. A seed only one side has, or a seed outside the order, is not used.
- The record is recomputed from the results every round, taking the looks in order: a comparison
  stops at the first look that decides it and ignores any later seeds it may have, so the record
  does not depend on how many rounds it took to get there.
- Only open comparisons get seeds: a variant needs the seeds of its next look that it lacks; the
  baseline needs the seeds of the open variants' next looks that it lacks (in a study run round by
  round, the union of what they need).
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import numpy as np

from pipeline.deciding.record import Baseline, Comparison, Record, Shape
from pipeline.deciding.rule import DECIDED, Plan, decide


def seed_order(seeds: Sequence[int], budget: int) -> list[int]:
    """The study's seeds in the order they are used: `seeds` as listed, then max(seeds) + 1, + 2, ...
    until there are `budget` of them."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must list at least one seed")
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in seeds):
        raise ValueError(f"seeds must be integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {seeds!r}")
    if len(seeds) > budget:  # dropping the user's seeds would leave runs out of the study
        raise ValueError(f"seeds lists {len(seeds)} seeds, more than the budget of {budget}")
    top = max(seeds)
    return [int(s) for s in seeds] + list(range(top + 1, top + 1 + budget - len(seeds)))


def _paired_prefix(order: list[int], variant: Mapping[int, float], baseline: Mapping[int, float]) -> int:
    """How many seeds at the start of `order` both sides have."""
    n = 0
    for s in order:
        if s not in variant or s not in baseline:
            break
        n += 1
    return n


def plan_fingerprint(*, baseline: str, variants: Sequence[str], seeds: Sequence[int], looks: Sequence[int],
                     alpha: float, margin: float | None, metric: str | None, method: str = "t",
                     boundary: str = "bonferroni", rho: float = 1.0) -> str:
    """What the study was planned as, hashed: every look's verdict depends on it, so a study whose
    rounds ran under one fingerprint cannot go on under another (pipeline/grid/decide.py). `metric`
    as params.yaml names it (report.primary_metric; None: the report's default for the task)."""
    import hashlib

    plan = {"baseline": baseline, "variants": sorted(variants), "seeds": [int(s) for s in seeds],
            "looks": [int(n) for n in looks], "alpha": float(alpha),
            "margin": None if margin is None else float(margin), "metric": metric, "method": method}
    if boundary != "bonferroni":  # a Bonferroni study's fingerprint stays what it was before boundaries
        plan.update(boundary=boundary, rho=float(rho) if boundary == "rho" else None)
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]


FAR_OUT = 3.5  # robust z (Iglewicz & Hoaglin's modified z-score): |d - median| / (1.4826 MAD)


def shape(diffs: Sequence[float], seeds: Sequence[int]) -> dict:
    """Whether the per-seed differences look like the t-model's normal draws: their sample skewness
    (adjusted, G1) against twice its standard error under normality, and the seeds far out by a
    robust rule (modified z-score above FAR_OUT; none where over half the differences are equal).
    `doubtful`: a skew beyond 2 SE, or a seed far out. A weak check at a few seeds, said so."""
    d = np.asarray(diffs, dtype=float)
    n = d.size
    out: dict = {"n": int(n), "skew": None, "skew_se": None, "far_out": [], "doubtful": False}
    if n < 3:
        return out
    spread = float(d.std(ddof=1))
    if spread > 0:
        g1 = float(np.mean((d - d.mean()) ** 3) / np.mean((d - d.mean()) ** 2) ** 1.5)
        out["skew"] = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    out["skew_se"] = math.sqrt(6 * n * (n - 1) / ((n - 2) * (n + 1) * (n + 3)))
    mad = float(np.median(np.abs(d - np.median(d))))
    if mad > 0:
        z = np.abs(d - np.median(d)) / (1.4826 * mad)
        out["far_out"] = [int(s) for s, zi in zip(seeds, z) if zi > FAR_OUT]
    out["doubtful"] = bool(out["far_out"]) or (out["skew"] is not None and abs(out["skew"]) > 2 * out["skew_se"])
    return out


def _comparison(name: str, variant: Mapping[int, float], baseline: Mapping[int, float], order: list[int],
                plan: Plan, higher_is_better: bool) -> Comparison:
    paired = _paired_prefix(order, variant, baseline)
    ready = sum(1 for n in plan.looks if n <= paired)  # looks whose seeds both sides have
    diffs = [variant[s] - baseline[s] for s in order[:paired]]
    looks = []
    for k in range(ready):
        try:
            decision = decide(diffs, plan, k, higher_is_better)
        except ValueError as err:  # a non-finite metric: say which variant, not just that one is
            raise ValueError(f"{name}: {err}") from None
        looks.append(decision)
        if decision.verdict in DECIDED:
            break
    state = looks[-1].verdict if looks else "continue"
    open_ = state == "continue"
    next_look = plan.looks[len(looks)] if open_ else None
    needs = [s for s in order[:next_look] if s not in variant] if open_ else []
    # The values the looks were computed from, so that anyone can recompute every look (the paired
    # differences are these minus the baseline's, seed by seed in seed_order).
    return Comparison(looks, state, next_look, needs, sum(1 for s in order if s in variant),
                      {s: variant[s] for s in order if s in variant}, diffs, Shape(**shape(diffs, order[:paired])))


def step(results: Mapping[str, Mapping[int, float]], plan: Plan, seeds: Sequence[int], higher_is_better: bool,
         *, baseline: str, metric: str, fingerprint: str | None) -> Record:
    """The study's record from `results` (variant -> {seed: metric}, the baseline included under
    `baseline`; a variant with no runs yet as {}): per variant the looks taken, its state, the seed
    count of its next look and the seeds it needs for it; the seeds the baseline needs.
    `higher_is_better` is the direction of `metric` (pipeline.reporting.stats.higher_is_better);
    `fingerprint` the plan's (plan_fingerprint)."""
    if baseline not in results:
        raise ValueError(f"results has no baseline {baseline!r}")
    names = sorted(v for v in results if v != baseline)
    if len(names) != plan.comparisons:  # the Bonferroni level counts every comparison of the study
        raise ValueError(f"plan.comparisons is {plan.comparisons} but results has {len(names)} variants "
                         f"besides the baseline: {names}")
    order = seed_order(seeds, plan.budget)
    base = results[baseline]
    variants = {v: _comparison(v, results[v], base, order, plan, higher_is_better) for v in names}
    wanted = {s for rec in variants.values() if rec.next_look is not None for s in order[:rec.next_look]}
    base_needs = [s for s in order if s in wanted and s not in base]
    return Record(plan, bool(higher_is_better), order,
                  Baseline(baseline, sum(1 for s in order if s in base), base_needs,
                           {s: base[s] for s in order if s in base}),
                  variants, metric, fingerprint)
