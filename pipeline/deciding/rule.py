"""The sequential stopping rule: each ablation vs the baseline, decided at seed counts fixed in advance.

At look k every open comparison gets an interval for its paired difference (variant - baseline over
its first n_k seeds): a t-interval at level 1 - alpha / (m K) (Bonferroni over the m comparisons and
K looks), mean +- c_k s / sqrt(n_k) with critical values exact for nested looks (a spending boundary:
pipeline/deciding/boundary.py), or the order-statistic interval for the median (method "median").
Its verdict: worse / better when the interval excludes 0, equivalent when it lies inside
(-margin, margin), otherwise continue, or undecided at the last look. Every interval that could
ever be computed covers its difference at once with probability >= 1 - alpha, whatever the
stopping, so every verdict holds with that probability. The rule, its proof and what it does not
promise: docs/seeds-until-decided.md#the-rule-and-its-guarantee; tests/test_deciding.py checks it by
simulation. Zero variance (every seed gives the same difference) gives the point as interval, said
in a note and stating no direction, as pipeline.reporting.stats does.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import stats as sps

from pipeline.deciding.boundary import SPENDING, criticals, nominal

DECIDED = ("worse", "better", "equivalent")  # a comparison with one of these takes no later look
VERDICTS = DECIDED + ("continue", "undecided")
ZERO_VARIANCE = ("zero variance: every seed gives the same difference, so the interval is that point, "
                 "which states no direction")
INSIDE_MARGIN = "inside the margin too: a difference smaller than the margin"
# The tolerance of pipeline.reporting.stats (its _zero_variance): differences that differ only by
# float round-off must not give an absurdly narrow interval.
ZERO_VARIANCE_RTOL = 1e-12
METHODS = ("t", "median")
BOUNDARIES = ("bonferroni",) + SPENDING


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


@dataclass(frozen=True)
class Plan:
    """What a sequential study fixes before its first run (validated here, once)."""

    looks: tuple[int, ...]  # seed counts at which each open comparison is decided; the last is the budget
    alpha: float  # family-wise error: P(any reported interval misses its difference) <= alpha
    margin: float | None  # delta: an interval inside (-delta, delta) is "equivalent"; None decides signs only
    comparisons: int  # m, the ablations compared with the baseline: Bonferroni counts every one
    method: str = "t"  # "t": t-intervals for the mean difference; "median": order statistics, no normality
    # How the looks share each comparison's error alpha / m: "bonferroni" (alpha / (m K) at every
    # look) or a Lan–DeMets spending function (pipeline/deciding/boundary.py; method t only)
    boundary: str = "bonferroni"
    rho: float = 1.0  # the exponent of boundary "rho"

    def __post_init__(self) -> None:
        if isinstance(self.looks, (str, bytes)) or not isinstance(self.looks, (Sequence, np.ndarray)):
            raise ValueError(f"Plan.looks must be a sequence of seed counts, got {self.looks!r}")
        looks = tuple(self.looks)
        if not looks or not all(_is_int(n) for n in looks):
            raise ValueError(f"Plan.looks must be a non-empty list of integer seed counts, got {self.looks!r}")
        looks = tuple(int(n) for n in looks)
        if looks[0] < 2:
            raise ValueError(f"Plan.looks must start at 2 seeds or more (a t-interval needs two), got {looks}")
        if any(b <= a for a, b in zip(looks, looks[1:])):
            raise ValueError(f"Plan.looks must be strictly increasing, got {looks}")
        if not _is_real(self.alpha) or not 0 < self.alpha < 1:
            raise ValueError(f"Plan.alpha must be in (0, 1), got {self.alpha!r}")
        if self.margin is not None and (
            not _is_real(self.margin) or not math.isfinite(self.margin) or self.margin <= 0
        ):
            raise ValueError(f"Plan.margin must be None or a finite number > 0, got {self.margin!r}")
        if not _is_int(self.comparisons) or self.comparisons < 1:
            raise ValueError(f"Plan.comparisons must be an integer >= 1, got {self.comparisons!r}")
        if self.method not in METHODS:
            raise ValueError(f"Plan.method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"Plan.boundary must be one of {', '.join(BOUNDARIES)}, got {self.boundary!r}")
        if self.method == "median" and self.boundary != "bonferroni":
            raise ValueError("Plan.boundary: method median takes boundary bonferroni only (a spending boundary "
                             "is calibrated for t statistics)")
        if not _is_real(self.rho) or not 0 < self.rho < math.inf:
            raise ValueError(f"Plan.rho must be a number > 0, got {self.rho!r}")
        object.__setattr__(self, "looks", looks)  # frozen: normalised once (a list from YAML -> tuple)
        object.__setattr__(self, "alpha", float(self.alpha))
        object.__setattr__(self, "margin", None if self.margin is None else float(self.margin))
        object.__setattr__(self, "comparisons", int(self.comparisons))
        object.__setattr__(self, "rho", float(self.rho))
        if self.method == "median" and median_rank(self.budget, self.level) is None:
            raise ValueError(f"Plan.looks: with method median no look can decide at level {self.level:.4f}: "
                             f"the budget must be at least {min_seeds(self.level)} seeds, got {self.budget}")

    @property
    def level(self) -> float:
        """Bonferroni's level of every interval: 1 - alpha / (comparisons * looks)."""
        return 1 - self.alpha / (self.comparisons * len(self.looks))

    @cached_property  # every interval reads it: computed once per plan
    def criticals(self) -> tuple[float, ...]:
        """The t-interval's critical value at each look (inf: no verdict can come at that look)."""
        if self.boundary == "bonferroni":
            return tuple(float(sps.t.isf((1 - self.level) / 2, n - 1)) for n in self.looks)
        return criticals(self.looks, self.alpha / self.comparisons, self.boundary, self.rho)

    @cached_property  # every interval reads it: computed once per plan
    def levels(self) -> tuple[float, ...]:
        """Each look's interval as a fixed-n interval's coverage (Bonferroni: `level` at every look)."""
        if self.boundary == "bonferroni" or self.method == "median":
            return (self.level,) * len(self.looks)
        return tuple(nominal(c, n) for c, n in zip(self.criticals, self.looks))

    @property
    def budget(self) -> int:
        """The most seeds any variant runs: the last look."""
        return self.looks[-1]

    @property
    def first_look(self) -> int:
        """The first look's seed count at which an interval can exclude anything (t: the first look)."""
        if self.method == "t":
            return next((n for n, c in zip(self.looks, self.criticals) if math.isfinite(c)), self.budget)
        return next(n for n in self.looks if median_rank(n, self.level) is not None)

    def to_json(self) -> dict:
        out = {"looks": list(self.looks), "alpha": self.alpha, "margin": self.margin,
               "comparisons": self.comparisons, "level": self.level, "method": self.method,
               "first_look": self.first_look}  # level: Bonferroni's (a spending plan's are `levels`)
        if self.boundary != "bonferroni":  # records of the Bonferroni rule keep their shape
            out.update(boundary=self.boundary, levels=list(self.levels),
                       criticals=[c if math.isfinite(c) else None for c in self.criticals])
            if self.boundary == "rho":
                out["rho"] = self.rho
        return out


