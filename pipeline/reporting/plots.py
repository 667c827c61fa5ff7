"""Figures of the report, one PNG per function.

Uses matplotlib's object API (`matplotlib.figure.Figure`, which renders with Agg) instead of pyplot,
so no global backend or figure state is touched: safe on a headless machine and inside tests.
Every function takes plain arrays/mappings already read from the run files and returns nothing;
callers decide whether there is enough data to draw. Each PNG is written through drawing.save: in
a forked child when the report draws side by side.
"""
from __future__ import annotations

import math

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from pipeline.reporting.drawing import save
from pipeline.reporting.stats import Delta, summarize

MAX_TICK_LABELS = 40  # beyond this many tokens an axis of token labels is unreadable

Curve = tuple[np.ndarray, np.ndarray]  # (tokens, value) of one seed, sorted by tokens


def variant_colors(variants: Sequence[str]) -> dict[str, tuple]:
    """One fixed colour per variant, shared by every figure."""
    cmap = colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def mean_band(curves: Sequence[Curve]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Mean and min/max envelope of seed curves on the tokens they share.

    Seeds may log at slightly different token counts (padding differs), so each curve is
    interpolated onto the union of logged token counts inside the range all seeds cover.
    None if the seeds' token ranges do not overlap.
    """
    lo = max(float(x[0]) for x, _ in curves)
    hi = min(float(x[-1]) for x, _ in curves)
    if hi < lo:
        return None
    grid = np.unique(np.concatenate([x[(x >= lo) & (x <= hi)] for x, _ in curves]))
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def _focus_ylim(ax, series: list[Curve]) -> None:
    # Losses fall steeply at the start; scaling the axis to the whole curve would flatten the
    # differences between variants near the end, which are the point of the figure.
    tail = []
    for x, y in series:
        if len(x) > 4:
            tail.append(y[x >= x[0] + 0.1 * (x[-1] - x[0])])
    tail = [t for t in tail if t.size]
    if tail:
        values = np.concatenate(tail)
        top, bottom = float(values.max()), float(values.min())
        pad = 0.05 * (top - bottom) or 0.05 * abs(top) or 0.1
        ax.set_ylim(bottom - pad, top + pad)


def _plot_curve_panel(ax, curves: Mapping[str, list[Curve]], colors: Mapping, ylabel: str) -> None:
    drawn = []
    for variant, seed_curves in curves.items():
        if not seed_curves:
            continue
        color = colors[variant]
        label = f"{variant} (n={len(seed_curves)})"
        band = mean_band(seed_curves) if len(seed_curves) > 1 else None
        if band is None:  # one seed, or seeds without a common token range: draw each seed
            for i, (x, y) in enumerate(seed_curves):
                ax.plot(x, y, color=color, lw=1.4, marker="." if len(x) < 30 else None,
                        label=label if i == 0 else None)
                drawn.append((x, y))
            continue
        grid, mean, low, high = band
        ax.plot(grid, mean, color=color, lw=1.6, marker="." if len(grid) < 30 else None, label=label)
        ax.fill_between(grid, low, high, color=color, alpha=0.2, lw=0)
        drawn += [(grid, low), (grid, high)]
    _focus_ylim(ax, drawn)
    ax.set_xlabel("tokens trained")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_curves(
    train: Mapping[str, list[Curve]], val: Mapping[str, list[Curve]], colors: Mapping, path: Path
) -> None:
    """Training and validation loss vs tokens: mean over seeds, band = min..max across seeds."""
    fig = Figure(layout="constrained", figsize=(12, 4.5))
    ax_train, ax_val = fig.subplots(1, 2)
    _plot_curve_panel(ax_train, train, colors, "training loss")
    ax_train.set_title("Training loss")
    _plot_curve_panel(ax_val, val, colors, "validation loss")
    ax_val.set_title("Validation loss")
    save(fig, path)


def _short_verdict(delta: Delta) -> str:
    if delta.mean is None:
        return "missing"
    if delta.p_value is None:
        return delta.verdict.split(":")[0]
    verdict = "n.s." if delta.verdict.startswith("no significant") else delta.verdict
    return f"{verdict}\np={delta.p_value:.2g}"


def plot_deltas(
    panels: Sequence[tuple[str, bool, Mapping[str, Delta]]], baseline: str, colors: Mapping, path: Path
) -> None:
    """Bars of mean delta vs the baseline per variant, error bars = 95% t-interval of the delta.

    `panels` is a list of (metric, higher_is_better, variant -> Delta).
    """
    fig = Figure(layout="constrained", figsize=(5.5 * len(panels), 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (metric, higher_better, deltas) in zip(axes, panels):
        names = list(deltas)
        means = [d.mean if d.mean is not None else 0.0 for d in deltas.values()]
        # An unbounded interval (a spending boundary's early look that spends less than its Monte
        # Carlo resolves: critical t infinite, no verdict possible) gets no bar and does not set the axis.
        bounded = [d.half_width is not None and math.isfinite(d.half_width) for d in deltas.values()]
        errs = [d.half_width if ok else 0.0 for d, ok in zip(deltas.values(), bounded)]
        xs = np.arange(len(names))
        ax.bar(xs, means, color=[colors[n] for n in names], alpha=0.85)
        with_ci = [i for i, ok in enumerate(bounded) if ok]
        ax.errorbar(xs[with_ci], np.array(means)[with_ci], yerr=np.array(errs)[with_ci], fmt="none",
                    ecolor="black", capsize=5)
        ax.axhline(0, color="black", lw=0.8)
        span = max([abs(m) + e for m, e in zip(means, errs)] + [1e-12])
        for x, m, e, d, ok in zip(xs, means, errs, deltas.values(), bounded):
            y = m + e if m >= 0 else m - e
            unbounded = d.half_width is not None and not ok
            ax.annotate(_short_verdict(d) + ("\ninterval unbounded" if unbounded else ""), (x, y),
                        xytext=(0, 4 if m >= 0 else -4),
                        textcoords="offset points", ha="center", va="bottom" if m >= 0 else "top",
                        fontsize=8)
        ax.set_ylim(-1.35 * span, 1.35 * span)
        ax.set_xticks(xs, names, rotation=20, ha="right")
        direction = "higher" if higher_better else "lower"
        ax.set_title(f"Δ {metric} vs {baseline} ({direction} is better)", fontsize=10)
        ax.set_ylabel(f"Δ {metric} (variant − {baseline})")
        ax.grid(axis="y", alpha=0.3)
    save(fig, path)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> None:
    """Labels, grid and legend of a one-panel figure, then the PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def plot_params_vs_loss(
    points: Mapping[str, list[tuple[float, float]]], colors: Mapping, path: Path
) -> None:
    """Parameter count vs validation loss: one faint dot per seed, mean ± 95% CI per variant."""
    fig = Figure(layout="constrained", figsize=(7, 4.8))
    ax = fig.subplots()
    labelled: list[float] = []  # parameter counts already labelled, to stack labels that coincide
    for variant, pts in points.items():
        if not pts:
            continue
        params = np.array([p for p, _ in pts], dtype=float)
        losses = np.array([loss for _, loss in pts], dtype=float)
        color = colors[variant]
        ax.scatter(params, losses, color=color, alpha=0.35, s=18)
        s = summarize(losses)
        ax.errorbar(params.mean(), s.mean, yerr=s.half_width or 0.0, fmt="o", color=color,
                    capsize=4, ms=7, label=f"{variant} (n={s.n})")
        stack = sum(np.isclose(params.mean(), labelled, rtol=1e-3))
        labelled.append(params.mean())
        ax.annotate(variant, (params.mean(), s.mean), xytext=(8, 6 - 11 * stack), textcoords="offset points",
                    fontsize=8, color=color)
    ax.margins(x=0.12)  # room for the labels of the outermost variants
    ax.xaxis.set_major_formatter(EngFormatter())
    _finish(fig, ax, "parameters (total)", "validation loss", "Parameters vs validation loss", path)


def _token_ticks(ax, axis: str, tokens: Sequence | None, size: int) -> None:
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    if tokens is not None and len(tokens) == size and size <= MAX_TICK_LABELS:
        setter(range(size), [str(t) for t in tokens], fontsize=7,
               **({"rotation": 90} if axis == "x" else {}))


def plot_attention(
    panels: Sequence[tuple[str, np.ndarray, Sequence | None, Sequence | None]], path: Path
) -> None:
    """Heatmaps of attention maps; each panel is (title, matrix Tq x Tk, key tokens, query tokens)."""
    fig = Figure(layout="constrained", figsize=(5.8 * len(panels), 5.2))
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    vmax = max(float(np.max(matrix)) for _, matrix, _, _ in panels)  # one scale: panels compare
    for ax, (title, matrix, keys, queries) in zip(axes, panels):
        im = ax.imshow(matrix, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        _token_ticks(ax, "x", keys, matrix.shape[1])
        _token_ticks(ax, "y", queries, matrix.shape[0])
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_title(title, fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    save(fig, path)


def plot_lr_sweep(points: Mapping[str, list[tuple[float, list[float], bool]]], colors: Mapping, path: Path) -> None:
    """Validation loss vs learning rate: per variant, mean ± 95% CI over seeds at each rate
    (rate, seed values, chosen); the chosen rate is starred. Rates without values are skipped."""
    fig = Figure(layout="constrained", figsize=(7, 4.8))
    ax = fig.subplots()
    for variant, pts in points.items():
        pts = sorted(((lr, summarize(vals), chosen) for lr, vals, chosen in pts if vals), key=lambda t: t[0])
        if not pts:
            continue
        lrs = [lr for lr, _, _ in pts]
        means = [s.mean for _, s, _ in pts]
        errs = [s.half_width or 0.0 for _, s, _ in pts]
        ax.errorbar(lrs, means, yerr=errs, color=colors[variant], marker="o", ms=5, capsize=3, label=variant)
        for lr, s, chosen in pts:
            if chosen:
                ax.plot([lr], [s.mean], marker="*", ms=16, color=colors[variant], markeredgecolor="black")
    ax.set_xscale("log")
    _finish(fig, ax, "learning rate", "validation loss", "Validation loss vs learning rate (★ = each variant's chosen rate)",
            path)


def plot_delta_vs_params(points: Mapping[str, list[tuple[float, Delta]]], metric: str, baseline: str,
                         colors: Mapping, path: Path) -> None:
    """Δ metric vs the baseline's parameter count per ablation: mean ± 95% CI of the paired Δ."""
    fig = Figure(layout="constrained", figsize=(7, 4.8))
    ax = fig.subplots()
    for variant, pts in points.items():
        pts = sorted(((n, d) for n, d in pts if d.mean is not None), key=lambda t: t[0])
        if not pts:
            continue
        ax.errorbar([n for n, _ in pts], [d.mean for _, d in pts], yerr=[d.half_width or 0.0 for _, d in pts],
                    color=colors[variant], marker="o", ms=5, capsize=4, label=variant)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(EngFormatter())
    _finish(fig, ax, f"parameters of {baseline} at each size", f"Δ {metric} (variant − {baseline})",
            f"Effect of each ablation across sizes (Δ {metric})", path)
