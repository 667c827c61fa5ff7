"""Tables of the report, built from the loaded runs; every number is read from a run file.

A value that is absent (no run, no file, no key, null, NaN) is shown as MISSING and left out of the
statistics: it is never replaced by zero.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pipeline.reporting.inputs import Run, number, values_by_seed
from pipeline.reporting.render import Block, Heading, Paragraph, Table
from pipeline.reporting.stats import (
    ALPHA, MAX_SEEDS, POWER, Delta, Summary, detectable_effect, higher_is_better, holm, paired_delta,
    sd_from_interval, seeds_needed, summarize, verdict_for, welch,
)

MISSING = "—"
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
DEGENERATE = "⚠"
COMPONENT_ORDER = ("embeddings", "attention", "ffn", "norms", "other", "total")
RUN_FILES = ("train.json", "train_curve.csv", "val_curve.csv", "eval.json", "samples.json", "attention.json")
_RUN_FIELDS = ("train", "train_curve", "val_curve", "eval", "samples", "attention")
N_SAMPLES = 3  # sample outputs shown per variant
SAMPLE_CHARS = 160  # longer texts are cut, the table is a glance not a dump


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return MISSING
    # Large values (perplexity of an untrained model, token counts) read better without exponent.
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def fmt_sci(x: float | None) -> str:
    """FLOP counts: three significant digits and an exponent (4.21e+11)."""
    return MISSING if x is None else f"{x:.3g}"


def fmt_int(x: float | None) -> str:
    return MISSING if x is None else f"{round(x):,}"


def fmt_range(values: Sequence[float]) -> str:
    """Integer counts over seeds as they are: one value when all agree, else "min–max"."""
    if not values:
        return MISSING
    low, high = fmt_int(min(values)), fmt_int(max(values))
    return low if low == high else f"{low}–{high}"


def fmt_p(p: float | None) -> str:
    return MISSING if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def fmt_summary(s: Summary) -> str:
    if s.mean is None:
        return MISSING
    if s.half_width is None:
        return f"{fmt(s.mean)} ({s.note})"
    note = f"n={s.n}" + (f", {s.note}" if s.note else "")
    return f"{fmt(s.mean)} ± {fmt(s.half_width, 2)} ({note})"


def fmt_raw(record: Mapping | None, key: str) -> str:
    """A value as written in the file (NaN/inf shown as such), MISSING if absent."""
    value = None if record is None else record.get(key)
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else fmt(value)


def arrow(metric: str) -> str:
    return "↑" if higher_is_better(metric) else "↓"


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


def _params_total(runs: Mapping[tuple[str, int], Run], variant: str, seeds: Sequence[int]) -> str:
    totals = sorted(set(values_by_seed(runs, variant, seeds, "train", "params_total").values()))
    return " / ".join(fmt_int(t) for t in totals) if totals else MISSING


def setup_blocks(runs, variants, seeds, baseline: str, budget: Mapping, task: str | None,
                 notes: Sequence[str] = ()) -> list[Block]:
    """What was compared: task, seeds, baseline, budget, parameter counts and missing runs."""
    budget_parts = [f"{k} = {fmt_int(v) if isinstance(v, (int, float)) else v}" for k, v in budget.items()]
    budget_text = (
        "Training budget per run (params.yaml train): " + "; ".join(budget_parts) + "."
        if budget_parts
        else "Training budget: not stated in params.yaml (no train.budget_tokens / train.budget_steps)."
    )
    if "budget_flops" in budget:
        budget_text += (" FLOP-matched: each run's target tokens are budget_flops ÷ its training FLOPs per target "
                        "token (6 × weights + attention, the count behind MFU), so a variant cheaper per token "
                        "trains on more tokens (Training cost).")
    rows = []
    for v in variants:
        found = [s for s in seeds if not runs[(v, s)].missing]
        gaps = []
        for s in seeds:
            run = runs[(v, s)]
            absent = [f for f, attr in zip(RUN_FILES, _RUN_FIELDS) if getattr(run, attr) is None]
            if run.missing:
                gaps.append(f"seed {s}: run missing")
            elif absent:
                gaps.append(f"seed {s}: no " + ", ".join(absent))
        if not found:
            gaps = ["all seeds: run missing"]
        rows.append([v, _params_total(runs, v, seeds), f"{len(found)}/{len(seeds)}", "; ".join(gaps) or "none"])
    norms = sorted({str(r.eval["normalization"]) for r in runs.values() if r.eval and r.eval.get("normalization")})
    return [
        Heading("Setup"),
        Paragraph(
            f"Task: {task or MISSING}. Baseline: {baseline}. Seeds: {', '.join(map(str, seeds))}. "
            f"Variants: {', '.join(variants)}."
        ),
        Paragraph(budget_text),
        Paragraph("Tokenizer normalisation (eval.json): " + (" | ".join(norms) or MISSING) + "."),
        *[Paragraph(f"Note (params.yaml report.notes): {n}") for n in notes],
        Table(["variant", "parameters", "runs found", "missing"], rows, "Variants and runs"),
    ]


def degenerate_runs(runs, variant: str, seeds: Sequence[int]) -> dict[int, list[str]]:
    """seed -> reasons, for the seeds of `variant` whose eval.json flags degenerate outputs."""
    out = {}
    for s in seeds:
        reasons = (runs[(variant, s)].eval or {}).get("degenerate")
        if isinstance(reasons, list) and reasons:
            out[s] = [str(r) for r in reasons]
    return out


def results_blocks(results: Results, variants: Sequence[str], baseline: str, runs,
                   seeds: Sequence[int]) -> list[Block]:
    """Metric table (mean ± CI) and delta table (paired by seed, t-test, verdict)."""
    headers = ["variant"] + [f"{m} {arrow(m)}" for m in results.metrics]
    flagged = {v: degenerate_runs(runs, v, seeds) for v in variants}
    output_metrics = [m for m in results.metrics if m in OUTPUT_METRICS]
    rows = []
    for v in variants:
        mark = f" {DEGENERATE}" if flagged.get(v) else ""
        cells = [fmt_summary(results.summaries[v][m]) + (mark if m in output_metrics else "")
                 for m in results.metrics]
        rows.append([v + (mark if mark and not output_metrics else "")] + cells)
    notes = [f"↓ lower is better, ↑ higher is better. n = seeds with a value; {MISSING} = no run has the value. "
             "NaN/inf values count as missing here; the per-run table shows them as written.",
             "val_loss and test_loss are the evaluate stage's loss over the whole validation and test split. "
             "The validation curve in the figures is the train stage's loss on a fixed subset of the validation "
             "split (train.eval_examples), so its last point is not this val_loss."]
    notes += [METRIC_NOTES[m] + "." for m in results.metrics if m in METRIC_NOTES]
    for v, by_seed in flagged.items():
        if by_seed:
            what = ", ".join(output_metrics) if output_metrics else "its generated continuations"
            detail = "; ".join(f"seed {s}: {', '.join(r)}" for s, r in by_seed.items())
            notes.append(f"{DEGENERATE} {v}: degenerate outputs, so {what} score text that is not a "
                         f"real attempt ({detail}).")
    metric_table = Table(
        headers, rows, "Metrics on the evaluation data (eval.json): mean ± 95% t-interval half-width over seeds",
        notes,
    )
    delta_rows = []
    for v, by_metric in results.deltas.items():
        if all(s.n == 0 for s in results.summaries[v].values()):  # one row, not one per metric
            delta_rows.append([v, "all"] + [MISSING] * 5 + ["0", MISSING, MISSING, "no values for this variant"])
            continue
        for m, d in by_metric.items():
            t = results.tests[v][m]
            if d.half_width is None:
                ci = MISSING if d.mean is None else "n=1: no interval"
            else:
                ci = f"[{fmt(d.mean - d.half_width, 3)}, {fmt(d.mean + d.half_width, 3)}]"
            holm_cell = {"primary": "primary: uncorrected", "derived": MISSING}.get(t.role, fmt_p(t.p_holm))
            if t.detectable is None:
                seeds_cell = MISSING
            else:  # a test was made; no count means Δ = 0 or more seeds than the search tries
                seeds_cell = str(t.seeds) if t.seeds else (MISSING if d.mean == 0 else f"> {MAX_SEEDS:,}")
            delta_rows.append([v, f"{m} {arrow(m)}", fmt(d.mean, 3), ci, fmt(d.sd, 3), fmt_p(d.p_value), holm_cell,
                               str(d.n), fmt(t.detectable, 3), seeds_cell, d.verdict])
    blocks: list[Block] = [Heading("Results"), metric_table]
    if delta_rows:
        blocks.append(Table(
            ["variant", "metric", "Δ mean", "95% CI of Δ", "sd of Δ", "p (paired t)", "p (Holm)", "paired seeds",
             f"detectable |Δ| ({POWER:.0%} power)", f"seeds for this Δ ({POWER:.0%} power)", "verdict"],
            delta_rows, f"Δ vs {baseline} (variant − {baseline}), paired by seed", delta_notes(results, variants),
        ))
    return blocks


def delta_notes(results: Results, variants: Sequence[str]) -> list[str]:
    """What the Δ table's tests are: primary, Holm family, derived metrics, power columns."""
    primary = results.primary
    secondary = [m for m in results.metrics if m != primary and m not in DERIVED]
    derived = [m for m in results.metrics if m in DERIVED and m != primary]
    m = results.family_size
    notes = [
        "Two-sided paired t-tests at 5%; 'better'/'worse' account for the metric's direction.",
        f"Primary metric: {primary} (report.primary_metric; {DEFAULT_PRIMARY} when unset). Its test is not "
        "corrected for multiplicity: it is the one question the study asks before it is run.",
        f"Secondary metrics ({', '.join(secondary) or 'none'}): one Holm family of {m} tests, every secondary "
        f"metric × variant ({', '.join(v for v in variants if v in results.deltas)}) with a p-value; "
        "p (Holm) is the adjusted p-value the verdict compares with 5%, so the chance of any false "
        "'better'/'worse' among them is at most 5%.",
    ]
    if derived:
        notes.append("Derived metrics, no test or verdict of their own (their Δ repeats the test of the metric "
                     "they come from): " + ", ".join(f"{d} from {DERIVED[d]}" for d in derived) + ".")
    notes += [
        f"sd of Δ: standard deviation of the per-seed differences. Detectable |Δ|: the true difference the "
        f"paired t-test finds with {POWER:.0%} power given that sd and the paired seeds (noncentral t), "
        "at 5% for the primary metric" + (f" and at 5%/{m} = {ALPHA / m:.2g} for secondary ones (Holm rejects "
                                          "any test whose p-value is below that, whatever the other tests give)"
                                          if m else "") +
        f". Seeds for this Δ: the fewest seeds that would find the observed Δ with {POWER:.0%} power at the "
        "same level.",
        "Both power columns take the observed sd (and Δ) for the true ones; with a few seeds that sd is "
        "itself uncertain, so they are planning figures, not results. 'No significant difference' is "
        "not 'no difference': one smaller than the detectable |Δ| would usually be missed.",
    ]
    return notes


