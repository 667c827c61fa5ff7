"""The report's record of a seeds-until-decided study (params decide.looks; pipeline.deciding).

From the runs on disk: the primary metric per variant and seed, the rounds' record
(pipeline.deciding.rounds.step: the looks each comparison took, its interval at the study's level,
its verdict, the seeds it needs next), written to reports/decisions.json, which `bash run.sh decide`
reads to add the next round's runs. The section says per comparison what was decided and how, and
the runs spent beside the fixed design that runs every variant at the budget. Fixed-n p-values and
power are not valid after adaptive stopping: the section says so, and the sequential verdict is the
study's answer.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pipeline.deciding.record import Comparison, Record
from pipeline.deciding.rounds import plan_fingerprint, step
from pipeline.deciding.rule import Plan
from pipeline.reporting.formatting import arrow, fmt
from pipeline.reporting.render import Block, Heading, Paragraph, Table
from pipeline.reporting.stats import higher_is_better


def record(runs: Mapping, variants: Sequence[str], seeds: Sequence[int], baseline: str, primary: str,
           looks: Sequence[int], alpha: float, margin: float | None, metric_param: str | None = None,
           method: str = "t", boundary: str = "bonferroni", rho: float = 1.0) -> Record:
    """The rounds' record from the runs' eval.json (a run without the metric counts as not run),
    with the plan's fingerprint (`metric_param`: report.primary_metric as params.yaml has it)."""
    results: dict[str, dict[int, float]] = {v: {} for v in variants}
    for (variant, seed), run in runs.items():
        value = (run.eval or {}).get(primary)
        if variant in results and value is not None:
            results[variant][int(seed)] = float(value)
    plan = Plan(tuple(looks), alpha, margin, len(variants) - 1, method, boundary, rho)
    fingerprint = plan_fingerprint(baseline=baseline, variants=variants, seeds=seeds, looks=looks, alpha=alpha,
                                   margin=margin, metric=metric_param, method=method, boundary=boundary, rho=rho)
    return step(results, plan, seeds, higher_is_better(primary), baseline=baseline, metric=primary,
                fingerprint=fingerprint)


def decision_blocks(rec: Record) -> list[Block]:
    plan = rec.plan
    margin = plan.margin
    rows = []
    for name, v in sorted(rec.variants.items()):
        last = v.looks[-1] if v.looks else None
        taken = ", ".join(str(look.n) for look in v.looks) or "none yet"
        interval = f"[{fmt(last.lo, 3)}, {fmt(last.hi, 3)}]" if last else "—"
        rows.append([name, taken, str(last.n) if last else "0", fmt(last.mean, 3) if last else "—",
                     interval, v.state, str(v.runs)])
    median = plan.method == "median"
    kind = ("a distribution-free interval for the median difference (order statistics; no interval before "
            f"{plan.first_look} seeds)" if median else "a t-interval")
    words = (f"Seeds until decided: each comparison with {rec.baseline.name} on {rec.metric} was looked at "
             f"when it had {', '.join(map(str, plan.looks))} paired seeds, with {kind} "
             + boundary_words(plan) + ": "
             + (f"if the per-seed differences are independent draws from a continuous distribution, every interval "
                f"below covers its median difference at once with probability ≥ {1 - plan.alpha:.2f} however the "
                "looks turned out (pipeline/deciding/rule.py). worse/better: the " if median else
                f"if each comparison's per-seed differences are independent draws from one normal distribution, every "
                f"interval below covers its Δ at once with probability ≥ {1 - plan.alpha:.2f} however the looks "
                "turned out (pipeline/deciding/rule.py); a skew (rare seeds far out on one side, such as runs that "
                "leave a loss plateau late) breaks that guarantee. worse/better: the ")
             + "interval excludes 0; " + (f"equivalent: it lies inside (−{margin}, {margin}); " if margin else "")
             + "undecided: the budget was spent first. Only open comparisons got more seeds.")
    spent, fixed = rec.runs_spent, rec.fixed_design_runs
    cost = (f"Runs spent: {spent} (the baseline {rec.baseline.runs}), against {fixed} for the fixed design "
            f"that runs every variant at the budget of {plan.budget} seeds ({spent / fixed:.0%}).")
    caveat = ("The p-values, intervals and power in Results (and the Δ figure's secondary panel) are the fixed-n "
              "ones over every seed run and are not valid after adaptive stopping (a comparison stopped because its "
              "interval looked decided); this section's verdicts, and the Δ figure's primary panel, are the study's "
              "answer.")
    status = "" if rec.done else " Not finished: `bash run.sh decide` adds the runs still open comparisons need."
    return [Heading("Seeds until decided"), Paragraph(words),
            Table(["variant", "looks taken (n)", "n", "Δ", "interval", "verdict", "runs"], rows),
            Paragraph(cost + status), Paragraph(caveat)]


