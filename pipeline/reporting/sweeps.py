"""The report's sweep sections: each variant at its own best learning rate (params `lr_sweep`), and
each ablation's effect across model sizes (params `scales`). No section while a sweep is off.

Design decisions:
- The learning rate is chosen per variant on the validation split alone: `best_rates` is handed
  validation losses and nothing else, so no test number can leak into the choice. The variants are
  then compared at their chosen rates on what the choice did not see (test_loss and the task
  metric, both from the test split); comparing on val_loss would reward the selection itself.
- The main runs are every variant's point at its own `train.lr`; the sweep trains only the others.
- A rate at which any seed diverged (or has no value) is shown but never chosen: its mean is not
  over the same seeds as the others'.
- Scale trends are a paired test over seeds of (Δ at the largest size − Δ at the smallest), so the
  report says "grows", "shrinks" or "flips" only when the change itself is significant (Holm over
  the ablations); otherwise it says the change could not be detected.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.reporting import plots
from pipeline.reporting.formatting import MISSING, arrow, fmt, fmt_int, fmt_p, fmt_summary
from pipeline.reporting.inputs import Run, load_run, number, values_by_seed
from pipeline.reporting.render import Block, Figure, Heading, Paragraph, Table
from pipeline.reporting.results import DERIVED, MAIN_METRIC_PRIORITY
from pipeline.reporting.stats import ALPHA, Delta, higher_is_better, holm, paired_delta, summarize, verdict_for
from pipeline.tracking import point_label

SELECTION_METRIC = "val_loss"  # the one number a learning rate is chosen by
BASE_SCALE = "params.yaml"  # the main runs' size, the first point of the scale comparison


@dataclass
class RatePoint:
    """One variant's runs at one learning rate: the main runs at its train.lr, or a sweep point."""

    lr: float
    runs: dict[int, Run]  # seed -> run

    def diverged(self) -> list[int]:
        return [s for s, r in self.runs.items() if (r.train or {}).get("diverged") or (r.eval or {}).get("diverged")]


def _verdict(d: Delta, p: float | None, metric: str) -> str:
    """better / worse / n.s. at ALPHA for the Holm-adjusted p; without a test, why not."""
    if d.mean is None:
        return MISSING
    if p is None:  # zero variance or one seed (pipeline.reporting.stats.paired_delta)
        if d.verdict.startswith("no significant"):
            return "n.s. (identical in every seed)"
        if d.verdict.startswith(("better", "worse")):
            return d.verdict.split(" ")[0] + " (the same Δ in every seed)"
        return d.verdict
    return "n.s." if p >= ALPHA else verdict_for(d.mean, p, higher_is_better(metric))


def holm_deltas(pairs: Mapping[tuple[str, str], Delta]) -> dict[tuple[str, str], float | None]:
    """Holm-adjusted p per (variant, metric), over the tests of `pairs` that have a p-value."""
    tested = [k for k, d in pairs.items() if d.p_value is not None]
    adjusted = dict(zip(tested, holm([pairs[k].p_value for k in tested])))
    return {k: adjusted.get(k) for k in pairs}


def ci(d: Delta) -> str:
    if d.mean is None:
        return MISSING
    if d.half_width is None:
        return f"{fmt(d.mean, 3)} (n={d.n})"
    return f"{fmt(d.mean, 3)} [{fmt(d.mean - d.half_width, 3)}, {fmt(d.mean + d.half_width, 3)}]"


# ---------------------------------------------------------------- fair learning rates