def reference_blocks(results: Results, baseline: str, reference: Mapping | None) -> list[Block]:
    """The baseline against an outside reference value (report.reference): with the reference's
    spread and n, Welch's t-test of the difference (unpaired: other code, seeds and machine)."""
    if not reference:
        return []
    metric, value, source = reference["metric"], float(reference["value"]), reference["source"]
    ref_n, ci, std = reference.get("n"), reference.get("ci"), reference.get("std")
    ref_sd = std if std is not None else sd_from_interval(ci, ref_n) if ci is not None and ref_n else None
    ref_text = f"{fmt(value)}" + (f" ± {fmt(ci, 2)} (95% t-interval, n={ref_n})" if ci is not None else
                                  f" (sd {fmt(std, 2)}, n={ref_n})" if std is not None else " (no spread given)")
    head = f"Reference ({source}): {metric} = {ref_text}."
    if reference.get("description"):
        head += f" Measured: {reference['description']}."
    s = results.summaries.get(baseline, {}).get(metric)
    if s is None or s.mean is None:
        return [Heading("Reference"), Paragraph(head), Paragraph(f"{metric} of {baseline}: {MISSING} (no run has it).")]
    text = f"{baseline}: {fmt_summary(s)}."
    sd = sd_from_interval(s.half_width, s.n) if s.half_width is not None else None
    test = welch(s.mean, sd, s.n, value, ref_sd, ref_n) if sd is not None and ref_sd is not None else None
    if test is not None:
        verdict = verdict_for(test.diff, test.p_value, higher_is_better(metric))
        text += (f" Difference {baseline} − reference: {fmt(test.diff, 3)}, 95% CI [{fmt(test.diff - test.half_width, 3)}, "
                 f"{fmt(test.diff + test.half_width, 3)}], Welch t-test p = {fmt_p(test.p_value)} "
                 f"(df {test.df:.1f}): {verdict}.")
    else:  # no spread on one side: no test, only the distance
        better = (s.mean >= value) if higher_is_better(metric) else (s.mean <= value)
        why = "the reference gives no spread and n (report.reference ci or std, n)" if ref_sd is None \
            else f"{baseline} has no interval"
        text += (f" Mean {'at or better than' if better else 'worse than'} the reference by "
                 f"{fmt(abs(s.mean - value), 3)}; not tested: {why}.")
    return [Heading("Reference"), Paragraph(head), Paragraph(text)]


