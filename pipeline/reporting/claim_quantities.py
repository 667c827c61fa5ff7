"""Our quantity for each reading (`read`) of a seed's claim; pipeline.reporting.claims judges it.

- delta: Δ `metric` of `variant` vs the baseline, paired by seed (the Δ table's, with its interval);
  expect worse / better / same. With `versus` another variant, the same paired t-test against it
  (not in the Δ table): a seed's two arms that both differ from our baseline, e.g. both with its mask.
  `metric` train_loss: train.json's last logged training loss, the same paired t-test.
- ppl_ratio: the variant's perplexity ÷ the baseline's, exp(Δ `metric`) (val_loss unless test_loss),
  the geometric mean of the per-seed ratios, its interval exp() of the Δ's; expect lower / higher.
- time_ratio: the variant's training wall time ÷ the baseline's (train.json wall_time_s), paired by
  seed on the log scale like ppl_ratio; expect lower / higher.
- value: the variant's (the baseline's when unset) mean `metric` over seeds with its interval, or
  train.json's train_loss (the last logged training loss) or wall_time_s, beside `seed_value` ±
  `tolerance`.
- plateau: whether the variant's mean val_loss, its whole interval, ends below the unigram
  plateau (eval.json's unigram_val_loss: a model that learnt only the tokens' frequencies); expect
  stays ("does not converge": contradicted when it ends below) or leaves.
- early_loss: how fast the loss falls: Δ of the mean validation loss over each run's first half of
  training (the evaluations up to half its tokens; val_curve.csv) of `variant` vs `versus` (the
  baseline when unset), paired by seed; expect lower (it falls faster) / higher.
- param_count: a model the seed counted by hand (`config`: settings over the baseline's model),
  built on the meta device, the sum of our parameter counts of `components` beside `seed_value` ±
  `tolerance`: the seed's arithmetic checked by our model's own count.
- filter_kept: the share of `split` (train) the length filter kept (filter.json), beside
  `seed_value` ± `tolerance`.
- none: nothing here measures it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pipeline.reporting.formatting import arrow, fmt, fmt_p
from pipeline.reporting.inputs import number, values_by_seed
from pipeline.reporting.results import DERIVED, Results
from pipeline.reporting.stats import Delta, higher_is_better, paired_delta, summarize

# value readings taken from train.json rather than eval.json; step_time_s: wall_time_s / steps
TRAIN_VALUES = ("train_loss", "wall_time_s", "steps", "step_time_s")
EARLY = 0.5  # early_loss: the share of a run's training tokens whose evaluations it averages


def _direction(verdict: str) -> str | None:
    """'worse' / 'better' when the verdict found a difference, else None."""
    return next((w for w in ("worse", "better") if verdict.startswith(w)), None)


def _ratio_direction(verdict: str) -> str | None:
    """'higher' / 'lower' (of a ratio or an early loss) when the verdict found worse / better, else None."""
    return {"worse": "higher", "better": "lower"}.get(_direction(verdict) or "")


def _delta(results: Results, runs: Mapping, seeds: Sequence[int], variant: str, versus: str, baseline: str,
           metric: str) -> Delta | None:
    """The Δ table's Δ vs the baseline; against another variant (or of the training loss, which the Δ
    table does not hold) the same paired t-test, uncorrected."""
    if versus == baseline and metric not in TRAIN_VALUES:
        return results.deltas.get(variant, {}).get(metric)
    stage = "train" if metric in TRAIN_VALUES else "eval"
    values = [values_by_seed(runs, v, seeds, stage, metric) for v in (variant, versus)]
    return paired_delta(*values, higher_is_better(metric))


def delta_reading(read: str, results: Results, runs: Mapping, seeds: Sequence[int], variant: str, versus: str,
                  baseline: str, metric: str) -> tuple | None:
    """read delta (Δ `metric`) or ppl_ratio (its exp) by our fixed-n test, a derived metric's by its source's:
    (mean, interval, n, direction, text); None without a Δ."""
    d = _delta(results, runs, seeds, variant, versus, baseline, metric)
    if d is None or d.mean is None:
        return None
    vs = ("" if versus == baseline and metric not in TRAIN_VALUES
          else f" vs {versus} (paired t-test, not in the Δ table)")
    source = DERIVED.get(metric) if metric != results.primary else None
    tested = (_delta(results, runs, seeds, variant, versus, baseline, source) or d) if source else d
    low_high = interval(d.mean, d.half_width)
    if read == "delta":
        ours = (f"Δ{vs} {d.mean:+.3g} ({ci_text(low_high)}, {d.n} paired seed{'s' * (d.n != 1)}, "
                f"p {fmt_p(tested.p_value)}{f' of {source}' if source else ''}): {tested.verdict}")
        return d.mean, low_high, d.n, _direction(tested.verdict), ours
    mean = math.exp(d.mean)
    low_high = None if low_high is None else (math.exp(low_high[0]), math.exp(low_high[1]))
    ours = (f"ratio{vs} {fmt(mean)} ({ci_text(low_high)}; exp of Δ {metric} {d.mean:+.3g}, "
            f"p {fmt_p(tested.p_value)}): {tested.verdict}")
    return mean, low_high, d.n, _ratio_direction(tested.verdict), ours


def interval(mean: float, half: float | None) -> tuple[float, float] | None:
    return None if half is None else (mean - half, mean + half)


def ci_text(low_high: tuple[float, float] | None) -> str:
    return "no interval" if low_high is None else f"95% CI [{fmt(low_high[0], 3)}, {fmt(low_high[1], 3)}]"


def median_passes(runs: Mapping, variant: str, seeds: Sequence[int]) -> float | None:
    """The median over seeds of the variant's passes over its training data (train.json), None if unrecorded."""
    passes = sorted(p for p in ((runs[(variant, s)].train or {}).get("passes") for s in seeds if (variant, s) in runs)
                    if p is not None)
    return passes[len(passes) // 2] if passes else None


def filter_kept(filter_metrics: Mapping | None, split: str) -> tuple[float, int, str] | None:
    """(share of `split` the length filter kept, 1, our text) from filter.json; None without its counts."""
    counts = ((filter_metrics or {}).get("splits") or {}).get(split)
    raw, dropped = number(counts, "raw"), number(counts, "dropped_length")
    if not raw or dropped is None:
        return None
    share = (raw - dropped) / raw
    return share, 1, f"{share:.1%} of {split} kept by length ({round(raw - dropped):,} of {round(raw):,}; filter.json)"


def over_seeds(results: Results, runs: Mapping, seeds: Sequence[int], variant: str, metric: str) -> tuple:
    """A variant's summary of `metric` over seeds (train.json's for TRAIN_VALUES) and where it is read from."""
    if metric == "step_time_s":
        walls, steps = (values_by_seed(runs, variant, seeds, "train", k) for k in ("wall_time_s", "steps"))
        s = summarize([walls[seed] / steps[seed] for seed in walls if steps.get(seed)])
        return s, "train.json wall_time_s / steps, seconds per optimizer step"
    if metric in TRAIN_VALUES:
        s = summarize(list(values_by_seed(runs, variant, seeds, "train", metric).values()))
        return s, f"train.json {metric}" + (", last logged" if metric == "train_loss" else "")
    return results.summaries.get(variant, {}).get(metric), f"{metric} {arrow(metric)}"


def time_ratio(runs: Mapping, seeds: Sequence[int], variant: str, versus: str) -> tuple | None:
    """The training wall-time ratio paired by seed on the log scale: (mean, interval, n, direction, text)."""
    times = {v: {s: math.log(t) for s, t in values_by_seed(runs, v, seeds, "train", "wall_time_s").items() if t > 0}
             for v in (variant, versus)}
    d = paired_delta(times[variant], times[versus], higher_better=False)
    if d.mean is None:
        return None
    mean, low_high = math.exp(d.mean), interval(d.mean, d.half_width)
    low_high = None if low_high is None else (math.exp(low_high[0]), math.exp(low_high[1]))
    direction = _ratio_direction(d.verdict)
    ours = (f"ratio {fmt(mean)} ({ci_text(low_high)}, {d.n} paired seed{'s' * (d.n != 1)}, "
            f"p {fmt_p(d.p_value)}, paired t-test of log wall time): "
            + (f"{direction} than {versus}'s" if direction else d.verdict))
    return mean, low_high, d.n, direction, ours


def early_mean(curve) -> float | None:
    """The mean val_loss of a run's evaluations within the first EARLY of its training tokens."""
    if curve is None or curve.empty:
        return None
    first = curve[curve["tokens"] <= EARLY * curve["tokens"].max()]["val_loss"].dropna()
    return float(first.mean()) if len(first) else None


def early_loss(runs: Mapping, seeds: Sequence[int], variant: str, versus: str) -> tuple | None:
    """Δ of the early mean val_loss (early_mean), paired by seed: (mean, interval, n, direction, text)."""
    early = {v: {s: m for s in seeds if (v, s) in runs and (m := early_mean(runs[(v, s)].val_curve)) is not None}
             for v in (variant, versus)}
    d = paired_delta(early[variant], early[versus], higher_better=False)
    if d.mean is None:
        return None
    low_high = interval(d.mean, d.half_width)
    direction = _ratio_direction(d.verdict)
    ours = (f"Δ vs {versus} {d.mean:+.3g} ({ci_text(low_high)}, {d.n} paired seed{'s' * (d.n != 1)}, "
            f"p {fmt_p(d.p_value)}, paired t-test of the mean val_loss over the first {EARLY:.0%} of training): "
            + (f"{direction} than {versus}'s" if direction else d.verdict))
    return d.mean, low_high, d.n, direction, ours


