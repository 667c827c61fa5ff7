"""The t-model's assumption checked on the study's own runs, in every report that gives a verdict.

Every verdict here rests on t-intervals over per-seed paired differences, which assume those
differences are independent normal draws. What breaks that in practice is a skew: a few seeds far
out on one side. In the default study's noise the cause is visible in the curves: most runs leave
the early loss plateau at about the same point, a few much later, and those end much worse.

So the section gives, per ablation, (1) the shape of its paired differences on the primary metric
(pipeline.deciding.rounds.shape: skewness against twice its standard error, seeds far out by the
modified z-score), and (2) the runs that left the plateau late: each run's exit is the first
logged token count at which its training loss falls below halfway between the unigram plateau
(eval.json) and its variant's median final training loss; an exit is late when it lies FAR_OUT
robust z-scores after its variant's median exit (plateau_exits). Late runs are named per ablation (its own and the
baseline's seeds), drawn on one figure, and for each ablation with one the interval without those
seeds is set beside the verdict's, so a reader sees whether the verdict depends on them.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from pipeline.deciding.rounds import FAR_OUT, shape
from pipeline.deciding.rule import t_interval
from pipeline.reporting import drawing
from pipeline.reporting.inputs import Run
from pipeline.reporting.render import Block, Figure, Heading, Paragraph, Table

LEAVES = 0.1  # a variant leaves the plateau when its runs' median final loss is 10% or more below it


def paired(runs: Mapping[tuple[str, int], Run], variant: str, baseline: str, seeds: Sequence[int],
           metric: str) -> tuple[list[int], list[float]]:
    """The seeds both runs have `metric` for, and variant − baseline on each."""
    out_seeds, diffs = [], []
    for s in seeds:
        a, b = runs.get((variant, s)), runs.get((baseline, s))
        x = (a.eval or {}).get(metric) if a else None
        y = (b.eval or {}).get(metric) if b else None
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(x) and math.isfinite(y):
            out_seeds.append(int(s))
            diffs.append(float(x) - float(y))
    return out_seeds, diffs


def plateau_exits(runs: Mapping[tuple[str, int], Run], plateau: float | None) -> tuple[dict, dict, set]:
    """Each run's exit from the plateau (tokens), each variant's exit level, and the late runs. A
    variant is its own reference (an ablation that trains slower is not late, it is the ablation):
    its level is halfway between the plateau and its runs' median final loss, and a run is late when
    its exit lies more than FAR_OUT robust z-scores after the variant's median exit, or when it never
    falls below the level while most of the variant's runs do. A variant whose median final loss
    stays within LEAVES of the plateau (no residual connections, say) has no exit to time."""
    curves: dict[str, dict[int, object]] = {}
    for (variant, seed), r in runs.items():
        c = r.train_curve
        if c is not None and {"tokens", "train_loss"} <= set(c.columns):
            c = c.dropna(subset=["tokens", "train_loss"])
            if len(c) >= 3:
                curves.setdefault(variant, {})[seed] = c
    exits, levels, late = {}, {}, set()
    if plateau is None:
        return exits, levels, late
    for variant, by_seed in curves.items():
        if len(by_seed) < 3:
            continue
        final = float(np.median([c["train_loss"].iloc[-1] for c in by_seed.values()]))
        if not final < (1 - LEAVES) * plateau:  # a variant that never really leaves it has no exit to time
            continue
        level = levels[variant] = (plateau + final) / 2
        mine = {}
        for seed, c in by_seed.items():
            below = c["tokens"][c["train_loss"].to_numpy() < level]
            if len(below):
                mine[seed] = float(below.iloc[0])
        exits.update({(variant, seed): t for seed, t in mine.items()})
        if 2 * len(mine) > len(by_seed):
            late |= {(variant, seed) for seed in by_seed if seed not in mine}
        if len(mine) >= 3:
            x = np.array(list(mine.values()))
            mad = float(np.median(np.abs(x - np.median(x))))
            if mad > 0:
                late |= {(variant, seed) for seed, t in mine.items() if (t - np.median(x)) / (1.4826 * mad) > FAR_OUT}
    return exits, levels, late


def _interval(diffs: Sequence[float], level: float) -> tuple[float, float] | None:
    """The verdicts' t-interval (pipeline.deciding.rule.t_interval); None where it says nothing."""
    if len(diffs) < 2:
        return None
    _, lo, hi, constant = t_interval(np.asarray(diffs, dtype=float), level)
    return None if constant else (float(lo), float(hi))


