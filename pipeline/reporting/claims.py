"""The seed study's claims beside ours: report.seed_claims, one row each, checked by our verdict.

A preset that reruns a seed study (shared/seeds) lists what that study claimed: the claim in its
words, its number or words, the quantity that is, and how to read our same quantity from this
report's own data (`read`; each reading's quantity: pipeline.reporting.claim_quantities); never a
number of ours typed into the preset.

The check is our verdict's. A direction (worse/better, lower/higher) agrees when the verdict of
the Δ behind it (the primary metric's uncorrected test, a secondary metric's Holm-corrected one, a
derived metric's source's; against `versus`, and for a time ratio on the log times, the same
paired t-test, uncorrected) says that direction, contradicts when it says the other, and is undecided when there is no
significant difference: the interval holds 0 (contradicts when the claim's `seed_value` lies
outside our interval: the seed's number is ruled out). `same` agrees when the whole interval lies within ±
`tolerance`, contradicts when it lies outside (without a tolerance: when the verdict finds a
difference), else undecided. A value agrees when our whole interval lies within `seed_value` ±
`tolerance`, contradicts when none of it does. A verdict is given only like with like: "not
comparable", the differences named, when ours is not the seed's quantity (`comparable: false`), an
arm we compare lacks a setting the seed's runs had (`seed_conditions`), or our passes over the
training data are more than BUDGET_CLASS times off the seed's (`seed_passes`). "Cannot check here"
when the quantity is absent (no run, no file, no value, `read: none`) or a time ratio's runs were
timed under contention; `why` says why in every case.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pipeline.deciding.record import Record
from pipeline.reporting.claim_quantities import (TRAIN_VALUES, ci_text, delta_reading, early_loss, filter_kept,
                                                 interval, median_passes, over_seeds, time_ratio)
from pipeline.reporting.cost import contended
from pipeline.reporting.decisions import look_level
from pipeline.reporting.formatting import MISSING, fmt
from pipeline.reporting.inputs import ReportInputError
from pipeline.reporting.render import Block, Heading, Paragraph, Table
from pipeline.reporting.results import BASE_METRICS, TASK_METRICS, Results, unigram_plateau

AGREE, CONTRADICT, UNDECIDED, CANNOT = "agree", "contradict", "undecided", "cannot check here"
NOT_COMPARABLE = "not comparable"
STATUSES = (AGREE, CONTRADICT, UNDECIDED, NOT_COMPARABLE, CANNOT)
# Passes within this factor of the seed's: the same budget class, an order of magnitude (10 passes and
# the seed's 50 epochs are one; 10 and its 300, where a causal model memorises at ~100, are not).
BUDGET_CLASS = 10.0
FIXED_N = " [fixed-n, over the seeds the rounds chose: not covered by seeds until decided's guarantee]"


def check_claims(claims: Sequence[Mapping], variants: Sequence[str], where: str) -> None:
    """The keys the params schema cannot check alone: variants of this study, reported metrics."""
    for i, c in enumerate(claims):
        key = f"{where}: report.seed_claims.{i}"
        for name in ("variant", "versus"):
            if c.get(name) is not None and c[name] not in variants:
                raise ReportInputError(f"{key}.{name}: {c[name]!r} is not a variant in ablations "
                                       f"(have: {', '.join(variants)})")
        train = {"value": TRAIN_VALUES, "delta": ("train_loss",)}.get(c.get("read"), ())  # from train.json
        known = BASE_METRICS + TASK_METRICS + train
        if c.get("metric") is not None and c["metric"] not in known:
            raise ReportInputError(f"{key}.metric: {c['metric']!r} is not a reported metric ({', '.join(known)})")


def _inside(value: float | None, low_high: tuple[float, float] | None) -> str:
    if value is None or low_high is None:
        return ""
    where = "inside" if low_high[0] <= value <= low_high[1] else "outside"
    return f"; the seed's {fmt(value)} is {where} it"


def _sequential(decided: Record | None, variant: str, versus: str, baseline: str, metric: str) -> dict | None:
    """The record's last look at `variant` (n, mean, lo, hi, verdict) when the claim is one the record
    decides: Δ of the primary metric against the baseline; else None."""
    if not decided or versus != baseline or metric != decided.metric:
        return None
    v = decided.variants.get(variant)
    if not v or not v.looks:
        return None
    return {**v.looks[-1].to_json(), "state": v.state}


def read_claim(claim: Mapping, results: Results, runs: Mapping, seeds: Sequence[int], baseline: str,
               filter_metrics: Mapping | None, decided: Record | None = None) -> dict:
    """Our number on the claim's quantity and the check: {"ours": text, "status", "reason",
    "mean", "low", "high", "n"} (numbers None where absent). A verdict only where the quantity,
    the arm and the budget class are the seed's; else "not comparable", the differences named."""
    out = _read(claim, results, runs, seeds, baseline, filter_metrics, decided)
    if out["status"] == CANNOT and out["mean"] is None:
        return out  # nothing of ours to compare
    passes = median_passes(runs, claim.get("variant") or baseline, seeds)
    if claim.get("seed_passes") and passes is not None:
        out["ours"] += f" [{fmt(passes)} passes; the seed's number: {fmt(claim['seed_passes'])}]"
    differs = differences(claim, baseline, passes)
    return {**out, "status": NOT_COMPARABLE, "reason": "; ".join(differs)} if differs else out


