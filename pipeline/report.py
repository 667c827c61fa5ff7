"""Report stage: compare every variant with the baseline over seeds, as Markdown + HTML + figures.

    python -m pipeline.report --runs data/runs --evals data/eval \
        --filter-metrics data/metrics/filter.json --raw data/raw --shards data/shards \
        --params params.yaml --out-dir reports

Design decisions:
- Reads only the stage outputs (train.json, curves, eval.json, samples, attention, filter.json,
  data/raw/meta.json, the shards' manifest.json); every number in the report comes from those files.
- A preset that reruns a seed study lists the seed's claims (report.seed_claims); the section after
  the verdict sets each beside our number on the same quantity, checked by our verdict
  (pipeline.reporting.claims). Without claims there is no such section.
- The answer first: one verdict line per ablation on the primary metric and the Δ figure open the
  report (pipeline.reporting.verdict); the tables that support them follow.
- A preset's report.notes are quoted as its author's text beside the generated facts about the
  data, and flagged when written for other data (pipeline.reporting.notes). A missing file or value is shown as missing
  (—), never as zero; an unreadable file stops the stage with one line naming it (exit code 1).
- Statistics are in pipeline.reporting.stats (t-intervals over seeds, paired t-test vs the baseline, power,
  Holm). One primary metric (report.primary_metric) is tested uncorrected, the other metrics are
  Holm-corrected as one family, and metrics derived from another (ppl, bits) get no verdict.
- The outputs are built in a temporary directory and swapped in at the end, each atomically, so a
  failure leaves the previous report intact instead of a half-written one. Only the stage's own
  outputs are replaced: reports/studies/ (committed study reports) lives beside them.
- MLflow only mirrors (pipeline.reporting.mlflow_mirror): each training run is a top-level run (so `mlflow ui`
  lists every variant x seed), created from the stages' files unless the train stage mirrored it
  live, and one `report` run holds the report as artifacts. Any MLflow failure is a warning; the
  report on disk is the result.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.deciding.rounds import seed_order
from pipeline.io.atomic import DiskFull, atomic_path, explain_full_disk
from pipeline.params import (Params, ParamsError, ReportParams, knockout_seeds, load_params, model_config,
                             resolve_variant, stage_error)
from pipeline.reporting import decisions, drawing, sweeps
from pipeline.reporting.assumption import assumption_blocks
from pipeline.reporting.claims import check_claims, claims_blocks, claims_summary
from pipeline.reporting.cost import cost_blocks
from pipeline.reporting.data_tables import data_blocks, download_blocks
from pipeline.reporting.dvc_files import curve_tables, details_summary, metrics_summary
from pipeline.reporting.figures import delta_blocks, figure_blocks
from pipeline.reporting.fingerprint import fingerprint
from pipeline.reporting.inputs import ReportInputError
from pipeline.reporting.knockout import knockout_blocks, knockout_summary, mirror_knockouts
from pipeline.reporting.loss_budget import loss_budget_blocks
from pipeline.reporting.mlflow_mirror import RunFiles, import_ahead, mirror_runs, run_data
from pipeline.reporting.notes import notes_blocks
from pipeline.reporting.plots import variant_colors
from pipeline.reporting.render import Block, Paragraph, to_html, to_markdown
from pipeline.reporting.results import BASE_METRICS, DERIVED, TASK_METRICS
from pipeline.reporting.stats import ALPHA
from pipeline.reporting.study import ReportInputs, Study, read_inputs
from pipeline.reporting.tables import (
    output_blocks, params_blocks, per_run_blocks, plateau_blocks, reference_blocks, reference_summary, results_blocks,
    samples_blocks, setup_blocks,
)
from pipeline.reporting.verdict import verdict_blocks
from pipeline.tracking import tracking_enabled, tracking_root

log = logging.getLogger(__name__)

TITLE = "Ablation report"
DEFAULT_EXPERIMENT = ReportParams.model_fields["experiment"].default  # unless report.experiment names another
BUDGET_KEYS = ("budget_tokens", "budget_steps", "budget_flops")


def render_report(r: ReportInputs, out_dir: Path) -> list[RunFiles]:
    """Write report.md, report.html, figures/*.png, metrics.json, details.json, decisions.json,
    fingerprint.json and curves/ into `out_dir`, from the inputs read once (read_inputs).

    Returns the training runs (their files) for the MLflow mirror (pipeline.reporting.mlflow_mirror).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".report-build.*"):  # left by a report stage killed mid-build
        shutil.rmtree(stale, ignore_errors=True)
    # Built whole in a scratch folder, then each output swapped in atomically: a failure leaves the
    # previous report, and the folder's other contents (reports/studies/) are never touched.
    # The figures draw in forked children where the stage's command turns that on, while the tables
    # are made (pipeline.reporting.drawing); meanwhile MLflow's imports load, for the mirror after.
    with tempfile.TemporaryDirectory(prefix=".report-build.", dir=out_dir) as build, \
            explain_full_disk(out_dir, Path(build)), drawing.side_by_side():
        tmp = Path(build)
        (tmp / "figures").mkdir(parents=True)
        blocks = report_blocks(r, tmp / "figures")
        (tmp / "report.md").write_text(to_markdown(TITLE, blocks), encoding="utf-8")
        _write_data_files(r, tmp)
        drawing.finish(meanwhile=import_ahead)  # every figure drawn: the HTML embeds them
        (tmp / "report.html").write_text(to_html(TITLE, blocks, tmp), encoding="utf-8")
        for item in sorted(tmp.iterdir()):
            with atomic_path(out_dir / item.name) as dst:
                os.replace(item, dst)
    return run_files(r)


def report_blocks(r: ReportInputs, figures: Path) -> list[Block]:
    """The report top to bottom, drawing its figures into `figures`."""
    colors = variant_colors(r.study.variants)
    return _answer(r, figures, colors) + _results(r) + _beside(r, figures, colors) + _detail(r, figures)


def _answer(r: ReportInputs, figures: Path, colors) -> list[Block]:
    """The answer first: the verdict and the Δ figure, then what it rests on (the t-model's check)
    and the seed study's claims beside it."""
    s = r.study
    verdict, level = _verdict(r)
    return (verdict
            + delta_blocks(r.results, s.baseline, colors, figures, r.decided)
            + [Paragraph(f"Generated from {s.runs_dir}, {s.evals_dir} and {s.filter_metrics}.")]
            + assumption_blocks(r.runs, s.variants, s.seeds, s.baseline, r.results.primary, r.plateau, level,
                                figures, colors)
            + claims_blocks(s.seed_claims, r.results, r.runs, s.seeds, s.baseline, r.filt, r.decided))


def _verdict(r: ReportInputs) -> tuple[list[Block], float]:
    """The verdict lines and the level the t-model is checked at: under seeds until decided the
    rounds' record gives both (and its own section), else the fixed-n test at 1 − ALPHA."""
    if r.decided is None:
        return verdict_blocks(r.results, r.study.variants, r.study.baseline), 1 - ALPHA
    return (decisions.verdict_blocks(r.decided) + decisions.decision_blocks(r.decided),
            r.decided.plan.levels[-1])


def _results(r: ReportInputs) -> list[Block]:
    """How the runs were made, the data they saw, and the tables behind the verdict."""
    s = r.study
    return (setup_blocks(r.runs, s.variants, s.seeds, s.baseline, s.budget, r.task, planned=r.planned)
            + notes_blocks(s.notes, s.notes_data_digest, r.raw_meta, r.filt, r.manifest)
            + results_blocks(r.results, s.variants, s.baseline, r.runs, s.seeds)
            + loss_budget_blocks(r.runs))


def _beside(r: ReportInputs, figures: Path, colors) -> list[Block]:
    """The comparisons beside the main one: the sweeps, a published reference, the unigram plateau
    and the knock-outs, each only where the study has it."""
    s = r.study
    return ((sweeps.fair_lr_blocks(r.fair, s.baseline, s.main_lr, figures, colors) if r.fair else [])
            + (sweeps.scale_blocks(r.scaled, s.baseline, figures, colors) if r.scaled else [])
            + reference_blocks(r.results, s.baseline, s.reference, r.runs, s.seeds)
            + plateau_blocks(r.results, s.variants, r.plateau)
            + knockout_blocks(r.knockouts, r.runs, s.seeds, s.baseline, s.ablations, figures))


def _detail(r: ReportInputs, figures: Path) -> list[Block]:
    """The figures, then the detail: parameters, cost, data, samples, outputs and every run."""
    s = r.study
    return (figure_blocks(r.runs, r.results, s.variants, s.seeds, s.baseline, figures)
            + params_blocks(r.runs, s.variants, s.seeds)
            + cost_blocks(r.runs, s.variants, s.seeds)
            + data_blocks(r.filt, Path(s.filter_metrics))
            + (download_blocks(r.download, Path(s.download_metrics)) if s.download_metrics is not None else [])
            + samples_blocks(r.runs, s.variants, s.seeds)
            + output_blocks(r.runs, s.variants, s.seeds)
            + per_run_blocks(r.runs, s.variants, s.seeds, r.results.metrics, r.planned))


def _write_data_files(r: ReportInputs, folder: Path) -> None:
    """What DVC and `bash run.sh decide` read back, and the curves' tables."""
    s = r.study
    # DVC compares metrics.json: the verdict's numbers only; the rest is detail (dvc_files).
    _write_json(folder / "metrics.json", metrics_summary(r.results, s.variants))
    _write_json(folder / "details.json", _details(r))
    # What `bash run.sh decide` reads to add the next round's runs; a DVC output either way.
    _write_json(folder / "decisions.json", r.decided.to_json() if r.decided else {"off": True})
    curve_tables(r.runs, folder / "curves")
    trains = {key: run.train for key, run in r.runs.items()}
    _write_json(folder / "fingerprint.json", fingerprint(s.runs_dir, s.variants, s.seeds, trains))


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _details(r: ReportInputs) -> dict:
    """details.json: every number behind the tables, and each comparison beside them that the study has."""
    s = r.study
    out = details_summary(r.results, s.variants, r.plateau)
    if r.fair:
        out["fair_lr"] = sweeps.fair_lr_summary(r.fair)
    if r.scaled:
        out["scales"] = sweeps.scale_summary(r.scaled)
    if r.knockouts:
        out["knockout"] = knockout_summary(r.knockouts)
    if s.seed_claims:  # the seed study's claims beside ours, checked (absent without claims)
        out["seed_claims"] = claims_summary(s.seed_claims, r.results, r.runs, s.seeds, s.baseline, r.filt, r.decided)
    if s.reference:  # the reference beside our same quantity (benchmarks/gpu.py reads it)
        out["reference"] = reference_summary(r.results, s.baseline, s.reference, r.runs, s.seeds)
    return out


def run_files(r: ReportInputs) -> list[RunFiles]:
    """Every trained run's folders for the MLflow mirror: the main runs, then each sweep run (its
    MLflow name carries its point). Diverged sweep runs have nothing to mirror."""
    runs_dir, evals_dir = Path(r.study.runs_dir), Path(r.study.evals_dir)
    found = [(run, runs_dir / f"{v}-{s}", evals_dir / f"{v}-{s}", "") for (v, s), run in r.runs.items()]
    found += [(sr.run, sr.run_dir, sr.eval_dir, sr.label) for sr in r.sweep_runs]
    out = []
    for run, run_dir, eval_dir, point in found:
        if run.train and not run.train.get("diverged"):
            live = run.train.get("mlflow_run_id")
            out.append(RunFiles(run.variant, run.seed, run_dir, eval_dir,
                                live if isinstance(live, str) and live else None, point))
    return out


def _read_params(path: Path) -> Params:
    """params.yaml as every stage reads it (pipeline.params: the one schema, unknown keys refused),
    and what only this stage can check: that the metrics it is asked about are ones it reports."""
    try:
        params = load_params(path)
    except ParamsError as e:
        raise ReportInputError(str(e)) from None
    primary = params.report.primary_metric
    if primary is not None and primary not in BASE_METRICS + TASK_METRICS:
        raise ReportInputError(f"{path}: report.primary_metric {primary!r} is not a reported metric "
                               f"({', '.join(BASE_METRICS + TASK_METRICS)})")
    if primary in DERIVED:  # its test is its source's: name the source, so the family is right
        raise ReportInputError(f"{path}: report.primary_metric {primary!r} is derived from "
                               f"{DERIVED[primary]!r} (the same test); name {DERIVED[primary]!r}")
    check_claims(claims(params), [str(v) for v in params.ablations], str(path))
    return params


def claims(params: Params) -> list[dict]:
    """report.seed_claims as mappings (what pipeline.reporting.claims reads), each with "arms": the
    resolved settings of the variants it compares, which its seed_conditions are checked against;
    a param_count claim also "counted": our model's counts at the seed's settings."""
    out = []
    for i, claim in enumerate(params.report.seed_claims):
        c = claim.model_dump()
        names = {c.get("variant") or params.report.baseline, c.get("versus") or params.report.baseline}
        c["arms"] = {v: resolve_variant(params, v) for v in sorted(names) if v in params.ablations}
        for arm in c["arms"].values():
            for section, settings in (c.get("seed_conditions") or {}).items():
                if unknown := sorted(set(settings) - set(arm[section])):
                    raise ReportInputError(f"report.seed_claims.{i}.seed_conditions.{section}.{unknown[0]}: "
                                           f"not a {section} setting")
        if c["read"] == "param_count":
            c["counted"] = counted(params, c["config"], f"report.seed_claims.{i}.config")
        out.append(c)
    return out


def counted(params: Params, config: Mapping, where: str) -> dict[str, int]:
    """Our model's parameter counts at a seed's hand-counted settings (over the baseline's model
    section; vocab_size the tokenizer's), built on the meta device: no weights, no time.

    The report stage loads model/ only here, for a preset with such a claim, so dvc.yaml does not
    list it: every model edit reruns the train stages, and the report follows their outputs."""
    import torch

    from model import build_model

    model = dict(resolve_variant(params, params.report.baseline)["model"])
    if unknown := sorted(set(config) - set(model) - {"vocab_size"}):
        raise ReportInputError(f"{where}.{unknown[0]}: not a model setting")
    model.update({k: v for k, v in config.items() if k != "vocab_size"})
    tok = params.train_bpe
    ids = {"vocab_size": config.get("vocab_size", tok.vocab_size), "pad_id": tok.pad_id, "bos_id": tok.bos_id,
           "eos_id": tok.eos_id}
    try:
        with torch.device("meta"):
            return build_model(model_config(model, ids, where)).param_counts()
    except (ValueError, TypeError) as e:
        raise ReportInputError(f"{where}: {e}") from None


def main_rates(params: Params) -> dict[str, float]:
    """Each variant's own train.lr: the baseline's, unless its ablation overrides it."""
    return {str(v): float((o.get("train") or {}).get("lr", params.train.lr)) for v, o in params.ablations.items()}


def budget(train: Mapping) -> dict:
    """The budget keys that decide the runs' length (budget_tokens is unused under another)."""
    out = {k: train[k] for k in BUDGET_KEYS if train.get(k) is not None}
    if len(out) > 1:
        out.pop("budget_tokens", None)
    return out


def study(params: Params, args: argparse.Namespace) -> Study:
    """What params.yaml and the command line ask of the report."""
    report, decide = params.report, params.decide
    # With seeds until decided the runs are ragged: every variant has `seeds`, open ones more.
    seeds = params.seeds + sorted({r.seed for r in decide.runs.values()})
    knocked = knockout_seeds(params.knockout.seeds, params.seeds + sorted(
        r.seed for r in decide.runs.values() if r.variant == report.baseline))
    return Study(
        args.runs, args.evals, args.filter_metrics, [str(v) for v in params.ablations], seeds, report.baseline,
        budget=budget(params.train.model_dump(exclude_unset=True)),  # as params.yaml states it
        notes=report.notes, reference=report.reference.model_dump() if report.reference else None,
        primary_metric=report.primary_metric, lr_sweep=params.lr_sweep, main_lr=main_rates(params),
        scales=[str(s) for s in params.scales], raw_dir=args.raw, shards=args.shards,
        notes_data_digest=report.notes_data_digest, download_metrics=args.download_metrics,
        knockout_seeds=knocked, ablations=params.ablations, seed_claims=claims(params),
        decide={"seeds": params.seeds, "looks": decide.looks, "alpha": decide.alpha, "margin": decide.margin,
                "runs": {k: r.model_dump() for k, r in decide.runs.items()},
                "primary_metric": report.primary_metric, "method": decide.method,
                "boundary": decide.boundary, "rho": decide.rho}
        if decide.looks else None,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, required=True, help="train stage outputs (data/runs)")
    parser.add_argument("--evals", type=Path, required=True, help="evaluate stage outputs (data/eval)")
    parser.add_argument("--filter-metrics", type=Path, required=True, help="data/metrics/filter.json")
    parser.add_argument("--download-metrics", type=Path, help="data/metrics/download.json")
    parser.add_argument("--raw", type=Path, help="download stage output (data/raw): its meta.json")
    parser.add_argument("--shards", type=Path, help="encode stage output (data/shards): its manifest, its DVC hash")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--out-dir", type=Path, required=True, help="replaced as a whole (reports)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.monotonic()
    try:
        params = _read_params(args.params)
        with drawing.forking():  # the figures side by side
            inputs = read_inputs(study(params, args))
            runs = render_report(inputs, args.out_dir)
    except (ReportInputError, DiskFull, drawing.DrawingError) as e:
        raise stage_error("report", e) from None
    written = time.monotonic()
    log.info("report: wrote %s (report.md, report.html, figures/) in %.1f s", args.out_dir, written - started)
    report, decide = params.report, params.decide
    if decide.looks:  # MLflow tags each run with the round that added it
        order = seed_order(params.seeds, decide.looks[-1])
        runs = [dataclasses.replace(r, round=1 + sum(order.index(r.seed) >= n for n in decide.looks))
                if r.seed in order else r for r in runs]
    data = run_data(params.data.model_dump(exclude_unset=True), args.shards, tracking_root() / "dvc.lock") \
        if args.shards else None
    summary = json.loads((args.out_dir / "details.json").read_text())  # MLflow's view: the same metrics
    columns = tuple(m for m in (summary.get("primary_metric"), summary.get("main_metric")) if m)
    mirror_runs(runs, args.out_dir, report.experiment, data, columns)
    mirror_knockouts(args.evals, report.baseline, inputs.study.knockout_seeds, report.experiment, data)
    if tracking_enabled():
        log.info("report: mirroring %d runs took %.1f s more", len(runs), time.monotonic() - written)

if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