def assumption_blocks(runs: Mapping[tuple[str, int], Run], variants: Sequence[str], seeds: Sequence[int],
                      baseline: str, metric: str, plateau: float | None, level: float, figures_dir: Path,
                      colors: Mapping) -> list[Block]:
    """The section; `level` is the verdicts' interval level (0.95 fixed-n, 1 − α/(m·K) sequential)."""
    exits, levels, late = plateau_exits(runs, plateau)
    rows, doubtful, sensitivity = [], [], []
    for v in variants:
        if v == baseline:
            continue
        s, d = paired(runs, v, baseline, seeds, metric)
        if not d:
            continue
        sh = shape(d, s)
        late_here = sorted(seed for seed in s if (v, seed) in late or (baseline, seed) in late)
        skew = "—" if sh["skew"] is None else f"{sh['skew']:+.2f} (2 SE {2 * sh['skew_se']:.2f})"
        if sh["doubtful"] or late_here:
            doubtful.append(v)
        rows.append([v, str(sh["n"]), skew, ", ".join(map(str, sh["far_out"])) or "none",
                     ", ".join(map(str, late_here)) or "none",
                     "doubtful" if sh["doubtful"] else "no sign against it" + ("" if sh["n"] >= 8 else " (few seeds)")])
        if late_here:
            kept = [x for seed, x in zip(s, d) if seed not in late_here]
            with_all, without = _interval(d, level), _interval(kept, level)
            show = (lambda i: "—" if i is None else f"[{i[0]:+.3g}, {i[1]:+.3g}]")
            sensitivity.append(f"{v}: {level:.2%} interval {show(with_all)} over all {len(d)} paired seeds, "
                               f"{show(without)} without seeds {', '.join(map(str, late_here))}.")
    if not rows:
        return []
    blocks: list[Block] = [
        Heading("Checking the t-model"),
        Paragraph(f"The verdicts' intervals assume each ablation's per-seed differences on {metric} are independent "
                  "normal draws. Checked on this study's runs: the differences' skewness against twice its standard "
                  f"error, the seeds far out (modified z-score above {FAR_OUT}), and the runs whose training loss left "
                  "the early plateau late (a run's exit: the first token count below halfway between the unigram "
                  "plateau and its variant's median final loss; late: more than "
                  f"{FAR_OUT} robust z-scores after its variant's median exit, or never while most of them do)."),
        Table(["variant", "n", "skew", "seeds far out", "seeds with a late exit (its or the baseline's)",
               "normality"], rows)]
    if doubtful:
        blocks.append(Paragraph(
            f"For {', '.join(doubtful)} the assumption is in doubt: a skew or late runs on one side make an interval "
            "miss on that side more often than its level says, so the verdict's guarantee does not hold as stated. "
            + ("The interval without the late seeds shows whether the verdict depends on them: " + " ".join(sensitivity)
               if sensitivity else "Look at the seeds named before leaning on the verdict.")))
    else:
        blocks.append(Paragraph("No ablation shows a skew beyond twice its standard error, a seed far out or a late "
                                "plateau exit; at a few seeds this check can miss a skew."))
    if exits:
        _plot_exits(runs, exits, late, colors, figures_dir / "plateau_exits.png")
        blocks.append(Figure("figures/plateau_exits.png",
                             "Training loss of every run vs tokens, in its variant's colour; each variant's exit level "
                             f"({', '.join(f'{v} {lv:.3f}' for v, lv in levels.items())}) marked where each run "
                             "crosses it; runs with a late exit drawn bold and named."))
    return blocks


def _plot_exits(runs, exits: Mapping, late: set, colors: Mapping, path: Path) -> None:
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(layout="constrained", figsize=(9, 4.5))
    ax = fig.subplots()
    for (variant, seed), run in sorted(runs.items()):
        c = run.train_curve
        if c is None or ((variant, seed) not in exits and (variant, seed) not in late):
            continue
        c = c.dropna(subset=["tokens", "train_loss"])
        bold = (variant, seed) in late
        color = colors.get(variant, "grey")
        ax.plot(c["tokens"], c["train_loss"], color=color, lw=2.0 if bold else 0.7, alpha=1.0 if bold else 0.35,
                label=f"{variant} seed {seed} (late)" if bold else None)
        if (variant, seed) in exits:
            ax.plot([exits[(variant, seed)]], [float(np.interp(exits[(variant, seed)], c["tokens"], c["train_loss"]))],
                    marker="o", ms=3, color=color)
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("training loss")
    ax.set_title("Leaving the plateau: late runs bold")
    if late:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    drawing.save(fig, path)