def unigram_plateau(runs) -> float | None:
    """The unigram plateau the evaluate stage copied from the manifest (the same in every eval.json)."""
    return next((float(run.eval["unigram_val_loss"]) for run in runs.values()
                 if run.eval and isinstance(run.eval.get("unigram_val_loss"), (int, float))), None)


def plateau_blocks(results: Results, variants: Sequence[str], plateau: float | None) -> list[Block]:
    """How far each variant's val_loss is below the unigram plateau (see unigram_plateau)."""
    if plateau is None:
        return []
    rows = []
    for v in variants:
        s = results.summaries.get(v, {}).get("val_loss")
        if s is None or s.mean is None:
            rows.append([v, MISSING, MISSING, MISSING])
            continue
        rows.append([v, fmt_summary(s), fmt(plateau - s.mean, 3), f"{100 * (plateau - s.mean) / plateau:.0f}%"])
    return [Table(["variant", "val_loss", "below the plateau (nats/token)", "below (% of plateau)"], rows,
                  f"Unigram plateau: val_loss {fmt(plateau)} nats/token",
                  ["The validation cross-entropy of a model that knows only the training split's token "
                   "frequencies (add-one smoothed; the encode stage's manifest). A variant near it has learnt "
                   "frequencies, not text; one above it did worse than that."])]


