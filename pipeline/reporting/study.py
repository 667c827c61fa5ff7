"""The report's inputs as one object: the study it is asked about, and everything read from it once.

`Study` is what the stage is asked: where the stages' outputs lie (the command line) and what
params.yaml says of the study. `read_inputs(study)` reads every file the report draws on and works
out the numbers behind it (the tested results, the sweeps, the rounds' record of seeds until
decided) once; each section of the report then reads that `ReportInputs`. Reading comes first, so
an unreadable file stops the stage before anything is written.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.deciding.record import Record
from pipeline.reporting import decisions, sweeps
from pipeline.reporting.inputs import ReportInputError, Run, load_filter_metrics, load_runs, read_json
from pipeline.reporting.knockout import load_knockouts
from pipeline.reporting.results import Results, compute_results, unigram_plateau


@dataclass(frozen=True)
class Study:
    """What the report stage is asked; every setting but the first six is optional."""

    runs_dir: Path  # the train stage's outputs (data/runs)
    evals_dir: Path  # the evaluate stage's outputs (data/eval)
    filter_metrics: Path  # data/metrics/filter.json
    variants: Sequence[str]
    seeds: Sequence[int]  # ragged under seeds until decided: open comparisons' variants have more
    baseline: str
    budget: Mapping[str, object] = field(default_factory=dict)  # the train keys that decide the runs' length
    notes: Sequence[str] = ()  # report.notes, the preset author's
    reference: Mapping | None = None  # report.reference: a published number beside ours
    primary_metric: str | None = None
    lr_sweep: Sequence[float] = ()
    main_lr: Mapping[str, float] = field(default_factory=dict)  # each variant's train.lr; needed with lr_sweep
    scales: Sequence[str] = ()
    raw_dir: Path | None = None  # the download stage's output: its meta.json
    shards: Path | None = None  # the encode stage's output: its manifest.json
    notes_data_digest: str | None = None  # the data report.notes were written for
    download_metrics: Path | None = None  # data/metrics/download.json
    knockout_seeds: Sequence[int] = ()  # the baseline's seeds the knockout stage ran on; () when off
    ablations: Mapping[str, Mapping | None] = field(default_factory=dict)
    seed_claims: Sequence[Mapping] = ()  # report.seed_claims as pipeline.report.claims resolves them
    decide: Mapping | None = None  # params decide (seeds until decided); None when off


@dataclass(frozen=True)
class ReportInputs:
    """Everything the report's sections draw on: the study, its files, and the numbers worked out from them."""

    study: Study
    runs: dict[tuple[str, int], Run]  # the main runs, (variant, seed) in variant-then-seed order
    sweep_runs: list[sweeps.SweepRun]
    filt: dict | None  # filter.json
    raw_meta: dict | None
    manifest: dict | None
    download: dict | None  # download.json
    knockouts: dict[int, dict]  # seed -> knockout.json; {} when the stage is off
    task: str | None
    results: Results
    plateau: float | None  # the unigram plateau
    fair: sweeps.FairLR | None  # each variant at its own best learning rate, with lr_sweep
    scaled: sweeps.ScaleResults | None  # the effects across model sizes, with scales
    decided: Record | None  # the rounds' record, with decide
    planned: dict[str, list[int]] | None  # each variant's seeds, with decide


def read_inputs(study: Study) -> ReportInputs:
    """Read and work out everything once. Raises ReportInputError naming the file when one cannot be read."""
    s = replace(study, variants=list(study.variants), seeds=list(study.seeds))
    if s.baseline not in s.variants:
        raise ReportInputError(f"baseline {s.baseline!r} is not one of the variants {s.variants}")
    runs = load_runs(Path(s.runs_dir), Path(s.evals_dir), s.variants, s.seeds)
    filt = load_filter_metrics(Path(s.filter_metrics))
    raw_meta = read_json(Path(s.raw_dir) / "meta.json", dict) if s.raw_dir else None
    manifest = read_json(Path(s.shards) / "manifest.json", dict) if s.shards else None
    results = compute_results(runs, s.variants, s.seeds, s.baseline, s.primary_metric)
    decided, planned = _decided(s, runs, results) if s.decide else (None, None)
    knockouts = load_knockouts(Path(s.evals_dir), s.baseline, s.knockout_seeds)
    task = next((str(r.eval["task"]) for r in runs.values() if r.eval and r.eval.get("task")), None)
    sweep_runs = sweeps.load_sweeps(s.runs_dir, s.evals_dir, s.variants, s.seeds, s.lr_sweep, s.main_lr, s.scales)
    fair = scaled = None
    if s.lr_sweep:
        grid = sweeps.lr_grid(runs, sweep_runs, s.variants, s.seeds, s.main_lr)
        fair = sweeps.fair_lr_results(grid, s.baseline, runs, s.main_lr)
    if s.scales:
        scaled = sweeps.scale_results(sweeps.scale_runs(runs, sweep_runs), s.variants, s.seeds, s.baseline,
                                      results.primary)
    download = read_json(Path(s.download_metrics), dict) if s.download_metrics is not None else None
    return ReportInputs(s, runs, sweep_runs, filt, raw_meta, manifest, download, knockouts, task, results,
                        unigram_plateau(runs), fair, scaled, decided, planned)


def _decided(s: Study, runs: Mapping, results: Results) -> tuple[Record, dict[str, list[int]]]:
    """Seeds until decided: the rounds' record from the same runs, and each variant's seeds."""
    d = s.decide
    record = decisions.record(runs, s.variants, d["seeds"], s.baseline, results.primary, d["looks"], d["alpha"],
                              d["margin"], d.get("primary_metric"), d.get("method", "t"),
                              d.get("boundary", "bonferroni"), d.get("rho", 1.0))
    return record, decisions.planned_seeds(s.variants, d["seeds"], d["runs"])
