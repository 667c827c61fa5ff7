"""pipeline.reporting.stats against values computed here directly with numpy/scipy."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from pipeline.reporting.stats import (
    detectable_effect, higher_is_better, holm, paired_delta, paired_power, seeds_needed, summarize,
)


def test_summary_matches_scipy_t_interval():
    x = np.array([3.1, 2.9, 3.4, 3.05])
    low, high = sps.t.interval(0.95, df=len(x) - 1, loc=x.mean(), scale=sps.sem(x))
    s = summarize(list(x))
    assert s.n == 4 and s.note == ""
    assert s.mean == pytest.approx(x.mean())
    assert (s.low, s.high) == (pytest.approx(low), pytest.approx(high))


def test_summary_of_one_value_has_no_interval():
    s = summarize([2.5])
    assert (s.n, s.mean, s.half_width, s.low) == (1, 2.5, None, None)
    assert s.note == "n=1: no interval"


def test_summary_of_identical_values_has_zero_width_not_nan():
    s = summarize([1.25, 1.25, 1.25])
    assert s.mean == 1.25 and s.half_width == 0.0 and s.note == "zero variance"
    assert not any(math.isnan(v) for v in (s.mean, s.half_width, s.low, s.high))


def test_summary_of_nothing_is_missing_and_nonfinite_is_rejected():
    s = summarize([])
    assert (s.n, s.mean, s.half_width, s.note) == (0, None, None, "no data")
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_paired_delta_matches_ttest_rel_and_interval_of_differences():
    base = {0: 3.0, 1: 3.2, 2: 2.9, 3: 3.1}
    var = {0: 3.3, 1: 3.4, 2: 3.3, 3: 3.25}
    b, v = np.array(list(base.values())), np.array(list(var.values()))
    d = v - b
    low, high = sps.t.interval(0.95, df=len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    delta = paired_delta(var, base, higher_better=False)
    assert delta.n == 4
    assert delta.mean == pytest.approx(d.mean())
    assert delta.half_width == pytest.approx((high - low) / 2)
    assert delta.p_value == pytest.approx(sps.ttest_rel(v, b).pvalue)
    assert delta.p_value < 0.05 and delta.verdict == "worse"  # loss went up


def test_paired_delta_pairs_only_seeds_present_in_both():
    base = {1: 1.0, 2: 2.0, 3: 3.5, 4: 9.0}
    var = {0: -5.0, 1: 1.5, 2: 2.1, 3: 4.3}
    delta = paired_delta(var, base, higher_better=True)
    common = [1, 2, 3]
    expected = sps.ttest_rel([var[s] for s in common], [base[s] for s in common]).pvalue
    assert delta.n == 3
    assert delta.mean == pytest.approx(np.mean([var[s] - base[s] for s in common]))
    assert delta.p_value == pytest.approx(expected)


def test_verdict_follows_metric_direction():
    base = {s: float(s) for s in range(5)}
    up = {s: base[s] + 1.0 + 0.05 * (-1) ** s for s in range(5)}
    assert paired_delta(up, base, higher_better=True).verdict == "better"  # e.g. ROUGE up
    assert paired_delta(up, base, higher_better=False).verdict == "worse"  # e.g. loss up
    down = {s: base[s] - 1.0 + 0.05 * (-1) ** s for s in range(5)}
    assert paired_delta(down, base, higher_better=False).verdict == "better"


def test_noisy_difference_is_not_significant():
    base = {0: 3.0, 1: 3.2, 2: 2.9}
    var = {0: 3.1, 1: 3.0, 2: 3.05}
    delta = paired_delta(var, base, higher_better=False)
    assert delta.p_value >= 0.05
    assert delta.verdict == "no significant difference at 5%"


def test_identical_and_constant_differences_give_no_test_not_nan():
    base = {0: 3.0, 1: 3.2, 2: 2.9}
    same = paired_delta(dict(base), base, higher_better=False)
    assert same.mean == 0.0 and same.p_value is None and same.half_width == 0.0
    assert same.verdict.startswith("no significant difference at 5%") and "zero variance" in same.verdict
    shifted = paired_delta({s: v + 0.5 for s, v in base.items()}, base, higher_better=False)
    assert shifted.mean == pytest.approx(0.5) and shifted.p_value is None
    assert shifted.verdict.startswith("worse") and "constant difference" in shifted.verdict
    up = paired_delta({s: v + 0.5 for s, v in base.items()}, base, higher_better=True)
    assert up.verdict.startswith("better")


def test_one_or_no_paired_seed_gives_no_test():
    one = paired_delta({0: 3.5, 1: 3.0}, {0: 3.0}, higher_better=False)
    assert (one.n, one.mean, one.half_width, one.p_value) == (1, 0.5, None, None)
    assert one.verdict == "n=1: no test"
    none = paired_delta({1: 3.0}, {0: 3.0}, higher_better=False)
    assert (none.n, none.mean, none.verdict) == (0, None, "no paired seeds")


def test_metric_directions():
    assert higher_is_better("rougeL") and higher_is_better("bleu") and higher_is_better("chrf")
    assert not higher_is_better("val_loss") and not higher_is_better("val_ppl")
    assert not higher_is_better("bits_per_token")
    with pytest.raises(KeyError):
        higher_is_better("n_decoded")


def test_holm_matches_a_hand_computed_example():
    # Sorted: 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 = 0.04 -> raised to 0.06 (step-down
    # keeps the order), then put back in input order; products above 1 are capped.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]
    assert holm([0.02]) == [0.02] and holm([]) == []


def power_by_integration(effect: float, n: int, alpha: float = 0.05) -> float:
    """Paired t-test power without the noncentral t: T = (Z + effect sqrt(n)) / sqrt(V / df), with
    Z standard normal and V chi-square(df); integrate P(|T| > t_crit | V) over V's density."""
    from scipy import integrate

    df, shift = n - 1, effect * math.sqrt(n)
    c = sps.t.ppf(1 - alpha / 2, df)

    def given_v(v: float) -> float:
        scale = c * math.sqrt(v / df)
        return (sps.norm.sf(scale - shift) + sps.norm.cdf(-scale - shift)) * sps.chi2.pdf(v, df)

    return integrate.quad(given_v, 0, np.inf, limit=200)[0]