@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep stage: `kind` "lr" or "scale", `value` as params.yaml holds it."""

    kind: str
    value: float | str
    run_dir: Path
    eval_dir: Path
    run: Run

    @property
    def label(self) -> str:
        """Its MLflow point, `lr=0.01` or `scale=wide` (pipeline.tracking.point_label)."""
        return point_label({self.kind: float(self.value) if self.kind == "lr" else self.value})


def load_sweeps(runs_dir: Path, evals_dir: Path, variants: Sequence[str], seeds: Sequence[int],
                lr_sweep: Sequence[float], main_lr: Mapping[str, float], scales: Sequence[str]) -> list[SweepRun]:
    """Every sweep run's files, read once. A folder is named as DVC writes the matrix value (`str`
    of what params.yaml holds): data/runs/lr/<variant>-<seed>-0.01, data/runs/scale/<...>-wide.
    A variant that sets its own train.lr has its main runs at that rate, not a sweep point."""
    out = []
    for v in variants:
        points = [("lr", lr) for lr in lr_sweep if float(lr) != float(main_lr[v])] + [("scale", sc) for sc in scales]
        for kind, value in points:
            for seed in seeds:
                runs, evals = Path(runs_dir) / kind, Path(evals_dir) / kind
                name = f"{v}-{seed}-{value}"
                out.append(SweepRun(kind, value, runs / name, evals / name, load_run(runs, evals, v, seed, str(value))))
    return out


def lr_grid(main_runs: Mapping[tuple[str, int], Run], sweeps: Sequence[SweepRun], variants: Sequence[str],
            seeds: Sequence[int], main_lr: Mapping[str, float]) -> dict[str, list[RatePoint]]:
    """variant -> its points by rising rate: the main runs at main_lr[variant] and each sweep rate."""
    grid = {v: {float(main_lr[v]): RatePoint(float(main_lr[v]), {s: main_runs[(v, s)] for s in seeds})}
            for v in variants}
    for sr in sweeps:
        if sr.kind == "lr":
            grid[sr.run.variant].setdefault(float(sr.value), RatePoint(float(sr.value), {})).runs[sr.run.seed] = sr.run
    return {v: [points[lr] for lr in sorted(points)] for v, points in grid.items()}


def validation_losses(grid: Mapping[str, Sequence[RatePoint]]) -> dict[str, dict[float, dict[int, float | None]]]:
    """variant -> rate -> seed -> val_loss (None: diverged or missing). Nothing else is read."""
    out: dict[str, dict[float, dict[int, float | None]]] = {}
    for v, points in grid.items():
        out[v] = {}
        for p in points:
            bad = set(p.diverged())
            out[v][p.lr] = {s: None if s in bad else number(r.eval, SELECTION_METRIC) for s, r in p.runs.items()}
    return out


def best_rates(val: Mapping[str, Mapping[float, Mapping[int, float | None]]]) -> dict[str, float | None]:
    """variant -> the rate with the lowest mean validation loss among rates with every seed's value."""
    best = {}
    for v, by_rate in val.items():
        complete = {lr: float(np.mean(list(by_seed.values()))) for lr, by_seed in by_rate.items()
                    if by_seed and all(x is not None for x in by_seed.values())}
        best[v] = min(complete, key=complete.get) if complete else None
    return best


def compared_metrics(runs: Mapping[tuple[str, int], Run]) -> list[str]:
    """test_loss and the task's main metric when it is not derived from test_loss (held-out both)."""
    present = {k for r in runs.values() if r.eval for k in r.eval}
    main = next((m for m in MAIN_METRIC_PRIORITY if m in present), None)
    return ["test_loss"] + ([main] if main and main not in DERIVED else [])


def compare(points: Mapping[str, RatePoint], baseline: str, metrics: Sequence[str]):
    """(variant, metric) -> (Delta vs the baseline's point, Holm-adjusted p over the table)."""
    def vals(v: str, m: str) -> dict[int, float]:
        p = points[v]
        runs = {(v, s): r for s, r in p.runs.items()}
        return values_by_seed(runs, v, list(p.runs), "eval", m)

    deltas = {(v, m): paired_delta(vals(v, m), vals(baseline, m), higher_is_better(m))
              for v in points if v != baseline and points[v] is not None for m in metrics}
    adjusted = holm_deltas(deltas)
    return {k: (d, adjusted[k]) for k, d in deltas.items()}


@dataclass
class FairLR:
    grid: dict[str, list[RatePoint]]
    val: dict[str, dict[float, dict[int, float | None]]]
    best: dict[str, float | None]
    metrics: list[str]
    fair: dict  # (variant, metric) -> (Delta, p_holm), each variant at its best rate
    shared: dict  # the same at each variant's train.lr (the main comparison)


