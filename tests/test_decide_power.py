"""benchmarks/decide_power.py: the fixed design's power is the t-test's, and the simulation counts
decisions and runs the way the rule takes them."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from benchmarks.decide_power import LOOKS, fixed_power, simulate


def test_the_fixed_power_is_what_paired_t_tests_find():
    rng = np.random.default_rng(5)
    d = rng.normal(0.5, 1.0, size=(20_000, 20))
    found = (sps.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05).mean()
    assert abs(found - fixed_power(0.5, 20, 0.05)) < 3 * math.sqrt(0.25 / 20_000)


def test_a_huge_effect_is_decided_at_the_first_look_and_costs_the_first_looks_runs():
    got = simulate(1, 30.0, "t", 2_000, np.random.default_rng(6))
    assert got["decided"] == 1.0 and got["runs"] == LOOKS[0] / LOOKS[-1]  # 3 + 3 runs of the fixed 20 + 20
    later = simulate(1, 30.0, "median", 2_000, np.random.default_rng(6))
    assert later["decided"] == 1.0 and later["runs"] == 8 / LOOKS[-1]  # the median rule's first look: 8 seeds


def test_obf_waits_one_look_for_a_huge_effect():
    # at 3 seeds the O'Brien–Fleming-type boundary asks for |t| above a thousand (a sample sd near 0 can
    # still reach it, about once in a thousand studies): the decisions come at 5
    got = simulate(1, 30.0, "obf", 2_000, np.random.default_rng(7))
    assert got["decided"] == 1.0 and abs(got["seeds"] - 5) < 0.02 and abs(got["runs"] - 5 / LOOKS[-1]) < 0.001