def differences(claim: Mapping, baseline: str, passes: float | None) -> list[str]:
    """How the claim's reading differs from the seed's: the quantity (comparable: false), a setting of
    seed_conditions that an arm of ours lacks (claim["arms"]: resolved settings, pipeline.report), our
    `passes` (the variant's, median_passes) outside BUDGET_CLASS of seed_passes."""
    out = [] if claim.get("comparable", True) else ["not the seed's quantity (comparable: false)"]
    if claim["read"] in ("filter_kept", "param_count", "none"):
        return out
    variant = claim.get("variant") or baseline
    names = [variant] + ([claim.get("versus") or baseline] if claim["read"] not in ("value", "plateau") else [])
    for name in dict.fromkeys(names):
        arm = (claim.get("arms") or {}).get(name)
        for section, settings in (claim.get("seed_conditions") or {}).items():
            for key, value in settings.items():
                if arm is None:
                    out.append(f"{name}'s settings unknown here, the seed's runs had {section}.{key} {value}")
                elif arm[section].get(key) != value:
                    out.append(f"{name} has {section}.{key} {arm[section].get(key)}, the seed's runs had {value}")
    if seed := claim.get("seed_passes"):
        ours = passes
        if ours is None:
            out.append(f"our passes over the training data are not recorded (train.json), the seed's: {fmt(seed)}")
        elif max(ours, seed) / min(ours, seed) > BUDGET_CLASS:
            out.append(f"{variant} trained {fmt(ours)} passes over its training data, the seed's number "
                       f"came from {fmt(seed)}")
    return out