def params_blocks(runs, variants: Sequence[str], seeds: Sequence[int]) -> list[Block]:
    """Parameter count by component, from the first seed with a train.json."""
    by_variant: dict[str, dict] = {}
    for v in variants:
        first = next((runs[(v, s)].train for s in seeds if runs[(v, s)].train), None)
        comps = first.get("params_by_component") if first else None
        by_variant[v] = comps if isinstance(comps, dict) else {}
    keys = {k for comps in by_variant.values() for k in comps}
    columns = [c for c in COMPONENT_ORDER if c in keys] + sorted(keys - set(COMPONENT_ORDER))
    rows = [[v] + [fmt_int(number(by_variant[v], c)) for c in columns] for v in variants]
    return [Heading("Parameters by component"),
            Table(["variant"] + columns, rows, "Parameters (train.json params_by_component)")]


CONTENDED = "⚠"


def load_peak(train: Mapping | None) -> float | None:
    """The higher of the 1-minute load averages train.json recorded at the start and end of training."""
    load = (train or {}).get("load") if isinstance((train or {}).get("load"), dict) else {}
    values = [number(load.get(k) if isinstance(load.get(k), dict) else None, "loadavg_1m") for k in ("start", "end")]
    values = [v for v in values if v is not None]
    return max(values) if values else None


# Other processes' share of the machine's CPU time during a run (train.json load.others_cpu_share)
# above which its timing is marked: kernel threads and DVC's own bookkeeping stay well below it.
OTHERS_SHARE = 0.10