@dataclass(frozen=True)
class Decision:
    """One comparison at one look: the mean difference, its interval at the plan's level, the verdict."""

    n: int  # paired seeds used: the look's seed count
    mean: float  # mean difference variant - baseline
    lo: float  # the look's interval (Plan.levels)
    hi: float
    verdict: str  # one of VERDICTS
    note: str = ""  # "" | ZERO_VARIANCE | INSIDE_MARGIN (joined with "; " when both)

    def to_json(self) -> dict:
        return {"n": self.n, "mean": self.mean, "lo": self.lo, "hi": self.hi, "verdict": self.verdict,
                "note": self.note}


def t_interval(diffs: np.ndarray, level: float | None = None,
               critical: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean and two-sided Student t-interval at `level` (or with the critical value `critical`, inf
    for an unbounded one) over the last axis of `diffs` (n >= 2 values), and where they have zero
    variance (there the interval is the mean itself, not NaN)."""
    d = np.asarray(diffs, dtype=float)
    n = d.shape[-1]
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 differences, got {n}")
    mean = d.mean(axis=-1)
    constant = np.ptp(d, axis=-1) <= ZERO_VARIANCE_RTOL * np.maximum(1.0, np.abs(d).max(axis=-1))
    c = float(sps.t.isf((1 - level) / 2, n - 1)) if critical is None else critical
    with np.errstate(invalid="ignore"):  # inf x 0 spread: a constant, handled below
        half = c * d.std(axis=-1, ddof=1) / math.sqrt(n)
    half = np.where(constant, 0.0, half)
    return mean, mean - half, mean + half, constant


def median_rank(n: int, level: float) -> int | None:
    """The largest k with 2 P(Binomial(n, 1/2) <= k - 1) <= 1 - level: [d_(k), d_(n+1-k)] covers the
    median with probability >= level. None where even k = 1 does not (too few seeds)."""
    k = int(sps.binom.ppf((1 - level) / 2, n, 0.5))  # the smallest j with P(B <= j) >= (1 - level) / 2
    while k >= 0 and 2 * sps.binom.cdf(k, n, 0.5) > 1 - level:
        k -= 1
    return k + 1 if k >= 0 else None


def min_seeds(level: float) -> int:
    """The fewest seeds for which a median interval exists at `level`."""
    return math.ceil(1 - math.log2(1 - level))


def median_interval(diffs: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Median and the order-statistic interval at `level` over the last axis (-inf, inf where the
    seeds are too few), and where the differences are all equal (a zero-width interval)."""
    d = np.sort(np.asarray(diffs, dtype=float), axis=-1)
    n = d.shape[-1]
    centre = np.median(d, axis=-1)
    constant = np.ptp(d, axis=-1) <= ZERO_VARIANCE_RTOL * np.maximum(1.0, np.abs(d).max(axis=-1))
    k = median_rank(n, level)
    if k is None:
        return centre, np.full(centre.shape, -np.inf), np.full(centre.shape, np.inf), constant
    return centre, d[..., k - 1], d[..., n - k], constant


def interval(diffs: np.ndarray, plan: "Plan", look: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The plan's interval at look `look`: the t-interval of the mean with the boundary's critical
    value there, or the median's at the Bonferroni level."""
    if plan.method == "median":
        return median_interval(diffs, plan.level)
    return t_interval(diffs, critical=plan.criticals[look])


def _verdicts(lo: np.ndarray, hi: np.ndarray, margin: float | None, final: np.ndarray | bool,
              higher_is_better: bool, constant: np.ndarray | bool = False) -> np.ndarray:
    """The verdict of each interval (elementwise); `final` marks the last look, `constant` the
    zero-width intervals (every seed the same difference)."""
    above, below = "better", "worse"  # an interval above 0: the variant's metric is higher
    if not higher_is_better:
        above, below = below, above
    inside = np.zeros(np.shape(lo), dtype=bool) if margin is None else (lo > -margin) & (hi < margin)
    # Sign first: an interval that excludes 0 and lies inside the margin states a direction (a note
    # in decide() says it is smaller than the margin); both statements are covered by the proof.
    # A zero-width interval states no direction: the t-model has no spread to test against, and
    # differences that are round-off (3e-16, 1e-16, 2e-16) would otherwise read as a sign. It can
    # still lie inside the margin (identical runs: equivalent).
    signed = ~np.asarray(constant, dtype=bool)
    verdict = np.select([signed & (lo > 0), signed & (hi < 0), inside], [above, below, "equivalent"],
                        default="continue")
    return np.where(np.asarray(final) & (verdict == "continue"), "undecided", verdict)


def decide(diffs: Sequence[float], plan: Plan, look: int, higher_is_better: bool = False) -> Decision:
    """The verdict at look `look` (an index into plan.looks) from the paired differences
    variant - baseline, seed by seed in the study's seed order; the first plan.looks[look] are used."""
    if not _is_int(look) or not 0 <= look < len(plan.looks):
        raise ValueError(f"look must be an index into plan.looks (0..{len(plan.looks) - 1}), got {look!r}")
    n = plan.looks[look]
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1:
        raise ValueError(f"decide() takes one comparison's differences (1-D), got shape {d.shape}")
    if d.size < n:
        raise ValueError(f"look {look} needs {n} paired differences, got {d.size}")
    d = d[:n]
    if not np.all(np.isfinite(d)):
        raise ValueError("decide() needs finite differences; a diverged run must be dealt with first")
    mean, lo, hi, constant = interval(d, plan, look)
    verdict = str(_verdicts(lo, hi, plan.margin, look == len(plan.looks) - 1, higher_is_better, constant))
    notes = [ZERO_VARIANCE] if constant else []
    if verdict in ("worse", "better") and plan.margin is not None and -plan.margin < lo and hi < plan.margin:
        notes.append(INSIDE_MARGIN)
    return Decision(n, float(mean), float(lo), float(hi), verdict, "; ".join(notes))


@dataclass(frozen=True, eq=False)
class Trace:
    """The rule run over complete studies: every look computed, those after `stop` not taken."""

    mean: np.ndarray  # (..., K) mean difference at each look
    lo: np.ndarray  # (..., K)
    hi: np.ndarray  # (..., K)
    verdict: np.ndarray  # (..., K) strings, as decide() gives them
    stop: np.ndarray  # (...,) index of the last look taken: the first that decides, else K - 1

    @property
    def taken(self) -> np.ndarray:
        """(..., K) True for the looks the rule takes (the intervals it reports)."""
        return np.arange(self.verdict.shape[-1]) <= self.stop[..., None]

    @property
    def final(self) -> np.ndarray:
        """(...,) the verdict of the last look taken."""
        return np.take_along_axis(self.verdict, self.stop[..., None], axis=-1)[..., 0]


def decide_all(diffs: np.ndarray, plan: Plan, higher_is_better: bool = False) -> Trace:
    """The whole rule on complete studies: `diffs` has shape (..., n >= plan.budget), one row of paired
    differences per comparison; the same intervals and verdicts as decide() at every look, and where
    each comparison stops. For simulation (tests/test_deciding.py) and planning: a real study only
    ever has the seeds of the looks it took (pipeline.deciding.rounds)."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim < 1 or d.shape[-1] < plan.budget:
        raise ValueError(f"decide_all() needs {plan.budget} differences per comparison, got shape {d.shape}")
    parts = [interval(d[..., :n], plan, k) for k, n in enumerate(plan.looks)]
    mean, lo, hi, constant = (np.stack([p[i] for p in parts], axis=-1) for i in range(4))
    final = np.arange(len(plan.looks)) == len(plan.looks) - 1
    verdict = _verdicts(lo, hi, plan.margin, final, higher_is_better, constant)
    decided = np.isin(verdict, DECIDED)
    stop = np.where(decided.any(axis=-1), decided.argmax(axis=-1), len(plan.looks) - 1)
    return Trace(mean, lo, hi, verdict, stop)
