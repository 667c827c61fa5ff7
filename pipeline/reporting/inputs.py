"""Reading the report's inputs: per-run files of the train and evaluate stages, and filter metrics.

A missing file is information (the run failed or was never made) and comes back as None, so the
report can show it as missing. A file that exists but cannot be parsed means a broken pipeline and
raises `ReportInputError` with one line naming the file; `pipeline.report.main` turns that into
exit code 1.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

TRAIN_CURVE_COLUMNS = ("step", "tokens", "train_loss")
VAL_CURVE_COLUMNS = ("step", "tokens", "val_loss")


class ReportInputError(ValueError):
    """An input file exists but is unreadable or malformed; the message names the file."""


@dataclass
class Run:
    """Everything on disk for one variant x seed; each field is None when its file is missing."""

    variant: str
    seed: int
    train: dict | None = None  # train.json
    eval: dict | None = None  # eval.json
    train_curve: pd.DataFrame | None = None  # train_curve.csv
    val_curve: pd.DataFrame | None = None  # val_curve.csv
    samples: list[dict] | None = None  # samples.json
    attention: dict | None = None  # attention.json, maps converted to 2-D float arrays

    @property
    def missing(self) -> bool:
        """No train.json and no eval.json: the run as a whole is absent."""
        return self.train is None and self.eval is None


def read_json(path: Path, expected: type) -> Any | None:
    """Parsed JSON of `path`, None if the file does not exist."""
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReportInputError(f"cannot read {path}: {e}") from e
    if not isinstance(obj, expected):
        raise ReportInputError(f"{path}: expected a JSON {expected.__name__}, got {type(obj).__name__}")
    return obj


def read_curve(path: Path, columns: Sequence[str]) -> pd.DataFrame | None:
    """The numeric `columns` of a curve CSV, sorted by tokens; None if the file does not exist."""
    if not path.is_file():
        return None
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise ReportInputError(f"cannot read {path}: {e}") from e
    absent = [c for c in columns if c not in df.columns]
    if absent:
        raise ReportInputError(f"{path}: missing column(s) {', '.join(absent)}")
    try:
        df = df[list(columns)].apply(pd.to_numeric)
    except ValueError as e:
        raise ReportInputError(f"{path}: non-numeric value ({e})") from e
    return df.sort_values("tokens").reset_index(drop=True)


def _read_attention(path: Path) -> dict | None:
    att = read_json(path, dict)
    if att is None:
        return None
    maps = att.get("maps")
    if not isinstance(maps, dict):
        raise ReportInputError(f"{path}: key 'maps' must be an object of name -> matrix")
    converted = {}
    for name, matrix in maps.items():
        try:
            arr = np.asarray(matrix, dtype=float)
        except (TypeError, ValueError) as e:
            raise ReportInputError(f"{path}: maps.{name} is not a numeric matrix ({e})") from e
        if arr.ndim != 2 or arr.size == 0:
            raise ReportInputError(f"{path}: maps.{name} must be a non-empty 2-D matrix")
        converted[name] = arr
    return {**att, "maps": converted}


def load_run(runs_dir: Path, evals_dir: Path, variant: str, seed: int, point: str = "") -> Run:
    """Read the six files of one run; absent files stay None. `point` is a sweep run's folder
    suffix (`0.01` in data/runs/lr/baseline-0-0.01)."""
    name = f"{variant}-{seed}" + (f"-{point}" if point else "")
    run_dir, eval_dir = Path(runs_dir) / name, Path(evals_dir) / name
    return Run(
        variant=variant,
        seed=seed,
        train=read_json(run_dir / "train.json", dict),
        eval=read_json(eval_dir / "eval.json", dict),
        train_curve=read_curve(run_dir / "train_curve.csv", TRAIN_CURVE_COLUMNS),
        val_curve=read_curve(run_dir / "val_curve.csv", VAL_CURVE_COLUMNS),
        samples=read_json(eval_dir / "samples.json", list),
        attention=_read_attention(eval_dir / "attention.json"),
    )


def load_runs(
    runs_dir: Path, evals_dir: Path, variants: Sequence[str], seeds: Sequence[int]
) -> dict[tuple[str, int], Run]:
    """(variant, seed) -> Run for every combination, in variant-then-seed order."""
    return {(v, s): load_run(runs_dir, evals_dir, v, s) for v in variants for s in seeds}


def load_filter_metrics(path: Path) -> dict | None:
    """data/metrics/filter.json, or None if it does not exist."""
    return read_json(Path(path), dict)


def number(record: Mapping | None, key: str) -> float | None:
    """A finite numeric value of `record[key]`, else None (missing file, key, null, NaN or inf).

    Non-finite values are missing for the statistics; the per-run table shows them as written.
    """
    if record is None:
        return None
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def values_by_seed(
    runs: Mapping[tuple[str, int], Run], variant: str, seeds: Sequence[int], source: str, key: str
) -> dict[int, float]:
    """seed -> value of `key` in the run's `source` ("train" or "eval") record, present values only."""
    out = {}
    for seed in seeds:
        run = runs.get((variant, seed))
        value = number(getattr(run, source) if run is not None else None, key)
        if value is not None:
            out[seed] = value
    return out
