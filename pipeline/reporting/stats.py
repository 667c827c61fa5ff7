"""Statistics for the report: mean and 95% t-interval over seeds, and paired deltas vs the baseline.

Pure functions over plain floats: no files, no formatting. Design decisions:
- The interval is Student's t (`scipy.stats.t`): runs have a handful of seeds, and a normal interval
  would be too narrow at n = 2..5.
- Deltas are paired by seed (variant at seed s minus baseline at seed s), tested with
  `scipy.stats.ttest_rel`: a seed fixes init and data order for both runs, so pairing removes the
  seed-to-seed spread they share. Only seeds present in both are paired.
- With fewer than two values there is no interval and no test; with zero variance the t statistic
  is 0/0 or infinite. Both cases come back as a note instead of NaN, so the report can say so.
- Power of the paired t-test comes from the noncentral t distribution (`scipy.stats.nct`): with
  n pairs and a true mean difference of d standard deviations of the differences, the t statistic
  is noncentral t with n - 1 degrees of freedom and noncentrality d * sqrt(n). From it: the minimum
  detectable effect (the difference found with 80% power) and the seeds an effect would need.
- Multiplicity: `holm` gives Holm's step-down adjusted p-values (controls the family-wise error
  rate under any dependence between the tests, and never rejects less than Bonferroni).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq

ALPHA = 0.05  # two-sided test level and 1 - confidence of every interval in the report
POWER = 0.8  # the conventional target power (Cohen 1988) of the detectable effects in the report
MAX_SEEDS = 10_000  # seeds_needed() stops searching here: beyond it the answer is "more than this"

# Direction of every metric the report knows; a metric not listed here is not reported.
LOWER_IS_BETTER = frozenset(
    {"val_loss", "val_ppl", "test_loss", "test_ppl", "train_loss", "bits_per_token", "bits_per_char",
     "bits_per_byte"}
)
HIGHER_IS_BETTER = frozenset({"rouge1", "rouge2", "rougeL", "rougeLsum", "bleu", "chrf"})

NOT_SIGNIFICANT = f"no significant difference at {ALPHA:.0%}"


def higher_is_better(metric: str) -> bool:
    """True for metrics where a larger value is better (ROUGE, BLEU, chrF); KeyError if unknown."""
    if metric in HIGHER_IS_BETTER:
        return True
    if metric in LOWER_IS_BETTER:
        return False
    raise KeyError(f"no known direction for metric {metric!r}")


def _zero_variance(values: np.ndarray) -> bool:
    # Relative tolerance: values that differ only by float round-off would otherwise give an
    # absurd t statistic (a difference of 1e-16 "significant" at p ~ 0).
    scale = max(1.0, float(np.max(np.abs(values))))
    return float(np.ptp(values)) <= 1e-12 * scale


@dataclass(frozen=True)
class Summary:
    """Mean over seeds with a t-interval `mean ± half_width`; `note` says why an interval is absent."""

    n: int
    mean: float | None  # None when there are no values
    half_width: float | None  # None when no interval can be given (n < 2)
    note: str  # "" | "no data" | "n=1: no interval" | "zero variance"

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half_width is None else self.mean + self.half_width


def summarize(values: Sequence[float], confidence: float = 1 - ALPHA) -> Summary:
    """Mean and two-sided t-interval of `values` (finite floats, one per seed)."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return Summary(0, None, None, "no data")
    if not np.all(np.isfinite(x)):
        raise ValueError("summarize() needs finite values; drop missing/non-finite ones first")
    mean = float(x.mean())
    if x.size == 1:
        return Summary(1, mean, None, "n=1: no interval")
    if _zero_variance(x):
        return Summary(int(x.size), mean, 0.0, "zero variance")
    sem = float(x.std(ddof=1)) / math.sqrt(x.size)
    t_crit = float(sps.t.ppf(0.5 + confidence / 2, df=x.size - 1))
    return Summary(int(x.size), mean, t_crit * sem, "")


@dataclass(frozen=True)
class Delta:
    """Paired difference variant - baseline over the seeds both have, with test and verdict."""

    n: int  # number of paired seeds
    mean: float | None
    half_width: float | None  # t-interval half-width of the mean difference; None if n < 2
    p_value: float | None  # paired t-test; None when no test can be made
    verdict: str  # "better" | "worse" | NOT_SIGNIFICANT | a reason no test was made
    sd: float | None = None  # standard deviation (ddof=1) of the per-seed differences; None if n < 2