def fair_lr_results(grid: Mapping[str, list[RatePoint]], baseline: str, main_runs,
                    main_lr: Mapping[str, float]) -> FairLR:
    val = validation_losses(grid)
    best = best_rates(val)
    metrics = compared_metrics(main_runs)
    at_best = {v: next((p for p in pts if p.lr == best[v]), None) for v, pts in grid.items()}
    fair = compare(at_best, baseline, metrics) if at_best.get(baseline) else {}
    shared = compare({v: next(p for p in pts if p.lr == float(main_lr[v])) for v, pts in grid.items()},
                     baseline, metrics)
    return FairLR(dict(grid), val, best, metrics, fair, shared)


def fair_lr_blocks(res: FairLR, baseline: str, main_lr: Mapping[str, float], figures_dir: Path,
                   colors) -> list[Block]:
    rates = sorted({p.lr for pts in res.grid.values() for p in pts})
    rows = []
    for v, pts in res.grid.items():
        cells = {}
        for p in pts:
            bad = p.diverged()
            vals = [x for x in res.val[v][p.lr].values() if x is not None]
            text = fmt_summary(summarize(vals)) if vals else MISSING
            if bad:
                text = f"diverged ({len(bad)}/{len(p.runs)} seeds)" + (f"; others {text}" if vals else "")
            mark = " ★" if p.lr == res.best[v] else ""
            shared = " (train.lr)" if p.lr == main_lr[v] else ""
            cells[p.lr] = text + mark + shared
        rows.append([v] + [cells.get(lr, "not trained") for lr in rates])
    blocks: list[Block] = [
        Heading("Fair learning rates"),
        Paragraph(f"Every variant trained at each rate of params.yaml lr_sweep besides its own train.lr (the main "
                  f"runs), over the same seeds. Each variant's rate is the one with the lowest mean {SELECTION_METRIC} "
                  "(the whole validation split) over the seeds; the comparison below is on the test split, which the "
                  "choice never read."),
        Table(["variant"] + [f"lr {lr:g}" for lr in rates], rows,
              f"{SELECTION_METRIC} ↓ by learning rate: mean ± 95% t-interval over seeds; ★ = the rate chosen",
              ["A rate where a seed diverged or has no value is not chosen (its mean would be over other seeds)."]
              + [f"{v}: the chosen rate {res.best[v]:g} is the {side} one tried, so its best rate may lie beyond the "
                 f"sweep; add a {'higher' if side == 'highest' else 'lower'} rate to lr_sweep to know."
                 for v, side in at_edge(res).items()]),
    ]
    plots.plot_lr_sweep({v: [(lr, list(by_seed.values()), res.best[v] == lr) for lr, by_seed in res.val[v].items()
                               if by_seed and None not in by_seed.values()] for v in res.grid},
                          colors, figures_dir / "lr_sweep.png")
    blocks.append(Figure("figures/lr_sweep.png", f"{SELECTION_METRIC} vs learning rate per variant: mean ± 95% "
                         "t-interval over seeds; the star marks each variant's chosen rate; a rate where a seed diverged or "
                         "has no value is left out."))
    if not res.fair:
        best = res.best.get(baseline)
        return blocks + [Paragraph(f"No fair-LR comparison: the baseline {baseline} has no rate with every seed's "
                                   f"value (best: {best})." if best is None else "No fair-LR comparison.")]
    rows, changed = [], []
    for (v, m), (d, p) in res.fair.items():
        d0, p0 = res.shared[(v, m)]
        now, before = _verdict(d, p, m), _verdict(d0, p0, m)
        flip = "yes" if now != before and MISSING not in (now, before) else "no"
        if flip == "yes":
            changed.append(f"{v} on {m}: {before} at the shared rate, {now} at its own")
        rows.append([v, f"{m} {arrow(m)}", f"{res.best[v]:g}" if res.best[v] is not None else MISSING,
                     ci(d), fmt_p(p), now, f"{main_lr[v]:g}", ci(d0), fmt_p(p0), before, flip])
    blocks.append(Table(
        ["variant", "metric", "its best lr", "Δ at best lr [95% CI]", "p (Holm)", "verdict",
         "train.lr", "Δ at train.lr [95% CI]", "p (Holm)", "verdict", "changed"],
        rows, f"Δ vs {baseline} on the test split, each at its own best rate ({baseline}: "
              f"{res.best[baseline]:g}) and at the shared train.lr, paired by seed",
        [f"Each column of p-values is Holm-corrected over its {len(res.fair)} tests; verdicts at {ALPHA:.0%}.",
         "The shared-rate columns use the main runs, as the Results section does, but are corrected over this "
         "table's tests only, so they can differ from the Δ table's verdicts."]))
    blocks.append(Paragraph("Verdicts that change with fair learning rates: " + "; ".join(changed) + "."
                            if changed else f"No verdict changes between the shared rate and each variant's own best rate "
                                            f"({len(rows)} comparisons)."))
    return blocks


