"""report.seed_claims: validated like every key, checked by our verdict, rendered after it, absent by default."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from pipeline.params import ParamsError, load_params
from pipeline.report import _read_params, render_report
from pipeline.reporting.claims import (AGREE, CANNOT, CONTRADICT, NOT_COMPARABLE, UNDECIDED, claims_blocks,
                                       read_claim)
from pipeline.reporting.inputs import ReportInputError, Run
from pipeline.reporting.results import compute_results
from pipeline.reporting.study import Study, read_inputs
from tests.committed import DEFAULT_PARAMS
from tests.fixtures.report.fake_runs import make_project

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2]
# variant -> its val_loss minus the baseline's at seeds 0, 1, 2
SHIFTS = {"baseline": (0.0, 0.0, 0.0), "worse": (0.50, 0.55, 0.45), "better": (-0.3, -0.25, -0.35),
          "straddles": (0.05, -0.06, 0.02)}
BASE = (2.0, 2.1, 1.9)


def claim(**keys) -> dict:
    return {"claim": "it hurts", "seed_says": "loss 1.25 vs 0.85", "quantity": "Δ val_loss", "why": "same arm",
            **keys}


@pytest.fixture(scope="module")
def study():
    runs = {}
    for v, shifts in SHIFTS.items():
        for s, (b, d) in enumerate(zip(BASE, shifts)):
            loss = b + d
            runs[(v, s)] = Run(v, s, train={"wall_time_s": 100.0 * (0.5 if v == "better" else 1.0) + s,
                                            "train_loss": loss - 0.2, "threads": 2, "passes": 10.0 + s},
                               eval={"val_loss": loss, "val_ppl": math.exp(loss), "test_loss": loss + 0.01,
                                     "test_ppl": math.exp(loss + 0.01), "unigram_val_loss": 2.4})
    results = compute_results(runs, list(SHIFTS), SEEDS, "baseline")
    filt = {"splits": {"train": {"raw": 1000, "dropped_length": 930, "kept": 70}}}
    return results, runs, filt


def check(study, **keys) -> dict:
    results, runs, filt = study
    return read_claim(claim(**keys), results, runs, SEEDS, "baseline", filt)


@pytest.mark.parametrize("variant, expect, status", [
    ("worse", "worse", AGREE),  # our interval above 0, the seed says worse
    ("worse", "better", CONTRADICT),
    ("better", "worse", CONTRADICT),  # our interval below 0
    ("better", "better", AGREE),
    ("straddles", "worse", UNDECIDED),  # our interval holds 0
])
def test_a_direction_is_checked_by_our_verdict(study, variant, expect, status):
    r = check(study, read="delta", variant=variant, metric="val_loss", expect=expect)
    assert r["status"] == status
    assert (r["low"] > 0) == (variant == "worse") and (r["high"] < 0) == (variant == "better")
    if status == UNDECIDED:
        assert r["low"] < 0 < r["high"] and "no significant difference" in r["reason"]


def sequential(study, looks, margin):
    from pipeline.reporting.decisions import record
    return record(study[1], list(SHIFTS), SEEDS, "baseline", "val_loss", looks, 0.05, margin)


@pytest.mark.parametrize("variant, expect, status", [
    ("worse", "worse", AGREE),
    ("better", "worse", CONTRADICT),
    ("straddles", "worse", CONTRADICT),  # equivalent inside ±0.3: a finding against "worse"
    ("straddles", "same", AGREE),
    ("worse", "same", CONTRADICT),
])
def test_under_seeds_until_decided_the_sequential_verdict_checks_the_claim(study, variant, expect, status):
    results, runs, filt = study
    decided = sequential(study, [3], 0.3)
    r = read_claim(claim(read="delta", variant=variant, metric="val_loss", expect=expect), results, runs, SEEDS,
                   "baseline", filt, decided)
    look = decided.variants[variant].looks[-1]
    assert r["status"] == status and "sequential" in r["reason"] and "sequential interval" in r["ours"]
    assert (r["mean"], r["low"], r["high"]) == (look.mean, look.lo, look.hi)
    fixed = check(study, read="delta", variant=variant, metric="val_loss", expect=expect)
    assert r["high"] - r["low"] > fixed["high"] - fixed["low"]  # the study's level is stricter than 95%


def test_an_open_comparison_is_undecided_and_other_metrics_keep_the_fixed_test(study):
    results, runs, filt = study
    decided = sequential(study, [3, 5], None)  # no margin: straddles goes on to the next look
    r = read_claim(claim(read="delta", variant="straddles", metric="val_loss", expect="worse"), results, runs, SEEDS,
                   "baseline", filt, decided)
    assert r["status"] == UNDECIDED and "not decided yet" in r["reason"]
    ratio = read_claim(claim(read="ppl_ratio", variant="worse", expect="higher"), results, runs, SEEDS, "baseline",
                       filt, decided)
    assert ratio["status"] == AGREE
    assert ratio["mean"] == pytest.approx(math.exp(decided.variants["worse"].looks[-1].mean))
    other = read_claim(claim(read="delta", variant="worse", metric="test_loss", expect="worse"), results, runs, SEEDS,
                       "baseline", filt, decided)
    fixed = check(study, read="delta", variant="worse", metric="test_loss", expect="worse")
    assert other["ours"] == fixed["ours"] + " [fixed-n, over the seeds the rounds chose: not covered by seeds until " \
                                            "decided's guarantee]"
    assert {k: v for k, v in other.items() if k != "ours"} == {k: v for k, v in fixed.items() if k != "ours"}


def test_versus_compares_two_arms_that_both_differ_from_the_baseline(study):
    # e.g. the seed's no-positional run against its full model, both with its leaking mask
    r = check(study, read="delta", variant="worse", versus="better", metric="val_loss", expect="worse")
    deltas = [w - b for w, b in zip(SHIFTS["worse"], SHIFTS["better"])]
    assert r["status"] == AGREE and r["mean"] == pytest.approx(sum(deltas) / 3)
    assert r["ours"].startswith("Δ vs better (paired t-test, not in the Δ table) +0.8")
    assert check(study, read="delta", variant="better", versus="worse", metric="val_loss",
                 expect="worse")["status"] == CONTRADICT


def test_one_seed_has_no_interval_and_decides_nothing(study):
    results, runs, filt = study
    one = compute_results(runs, list(SHIFTS), [0], "baseline")
    r = read_claim(claim(read="delta", variant="worse", metric="val_loss", expect="worse"), one, runs, [0], "baseline",
                   filt)
    assert r["status"] == UNDECIDED and "one paired seed" in r["reason"] and "no interval" in r["ours"]


def test_a_derived_metric_is_checked_by_its_sources_test(study):
    r = check(study, read="delta", variant="worse", metric="test_ppl", expect="worse")
    assert r["status"] == AGREE and "of test_loss" in r["ours"]


def test_a_quantity_this_study_lacks_cannot_be_checked_here(study):
    for keys in ({"read": "delta", "variant": "worse", "metric": "bleu", "expect": "worse"},  # no such metric here
                 {"read": "value", "metric": "rougeL", "seed_value": 0.3, "tolerance": 0.1},
                 {"read": "none"}):
        r = check(study, **keys)
        assert r["status"] == CANNOT and r["reason"]
    results, runs, _ = study
    r = read_claim(claim(read="filter_kept", seed_value=0.07, tolerance=0.02), results, runs, SEEDS, "baseline", None)
    assert r["status"] == CANNOT and "filter.json" in r["reason"]


def test_not_comparable_shows_ours_but_does_not_check(study):
    r = check(study, read="delta", variant="worse", metric="val_loss", expect="worse", comparable=False)
    assert r["status"] == NOT_COMPARABLE and r["ours"].startswith("Δ +0.5") and "comparable: false" in r["reason"]
    value = check(study, read="value", variant="worse", metric="val_loss", seed_value=0.2, comparable=False)
    assert value["status"] == NOT_COMPARABLE  # no tolerance needed to say so


def arms(**settings) -> dict:
    """claim["arms"] as pipeline.report.claims resolves them: each variant's model settings."""
    return {v: {"model": {"decoder_mask": "causal", "n_heads": 4, **settings.get(v, {})}, "train": {"lr": 1e-3}}
            for v in SHIFTS}


