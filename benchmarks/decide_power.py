"""The price of seeds until decided, by simulation: how often each rule decides, and with how many
runs, against the fixed design that runs every variant at the budget.

Run: python -m benchmarks.decide_power [--studies 20000] [--seed 0]
Prints one JSON object, whose table and columns docs/seeds-until-decided.md#the-price gives. The
paired differences of the m comparisons are correlated 0.5 (a shared baseline, as
tests/test_deciding.py simulates); `fixed_power` is exact (noncentral t).
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
from scipy import stats as sps

from pipeline.deciding.rule import Plan, decide_all

LOOKS = (3, 5, 8, 12, 20)
ALPHA = 0.05
COMPARISONS = (1, 3, 5)
EFFECTS = (0.5, 0.8, 1.5)
RULES = {"t": ("t", "bonferroni"), "obf": ("t", "obf"), "pocock": ("t", "pocock"), "median": ("median", "bonferroni")}


def fixed_power(delta: float, n: int, level: float) -> float:
    """Power of a two-sided paired t-test at `level` with n differences of sd 1 and mean delta."""
    crit = float(sps.t.isf(level / 2, n - 1))
    nc = delta * math.sqrt(n)
    return float(sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc))


def simulate(m: int, delta: float, rule: str, studies: int, rng) -> dict:
    plan = Plan(LOOKS, ALPHA, None, m, *RULES[rule])
    e = rng.standard_normal((studies, m + 1, plan.budget))
    diffs = delta + (e[:, 1:] - e[:, :1]) / math.sqrt(2)
    trace = decide_all(diffs, plan, higher_is_better=True)
    used = np.asarray(LOOKS)[trace.stop]  # (studies, m): seeds each comparison ran
    runs = used.sum(axis=1) + used.max(axis=1)  # the variants' and the baseline's
    return {"decided": float((trace.final == "better").mean()), "seeds": float(used.mean()),
            "runs": float(runs.mean() / ((m + 1) * plan.budget))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--studies", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for m in COMPARISONS:
        for delta in EFFECTS:
            row = {"comparisons": m, "delta_sd": delta, "fixed_power": round(fixed_power(delta, LOOKS[-1], ALPHA / m), 3)}
            for rule in RULES:
                got = simulate(m, delta, rule, args.studies, rng)
                row[f"decided_{rule}"] = round(got["decided"], 3)
                row[f"seeds_{rule}"] = round(got["seeds"], 2)
                row[f"runs_{rule}"] = round(got["runs"], 3)
            rows.append(row)
    print(json.dumps({"looks": list(LOOKS), "alpha": ALPHA, "studies": args.studies, "seed": args.seed,
                      "monte_carlo_se_max": round(0.5 / math.sqrt(args.studies), 4), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
