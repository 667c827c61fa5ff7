"""Tables of the report, built from the loaded runs; every number is read from a run file.

Setup (what was compared), Results (mean ± interval per metric, the Δ table with its tests), the
outside reference, the unigram plateau, parameters, samples, output checks and every run's own
values. The numbers behind them are pipeline.reporting.results'; the cost and data tables have
modules of their own. A value that is absent (no run, no file, no key, null, NaN) is shown as
MISSING and left out of the statistics: it is never replaced by zero.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.reporting.formatting import MISSING, arrow, fmt, fmt_int, fmt_p, fmt_raw, fmt_summary
from pipeline.reporting.inputs import Run, number, values_by_seed
from pipeline.reporting.render import Block, Heading, Paragraph, Table
from pipeline.reporting.results import DEFAULT_PRIMARY, DERIVED, METRIC_NOTES, OUTPUT_METRICS, Results
from pipeline.reporting.stats import (ALPHA, MAX_SEEDS, POWER, Summary, higher_is_better, sd_from_interval, summarize,
                                      verdict_for, welch)

DEGENERATE = "⚠"
COMPONENT_ORDER = ("embeddings", "attention", "ffn", "norms", "other", "total")
RUN_FILES = ("train.json", "train_curve.csv", "val_curve.csv", "eval.json", "samples.json", "attention.json")
_RUN_FIELDS = ("train", "train_curve", "val_curve", "eval", "samples", "attention")
N_SAMPLES = 3  # sample outputs shown per variant
SAMPLE_CHARS = 160  # longer texts are cut, the table is a glance not a dump


def _params_total(runs: Mapping[tuple[str, int], Run], variant: str, seeds: Sequence[int]) -> str:
    totals = sorted(set(values_by_seed(runs, variant, seeds, "train", "params_total").values()))
    return " / ".join(fmt_int(t) for t in totals) if totals else MISSING


def setup_blocks(runs, variants, seeds, baseline: str, budget: Mapping, task: str | None,
                 notes: Sequence[str] = (), planned: Mapping[str, Sequence[int]] | None = None) -> list[Block]:
    """What was compared: task, seeds, baseline, budget, parameter counts and missing runs.
    `planned`: each variant's own seeds (seeds until decided), where not every variant runs every seed."""
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
        own = list(planned[v]) if planned else list(seeds)
        found = [s for s in own if not runs[(v, s)].missing]
        gaps = []
        for s in own:
            run = runs[(v, s)]
            absent = [f for f, attr in zip(RUN_FILES, _RUN_FIELDS) if getattr(run, attr) is None]
            if run.missing:
                gaps.append(f"seed {s}: run missing")
            elif absent:
                gaps.append(f"seed {s}: no " + ", ".join(absent))
        if not found:
            gaps = ["all seeds: run missing"]
        rows.append([v, _params_total(runs, v, seeds), f"{len(found)}/{len(own)}", "; ".join(gaps) or "none"])
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


# report.reference.quantity -> what of ours is the same quantity: (record, key, how it is measured).
REFERENCE_QUANTITIES = {
    "whole_split": ("eval", None, "the evaluate stage's loss over the whole split, of the model train kept"),
    "best_estimate": ("train", "val_estimate_best", "the lowest in-loop estimate of each run (train.json "
                      "val_estimate_best: train.eval_windows, train.eval_examples windows every train.eval_every steps)"),
}


def reference_quantities(results: Results, baseline: str, reference: Mapping, runs: Mapping | None,
                         seeds: Sequence[int]) -> tuple[str, Summary | None, Summary | None]:
    """(our key, the baseline's summary of the reference's quantity, its whole-split summary)."""
    metric = reference["metric"]
    record, key, _ = REFERENCE_QUANTITIES[reference.get("quantity") or "whole_split"]
    whole = results.summaries.get(baseline, {}).get(metric)
    if record == "eval":
        return metric, whole, whole
    values = values_by_seed(runs or {}, baseline, seeds, record, key)
    return key, (summarize(list(values.values())) if values else None), whole


def reference_summary(results: Results, baseline: str, reference: Mapping | None, runs: Mapping | None,
                      seeds: Sequence[int]) -> dict | None:
    """details.json's "reference": the value, its quantity, and ours (same quantity, and whole split)."""
    if not reference:
        return None
    key, same, whole = reference_quantities(results, baseline, reference, runs, seeds)

    def plain(s: Summary | None) -> dict | None:
        return None if s is None else {"n": s.n, "mean": s.mean, "half_width": s.half_width}
    last = values_by_seed(runs or {}, baseline, seeds, "eval", "val_loss_last")  # train.keep = best only
    return {"metric": reference["metric"], "value": float(reference["value"]),
            "quantity": reference.get("quantity") or "whole_split", "ours_key": key, "ours": plain(same),
            "ours_whole_split": plain(whole),
            "ours_whole_split_last_step": plain(summarize(list(last.values())) if last else None)}