def test_a_verdict_needs_the_seeds_arm(study):
    leak = {"model": {"decoder_mask": "future_only"}}
    keys = dict(read="delta", variant="worse", metric="val_loss", expect="worse", seed_conditions=leak)
    # ours has the causal mask where the seed's runs had its leak: not comparable, the setting named
    r = check(study, **keys, arms=arms())
    assert r["status"] == NOT_COMPARABLE and r["ours"].startswith("Δ +0.5")
    assert r["reason"] == ("worse has model.decoder_mask causal, the seed's runs had future_only; "
                           "baseline has model.decoder_mask causal, the seed's runs had future_only")
    # both arms of ours under the seed's mask: the verdict stands
    both = arms(worse={"decoder_mask": "future_only"}, baseline={"decoder_mask": "future_only"})
    assert check(study, **keys, arms=both)["status"] == AGREE
    # one of the two compared arms lacks it: still not comparable, that arm named
    r = check(study, **keys, arms=arms(worse={"decoder_mask": "future_only"}))
    assert r["status"] == NOT_COMPARABLE and r["reason"].startswith("baseline has")
    # a value reads one arm only
    value = dict(read="value", variant="worse", metric="val_loss", seed_value=2.5, tolerance=1.0, seed_conditions=leak)
    assert check(study, **value, arms=arms(worse={"decoder_mask": "future_only"}))["status"] == AGREE
    # settings that cannot be looked up are not taken as the seed's
    assert check(study, **keys)["status"] == NOT_COMPARABLE


