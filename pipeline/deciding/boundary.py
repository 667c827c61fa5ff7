"""Group-sequential boundaries for the t statistics of nested looks: Lan–DeMets alpha spending,
exact for Student's t up to Monte Carlo error.

Why they can be exact. With normal paired differences the pivots T_k = sqrt(n_k) (mean_k - Delta)
/ s_k at the looks n_1 < ... < n_K are functions of the standardised differences alone, so their
joint law depends on neither Delta nor sigma. Critical values c_k with

    P(|T_j| <= c_j for every j < k, |T_k| > c_k) = a(tau_k) - a(tau_{k-1}),  tau_k = n_k / n_K,

make P(some |T_k| > c_k) = a(1) = alpha' (the spending function a, two-sided). Then the repeated
confidence intervals mean_k +- c_k s_k / sqrt(n_k) cover Delta at every look at once with
probability 1 - alpha' (Jennison & Turnbull 2000, ch. 9), whatever the stopping: the rule's proof
(pipeline/deciding/rule.py) goes through with this in place of the union bound over the looks.
Plugging normal boundaries into t statistics is not this: at n = 3 it nearly doubles the error.

How. The first look's c_1 is Student's t quantile (exact). The later ones come from one seeded
simulation of that law (PATHS paths of n_K standard normals): c_k is the order statistic of |T_k|
among the paths not yet stopped that spends what is left of a(tau_k). Where that is less than
one path, c_k is infinite (no verdict can come at that look) and the unspent share carries to the
next. Monte Carlo error of the error rate: sqrt(alpha' / PATHS), 0.0002 at alpha' 0.05. Same
looks, alpha', function and seed: the same values on every machine (numpy's generator streams are
fixed), computed once per process.

Spending functions, two-sided alpha' (Lan & DeMets 1983; Kim & DeMets 1987):
- obf     2 - 2 Phi(z_{1 - alpha'/2} / sqrt(tau)): O'Brien–Fleming-type, spends almost nothing early
- pocock  alpha' log(1 + (e - 1) tau): Pocock-type, nearly even
- rho     alpha' tau^rho (rho 1: linear; 3: close to obf)
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats as sps

SPENDING = ("obf", "pocock", "rho")
PATHS = 1_000_000
SEED = 20_261_128  # the simulation's; tests draw their studies from other seeds
_CHUNK = 100_000


def spent(kind: str, tau: float, alpha: float, rho: float = 1.0) -> float:
    """a(tau): the share of the two-sided error alpha spent by information fraction tau in [0, 1]."""
    if not 0 <= tau <= 1:
        raise ValueError(f"information fraction must be in [0, 1], got {tau}")
    if tau == 0:
        return 0.0
    if kind == "obf":
        return float(2 * sps.norm.sf(sps.norm.isf(alpha / 2) / math.sqrt(tau)))
    if kind == "pocock":
        return alpha * math.log1p((math.e - 1) * tau)
    if kind == "rho":
        return alpha * tau ** rho
    raise ValueError(f"spending function must be one of {', '.join(SPENDING)}, got {kind!r}")


def pivots(looks: tuple[int, ...], paths: int, seed: int) -> np.ndarray:
    """|T_k| at each look for `paths` simulated studies of standard normal differences: (paths, K)."""
    rng = np.random.default_rng(seed)
    idx = np.asarray(looks) - 1
    n = np.asarray(looks, dtype=float)
    out = np.empty((paths, len(looks)))
    for start in range(0, paths, _CHUNK):
        x = rng.standard_normal((min(_CHUNK, paths - start), looks[-1]))
        mean = np.cumsum(x, axis=1)[:, idx] / n
        ss = np.cumsum(x * x, axis=1)[:, idx] - n * mean * mean
        out[start:start + len(x)] = np.sqrt(n) * np.abs(mean) / np.sqrt(ss / (n - 1))
    return out


@lru_cache(maxsize=16)
def criticals(looks: tuple[int, ...], alpha: float, kind: str, rho: float = 1.0, paths: int = PATHS,
              seed: int = SEED) -> tuple[float, ...]:
    """c_1..c_K for the two-sided error `alpha` (the plan's alpha / m) spent by `kind`."""
    if looks[0] < 2:
        raise ValueError(f"looks must start at 2 seeds or more, got {looks}")
    budget = [spent(kind, n / looks[-1], alpha, rho) for n in looks]
    t = pivots(looks, paths, seed)
    first = float(sps.t.isf(budget[0] / 2, looks[0] - 1)) if budget[0] > 0 else math.inf
    out, alive = [first], t[:, 0] <= first
    for k in range(1, len(looks)):
        crossed = paths - int(alive.sum())  # paths stopped at earlier looks
        quota = int(math.floor(budget[k] * paths)) - crossed  # paths this look may stop
        left = np.sort(t[alive, k])[::-1]
        c = math.inf if quota < 1 else float(left[min(quota, len(left)) - 1])
        c = math.nextafter(c, math.inf) if math.isfinite(c) else c  # |T| > c stops exactly `quota` paths
        out.append(c)
        alive &= t[:, k] <= c
    return tuple(out)


def nominal(c: float, n: int) -> float:
    """The two-sided coverage of one fixed-n t-interval with critical value c at n seeds."""
    return 1.0 if math.isinf(c) else float(1 - 2 * sps.t.sf(c, n - 1))