def others_share(train: Mapping | None) -> float | None:
    load = (train or {}).get("load")
    return number(load, "others_cpu_share") if isinstance(load, dict) else None


def contended(train: Mapping | None) -> bool | None:
    """Whether a run's timing was taken under contention: other processes used more than
    OTHERS_SHARE of the machine's CPU time while it trained. Runs recorded before that measure: a
    load average above the cores the run used (train.json threads), which also counts the run's
    own threads and the previous stage's tail, so it marks some quiet runs too. None if neither."""
    share = others_share(train)
    if share is not None:
        return share > OTHERS_SHARE
    peak, cores = load_peak(train), number(train, "threads")
    return None if peak is None or cores is None else peak > cores


def mean_batch(trains) -> str:
    """'24.3 × (17.1 + 19)': the mean padded batch over seeds, rows × (source + target) (target alone
    for a language model); MISSING where no train.json records it."""
    shapes = [t["batch_shape_mean"] for t in trains if t.get("batch_shape_mean")]
    if not shapes:
        return MISSING
    rows, src, tgt = np.mean(shapes, axis=0)
    return f"{fmt(rows, 3)} × ({fmt(src, 3)} + {fmt(tgt, 3)})" if src else f"{fmt(rows, 3)} × {fmt(tgt, 3)}"


def cost_blocks(runs, variants: Sequence[str], seeds: Sequence[int]) -> list[Block]:
    """Tokens, steps, wall time, throughput and MFU: mean over seeds with a train.json; timings taken
    under contention (see `contended`) are marked, as they understate what the code does."""
    def mean(v: str, key: str) -> float | None:
        vals = list(values_by_seed(runs, v, seeds, "train", key).values())
        return float(np.mean(vals)) if vals else None

    def counts(v: str, key: str) -> str:  # a mean of step counts (112 from 111 and 113) is no run's
        return fmt_range(list(values_by_seed(runs, v, seeds, "train", key).values()))

    rows, marked = [], []
    for v in variants:
        trains = {s: runs[(v, s)].train for s in seeds if runs[(v, s)].train}
        devices = sorted({str(t.get("device")) for t in trains.values()})
        busy = [s for s, t in trains.items() if contended(t)]
        peaks = [p for t in trains.values() if (p := load_peak(t)) is not None]
        mark = f" {CONTENDED}" if busy else ""
        if busy:
            marked.append(f"{v} (seed{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))})")
        rows.append([
            v, counts(v, "tokens_trained"), counts(v, "steps"), fmt_sci(mean(v, "flops_per_token")),
            fmt_sci(mean(v, "flops_trained")), fmt(mean(v, "wall_time_s")) + mark,
            fmt_int(mean(v, "tokens_per_s")) + mark, fmt(mean(v, "mfu"), 3), fmt(mean(v, "padding_ratio"), 3),
            mean_batch(trains.values()), ", ".join(devices) or MISSING, fmt_range(list(values_by_seed(runs, v, seeds, "train", "threads").values())),
            fmt(max(peaks), 3) if peaks else MISSING,
            f"{max(shares):.0%}" if (shares := [s for t in trains.values() if (s := others_share(t)) is not None])
            else MISSING,
        ])
    notes = ["Load: the highest 1-minute load average (/proc/loadavg) train.json recorded at the start and end "
             "of a seed's training; cores: the CPU threads the run used (train.json threads); others' CPU: the "
             "largest share of the machine's CPU time that other processes used during a seed's training "
             "(train.json load.others_cpu_share, from /proc/stat less the run's own CPU time). Mean batch: rows x "
             "(source + target length), padded, over the micro-batches trained (train.json batch_shape_mean); "
             "pipeline.plan's CPU time model is calibrated on it."]
    notes.append(f"{CONTENDED} timed under contention: other processes used more than {OTHERS_SHARE:.0%} of the "
                 "machine's CPU time (runs recorded before that measure: the load exceeded the cores the run used), "
                 "so wall time and tokens/s understate this code's speed: " + "; ".join(marked) + "." if marked else
                 "No timing here was taken under contention (others' CPU at most "
                 f"{OTHERS_SHARE:.0%}, or where not recorded, load at or below the cores each run used)."
                 if any(row[-2] != MISSING for row in rows) else
                 "Machine load not recorded (train.json files from before it was), so contention is unknown.")
    return [Heading("Training cost"), Table(
        ["variant", "tokens trained", "steps", "FLOPs / target token", "FLOPs trained", "wall time (s)", "tokens/s",
         "MFU", "padding ratio", "mean batch", "device", "cores", "load (max)", "others' CPU (max)"],
        rows, "Training cost (train.json): tokens and steps as min–max over seeds (one value when all "
              "seeds agree), the other columns mean over seeds", notes,
    )]