def test_a_verdict_needs_the_seeds_budget_class(study):
    keys = dict(read="delta", variant="worse", metric="val_loss", expect="worse")
    assert check(study, **keys, seed_passes=110)["status"] == AGREE  # ours 11 (median of 10, 11, 12): within 10x
    assert check(study, **keys, seed_passes=1.1)["status"] == AGREE
    r = check(study, **keys, seed_passes=300)
    assert r["status"] == NOT_COMPARABLE and r["reason"] == (
        "worse trained 11 passes over its training data, the seed's number came from 300")
    assert check(study, **keys, seed_passes=1.0)["status"] == NOT_COMPARABLE
    results, runs, filt = study
    bare = {k: Run(r.variant, r.seed, train={x: y for x, y in r.train.items() if x != "passes"}, eval=r.eval)
            for k, r in runs.items()}
    r = read_claim(claim(**keys, seed_passes=20), results, bare, SEEDS, "baseline", filt)
    assert r["status"] == NOT_COMPARABLE and "not recorded" in r["reason"]


def test_the_report_resolves_the_arms_and_names_an_unknown_condition(tmp_path):
    from pipeline.report import claims

    leak = {"model": {"decoder_mask": "future_only"}}
    path = write_params(tmp_path, [claim(read="delta", variant="worse", metric="val_loss", expect="worse",
                                         seed_conditions=leak, seed_passes=300)])
    [c] = claims(load_params(path))
    assert sorted(c["arms"]) == ["baseline", "worse"] and c["arms"]["worse"]["model"]["decoder_mask"] == "causal"
    path = write_params(tmp_path, [claim(read="delta", variant="worse", metric="val_loss", expect="worse",
                                         seed_conditions={"model": {"decoder_msk": "future_only"}})])
    with pytest.raises(ReportInputError) as info:
        claims(load_params(path))
    assert str(info.value) == "report.seed_claims.0.seed_conditions.model.decoder_msk: not a model setting"


def test_does_not_converge_is_checked_against_the_unigram_plateau(study):
    # "worse" (mean 2.5, its interval reaching 2.4) stays at the plateau; "better" (1.7) left it
    stays = check(study, read="plateau", variant="worse", expect="stays")
    assert stays["status"] == AGREE and "against the unigram plateau 2.4" in stays["ours"]
    left = check(study, read="plateau", variant="better", expect="stays")
    assert left["status"] == CONTRADICT and "converged" in left["reason"] and left["high"] < 2.4
    assert check(study, read="plateau", variant="better", expect="leaves")["status"] == AGREE


def test_a_time_ratio_timed_under_contention_is_not_checked(study):
    results, runs, filt = study
    busy = {k: Run(r.variant, r.seed, train={**r.train, "load": {"others_cpu_share": 0.9}}, eval=r.eval)
            for k, r in runs.items()}
    r = read_claim(claim(read="time_ratio", variant="better", expect="lower"), results, busy, SEEDS, "baseline", filt)
    assert r["status"] == CANNOT and "contention" in r["reason"] and r["mean"] is not None