def reference_blocks(results: Results, baseline: str, reference: Mapping | None,
                     runs: Mapping | None = None, seeds: Sequence[int] = ()) -> list[Block]:
    """The baseline against an outside reference value (report.reference), like with like: the
    reference's `quantity` picks which of our numbers it sits beside (the whole-split loss, or the
    best in-loop estimate), and the whole-split loss is shown in either case. With the reference's
    spread and n, Welch's t-test of the difference (unpaired: other code, seeds and machine)."""
    if not reference:
        return []
    metric, value, source = reference["metric"], float(reference["value"]), reference["source"]
    quantity = reference.get("quantity") or "whole_split"
    ref_n, ci, std = reference.get("n"), reference.get("ci"), reference.get("std")
    ref_sd = std if std is not None else sd_from_interval(ci, ref_n) if ci is not None and ref_n else None
    ref_text = f"{fmt(value)}" + (f" ± {fmt(ci, 2)} (95% t-interval, n={ref_n})" if ci is not None else
                                  f" (sd {fmt(std, 2)}, n={ref_n})" if std is not None else " (no spread given)")
    record, _, how = REFERENCE_QUANTITIES[quantity]
    head = f"Reference ({source}): {metric} = {ref_text}, as {quantity.replace('_', ' ')}."
    if reference.get("description"):
        head += f" Measured: {reference['description']}."
    head += f" Ours, the same quantity: {how}."
    ours, s, whole = reference_quantities(results, baseline, reference, runs, seeds)
    if s is None or s.mean is None:
        return [Heading("Reference"), Paragraph(head), Paragraph(f"{ours} of {baseline}: {MISSING} (no run has it).")]
    text = f"{baseline}, {ours}: {fmt_summary(s)}."
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
    blocks = [Heading("Reference"), Paragraph(head), Paragraph(text)]
    if record != "eval":  # the other quantity, so neither is read for the other
        blocks.append(Paragraph(f"{baseline}, {metric} over the whole split (the kept model): "
                                + (fmt_summary(whole) if whole is not None and whole.mean is not None else MISSING)
                                + "; not the reference's quantity."))
    return blocks


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


def per_run_blocks(runs, variants, seeds, metrics: Sequence[str], planned: Mapping | None = None) -> list[Block]:
    """Every run's own values, as written in its files, so each mean above can be checked. Under
    seeds until decided (`planned`: each variant's seeds) a variant's rows are the seeds it took."""
    # Run ids exist only where the train stage mirrored live; otherwise the report stage mirrors
    # after this page is written, and the MLflow run is found by its name.
    live = any((runs[(v, s)].train or {}).get("mlflow_run_id") for v in variants for s in seeds)
    # train.keep = best: which step's model the evaluation scored, and the in-loop estimates.
    best = any((runs[(v, s)].train or {}).get("keep") == "best" for v in variants for s in seeds)
    kept = ("kept step", "val_estimate_best", "val_estimate_last")
    rows = []
    for v in variants:
        for s in seeds:
            if planned is not None and s not in planned.get(v, ()):
                continue  # a comparison decided before this seed's look: never run, by design
            run = runs[(v, s)]
            rows.append([v, str(s)] + [fmt_raw(run.eval, m) for m in metrics] + [
                fmt_raw(run.train, "tokens_trained"), fmt_raw(run.train, "wall_time_s"),
            ] + ([fmt_raw(run.train, k.replace(" ", "_")) for k in kept] + [fmt_raw(run.eval, "val_loss_last")]
                 if best else [])
                + ([fmt_raw(run.train, "mlflow_run_id")] if live else []))
    headers = (["variant", "seed"] + list(metrics) + ["tokens trained", "wall time (s)"]
               + ([*kept, "val_loss of the last step's model"] if best else []) + (["MLflow run"] if live else []))
    caption = "One row per variant × seed" + ("" if live else "; in MLflow, the run named <variant>-<seed>")
    if planned is not None:
        caption += "; seeds until decided: each variant's seeds are those its comparison took"
    if best:
        caption += ("; train.keep = best: each run's metrics are those of its kept step's model (the lowest "
                    "in-loop estimate), the last step's model is scored on the validation split beside it")
    return [Heading("Per-run values"), Table(headers, rows, caption)]
