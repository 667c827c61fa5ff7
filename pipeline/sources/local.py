"""Your own files as a dataset: parquet, jsonl, csv or txt, one or more paths per split.

    data:
      source: local
      local:
        task: translation
        paths: {train: my/train.jsonl, validation: my/dev.jsonl, test: my/test.jsonl}
        columns: {source: en, target: de}

A path may be a file, a list of files, or a directory (its files of the chosen format, sorted by
name). The format comes from the suffix (.parquet .jsonl .csv .txt) unless `format` is set.
Tabular files map `columns.source` / `columns.target` to source / target; for language modelling
only the target column is read and source is "". Text files are for language modelling only:
each blank-line separated block is a document (`documents: paragraph`) or each file is one
(`documents: file`). Relative paths are relative to the working directory (the repo root under
DVC; list them as deps of the download stage so edits rerun it). Nothing is downloaded or cached.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, PositiveInt, field_validator

from pipeline.fetch import sha256_file
from pipeline.sources import Split, parse_options, write_raw
from pipeline.sources.formats import read_csv, read_jsonl, read_parquet, split_paragraphs

NAME = "local"
task = None  # chosen by the `task` option; meta.json records it

Format = Literal["parquet", "jsonl", "csv", "txt"]
SUFFIXES: dict[str, Format] = {".parquet": "parquet", ".jsonl": "jsonl", ".csv": "csv",
                               ".txt": "txt"}


class Columns(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = "source"
    target: str = "target"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: Literal["summarization", "translation", "language_modeling"]
    paths: dict[Split, list[str]]  # a single path is accepted and becomes a one-item list
    format: Literal["auto", "parquet", "jsonl", "csv", "txt"] = "auto"
    columns: Columns = Columns()
    documents: Literal["paragraph", "file"] = "paragraph"  # txt only
    max_rows: PositiveInt | None = None  # keep the first N rows of each split

    @field_validator("paths", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: [v] if isinstance(v, str) else v for k, v in value.items()}
        return value


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> None:  # noqa: ARG001 (no cache)
    opts = parse_options(Options, options, NAME)
    if "train" not in opts.paths:
        raise ValueError(f"data.{NAME}.paths.train: required (a file, list of files or directory)")
    splits, records = {}, []
    for split, entry in opts.paths.items():
        rows: dict[str, list[str]] = {"source": [], "target": []}
        for path in _expand(entry, opts.format, f"data.{NAME}.paths.{split}"):
            if opts.max_rows is not None and len(rows["target"]) >= opts.max_rows:
                break
            left = None if opts.max_rows is None else opts.max_rows - len(rows["target"])
            sources, targets = _read(path, _format_of(path, opts.format), opts, left)
            rows["source"] += sources
            rows["target"] += targets
            records.append({"split": split, "path": str(path), "sha256": sha256_file(path),
                            "bytes": path.stat().st_size})
        if not rows["target"]:
            raise ValueError(f"data.{NAME}.paths.{split}: no rows found in {entry}")
        splits[split] = rows
    write_raw(out_dir, splits, {"source": NAME, "task": opts.task, "files": records,
                                "options": opts.model_dump()})


def _expand(entry: list[str], fmt: str, key: str) -> list[Path]:
    paths: list[Path] = []
    for item in entry:
        p = Path(item).expanduser()
        if p.is_dir():
            # auto: the files with a known suffix; explicit format: every non-hidden file
            found = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith(".")
                           and (fmt != "auto" or f.suffix in SUFFIXES))
            if not found:
                raise ValueError(f"{key}: directory {p} holds no data files")
            paths += found
        elif p.is_file():
            paths.append(p)
        else:
            raise ValueError(f"{key}: no such file or directory: {p}")
    return paths


def _format_of(path: Path, fmt: str) -> Format:
    if fmt != "auto":
        return fmt  # type: ignore[return-value]
    if path.suffix not in SUFFIXES:
        raise ValueError(f"{path}: cannot tell the format from the suffix; set data.{NAME}.format")
    return SUFFIXES[path.suffix]


def _read(path: Path, fmt: Format, opts: Options, max_rows: int | None
          ) -> tuple[list[str], list[str]]:
    lm = opts.task == "language_modeling"
    if fmt == "txt":
        if not lm:
            raise ValueError(f"{path}: .txt files only work with task language_modeling "
                             f"(task is {opts.task}); use parquet, jsonl or csv with columns")
        text = path.read_text(encoding="utf-8")
        docs = [text.strip()] if opts.documents == "file" else split_paragraphs(text)
        docs = [d for d in docs if d][:max_rows]
        return [""] * len(docs), docs
    wanted = [opts.columns.target] if lm else [opts.columns.source, opts.columns.target]
    if fmt == "parquet":
        table = read_parquet(path, wanted, max_rows)
    elif fmt == "csv":
        df = read_csv(path, max_rows)
        missing = [c for c in wanted if c not in df.columns]
        if missing:
            raise ValueError(f"{path}: no column {missing[0]!r} (columns: {', '.join(df.columns)})")
        table = {c: df[c].tolist() for c in wanted}
    else:
        records = read_jsonl(path, max_rows)
        for i, rec in enumerate(records):
            missing = [c for c in wanted if c not in rec]
            if missing:
                raise ValueError(f"{path}: record {i + 1} has no key {missing[0]!r}")
        table = {c: [rec[c] for rec in records] for c in wanted}
    for c in wanted:
        bad = next((i for i, v in enumerate(table[c]) if not isinstance(v, str)), None)
        if bad is not None:
            raise ValueError(f"{path}: row {bad} column {c!r} is {table[c][bad]!r}, not a string")
    targets = table[opts.columns.target]
    return ([""] * len(targets) if lm else table[opts.columns.source]), targets