def test_ppl_ratio_is_exp_of_the_loss_delta_and_its_interval(study):
    results, _, _ = study
    d = results.deltas["better"]["val_loss"]
    r = check(study, read="ppl_ratio", variant="better", expect="lower", seed_value=0.953)
    assert r["status"] == AGREE
    assert r["mean"] == pytest.approx(math.exp(d.mean))
    assert (r["low"], r["high"]) == pytest.approx((math.exp(d.mean - d.half_width), math.exp(d.mean + d.half_width)))
    assert "the seed's 0.953 is outside it" in r["ours"]
    assert check(study, read="ppl_ratio", variant="worse", expect="lower")["status"] == CONTRADICT


def test_an_undecided_direction_still_rules_out_the_seeds_number(study):
    # "straddles": no significant difference; a seed's number outside our interval is contradicted
    inside = check(study, read="delta", variant="straddles", metric="val_loss", expect="better", seed_value=0.0)
    assert inside["status"] == UNDECIDED
    outside = check(study, read="delta", variant="straddles", metric="val_loss", expect="better", seed_value=-2.0)
    assert outside["status"] == CONTRADICT and "ruled out" in outside["reason"]


def test_time_ratio_pairs_the_wall_times_by_seed(study):
    r = check(study, read="time_ratio", variant="better", expect="lower", seed_value=0.333)
    assert r["status"] == AGREE and r["high"] < 1 and "lower than baseline's" in r["ours"]
    assert check(study, read="time_ratio", variant="better", expect="higher")["status"] == CONTRADICT


def test_a_value_agrees_within_the_tolerance(study):
    mean = sum(b + d for b, d in zip(BASE, SHIFTS["worse"])) / 3
    near = check(study, read="value", variant="worse", metric="val_loss", seed_value=mean, tolerance=1.0)
    assert near["status"] == AGREE
    assert check(study, read="value", variant="worse", metric="val_loss", seed_value=0.178,
                 tolerance=0.1)["status"] == CONTRADICT
    train = check(study, read="value", variant="worse", metric="train_loss", seed_value=0.0065, tolerance=0.1)
    assert train["status"] == CONTRADICT and "train.json train_loss" in train["ours"]


def test_a_training_loss_delta_pairs_train_json_by_seed(study):
    # e.g. the seed's mask against the causal mask: the collapse is in the training loss
    r = check(study, read="delta", variant="better", metric="train_loss", expect="better")
    assert r["status"] == AGREE and r["mean"] == pytest.approx(sum(SHIFTS["better"]) / 3)
    assert r["ours"].startswith("Δ vs baseline (paired t-test, not in the Δ table) -0.3")
    assert check(study, read="delta", variant="worse", metric="train_loss", expect="better")["status"] == CONTRADICT


def test_a_training_metric_is_a_delta_or_a_value_only(tmp_path):
    path = write_params(tmp_path, [claim(read="ppl_ratio", variant="worse", metric="train_loss", expect="higher")])
    with pytest.raises(ReportInputError, match=r"report\.seed_claims\.0.*'train_loss'"):
        _read_params(path)
    path = write_params(tmp_path, [claim(read="delta", variant="worse", metric="wall_time_s", expect="worse")])
    with pytest.raises(ReportInputError, match=r"'wall_time_s' is not a reported metric"):
        _read_params(path)


def test_filter_share_is_read_from_filter_json(study):
    r = check(study, read="filter_kept", seed_value=0.07, tolerance=0.02)
    assert r["status"] == AGREE and r["mean"] == pytest.approx(0.07) and "70 of 1,000" in r["ours"]
    assert check(study, read="filter_kept", seed_value=0.5, tolerance=0.02)["status"] == CONTRADICT


def test_same_needs_a_margin_to_agree(study):
    assert check(study, read="delta", variant="straddles", metric="val_loss", expect="same")["status"] == UNDECIDED
    assert check(study, read="delta", variant="straddles", metric="val_loss", expect="same",
                 tolerance=1.0)["status"] == AGREE
    assert check(study, read="delta", variant="worse", metric="val_loss", expect="same")["status"] == CONTRADICT


def write_params(tmp_path: Path, claims) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "ablations": {"baseline": {}, "worse": {}},
                                    "report": {"seed_claims": claims}}))
    return path


