"""Which figures the report draws, and from which run files; the drawing is in pipeline.reporting.plots.

Each function writes its PNG under `figures_dir` and returns the report blocks that show it, or a
paragraph saying why it could not be drawn (no data is not a reason to fail the report).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.deciding.record import Record
from pipeline.reporting import plots
from pipeline.reporting.inputs import Run, number
from pipeline.reporting.render import Block, Figure, Heading, Paragraph
from pipeline.reporting.results import Results
from pipeline.reporting.stats import Delta, higher_is_better

ATTENTION_PREFERENCE = ("decoder.cross", "decoder.self", "encoder.self")  # first present is shown


def _curves(runs, variant: str, seeds: Sequence[int], attr: str, column: str) -> list[plots.Curve]:
    out = []
    for s in seeds:
        df = getattr(runs[(variant, s)], attr)
        if df is not None:
            df = df.dropna(subset=["tokens", column])
            if len(df):
                out.append((df["tokens"].to_numpy(float), df[column].to_numpy(float)))
    return out


def curve_blocks(runs, variants, seeds, colors, figures_dir: Path) -> list[Block]:
    train = {v: _curves(runs, v, seeds, "train_curve", "train_loss") for v in variants}
    val = {v: _curves(runs, v, seeds, "val_curve", "val_loss") for v in variants}
    if not any(train.values()) and not any(val.values()):
        return [Paragraph("Training curves not drawn: no train_curve.csv or val_curve.csv found.")]
    plots.plot_curves(train, val, colors, figures_dir / "curves.png")
    absent = [f"no {name} for {', '.join(v for v in variants if not curves[v])}"
              for name, curves in (("training curve", train), ("validation curve", val))
              if not all(curves.values())]
    return [Figure("figures/curves.png",
                   "Training and validation loss vs tokens trained: line = mean over seeds, "
                   "band = min..max across seeds (n = seeds with a curve); y-axis fitted to the last 90% "
                   "of training. The validation curve is the train stage's loss on a fixed subset of the "
                   "validation split (its first train.eval_examples examples; for language modelling that many "
                   "context windows, in whole batches), not the whole split of the tables' val_loss "
                   "(eval.json)." + "".join(f" {a.capitalize()}." for a in absent))]


def _sequential_deltas(decided: Record) -> dict[str, Delta]:
    """Seeds until decided: each comparison's last look as a Delta (its interval at the study's
    level, its verdict; no fixed-n p-value, which is not valid after adaptive stopping)."""
    out = {}
    for name, v in decided.variants.items():
        look = v.looks[-1] if v.looks else None
        out[name] = (Delta(0, None, None, None, "no look yet") if look is None else
                     Delta(look.n, look.mean, (look.hi - look.lo) / 2, None, f"{v.state} (n={look.n})"))
    return out


def delta_blocks(results: Results, baseline: str, colors, figures_dir: Path,
                 decided: Record | None = None) -> list[Block]:
    if not results.deltas:
        return [Paragraph("Δ figure not drawn: there is no variant besides the baseline.")]
    metrics = ["val_loss"] + ([results.main_metric] if results.main_metric else [])
    if all(results.deltas[v][m].mean is None for v in results.deltas for m in metrics):
        return [Paragraph("Δ figure not drawn: no variant shares a seed with the baseline.")]
    panels = [(m, higher_is_better(m), {v: results.deltas[v][m] for v in results.deltas}) for m in metrics]
    if decided:  # the primary metric's panel shows the sequential intervals and verdicts
        seq = _sequential_deltas(decided)
        panels = [(m, hb, {v: seq[v] for v in deltas}) if m == decided.metric else (m, hb, deltas)
                  for m, hb, deltas in panels]
    plots.plot_deltas(panels, baseline, colors, figures_dir / "deltas.png")
    if decided:
        return [Figure("figures/deltas.png",
                       f"Δ vs {baseline} paired by seed: bar = mean difference, error bar = the interval; for "
                       f"{decided.metric} the sequential interval "
                       + ("(each look's level: Seeds until decided) " if decided.plan.boundary != "bonferroni"
                          else f"at level {decided.plan.level:.4f} ")
                       + "of each comparison's last look and its verdict (Seeds until decided)"
                       + (f"; for {results.main_metric} the fixed-n 95% t-interval and Holm verdict over every seed "
                          "run, not valid after adaptive stopping" if results.main_metric else "") + ".")]
    return [Figure("figures/deltas.png",
                   f"Δ vs {baseline} paired by seed: bar = mean difference, error bar = 95% t-interval "
                   "(absent when n=1), label = verdict (Holm-corrected except for the primary metric "
                   f"{results.primary}; 'derived from' for a metric with no test of its own) and the "
                   "uncorrected paired t-test p-value.")]


def params_loss_blocks(runs, variants, seeds, colors, figures_dir: Path) -> list[Block]:
    points: dict[str, list[tuple[float, float]]] = {}
    for v in variants:
        pts = []
        for s in seeds:
            run = runs[(v, s)]
            params, loss = number(run.train, "params_total"), number(run.eval, "val_loss")
            if params is not None and loss is not None:
                pts.append((params, loss))
        points[v] = pts
    if not any(points.values()):
        return [Paragraph("Parameters vs loss not drawn: no run has both params_total and val_loss.")]
    plots.plot_params_vs_loss(points, colors, figures_dir / "params_vs_loss.png")
    return [Figure("figures/params_vs_loss.png",
                   "Total parameters (train.json) vs validation loss (eval.json): faint dots = seeds, "
                   "marker = mean with 95% t-interval.")]


def _attention_panel(run: Run) -> tuple | None:
    if run.attention is None:
        return None
    maps = run.attention["maps"]
    name = next((n for n in ATTENTION_PREFERENCE if n in maps), None)
    if name is None:
        return None
    # Queries are target positions; keys are source positions for cross-attention only.
    src, tgt = run.attention.get("src_tokens"), run.attention.get("tgt_tokens")
    keys, queries = {"decoder.cross": (src, tgt), "decoder.self": (tgt, tgt), "encoder.self": (src, src)}[name]
    return (f"{run.variant} (seed {run.seed}): {name}", maps[name], keys, queries)


def attention_blocks(runs, variants, seeds, baseline: str, figures_dir: Path) -> list[Block]:
    """Baseline and the first ablation with an attention map, on the first seed that has one."""
    def first_panel(variant: str) -> tuple | None:
        return next((p for s in seeds if (p := _attention_panel(runs[(variant, s)])) is not None), None)

    picks = [(baseline, first_panel(baseline))]
    picks.append(next(((v, p) for v in variants if v != baseline and (p := first_panel(v))), (None, None)))
    shown = [v for v, p in picks if p is not None]
    panels = [p for _, p in picks if p is not None]
    if not panels:
        return [Paragraph("Attention maps not drawn: no attention.json found.")]
    plots.plot_attention(panels, figures_dir / "attention.png")
    note = "" if baseline in shown else f" ({baseline} has no attention.json)"
    return [Figure("figures/attention.png",
                   f"Attention of one validation example, last layer, averaged over heads: "
                   f"{' and '.join(shown)}{note}. Rows = query (target) positions, columns = keys.")]


def figure_blocks(
    runs: Mapping[tuple[str, int], Run], results: Results, variants: Sequence[str],
    seeds: Sequence[int], baseline: str, figures_dir: Path,
) -> list[Block]:
    """The figures of the report's Figures section, drawn into `figures_dir` (the Δ figure, drawn
    by `delta_blocks`, opens the report beside the verdict instead)."""
    colors = plots.variant_colors(variants)
    return (
        [Heading("Figures")]
        + curve_blocks(runs, variants, seeds, colors, figures_dir)
        + params_loss_blocks(runs, variants, seeds, colors, figures_dir)
        + attention_blocks(runs, variants, seeds, baseline, figures_dir)
    )