def _read(claim: Mapping, results: Results, runs: Mapping, seeds: Sequence[int], baseline: str,
          filter_metrics: Mapping | None, decided: Record | None = None) -> dict:
    """read_claim before the comparability check: the reading and our verdict's check."""
    read, variant, metric = claim["read"], claim.get("variant"), claim.get("metric")
    out = {"ours": MISSING, "status": CANNOT, "reason": "", "mean": None, "low": None, "high": None, "n": 0}
    if read == "none":
        return {**out, "reason": "nothing in this study measures it"}
    versus = claim.get("versus") or baseline
    if read in ("delta", "ppl_ratio", "time_ratio") and variant == versus:
        return {**out, "reason": f"{variant} is the variant it is compared with: no Δ"}
    direction = None  # 'worse'/'better' (delta) or 'lower'/'higher' (ratios) as our verdict says; None: no difference
    if read in ("delta", "ppl_ratio"):
        metric = metric or "val_loss"
        seq = _sequential(decided, variant, versus, baseline, metric)
        if seq is not None:
            return _read_sequential(claim, read, seq, decided, out)
        got = delta_reading(read, results, runs, seeds, variant, versus, baseline, metric)
        if got is None:
            return {**out, "reason": f"no Δ {metric} of {variant} vs {versus} in this study's runs"}
        mean, low_high, n, direction, ours = got
    elif read == "time_ratio":
        got = time_ratio(runs, seeds, variant, versus)
        if got is None:
            return {**out, "reason": f"no paired training wall times (train.json) for {variant} and {versus}"}
        mean, low_high, n, direction, ours = got
        timed = [(variant, s) for s in seeds] + [(versus, s) for s in seeds]
        if any(contended(runs[k].train) for k in timed if k in runs):
            ours += " ⚠ some of these runs were timed under contention (Training cost)"
            return {**out, "ours": ours, "mean": mean, "n": n,
                    "reason": "some of these runs were timed under contention: their times are not the seed's quantity"}
    elif read == "early_loss":
        got = early_loss(runs, seeds, variant, versus)
        if got is None:
            return {**out, "reason": f"no paired validation curves (val_curve.csv) for {variant} and {versus}"}
        mean, low_high, n, direction, ours = got
    elif read == "param_count":
        return _read_param_count(claim, out)
    elif read == "value":
        variant = variant or baseline
        s, where = over_seeds(results, runs, seeds, variant, metric)
        if s is None or s.mean is None:
            return {**out, "reason": f"no {metric} for {variant} in this study's runs"}
        mean, n = s.mean, s.n
        low_high = interval(s.mean, s.half_width)
        ours = f"{variant}, {where}: {fmt(mean)} ({ci_text(low_high)}, {n} seed{'s' * (n != 1)})"
    elif read == "plateau":
        return _read_plateau(claim, results, runs, variant, decided, out)
    else:  # filter_kept: a count, not an estimate over seeds
        split = claim.get("split") or "train"
        kept = filter_kept(filter_metrics, split)
        if kept is None:
            return {**out, "reason": f"no {split} split counts in filter.json"}
        (mean, n, ours), low_high = kept, (kept[0], kept[0])
    low, high = low_high if low_high is not None else (None, None)
    if decided and read != "filter_kept":  # another metric, another arm, a value: not a sequential reading
        ours += FIXED_N
    if claim.get("seed_value") is not None and read in ("delta", "ppl_ratio", "time_ratio"):
        ours += _inside(claim["seed_value"], low_high)
    out.update(ours=ours, mean=mean, low=low, high=high, n=n)
    if not claim.get("comparable", True):
        return out  # not the seed's quantity: read_claim says so, no check
    status, reason = _check(claim, read, direction, mean, low_high)
    return {**out, "status": status, "reason": reason}


def _read_param_count(claim: Mapping, out: dict) -> dict:
    """read param_count: our model's own counts (claim["counted"], pipeline.report) of the seed's model."""
    counted, parts = claim.get("counted"), claim["components"]
    if not counted:
        return {**out, "reason": "the seed's model was not counted (pipeline.report attaches the counts)"}
    mean = float(sum(counted[c] for c in parts))
    ours = (f"{round(mean):,} ({' + '.join(f'{c} {counted[c]:,}' for c in parts)}; our model built at the seed's "
            "settings on the meta device, model.param_counts)")
    out = {**out, "ours": ours, "mean": mean, "low": mean, "high": mean, "n": 1}
    if not claim.get("comparable", True):
        return out
    status, reason = _check(claim, "value", None, mean, (mean, mean))
    return {**out, "status": status, "reason": f"{reason}; ours − the seed's: {mean - claim['seed_value']:+,.0f}"}