@pytest.mark.parametrize("keys, named", [
    ({"read": "delta", "variant": "worse", "metric": "val_loss", "expct": "worse"},
     "report.seed_claims.0.expct: unknown key (did you mean 'expect'?)"),
    ({"read": "delta", "variant": "worse", "metric": "val_loss"}, "report.seed_claims.0: read delta needs expect"),
    ({"read": "delta", "variant": "worse", "metric": "val_loss", "expect": "lower"},
     "read delta takes expect worse, better, same"),
    ({"read": "none", "metric": "val_loss"}, "read none does not take metric"),
    ({"read": "delta", "variant": "nope", "metric": "val_loss", "expect": "worse"},
     "report.seed_claims.0.variant: 'nope' is not a variant"),
    ({"read": "sign"}, "report.seed_claims.0.read:"),
    ({"read": "delta", "variant": "worse", "versus": "basline", "metric": "val_loss", "expect": "worse"},
     "report.seed_claims.0.versus: 'basline' is not a variant"),
])
def test_a_bad_claim_is_a_one_line_error_naming_its_key(tmp_path, keys, named):
    path = write_params(tmp_path, [claim(**keys)])
    with pytest.raises(ParamsError) as info:
        load_params(path)
    assert named in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ReportInputError) as info:  # the report stage checks its own key too
        _read_params(path)
    assert "report.seed_claims.0" in str(info.value) and "\n" not in str(info.value)


def test_the_report_stage_checks_a_claims_metric(tmp_path):
    path = write_params(tmp_path, [claim(read="delta", variant="worse", metric="val_los", expect="worse")])
    with pytest.raises(ReportInputError, match=r"report\.seed_claims\.0\.metric: 'val_los' is not a reported metric"):
        _read_params(path)


@pytest.mark.slow
def test_the_section_opens_the_body_after_the_verdict(tmp_path):
    p = make_project(tmp_path)
    claims = [claim(read="delta", variant="no_ffn", metric="val_loss", expect="worse"),
              claim(claim="one head degrades", read="delta", variant="single_head", metric="val_loss", expect="worse",
                    comparable=False, why="the seed's table is placeholders")]
    out = tmp_path / "reports"
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline",
                                    seed_claims=claims)), out)
    md = (out / "report.md").read_text(encoding="utf-8")
    assert md.index("## Verdict") < md.index("## Seed's claims") < md.index("## Setup")
    rows = [line for line in md.splitlines() if line.startswith("| it hurts") or line.startswith("| one head")]
    assert len(rows) == 2 and "| agree: our verdict: worse, the seed's: worse | same arm |" in rows[0]
    assert "not comparable: not the seed's quantity" in rows[1] and "placeholders" in rows[1]
    assert "1 agree, 1 not comparable" in md
    html = (out / "report.html").read_text()
    assert "Seed&#x27;s claims" in html or "Seed's claims" in html
    details = json.loads((out / "details.json").read_text())
    assert [c["status"] for c in details["seed_claims"]] == [AGREE, NOT_COMPARABLE]


@pytest.mark.slow
def test_default_params_give_no_section(tmp_path):
    assert load_params(DEFAULT_PARAMS).report.seed_claims == []  # the default study as committed
    assert claims_blocks([], None, {}, [], "baseline", None) == []
    p = make_project(tmp_path)
    out = tmp_path / "reports"
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline")), out)
    assert "Seed's claims" not in (out / "report.md").read_text(encoding="utf-8")
    assert "seed_claims" not in json.loads((out / "details.json").read_text())


@pytest.mark.parametrize("name", ["cnn_dailymail", "cnn_dailymail_cpu", "cnn_dailymail_leak_cpu", "tiny_shakespeare",
                                  "tiny_shakespeare_cpu", "tinystories", "tinystories_cpu", "multi30k_cpu",
                                  "iwslt2017"])
def test_every_seed_preset_lists_its_seeds_claims(name):
    claims = load_params(ROOT / "presets" / f"{name}.yaml").report.seed_claims
    assert claims and all(c.why.strip() for c in claims)