@pytest.mark.parametrize("effect, n", [(0.5, 34), (0.8, 15), (1.0, 3), (3.0, 2), (0.2, 100)])
def test_paired_power_matches_numerical_integration(effect, n):
    assert paired_power(effect, n) == pytest.approx(power_by_integration(effect, n), abs=1e-6)
    assert paired_power(-effect, n) == paired_power(effect, n)  # two-sided


def test_paired_power_is_alpha_without_an_effect_and_matches_simulation():
    assert paired_power(0.0, 5) == pytest.approx(0.05)
    # Monte Carlo of the test itself: paired differences N(effect, 1), t = mean / (sd / sqrt(n)).
    n, effect = 3, detectable_effect(3)
    d = np.random.default_rng(0).normal(effect, 1.0, size=(200_000, n))
    t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
    share = float(np.mean(np.abs(t) > sps.t.ppf(0.975, n - 1)))
    assert share == pytest.approx(0.8, abs=0.005)  # MC standard error ~0.0009


def test_detectable_effect_and_seeds_needed_hit_80_percent_power():
    for n, alpha in ((3, 0.05), (5, 0.05 / 12), (34, 0.05)):
        assert power_by_integration(detectable_effect(n, alpha=alpha), n, alpha) == pytest.approx(0.8, abs=1e-6)
    assert detectable_effect(1) is None
    # d = 0.5 needs 34 pairs and d = 0.8 needs 15 (one-sample/paired t, two-sided 5%, 80% power):
    # the fewest n whose power, integrated independently, reaches 0.8.
    for effect, n in ((0.5, 34), (0.8, 15)):
        assert seeds_needed(effect) == n
        assert power_by_integration(effect, n) >= 0.8 > power_by_integration(effect, n - 1)
    assert seeds_needed(0.0) is None and seeds_needed(1e-4) is None  # more than MAX_SEEDS
    assert seeds_needed(50.0) == 2


def test_paired_delta_reports_the_sd_of_the_differences():
    base = {0: 3.0, 1: 3.2, 2: 2.9}
    var = {0: 3.1, 1: 3.0, 2: 3.05}
    d = np.array([var[s] - base[s] for s in base])
    assert paired_delta(var, base, higher_better=False).sd == pytest.approx(d.std(ddof=1))
    assert paired_delta({0: 1.0}, {0: 2.0}, higher_better=False).sd is None


def test_welch_from_summaries_matches_scipy_on_the_raw_values():
    from pipeline.reporting.stats import sd_from_interval, summarize, welch

    ours, ref = np.array([1.884, 1.893, 1.897]), np.array([1.8982, 1.8980, 1.9059])
    s = summarize(ref)
    assert sd_from_interval(s.half_width, s.n) == pytest.approx(ref.std(ddof=1))
    w = welch(ours.mean(), ours.std(ddof=1), 3, ref.mean(), ref.std(ddof=1), 3)
    assert w.p_value == pytest.approx(sps.ttest_ind(ours, ref, equal_var=False).pvalue)
    assert w.diff == pytest.approx(ours.mean() - ref.mean())
    low, high = sps.ttest_ind(ours, ref, equal_var=False).confidence_interval(0.95)
    assert (w.diff - w.half_width, w.diff + w.half_width) == (pytest.approx(low), pytest.approx(high))
    assert welch(1.0, 0.1, 1, 1.0, 0.1, 3) is None and welch(1.0, 0.0, 3, 1.0, 0.0, 3) is None
