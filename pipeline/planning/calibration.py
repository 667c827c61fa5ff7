"""The CPU time model, fitted to the committed studies: wall = steps x step_s + FLOPs / (peak x mfu).

Small models on a CPU are bound by a fixed cost per optimizer step as much as by FLOPs, so one MFU
cannot describe them all. The measured walls come from the committed report.md files (reports/ and
reports/studies/*/): their training-cost and per-run tables are what the report stage wrote from each
run's train.json, the only record of the runs that git keeps.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipeline.params import load_params, resolve_variant
from pipeline.planning.estimate import PlanError, meta_model, task_of, tokenizer_ids
from pipeline.train import flops_per_target_token


@dataclass
class Calibration:
    """CPU time model: wall = steps x step_s + FLOPs / (peak x mfu), fitted to measured runs."""
    step_s: float
    mfu: float
    runs: int  # measured variants (one wall each) the fit used
    source: str


# Seeds of one variant do the same work, so their walls should agree. Where other jobs shared the
# cores during a run they do not (the default study's committed per-run table has one configuration
# at 5.6 s and at 68 s): a variant's wall is the median of its seeds' when another seed agrees with
# it within this fraction, and the variant is left out when none does (it measured the load).
SEED_AGREEMENT = 0.10


def seed_wall(walls: list[float]) -> float | None:
    """The median of one variant's per-seed walls if another seed confirms it, else None."""
    if len(walls) < 2:
        return walls[0] if walls else None
    mid = statistics.median_low(walls)
    others = list(walls)
    others.remove(mid)
    return mid if any(abs(w - mid) <= SEED_AGREEMENT * mid for w in others) else None


CONTENDED = "⚠"  # the report's mark on a timing taken under contention (tables.py's cost table)


def markdown_table(text: str, heading: str) -> list[dict]:
    """Rows of the first table under `## heading` in a report.md, as {column: cell}."""
    parts = re.split(r"^## ", text, flags=re.M)
    section = next((p for p in parts if p.startswith(heading)), None)
    if section is None:
        return []
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    if len(lines) < 3:
        return []
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[2:]]


def number(cell: str) -> float:
    """'1,389–1,394' (min–max over seeds) -> 1391.5, its middle; '2.48e+06' -> 2480000.0."""
    ends = [float(part) for part in cell.replace(",", "").split("–")]
    return sum(ends) / len(ends)


def measured_runs(report: Path) -> list[dict]:
    """The variants of one committed report as its training-cost table gives them: steps, tokens,
    tokens/s, MFU, FLOPs per token where the table has the column, and the wall (`seed_wall` of
    the per-run table where there is one, else the mean over seeds)."""
    text = report.read_text(encoding="utf-8")
    walls: dict[str, list[float]] = {}
    for r in markdown_table(text, "Per-run values"):
        if r.get("wall time (s)") and CONTENDED not in r["wall time (s)"]:
            walls.setdefault(r["variant"], []).append(number(r["wall time (s)"]))
    out = []
    for r in markdown_table(text, "Training cost"):
        if not r.get("device", "").startswith("cpu") or r.get("MFU") in (None, "—", ""):
            continue
        if CONTENDED in r.get("wall time (s)", "") + r.get("tokens/s", ""):
            continue  # the report marks a timing taken while the load exceeded the run's cores
        wall = seed_wall(walls[r["variant"]]) if r["variant"] in walls else number(r["wall time (s)"])
        if wall is None:
            continue
        fpt = number(r["FLOPs / target token"]) if r.get("FLOPs / target token") else None
        out.append({"variant": r["variant"], "steps": number(r["steps"]), "tokens": number(r["tokens trained"]),
                    "wall_s": wall, "tokens_per_s": number(r["tokens/s"]),
                    "mfu": number(r["MFU"]), "flops_per_token": fpt})
    return out


def reference_peak(reports: list[Path]) -> float:
    """The CPU peak the committed runs divided by: FLOPs/token x tokens/s / MFU of the rows whose
    table states FLOPs per token (the median: one number per machine, cached by the train stage)."""
    peaks = [r["flops_per_token"] * r["tokens_per_s"] / r["mfu"] for report in reports
             for r in measured_runs(report) if r["flops_per_token"]]
    if not peaks:
        raise PlanError(f"no committed report states FLOPs per target token ({', '.join(map(str, reports))})")
    return statistics.median(peaks)


def study_points(report: Path) -> list[tuple[float, float, float]]:
    """(steps, training FLOPs, wall s) for each usable variant of one committed report.

    A table without FLOPs per token (reports older than that column) gets them from the params.yaml
    beside it where that needs no data (language modelling); seq2seq rows without them are skipped."""
    points, params = [], None
    for run in measured_runs(report):
        fpt = run["flops_per_token"]
        if fpt is None:
            if params is None:
                path = report.parent / "params.yaml"
                params = load_params(path) if path.is_file() else False
            if not params or task_of(params) != "language_modeling":
                continue
            resolved = resolve_variant(params, run["variant"])
            cfg, model = meta_model(resolved, tokenizer_ids(params, None), run["variant"])
            fpt = flops_per_target_token(model, cfg, 0.0, float(resolved["train"]["context"]))
        points.append((run["steps"], fpt * run["tokens"], run["wall_s"]))
    return points


def fit(points: list[tuple[float, float, float]], peak: float, source: str) -> Calibration:
    """Least squares on relative error: wall ~ steps x step_s + FLOPs / (peak x mfu)."""
    import numpy as np

    if len(points) < 2:
        raise PlanError(f"{source}: fewer than two measured CPU runs to calibrate on")
    a = np.array([[s / w, f / peak / w] for s, f, w in points])
    (step_s, inv_mfu), *_ = np.linalg.lstsq(a, np.ones(len(points)), rcond=None)
    if step_s < 0 or inv_mfu <= 0:  # not physical: keep the FLOPs term alone
        step_s, inv_mfu = 0.0, float(np.mean([w * peak / f for _, f, w in points]))
    return Calibration(float(step_s), float(1 / inv_mfu), len(points), source)


def calibrate(reports: list[Path]) -> Calibration:
    """The CPU time model fitted to every usable run of `reports` (report.md files)."""
    if not reports:
        raise PlanError("no committed report.md to calibrate the CPU time on (see --calibration)")
    points = [p for report in reports for p in study_points(report)]
    return fit(points, reference_peak(reports), f"{len(points)} variants of {len(reports)} committed CPU studies")