def _read_plateau(claim: Mapping, results: Results, runs: Mapping, variant: str, decided: Record | None,
                  out: dict) -> dict:
    """read plateau: does the variant's whole val_loss interval end below the unigram plateau?"""
    s = results.summaries.get(variant, {}).get("val_loss")
    plateau = unigram_plateau(runs)
    if s is None or s.mean is None or plateau is None:
        return {**out, "reason": f"no val_loss for {variant} or no unigram plateau (eval.json) in this study"}
    low_high = interval(s.mean, s.half_width)
    top, share = (low_high[1] if low_high else s.mean), 1 - s.mean / plateau
    ours = (f"{variant}, val_loss {fmt(s.mean)} ({ci_text(low_high)}, {s.n} seed{'s' * (s.n != 1)}) against the "
            f"unigram plateau {fmt(plateau)}: {abs(share):.0%} {'below' if share > 0 else 'above'} it"
            + (FIXED_N if decided else ""))
    out = {**out, "ours": ours, "mean": s.mean, "low": low_high[0] if low_high else None, "high": top, "n": s.n}
    if not claim.get("comparable", True):
        return out
    left = top < plateau  # the whole interval below: it learnt more than the characters' frequencies
    status = AGREE if left == (claim["expect"] == "leaves") else CONTRADICT
    return {**out, "status": status, "reason": ("our whole interval lies below the plateau: it converged, "
                                                 "whatever its Δ" if left else "our interval reaches the plateau")}


def _read_sequential(claim: Mapping, read: str, seq: Mapping, decided: Record, out: dict) -> dict:
    """read_claim under seeds until decided: the record's verdict and interval, not the fixed-n test."""
    plan = decided.plan
    mean, low, high, state = seq["mean"], seq["lo"], seq["hi"], seq["state"]
    words = {"continue": "not decided yet", "undecided": "undecided at the budget",
             "equivalent": f"equivalent (inside ±{plan.margin})"}.get(state, state)
    interval = f"{look_level(plan, seq['n']):.2%} sequential interval"
    if read == "delta":
        ours = f"Δ {mean:+.3g} ({interval} [{fmt(low, 3)}, {fmt(high, 3)}], {seq['n']} paired seeds): {words}"
    else:
        mean, low, high = math.exp(mean), math.exp(low), math.exp(high)
        ours = (f"ratio {fmt(mean)} ({interval} [{fmt(low, 3)}, {fmt(high, 3)}]; exp of Δ {decided.metric} "
                f"{seq['mean']:+.3g}, {seq['n']} paired seeds): {words}")
    if claim.get("seed_value") is not None:
        ours += _inside(claim["seed_value"], (low, high))
    out = {**out, "ours": ours, "mean": mean, "low": low, "high": high, "n": seq["n"]}
    if not claim.get("comparable", True):
        return out  # not the seed's quantity: read_claim says so, no check
    expect = claim.get("expect")
    if read == "ppl_ratio":
        expect = {"higher": "worse", "lower": "better"}.get(expect, expect)
    if state in ("continue", "undecided"):
        status, reason = UNDECIDED, f"seeds until decided: {words}"
    elif state == "equivalent":
        status = AGREE if expect == "same" else CONTRADICT
        reason = f"our sequential verdict: {words}, the seed's: {claim.get('expect')}"
    elif expect == "same":
        status, reason = CONTRADICT, f"our sequential verdict: {state}"
    else:
        status = AGREE if state == expect else CONTRADICT
        reason = f"our sequential verdict: {state}, the seed's: {claim.get('expect')}"
    return {**out, "status": status, "reason": reason}


