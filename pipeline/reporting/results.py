"""The study's numbers: each variant's summary per metric and its paired Δ vs the baseline, tested.

Which metric is primary (tested uncorrected), which are secondary (one Holm family) and which are
derived from another (no test of their own) is decided here, once; the report's tables, its
verdict, its figures and reports/metrics.json and details.json all read the Results computed here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pipeline.reporting.formatting import fmt
from pipeline.reporting.inputs import Run, values_by_seed
from pipeline.reporting.stats import (
    ALPHA, POWER, Delta, Summary, detectable_effect, higher_is_better, holm, paired_delta, seeds_needed, summarize,
    verdict_for,
)

BASE_METRICS = ("val_loss", "val_ppl", "test_loss", "test_ppl")
ALWAYS_SHOWN = ("val_loss", "val_ppl")  # shown even when every run lacks them, so the gap is visible
TASK_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum", "bleu", "chrf", "bits_per_char", "bits_per_byte", "bits_per_token")
# Task metric of the delta figure: the first present, i.e. the one each task usually leads with.
# bits_per_token depends on the tokenizer, so the per-character/byte measures come first.
MAIN_METRIC_PRIORITY = ("rougeLsum", "rougeL", "bleu", "bits_per_char", "bits_per_byte", "bits_per_token", "rouge1", "rouge2",
                        "chrf")
# Metrics computed from generated text: meaningless when the outputs are degenerate.
OUTPUT_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum", "bleu", "chrf")
METRIC_NOTES = {
    "rougeL": "rougeL: one longest common subsequence over the whole summary (sentence-level ROUGE-L)",
    "rougeLsum": "rougeLsum: summary-level ROUGE-L over newline-separated sentences, the figure "
                 "published CNN/DailyMail results use",
}
# Metrics that are a fixed function of another metric in the table: their paired test repeats
# that metric's test, so a verdict of their own would count one finding twice. ppl = exp(loss);
# bits_per_token = test_loss / ln 2; bits per character (byte) = the same test nats / ln 2 / the
# test text's characters (bytes), which within one study (ablations change only model and train,
# so one tokenizer and one test split) is test_loss times a constant: the same t statistic.
DERIVED = {"val_ppl": "val_loss", "test_ppl": "test_loss", "bits_per_token": "test_loss",
           "bits_per_char": "test_loss", "bits_per_byte": "test_loss"}
# The primary metric unless report.primary_metric names another, for every task: val_loss is in
# every eval.json (language modelling, summarization, translation), is the objective all variants
# are trained on, and is measured on the whole validation split, so it is far less noisy than
# ROUGE/BLEU from a few hundred greedy decodes of a small model. The test split and the task metrics
# stay in the table as secondary, Holm-corrected tests. One primary per study, chosen before the
# runs, is what makes its uncorrected 5% test mean what it says.
DEFAULT_PRIMARY = "val_loss"


@dataclass(frozen=True)
class DeltaTest:
    """How one Δ is tested: its role, Holm-adjusted p, and what its seeds can detect."""

    role: str  # "primary" (uncorrected) | "secondary" (Holm) | "derived" (no test of its own)
    alpha: float  # level of `detectable` and `seeds`: ALPHA (primary), ALPHA / family size (secondary)
    p_holm: float | None = None  # secondary metrics with a test only
    detectable: float | None = None  # |Δ| found with POWER at `alpha` given the sd of Δ and the seeds
    seeds: int | None = None  # fewest seeds finding the observed Δ with POWER at `alpha`; None: > MAX_SEEDS


@dataclass
class Results:
    metrics: list[str]  # metrics reported, in display order
    main_metric: str | None  # task metric of the delta figure
    summaries: dict[str, dict[str, Summary]]  # variant -> metric -> Summary
    deltas: dict[str, dict[str, Delta]]  # non-baseline variant -> metric -> Delta (final verdict)
    primary: str = DEFAULT_PRIMARY  # the metric tested without multiplicity correction
    family_size: int = 0  # secondary tests made: the Holm family
    tests: dict[str, dict[str, DeltaTest]] | None = None  # non-baseline variant -> metric -> Test


def _power(d: Delta, alpha: float) -> tuple[float | None, int | None]:
    """(detectable |Δ|, seeds for the observed Δ) at `alpha`, from the sd of the per-seed differences."""
    if d.p_value is None or not d.sd:  # no test made (n < 2, zero variance)
        return None, None
    effect = detectable_effect(d.n, POWER, alpha)
    return effect * d.sd, seeds_needed(abs(d.mean) / d.sd, POWER, alpha)


def _not_significant(verdict: str, d: Delta, detectable: float | None) -> str:
    # What "not significant" means with this many seeds: only a difference this large is found
    # reliably, so a smaller true one may well be there.
    if detectable is None or not verdict.startswith("no significant"):
        return verdict
    return f"{verdict}: with {d.n} seeds only a true |Δ| ≥ {fmt(detectable, 3)} is found with {POWER:.0%} power"


def compute_results(
    runs: Mapping[tuple[str, int], Run], variants: Sequence[str], seeds: Sequence[int], baseline: str,
    primary_metric: str | None = None,
) -> Results:
    """Summary per variant and metric, and paired delta vs the baseline, from eval.json values.

    The primary metric's test is uncorrected; every other non-derived metric × variant test with a
    p-value is one Holm family; derived metrics (DERIVED) get no verdict of their own.
    """
    primary = primary_metric or DEFAULT_PRIMARY
    present = {k for run in runs.values() if run.eval for k in run.eval}
    metrics = [m for m in BASE_METRICS + TASK_METRICS if m in present or m in ALWAYS_SHOWN or m == primary]
    main = next((m for m in MAIN_METRIC_PRIORITY if m in present), None)
    values = {v: {m: values_by_seed(runs, v, seeds, "eval", m) for m in metrics} for v in variants}
    summaries = {v: {m: summarize(list(values[v][m].values())) for m in metrics} for v in variants}
    deltas = {
        v: {m: paired_delta(values[v][m], values[baseline][m], higher_is_better(m)) for m in metrics}
        for v in variants
        if v != baseline
    }
    family = [(v, m) for v, by_metric in deltas.items() for m, d in by_metric.items()
              if m != primary and m not in DERIVED and d.p_value is not None]
    p_holm = dict(zip(family, holm([deltas[v][m].p_value for v, m in family])))
    # A secondary p-value below ALPHA / m is rejected by Holm whatever the other tests give, so
    # power at that level is a floor for the corrected test (Holm itself depends on the others).
    secondary_alpha = ALPHA / max(len(family), 1)
    tests: dict[str, dict[str, DeltaTest]] = {}
    for v, by_metric in deltas.items():
        tests[v] = {}
        for m, d in by_metric.items():
            if m in DERIVED and m != primary:
                tests[v][m] = DeltaTest("derived", ALPHA)
                by_metric[m] = replace(d, p_value=None, verdict=f"derived from {DERIVED[m]}: no test of its own")
                continue
            role, alpha = ("primary", ALPHA) if m == primary else ("secondary", secondary_alpha)
            detectable, n_seeds = _power(d, alpha)
            verdict = d.verdict
            if (v, m) in p_holm:
                verdict = verdict_for(d.mean, p_holm[(v, m)], higher_is_better(m))
                verdict = verdict.replace(f"at {ALPHA:.0%}", f"at {ALPHA:.0%} after Holm")
            tests[v][m] = DeltaTest(role, alpha, p_holm.get((v, m)), detectable, n_seeds)
            by_metric[m] = replace(d, verdict=_not_significant(verdict, d, detectable))
    return Results(metrics, main, summaries, deltas, primary, len(family), tests)



def unigram_plateau(runs) -> float | None:
    """The unigram plateau the evaluate stage copied from the manifest (the same in every eval.json)."""
    return next((float(run.eval["unigram_val_loss"]) for run in runs.values()
                 if run.eval and isinstance(run.eval.get("unigram_val_loss"), (int, float))), None)