def paired_delta(
    variant: Mapping[int, float],
    baseline: Mapping[int, float],
    higher_better: bool,
    alpha: float = ALPHA,
) -> Delta:
    """Delta of `variant` vs `baseline` (seed -> value), paired on the seeds present in both."""
    seeds = sorted(set(variant) & set(baseline))
    if not seeds:
        return Delta(0, None, None, None, "no paired seeds")
    v = np.array([variant[s] for s in seeds], dtype=float)
    b = np.array([baseline[s] for s in seeds], dtype=float)
    d = v - b
    summary = summarize(d, confidence=1 - alpha)
    if len(seeds) == 1:
        return Delta(1, summary.mean, None, None, "n=1: no test")
    if _zero_variance(d):
        # No t statistic exists, but the answer is still plain: equal in every seed, or the same
        # shift in every seed.
        if np.all(d == 0):
            verdict = f"no significant difference at {alpha:.0%} (identical values, zero variance: no test)"
        else:
            direction = "better" if (summary.mean > 0) == higher_better else "worse"
            verdict = f"{direction} (constant difference in every seed, zero variance: no test)"
        return Delta(len(seeds), summary.mean, 0.0, None, verdict, 0.0)
    p = float(sps.ttest_rel(v, b).pvalue)
    verdict = verdict_for(summary.mean, p, higher_better, alpha)
    return Delta(len(seeds), summary.mean, summary.half_width, p, verdict, float(d.std(ddof=1)))


def verdict_for(mean: float, p: float, higher_better: bool, alpha: float = ALPHA) -> str:
    """'better' or 'worse' (by the metric's direction) when p < alpha, else not significant."""
    if p >= alpha:
        return f"no significant difference at {alpha:.0%}"
    return "better" if (mean > 0) == higher_better else "worse"


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the input order: reject test i at level a iff adjusted p_i < a.

    Sorted ascending, the j-th smallest (j = 0..m-1) is multiplied by m - j; a running maximum
    keeps the adjusted values in the same order as the raw ones (step-down), capped at 1.
    """
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for j, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - j) * p_values[i]))
        adjusted[i] = running
    return adjusted


def paired_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at level `alpha` with `n` pairs, when the true mean
    difference is `effect` standard deviations of the differences (Cohen's d_z)."""
    df, nc = n - 1, abs(effect) * math.sqrt(n)
    t_crit = float(sps.t.ppf(1 - alpha / 2, df))
    # Both tails as survival functions: scipy's nct.cdf can return NaN far in the lower tail,
    # its sf with the noncentrality negated (the mirror image) does not.
    return float(sps.nct.sf(t_crit, df, nc) + sps.nct.sf(t_crit, df, -nc))


def detectable_effect(n: int, power: float = POWER, alpha: float = ALPHA) -> float | None:
    """The smallest effect (in sd of the differences) the paired t-test detects with `power`;
    None for n < 2, where there is no test."""
    if n < 2:
        return None
    high = 1.0
    while paired_power(high, n, alpha) < power:  # power grows with the effect: bracket, then solve
        high *= 2
    return float(brentq(lambda e: paired_power(e, n, alpha) - power, 0.0, high, xtol=1e-10))


def seeds_needed(effect: float, power: float = POWER, alpha: float = ALPHA) -> int | None:
    """The fewest pairs (>= 2) with which the paired t-test detects `effect` (in sd of the
    differences) with `power`; None for a zero effect or one needing more than MAX_SEEDS."""
    if effect == 0 or paired_power(effect, MAX_SEEDS, alpha) < power:
        return None
    low, high = 1, MAX_SEEDS  # power(low) < power <= power(high); power grows with n
    while high - low > 1:
        mid = (low + high) // 2
        if mid >= 2 and paired_power(effect, mid, alpha) >= power:
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class Welch:
    """Our mean minus an outside reference's (unpaired: different code, seeds and machines)."""

    diff: float
    half_width: float  # 95% Welch t-interval of the difference
    p_value: float  # two-sided Welch t-test
    df: float  # Welch-Satterthwaite degrees of freedom


def sd_from_interval(half_width: float, n: int, confidence: float = 1 - ALPHA) -> float:
    """The standard deviation behind a t-interval `mean ± half_width` over n values."""
    return half_width * math.sqrt(n) / float(sps.t.ppf(0.5 + confidence / 2, df=n - 1))


def welch(mean: float, sd: float, n: int, ref_mean: float, ref_sd: float, ref_n: int,
          confidence: float = 1 - ALPHA) -> Welch | None:
    """Welch's t-test and interval of `mean - ref_mean` from summary statistics (sd with ddof=1);
    None without a spread on either side (n < 2, or both sds zero)."""
    if n < 2 or ref_n < 2:
        return None
    v, v_ref = sd ** 2 / n, ref_sd ** 2 / ref_n
    if v + v_ref == 0:
        return None
    df = (v + v_ref) ** 2 / (v ** 2 / (n - 1) + v_ref ** 2 / (ref_n - 1))
    p = float(sps.ttest_ind_from_stats(mean, sd, n, ref_mean, ref_sd, ref_n, equal_var=False).pvalue)
    half = float(sps.t.ppf(0.5 + confidence / 2, df)) * math.sqrt(v + v_ref)
    return Welch(mean - ref_mean, half, p, df)