def data_blocks(filter_metrics: dict | None, path: Path) -> list[Block]:
    """Examples per split (raw, dropped, moved, kept) and length percentiles, from the filter stage."""
    blocks: list[Block] = [Heading("Data")]
    if filter_metrics is None:
        return blocks + [Paragraph(f"Filter metrics not available: {path} is missing.")]
    splits = filter_metrics.get("splits") if isinstance(filter_metrics.get("splits"), dict) else {}
    rows = []
    for split, counts in splits.items():
        raw, kept = number(counts, "raw"), number(counts, "kept")
        by_length, by_sample = number(counts, "dropped_length"), number(counts, "dropped_subsample")
        share = by_length / raw if by_length is not None and raw else None
        moved = [f"{'+' if key == 'from_train' else '−'}{fmt_int(number(counts, key))} {label}"
                 for key, label in (("from_train", "from train"), ("to_validation", "to validation"),
                                    ("to_test", "to test")) if number(counts, key)]
        rows.append([split, fmt_int(raw), fmt_int(by_length), MISSING if share is None else f"{share:.1%}",
                     fmt_int(by_sample), ", ".join(moved) or "none", fmt_int(kept)])
    notes = [str(n) for n in filter_metrics.get("source_notes") or []]
    carve = {"contiguous_tail": "validation/test carved from the end of train, in document order "
                                "(no document on both sides)",
             "shuffled": "validation/test carved from train by a seeded shuffle"}.get(filter_metrics.get("carve"))
    blocks.append(Table(["split", "raw", "dropped by length", "dropped %", "dropped by subsample", "moved",
                         "kept"], rows or [[MISSING] * 7], f"Examples through the filter stage ({path})",
                        ([carve] if carve else []) + notes))
    pct_keys = ("p50", "p90", "p99", "max")
    lengths = filter_metrics.get("length_percentiles")
    lengths = lengths if isinstance(lengths, dict) else {}
    len_rows = []
    for side in ("source", "target"):
        by_stage = lengths.get(side) if isinstance(lengths.get(side), dict) else {}
        for stage, label in (("raw", "before filtering"), ("kept", "kept")):
            pct = by_stage.get(stage) if isinstance(by_stage.get(stage), dict) else None
            len_rows.append([side, label] + [fmt(number(pct, k)) for k in pct_keys])
    unit = {"chars": "characters", "pretokens": "pre-tokens (words and punctuation)"}.get(
        filter_metrics.get("length_unit"), "pre-tokens (words and punctuation)")
    blocks.append(Table(["sequence", "examples"] + list(pct_keys), len_rows,
                        f"Lengths in {unit}, the unit of the filter's limits"))
    return blocks