def at_edge(res: FairLR) -> dict[str, str]:
    """variant -> "highest" / "lowest" when its chosen rate is an end of the rates it trained at."""
    out = {}
    for v, pts in res.grid.items():
        if res.best[v] is not None and len(pts) > 1:
            if res.best[v] == pts[-1].lr:
                out[v] = "highest"
            elif res.best[v] == pts[0].lr:
                out[v] = "lowest"
    return out


def fair_lr_summary(res: FairLR) -> dict:
    """details.json's `fair_lr`: each variant's chosen rate and its Δs (fair and shared)."""
    out = {}
    edge = at_edge(res)
    for v in res.grid:
        entry = {"best_lr": res.best[v], "selected_on": SELECTION_METRIC, "best_at_edge": edge.get(v)}
        for m in res.metrics:
            if (v, m) in res.fair:
                (d, p), (d0, p0) = res.fair[(v, m)], res.shared[(v, m)]
                entry[m] = {"delta": d.mean, "ci95": d.half_width, "p_holm": p, "verdict": _verdict(d, p, m),
                            "delta_shared_lr": d0.mean, "p_holm_shared_lr": p0, "verdict_shared_lr": _verdict(d0, p0, m)}
        out[v] = entry
    return out


# ---------------------------------------------------------------- across scales

def scale_runs(main_runs: Mapping[tuple[str, int], Run],
               sweeps: Sequence[SweepRun]) -> dict[str, dict[tuple[str, int], Run]]:
    """scale -> (variant, seed) -> run; BASE_SCALE holds the main runs (params.yaml's own model)."""
    out = {BASE_SCALE: dict(main_runs)}
    for sr in sweeps:
        if sr.kind == "scale":
            out.setdefault(str(sr.value), {})[(sr.run.variant, sr.run.seed)] = sr.run
    return out


@dataclass
class ScaleResults:
    order: list[str]  # scales by the baseline's parameter count
    params: dict[str, float | None]  # scale -> the baseline's mean parameter count
    deltas: dict[str, dict[str, Delta]]  # variant -> scale -> Δ on the metric
    change: dict[str, tuple[Delta, float | None]]  # variant -> (Δ largest − Δ smallest, Holm p)
    metric: str


def scale_results(by_scale: Mapping[str, Mapping[tuple[str, int], Run]], variants: Sequence[str],
                  seeds: Sequence[int], baseline: str, metric: str) -> ScaleResults:
    params = {}
    for sc, runs in by_scale.items():
        counts = list(values_by_seed(runs, baseline, seeds, "train", "params_total").values())
        params[sc] = float(np.mean(counts)) if counts else None
    order = sorted(by_scale, key=lambda sc: (params[sc] is None, params[sc] or 0))
    hb = higher_is_better(metric)
    vals = {sc: {v: values_by_seed(runs, v, seeds, "eval", metric) for v in variants} for sc, runs in by_scale.items()}
    deltas = {v: {sc: paired_delta(vals[sc][v], vals[sc][baseline], hb) for sc in order}
              for v in variants if v != baseline}
    changes = {}
    small, large = order[0], order[-1]
    for v in deltas:
        per_seed = {}
        for s in seeds:
            got = [vals[sc][who].get(s) for sc in (small, large) for who in (v, baseline)]
            if None not in got:
                per_seed[s] = (got[2] - got[3], got[0] - got[1])  # (Δ large, Δ small) of this seed
        changes[v] = paired_delta({s: a for s, (a, _) in per_seed.items()}, {s: b for s, (_, b) in per_seed.items()}, hb)
    adjusted = holm_deltas({(v, metric): d for v, d in changes.items()})
    return ScaleResults(order, params, deltas, {v: (d, adjusted[(v, metric)]) for v, d in changes.items()}, metric)


