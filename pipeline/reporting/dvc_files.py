"""What the report stage hands back to DVC: a metrics file, the detail beside it, and curve tables.

`reports/metrics.json` (dvc.yaml top-level `metrics:`) is what `dvc exp show`, `dvc metrics show`
and `dvc metrics diff` put in columns, so it holds only what a verdict needs, named to fit a
terminal: per variant, the primary metric's numbers directly under its name and the task metric's
under `<variant>.<metric>`; `mean` (for the baseline with `ci95`, its 95% interval half-width), and
for each ablation `delta` (vs the baseline, paired by seed), `delta_ci95` (the Δ's 95% half-width)
and `p`, the p-value its verdict compares with 5% (the primary metric's paired t-test; for a
secondary metric Holm-adjusted; for a derived one its source's). `primary_metric` names the metric
the unprefixed columns are. A few dozen numbers: `no_positional.delta` is the ablation's Δ of the
primary metric, and four ablations' Δs of two experiments fit 120 columns.
`reports/details.json` (an output, not a DVC metric) holds the rest: every metric's mean, interval
and n, every Δ with how it was tested (role, raw and Holm-adjusted p, the |Δ| detectable with 80%
power, the seeds the observed Δ would need), the unigram plateau, the sweeps and the knock-outs.
Committed studies from before the split keep all of it in their metrics.json (`read_details`).
`reports/curves/{val,train}_loss.csv` hold every run's curve with variant and seed columns, drawn by
the `by_variant` template (.dvc/plots/).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from pipeline.reporting.inputs import Run
from pipeline.reporting.results import DERIVED


def metrics_summary(results, variants: Sequence[str]) -> dict:
    """reports/metrics.json: the primary and the task metric per variant (module docstring)."""
    out: dict = {"primary_metric": results.primary}
    for v in variants:
        entry = numbers(results, v, results.primary)
        task = results.main_metric
        if task and task != results.primary:
            entry[task] = numbers(results, v, task)
        out[v] = entry
    return out


def numbers(results, variant: str, metric: str) -> dict:
    """One metric of one variant for metrics.json: mean (and ci95) for the baseline; mean, delta,
    delta_ci95 and p for an ablation."""
    s = results.summaries[variant].get(metric)
    d = results.deltas.get(variant, {}).get(metric)
    if s is None:
        return {}
    if d is None:  # the baseline
        return {"mean": s.mean, "ci95": s.half_width}
    return {"mean": s.mean, "delta": d.mean, "delta_ci95": d.half_width, "p": verdict_p(results, variant, metric)}


def verdict_p(results, variant: str, metric: str) -> float | None:
    """The p-value the verdict on `metric` compares with 5%: the paired t-test's for the primary
    metric, Holm-adjusted for a secondary one, and a derived metric's source's (the same test)."""
    test = results.tests[variant][metric]
    if test.role == "derived":
        metric = DERIVED[metric]
        test = results.tests[variant].get(metric)
        if test is None:
            return None
    return test.p_holm if test.role == "secondary" else results.deltas[variant][metric].p_value


def details_summary(results, variants: Sequence[str], plateau: float | None = None) -> dict:
    """reports/details.json: every metric of every variant, each Δ with how it was tested; keys are
    only ever added (scripts.report_studies reads this file)."""
    out = {}
    for v in variants:
        entry = {}
        for m in results.metrics:
            s = results.summaries[v][m]
            entry[m] = {"mean": s.mean, "ci95": s.half_width, "n": s.n}
            d = results.deltas.get(v, {}).get(m)
            if d is not None:
                t = results.tests[v][m]
                entry[m].update({"delta": d.mean, "delta_ci95": d.half_width, "p": d.p_value, "verdict": d.verdict,
                                 "role": t.role, "p_holm": t.p_holm, "sd_delta": d.sd,
                                 "detectable_delta_80": t.detectable, "seeds_for_delta_80": t.seeds})
                if t.role == "derived":
                    entry[m]["derived_from"] = DERIVED[m]
        out[v] = entry
    summary = {"variants": out, "main_metric": results.main_metric, "primary_metric": results.primary,
               "holm_family_size": results.family_size}
    if plateau is not None:
        summary["unigram_val_loss"] = plateau  # the encode stage's unigram plateau
    return summary


def read_details(folder: Path) -> dict:
    """A report folder's details (details.json), or for a report written before metrics.json was
    cut to the verdict's numbers, its metrics.json, which held the same keys."""
    path = folder / "details.json"
    return json.loads((path if path.is_file() else folder / "metrics.json").read_text(encoding="utf-8"))


def curve_tables(runs: Mapping[tuple[str, int], Run], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for attr, column in (("val_curve", "val_loss"), ("train_curve", "train_loss")):
        frames = []
        for (variant, seed), run in runs.items():
            curve = getattr(run, attr)
            if curve is not None and not curve.empty:
                frames.append(curve[["tokens", column]].assign(variant=variant, seed=seed))
        table = pd.concat(frames) if frames else pd.DataFrame(columns=["tokens", column, "variant", "seed"])
        table[["variant", "seed", "tokens", column]].to_csv(out_dir / f"{column}.csv", index=False)