def download_blocks(metrics: dict | None, path: Path) -> list[Block]:
    """Rows per split and their lengths in characters as the download stage wrote them, so a
    user sees what a `documents` mode did (e.g. stories joined by `paragraph`)."""
    if metrics is None:
        return [Paragraph(f"Download metrics not available: {path} is missing.")]
    splits = metrics.get("splits") if isinstance(metrics.get("splits"), dict) else {}
    lm = metrics.get("task") == "language_modeling"
    pct_keys = ("p50", "p90", "p99", "max")
    rows = []
    for split, record in splits.items():
        record = record if isinstance(record, dict) else {}
        chars = record.get("target_chars") if isinstance(record.get("target_chars"), dict) else None
        breaks = number(record, "documents_with_line_breaks")
        rows.append([split, fmt_int(number(record, "rows"))] + [fmt_int(number(chars, k)) for k in pct_keys]
                    + ([fmt_int(breaks)] if lm else []))
    mode = metrics.get("documents")
    how = (f"documents: {mode}" + (f" (separator {metrics.get('separator')!r})" if metrics.get("separator") else "")
           if mode else "")
    notes = ([how] if how else []) + [str(w) for w in metrics.get("warnings") or []]
    header = (["split", "documents" if lm else "rows"] + [f"{k} chars" for k in pct_keys]
              + (["with a line break"] if lm else []))
    return [Table(header, rows or [[MISSING] * len(header)],
                  f"{'Documents' if lm else 'Rows'} as downloaded, {'text' if lm else 'target'} "
                  f"lengths in characters ({path})", notes)]


def _cut(text: object) -> str:
    if text is None:
        return MISSING
    text = " ".join(str(text).split())
    if not text:
        return "(empty)"
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 1] + "…"


def samples_blocks(runs, variants: Sequence[str], seeds: Sequence[int]) -> list[Block]:
    """The first few sample outputs per variant, from its first seed with a samples.json."""
    rows = []
    for v in variants:
        seed = next((s for s in seeds if runs[(v, s)].samples is not None), None)
        if seed is None:
            rows.append([v, MISSING, MISSING, MISSING, MISSING])
            continue
        for i, sample in enumerate(runs[(v, seed)].samples[:N_SAMPLES]):
            sample = sample if isinstance(sample, dict) else {}
            rows.append([f"{v} (seed {seed})" if i == 0 else "", str(i + 1), _cut(sample.get("source")),
                         _cut(sample.get("reference")), _cut(sample.get("prediction"))])
    return [Heading("Sample outputs"), Table(
        ["variant", "#", "source", "reference", "prediction"], rows,
        f"First {N_SAMPLES} samples per variant (samples.json), cut at {SAMPLE_CHARS} characters",
    )]


def output_blocks(runs, variants: Sequence[str], seeds: Sequence[int]) -> list[Block]:
    """Degeneracy checks of the generated outputs, one row per run (eval.json `outputs`)."""
    keys = ("distinct_1", "distinct_2", "identical_share", "repetition_rate", "empty_share")
    rows = []
    for v in variants:
        for s in seeds:
            ev = runs[(v, s)].eval or {}
            stats = ev.get("outputs") if isinstance(ev.get("outputs"), dict) else None
            if stats is None:
                continue
            reasons = ev.get("degenerate") or []
            rows.append([v, str(s)] + [fmt(number(stats, k), 3) for k in keys]
                        + [f"{DEGENERATE} " + "; ".join(map(str, reasons)) if reasons else "ok"])
    if not rows:
        return []
    return [Heading("Output checks"), Table(
        ["variant", "seed"] + list(keys) + ["verdict"], rows,
        "Generated outputs (eval.json outputs): word n-gram diversity, identical and empty outputs, "
        "repeated 3-grams within an output",
    )]


def per_run_blocks(runs, variants, seeds, metrics: Sequence[str]) -> list[Block]:
    """Every run's own values, as written in its files, so each mean above can be checked."""
    # Run ids exist only where the train stage mirrored live; otherwise the report stage mirrors
    # after this page is written, and the MLflow run is found by its name.
    live = any((runs[(v, s)].train or {}).get("mlflow_run_id") for v in variants for s in seeds)
    rows = []
    for v in variants:
        for s in seeds:
            run = runs[(v, s)]
            rows.append([v, str(s)] + [fmt_raw(run.eval, m) for m in metrics] + [
                fmt_raw(run.train, "tokens_trained"), fmt_raw(run.train, "wall_time_s"),
            ] + ([fmt_raw(run.train, "mlflow_run_id")] if live else []))
    headers = ["variant", "seed"] + list(metrics) + ["tokens trained", "wall time (s)"] + (["MLflow run"] if live else [])
    caption = "One row per variant × seed" + ("" if live else "; in MLflow, the run named <variant>-<seed>")
    return [Heading("Per-run values"), Table(headers, rows, caption)]