def curve_runs(early_shift: float) -> dict:
    """Runs whose validation curves agree at the end; "fast"'s first half lies `early_shift` off the baseline's."""
    import pandas as pd

    runs = {}
    for v in ("baseline", "fast"):
        for s in SEEDS:
            tokens = [0, 100, 200, 300, 400]
            loss = [5.0, 4.0 - 0.1 * s, 3.0, 2.5, 2.0 + 0.01 * s]
            if v == "fast":  # lower up to half the tokens, higher after: only the first half counts
                loss = [x + (early_shift + 0.02 * s if t <= 200 else 0.3) for t, x in zip(tokens, loss)]
            runs[(v, s)] = Run(v, s, train={"wall_time_s": 50.0 + s, "steps": 200},
                               eval={"val_loss": loss[-1], "val_ppl": math.exp(loss[-1])},
                               val_curve=pd.DataFrame({"tokens": tokens, "val_loss": loss}))
    return runs


def test_how_fast_the_loss_falls_is_the_early_validation_curve_paired_by_seed():
    for shift, expect, status in ((-0.5, "lower", AGREE), (-0.5, "higher", CONTRADICT), (0.5, "lower", CONTRADICT)):
        runs = curve_runs(shift)
        results = compute_results(runs, ["baseline", "fast"], SEEDS, "baseline")
        r = read_claim(claim(read="early_loss", variant="fast", expect=expect), results, runs, SEEDS, "baseline", None)
        assert r["status"] == status
        assert r["mean"] == pytest.approx(shift + 0.02 * sum(SEEDS) / len(SEEDS))  # the later half ignored
        assert "first 50% of training" in r["ours"]
    runs = curve_runs(-0.5)
    results = compute_results(runs, ["baseline", "fast"], SEEDS, "baseline")
    no_curve = {k: Run(r.variant, r.seed, train=r.train, eval=r.eval) for k, r in runs.items()}
    r = read_claim(claim(read="early_loss", variant="fast", expect="lower"), results, no_curve, SEEDS, "baseline", None)
    assert r["status"] == CANNOT and "val_curve.csv" in r["reason"]


def test_steps_and_seconds_per_step_are_read_from_train_json():
    runs = curve_runs(-0.5)
    results = compute_results(runs, ["baseline", "fast"], SEEDS, "baseline")
    per_step = read_claim(claim(read="value", metric="step_time_s", seed_value=0.329, tolerance=0.01),
                          results, runs, SEEDS, "baseline", None)
    assert per_step["mean"] == pytest.approx((50 + 51 + 52) / 3 / 200) and per_step["status"] == CONTRADICT
    steps = read_claim(claim(read="value", metric="steps", seed_value=200, tolerance=0), results, runs, SEEDS,
                       "baseline", None)
    assert steps["status"] == AGREE and "train.json steps" in steps["ours"]


@pytest.mark.slow
def test_a_seeds_hand_count_is_checked_by_our_models_own_count(tmp_path):
    """Seed 002 counts a block as 3 d² + 3 d d_ff: W_Q, W_K, W_V and SwiGLU's three, no W_O."""
    from pipeline.report import claims

    d, layers, hidden = 32, 2, 64
    seed_sum = layers * (3 * d * d + 3 * hidden * d)
    hand = claim(read="param_count", components=["attention", "ffn"], seed_value=seed_sum, tolerance=0,
                 config={"arch": "decoder_only", "n_encoder_layers": 0, "n_decoder_layers": layers, "d_model": d,
                         "n_heads": 4, "d_ff": hidden * 3 // 2, "ffn": "swiglu", "bias": False, "vocab_size": 500})
    [c] = claims(load_params(write_params(tmp_path, [hand])))
    assert c["counted"]["attention"] == layers * 4 * d * d and c["counted"]["ffn"] == layers * 3 * hidden * d
    assert c["counted"]["embeddings"] >= 500 * d
    r = read_claim(c, None, {}, SEEDS, "baseline", None)
    assert r["status"] == CONTRADICT and r["reason"].endswith(f"ours − the seed's: +{layers * d * d:,}")
    ok = read_claim({**c, "seed_value": seed_sum + layers * d * d}, None, {}, SEEDS, "baseline", None)
    assert ok["status"] == AGREE
    bad = claim(read="param_count", components=["ffn"], seed_value=1, tolerance=0, config={"d_modle": 8})
    with pytest.raises(ReportInputError, match=r"^report\.seed_claims\.0\.config\.d_modle: not a model setting$"):
        claims(load_params(write_params(tmp_path, [bad])))
