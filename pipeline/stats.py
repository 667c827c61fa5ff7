"""Statistics for the report: mean and 95% t-interval over seeds, and paired deltas vs the baseline.

Pure functions over plain floats: no files, no formatting. Design decisions:
- The interval is Student's t (`scipy.stats.t`): runs have a handful of seeds, and a normal interval
  would be too narrow at n = 2..5.
- Deltas are paired by seed (variant at seed s minus baseline at seed s), tested with
  `scipy.stats.ttest_rel`: a seed fixes init and data order for both runs, so pairing removes the
  seed-to-seed spread they share. Only seeds present in both are paired.
- With fewer than two values there is no interval and no test; with zero variance the t statistic
  is 0/0 or infinite. Both cases come back as a note instead of NaN, so the report can say so.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05  # two-sided test level and 1 - confidence of every interval in the report

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
        return Delta(len(seeds), summary.mean, 0.0, None, verdict)
    p = float(sps.ttest_rel(v, b).pvalue)
    if p >= alpha:
        verdict = f"no significant difference at {alpha:.0%}"
    else:
        improved = (summary.mean > 0) == higher_better
        verdict = "better" if improved else "worse"
    return Delta(len(seeds), summary.mean, summary.half_width, p, verdict)
