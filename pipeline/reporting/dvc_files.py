"""What the report stage hands back to DVC: a metrics file and long-format curve tables.

`reports/metrics.json` (dvc.yaml top-level `metrics:`) holds each variant's mean and 95% interval
half-width per metric and its paired delta vs the baseline, so `dvc metrics show/diff` and
`dvc exp show` compare variants and experiments. Each delta also carries how it was tested (role:
primary / secondary / derived, Holm-adjusted p, the |delta| detectable with 80% power and the seeds
the observed delta would need); keys are only ever added, scripts.report_studies reads this file.
`reports/curves/{val,train}_loss.csv` hold every run's curve with variant and seed columns, drawn by
the `by_variant` template (.dvc/plots/).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from pipeline.reporting.inputs import Run
from pipeline.reporting.results import DERIVED


def metrics_summary(results, variants: Sequence[str], plateau: float | None = None) -> dict:
    out = {}
    for v in variants:
        entry = {}
        for m in results.metrics:
            s = results.summaries[v][m]
            entry[m] = {"mean": s.mean, "ci95": s.half_width, "n": s.n}
            d = results.deltas.get(v, {}).get(m)
            if d is not None:
                t = results.tests[v][m]
                entry[m].update({"delta": d.mean, "p": d.p_value, "verdict": d.verdict, "role": t.role,
                                 "p_holm": t.p_holm, "sd_delta": d.sd, "detectable_delta_80": t.detectable,
                                 "seeds_for_delta_80": t.seeds})
                if t.role == "derived":
                    entry[m]["derived_from"] = DERIVED[m]
        out[v] = entry
    summary = {"variants": out, "main_metric": results.main_metric, "primary_metric": results.primary,
               "holm_family_size": results.family_size}
    if plateau is not None:
        summary["unigram_val_loss"] = plateau  # the encode stage's unigram plateau
    return summary


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