def _check(claim: Mapping, read: str, direction: str | None, mean: float,
           low_high: tuple[float, float] | None) -> tuple[str, str]:
    expect, tol = claim.get("expect"), claim.get("tolerance")
    if read in ("value", "filter_kept"):
        target, span = claim["seed_value"], f"{fmt(claim['seed_value'])} ± {fmt(tol)}"
        low, high = low_high if low_high is not None else (mean, mean)
        if target - tol <= low and high <= target + tol:
            return AGREE, f"ours lies within {span}"
        if high < target - tol or low > target + tol:
            return CONTRADICT, f"ours lies outside {span}"
        return UNDECIDED, f"our interval reaches both inside and outside {span}"
    if low_high is None and direction is None:
        return UNDECIDED, "no test: one paired seed has no interval"
    if expect == "same":
        if tol is not None and low_high is not None:
            if -tol <= low_high[0] and low_high[1] <= tol:
                return AGREE, f"our interval lies within ±{fmt(tol)}"
            if low_high[0] > tol or low_high[1] < -tol:
                return CONTRADICT, f"our interval lies outside ±{fmt(tol)}"
            return UNDECIDED, f"our interval reaches beyond ±{fmt(tol)}"
        if direction is not None:
            return CONTRADICT, f"our verdict: {direction}"
        return UNDECIDED, "no significant difference, which is not evidence of none (no margin given)"
    if direction is None:
        seed = claim.get("seed_value")
        if seed is not None and low_high is not None and not low_high[0] <= seed <= low_high[1]:
            return CONTRADICT, (f"no significant difference, and the seed's {fmt(seed)} lies outside our interval: "
                                "its number is ruled out")
        return UNDECIDED, "no significant difference: our interval holds " + ("0" if read in ("delta", "early_loss")
                                                                             else "1")
    return (AGREE if direction == expect else CONTRADICT), f"our verdict: {direction}, the seed's: {expect}"


def claims_blocks(claims: Sequence[Mapping], results: Results, runs: Mapping, seeds: Sequence[int],
                  baseline: str, filter_metrics: Mapping | None, decided: Record | None = None) -> list[Block]:
    """The "Seed's claims" section: one row per claim, ours beside the seed's; [] without claims."""
    if not claims:
        return []
    rows, counts = [], {}
    for c in claims:
        r = read_claim(c, results, runs, seeds, baseline, filter_metrics, decided)
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        rows.append([c["claim"], c["seed_says"], c["quantity"], r["ours"], f"{r['status']}: {r['reason']}",
                     c["why"]])
    tally = ", ".join(f"{counts[s]} {s}" for s in STATUSES if s in counts)
    return [
        Heading("Seed's claims"),
        Paragraph(f"What the seed study claimed (params.yaml report.seed_claims, the preset's), beside our number "
                  f"on the same quantity read from this report's data: {tally}. The check is our verdict's: a "
                  "direction agrees when our test finds it (95% interval clear of no difference), contradicts "
                  "when it finds the other, is undecided when the interval holds no difference; a value agrees "
                  "when our whole interval lies within the seed's number ± the claim's tolerance. Not comparable "
                  "when ours is not the seed's quantity, an arm of ours lacks a setting the seed's runs had, "
                  f"or our passes over the training data are more than {BUDGET_CLASS:g}× off the seed's (the "
                  "difference named); cannot check here when the quantity is absent."
                  + (" Under seeds until decided a Δ of the primary metric against the baseline is checked by "
                     "the sequential verdict and its interval (Seeds until decided), not the fixed-n test."
                     if decided else "")),
        Table(["claim (the seed's words)", "the seed", "quantity", "ours", "check", "why"], rows,
              "The seed's claims, checked"),
    ]


def claims_summary(claims: Sequence[Mapping], results: Results, runs: Mapping, seeds: Sequence[int],
                   baseline: str, filter_metrics: Mapping | None, decided: Record | None = None) -> list[dict]:
    """details.json's "seed_claims": each claim's reading and check."""
    out = []
    for c in claims:
        r = read_claim(c, results, runs, seeds, baseline, filter_metrics, decided)
        out.append({"claim": c["claim"], **{k: c.get(k) for k in ("read", "variant", "versus", "metric", "seed_value")},
                    **{k: r[k] for k in ("status", "mean", "low", "high", "n")}})
    return out
