"""Group-sequential boundaries (pipeline/deciding/boundary.py): exact for the t statistics, checked
by simulation on seeds other than the calibration's (tests/test_deciding.py's harness)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from pipeline.deciding import boundary
from pipeline.deciding.rounds import plan_fingerprint
from pipeline.deciding.rule import Plan, decide, decide_all
from tests.test_deciding import ALPHA, LOOKS, STUDIES, limit, simulate

SE = math.sqrt(ALPHA * (1 - ALPHA) / STUDIES)


@pytest.mark.parametrize("kind, rho", [("obf", 1.0), ("pocock", 1.0), ("rho", 1.0), ("rho", 3.0)])
def test_spending_functions_spend_alpha_by_the_end_and_never_take_back(kind, rho):
    taus = np.linspace(0, 1, 41)
    spent = [boundary.spent(kind, t, ALPHA, rho) for t in taus]
    assert spent[0] == 0 and spent[-1] == pytest.approx(ALPHA, rel=1e-12)
    assert all(b >= a for a, b in zip(spent, spent[1:]))


def test_obf_spends_almost_nothing_early_and_pocock_evenly():
    assert boundary.spent("obf", 3 / 20, ALPHA) < 1e-6
    assert boundary.spent("pocock", 3 / 20, ALPHA) > 0.01
    with pytest.raises(ValueError, match="spending function"):
        boundary.spent("haybittle", 0.5, ALPHA)


@pytest.mark.slow
def test_the_first_look_is_students_t_and_the_values_are_reproducible():
    plan = Plan(LOOKS, ALPHA, None, 1, "t", "pocock")
    first = boundary.spent("pocock", LOOKS[0] / LOOKS[-1], ALPHA)
    assert plan.criticals[0] == pytest.approx(float(sps.t.isf(first / 2, LOOKS[0] - 1)), rel=1e-12)
    kept = plan.criticals
    boundary.criticals.cache_clear()
    assert Plan(LOOKS, ALPHA, None, 1, "t", "pocock").criticals == kept  # seeded: the same bits again
    # O'Brien–Fleming-type: about 16 at 5 seeds, near the fixed test's 2.09 at the budget
    obf = Plan(LOOKS, ALPHA, None, 1, "t", "obf").criticals
    assert obf[0] > 1000 and 14 < obf[1] < 19 and 2.09 < obf[-1] < 2.25
    # Bonferroni's are what they were: the t quantile at alpha / (m K) at every look
    bon = Plan(LOOKS, ALPHA, None, 3).criticals
    assert bon == pytest.approx([float(sps.t.isf(ALPHA / (3 * len(LOOKS)) / 2, n - 1)) for n in LOOKS], rel=1e-12)


@pytest.mark.parametrize("kind, rho, seed", [("obf", 1.0, 101), ("pocock", 1.0, 102), ("rho", 2.0, 103)])
def test_a_spending_boundary_spends_exactly_alpha_under_the_null(kind, rho, seed):
    plan = Plan(LOOKS, ALPHA, None, 1, "t", kind, rho)
    sim = simulate(seed, [0.0], [1.0], plan)
    # exact, not only below: within Monte Carlo error of alpha on both sides
    assert abs(sim["wrong"] - ALPHA) <= 3 * SE + 3 * math.sqrt(ALPHA / boundary.PATHS), sim
    assert abs(sim["missed"] - ALPHA) <= 3 * SE + 3 * math.sqrt(ALPHA / boundary.PATHS), sim


@pytest.mark.parametrize("m, sigmas, seed", [(3, [0.01, 1.0, 40.0], 104), (5, [0.2, 0.2, 1.0, 3.0, 0.05], 105)])
def test_the_family_wise_error_over_m_comparisons_holds(m, sigmas, seed):
    sim = simulate(seed, [0.0] * m, sigmas, Plan(LOOKS, ALPHA, None, m, "t", "obf"), higher_is_better=True)
    assert sim["wrong"] <= limit(), sim


@pytest.mark.parametrize("kind, seed", [("obf", 106), ("pocock", 107)])
def test_equivalence_at_the_margin_is_declared_no_more_than_alpha(kind, seed):
    margin = 0.5
    sim = simulate(seed, [margin, -margin], [1.0, 1.0], Plan(LOOKS, ALPHA, margin, 2, "t", kind))
    assert sim["wrong"] <= limit(), sim


def power(plan: Plan, delta: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    diffs = delta + rng.standard_normal((STUDIES, 1, plan.budget))
    return float((decide_all(diffs, plan, higher_is_better=True).final == "better").mean())


def test_obf_nearly_matches_the_fixed_designs_power_where_bonferroni_does_not():
    # issue #64's simulation at 0.5 sd: Bonferroni 0.353, Pocock-type 0.440, OBF-type 0.545, fixed 0.564
    obf = power(Plan(LOOKS, ALPHA, None, 1, "t", "obf"), 0.5, 108)
    pocock = power(Plan(LOOKS, ALPHA, None, 1, "t", "pocock"), 0.5, 109)
    bonferroni = power(Plan(LOOKS, ALPHA, None, 1), 0.5, 110)
    tol = 3 * math.sqrt(0.25 / STUDIES)
    assert abs(obf - 0.545) <= tol + 0.005 and abs(pocock - 0.440) <= tol + 0.005
    assert abs(bonferroni - 0.353) <= tol + 0.005
    crit = float(sps.t.isf(ALPHA / 2, LOOKS[-1] - 1))
    fixed = float(sps.nct.sf(crit, LOOKS[-1] - 1, 0.5 * math.sqrt(LOOKS[-1])))
    assert obf < fixed + tol  # the price of looking: small, never negative


@pytest.mark.parametrize("kwargs, field", [
    ({"boundary": "haybittle"}, "Plan.boundary"),
    ({"method": "median", "boundary": "obf"}, "Plan.boundary"),
    ({"boundary": "rho", "rho": 0}, "Plan.rho"),
])
def test_plan_validation_names_the_boundary(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Plan(LOOKS, ALPHA, None, 1, **kwargs)


def test_a_spending_plan_records_its_boundary_and_bonferroni_fingerprints_stay():
    plan = Plan(LOOKS, ALPHA, None, 2, "t", "obf").to_json()
    assert plan["boundary"] == "obf" and len(plan["levels"]) == len(plan["criticals"]) == len(LOOKS)
    assert "boundary" not in Plan(LOOKS, ALPHA, None, 2).to_json()
    keys = dict(baseline="b", variants=["b", "v"], seeds=[0, 1, 2], looks=LOOKS, alpha=ALPHA, margin=None,
                metric=None)
    assert plan_fingerprint(**keys) == plan_fingerprint(**keys, boundary="bonferroni")
    assert plan_fingerprint(**keys, boundary="obf") != plan_fingerprint(**keys)
    assert plan_fingerprint(**keys, boundary="rho", rho=2.0) != plan_fingerprint(**keys, boundary="rho", rho=3.0)


def test_the_default_studys_obf_plan_gives_no_verdict_before_eight_seeds():
    """docs/seeds-until-decided.md: four comparisons at α 0.05 spend, by 5 of 20 seeds, less than
    the Monte Carlo resolves, so that look's interval is unbounded (and the report draws it so)."""
    plan = Plan((3, 5, 8, 12, 20), 0.05, 0.02, 4, "t", "obf")
    crit = plan.criticals
    assert crit[0] > 1e4 and math.isinf(crit[1]) and all(c < 10 for c in crit[2:])
    d = decide([5.0, 5.1, 4.9, 5.05, 4.95], plan, 1)  # a huge, steady effect: still no verdict at 5
    assert math.isinf(d.hi - d.lo) and d.verdict == "continue"