SPENDING_NAMES = {"obf": "O'Brien–Fleming-type", "pocock": "Pocock-type", "rho": "ρ-family"}


def boundary_words(plan: Plan) -> str:
    """How the plan's looks share the error, for the section's first paragraph."""
    looks = plan.looks
    if plan.boundary == "bonferroni":
        return (f"at level {plan.level:.4f} (1 − α/(m·K), α {plan.alpha}, m {plan.comparisons} comparisons, "
                f"K {len(looks)} looks)")
    name = SPENDING_NAMES[plan.boundary] + (f" (ρ {plan.rho})" if plan.boundary == "rho" else "")
    levels = ", ".join(f"{n}: {f'{lv:.4f}' if math.isfinite(c) else 'none'}"
                       for n, c, lv in zip(looks, plan.criticals, plan.levels))
    return (f"at each look's level of a group-sequential boundary: α/m = {plan.alpha / plan.comparisons:.4g} "
            f"(α {plan.alpha}, m {plan.comparisons}) spent over the looks by the {name} Lan–DeMets function, "
            f"the critical values exact for the t statistics (repeated confidence intervals; "
            f"pipeline/deciding/boundary.py), levels by look {levels} ('none': no verdict can come there)")


def look_level(plan: Plan, n: int) -> float:
    """The interval's level at the look with n seeds (Bonferroni: the same at every look)."""
    return plan.levels[plan.looks.index(n)]


WORDS = {"worse": "worse than {b}", "better": "better than {b}", "equivalent": "equivalent to {b} (inside ±{m})",
         "undecided": "undecided at the budget", "continue": "not decided yet"}


def interval_text(v: Comparison, plan: Plan) -> str:
    """A comparison's last look as the report's verdict and the docs' studies table both give it:
    `99.75% sequential interval [-0.103, 0.153], 20 paired seeds, looks at 3, 5, 8, 12, 20`."""
    last = v.looks[-1]
    return (f"{look_level(plan, last.n):.2%} sequential interval [{fmt(last.lo, 3)}, {fmt(last.hi, 3)}], "
            f"{last.n} paired seeds, looks at {', '.join(str(look.n) for look in v.looks)}")


def verdict_blocks(rec: Record) -> list[Block]:
    """The report's first lines under seeds until decided: each comparison's sequential verdict, its
    interval at the study's level and the seeds it took (the fixed-n test is not valid here)."""
    plan, base, metric = rec.plan, rec.baseline.name, rec.metric
    lines = []
    for name, v in sorted(rec.variants.items()):
        last = v.looks[-1] if v.looks else None
        words = WORDS[v.state].format(b=base, m=plan.margin)
        if last is None:
            lines.append(f"{name}: {metric} {arrow(metric)}: {words} (no look yet).")
            continue
        lines.append(f"{name}: {metric} {arrow(metric)} Δ {last.mean:+.3g} ({interval_text(v, plan)}): {words}.")
    return [Heading("Verdict"),
            Paragraph(f"Each variant − {base} on the primary metric {metric}, paired by seed, decided by seeds until "
                      "decided (the intervals hold together with probability ≥ "
                      f"{1 - plan.alpha:.2f}; Seeds until decided):"),
            *[Paragraph(line) for line in lines]]


def planned_seeds(variants: Sequence[str], seeds: Sequence[int], runs: Mapping[str, Mapping]) -> dict[str, list[int]]:
    """Each variant's seeds under seeds until decided: `seeds`, then those decide.runs added to it."""
    return {v: list(seeds) + sorted(int(r["seed"]) for r in runs.values() if r["variant"] == v) for v in variants}