def trend(small: Delta, large: Delta, change: Delta, p: float | None) -> str:
    """What happens to the effect from the smallest size to the largest, claimed only when significant."""
    if change.mean is None:
        return MISSING
    if p is None:
        return f"no test ({change.verdict.split(':')[0]})"
    if p >= ALPHA:
        return f"no detectable change (p {fmt_p(p)})"
    def clear(d: Delta) -> bool:  # its interval excludes zero
        return d.mean is not None and d.half_width is not None and abs(d.mean) > d.half_width
    if clear(small) and clear(large) and (small.mean > 0) != (large.mean > 0):
        return f"flips sign (p {fmt_p(p)})"
    return f"{'grows' if abs(large.mean) > abs(small.mean) else 'shrinks'} (p {fmt_p(p)})"


def scale_blocks(res: ScaleResults, baseline: str, figures_dir: Path, colors) -> list[Block]:
    heads = [f"{sc} ({fmt_int(res.params[sc])} params)" for sc in res.order]
    rows = [[v] + [ci(by_scale[sc]) for sc in res.order]
            + [ci(res.change[v][0]), fmt_p(res.change[v][1]),
               trend(by_scale[res.order[0]], by_scale[res.order[-1]], *res.change[v])]
            for v, by_scale in res.deltas.items()]
    m = res.metric
    blocks: list[Block] = [
        Heading("Across scales"),
        Paragraph(f"Every variant trained at each size of params.yaml scales (the baseline's model resized, then the "
                  f"variant's own diff applied), over the same seeds and train settings; `{BASE_SCALE}` is the "
                  "main runs' size (the model section as written). Sizes are ordered by the baseline's parameter "
                  "count."),
        Table(["variant"] + [f"Δ {m} {arrow(m)} at {h}" for h in heads]
              + [f"change {res.order[0]} → {res.order[-1]} [95% CI]", "p (Holm)", "trend"], rows,
              f"Δ {m} vs {baseline} at each size [95% CI], paired by seed, and its change from the smallest to the "
              "largest size",
              ["The change is a paired t-test over seeds of (Δ at the largest size − Δ at the smallest), Holm-corrected "
               f"over the {len(rows)} ablations; 'grows', 'shrinks' and 'flips sign' (both intervals exclude 0 with "
               "opposite signs) are said only when it is significant."]),
    ]
    points = {v: [(res.params[sc], by_scale[sc]) for sc in res.order if res.params[sc] is not None]
              for v, by_scale in res.deltas.items()}
    plots.plot_delta_vs_params(points, m, baseline, colors, figures_dir / "delta_vs_params.png")
    blocks.append(Figure("figures/delta_vs_params.png", f"Δ {m} vs {baseline} against the baseline's parameter "
                         "count at each size: mean ± 95% t-interval of the paired Δ over seeds."))
    return blocks


def scale_summary(res: ScaleResults) -> dict:
    out = {}
    for v, by_scale in res.deltas.items():
        d, p = res.change[v]
        out[v] = {"metric": res.metric, "by_scale": {
            sc: {"params_baseline": res.params[sc], "delta": x.mean, "ci95": x.half_width, "p": x.p_value}
            for sc, x in by_scale.items()},
            "change": {"delta": d.mean, "ci95": d.half_width, "p_holm": p,
                       "trend": trend(by_scale[res.order[0]], by_scale[res.order[-1]], d, p)}}
    return out
