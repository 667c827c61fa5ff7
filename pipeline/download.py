"""Stage `download`: produce the raw splits of the configured source in `data/raw/`.

    python -m pipeline.download --out data/raw

`data.source: synthetic` (the default) generates the embedded dataset, with no network. Real
sources (see pipeline/sources) download into a cache first; the output directory is written as a
whole or not at all.

`data.source: local` files must live under `--local-root` (data/local): dvc.yaml lists that folder
as a dependency of this stage, so editing a file there reruns the stage and everything after it.
A file elsewhere would be invisible to DVC (the study would silently keep the old data), so it is
an error. Links are fine: the path is checked as written, not where a link points.
"""
from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.io.atomic import atomic_path, atomic_write_json
from pipeline.io.progress import Progress
from pipeline.params import ParamsError, load_params, stage_error
from pipeline.params.data import check_source_paths
from pipeline.sources.common import SPLITS, TextStats
from pipeline.sources.http import default_cache_dir


def write_synthetic(out_dir: Path, n_examples: int, seed: int) -> None:
    from pipeline.sources import synthetic  # pandas: imported only for the source that uses it

    frame = synthetic.generate(n_examples, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out_dir / "train.parquet", index=False)
    atomic_write_json(out_dir / "meta.json", {"source": "synthetic", "task": "summarization",
                                              "n_examples": n_examples, "seed": seed})


log = logging.getLogger(__name__)
PERCENTILES = (50, 90, 99)
# With documents: paragraph, a share of documents holding a line break this high suggests a file
# whose documents end at a single newline (TinyStories without separators): the warning says so.
LINE_BREAK_WARNING = 0.1


def download(source: str, options: dict, cache_dir: Path, out: Path) -> dict:
    """Write the raw splits of `source` to `out` atomically (a directory swap); their metrics."""
    with atomic_path(out) as tmp:
        if source == "synthetic":
            write_synthetic(tmp, options["n_examples"], options["seed"])
            stats = read_stats(tmp)
        else:
            from pipeline.sources import get_source  # real sources: imported only when used

            tmp.mkdir(parents=True)
            stats = get_source(source).fetch(options, cache_dir, tmp)
        return raw_metrics(tmp, source, options, stats)


def read_stats(raw_dir: Path) -> dict[str, TextStats]:
    """TextStats of each raw/<split>.parquet, read back a record batch at a time."""
    stats = {}
    for split in (s for s in SPLITS if (raw_dir / f"{s}.parquet").exists()):
        stats[split] = TextStats()
        pf = pq.ParquetFile(raw_dir / f"{split}.parquet")
        with Progress(f"measuring {split}", total=pf.metadata.num_rows, unit="rows") as progress:
            for batch in pf.iter_batches(65536):
                stats[split].add(batch)
                progress.update(batch.num_rows)
    return stats


def percentiles(hist: Counter) -> dict[str, int | None]:
    """Exact nearest-rank p50/p90/p99 and max of the values counted in `hist`."""
    n = sum(hist.values())
    out: dict[str, int | None] = {f"p{p}": None for p in PERCENTILES} | {"max": None}
    if not n:
        return out
    ranks = {f"p{p}": max(1, -(-p * n // 100)) for p in PERCENTILES}  # ceil(p/100 * n)
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        for key, rank in ranks.items():
            if out[key] is None and seen >= rank:
                out[key] = value
    out["max"] = max(hist)
    return out


def raw_metrics(raw_dir: Path, source: str, options: dict, stats: dict[str, TextStats]) -> dict:
    """Per split: rows, length percentiles in characters and (language modelling) documents
    holding a line break; the documents mode and separator; a warning when `paragraph` leaves
    many documents with a line break."""
    meta = json.loads((raw_dir / "meta.json").read_text(encoding="utf-8"))
    lm = meta.get("task") == "language_modeling"
    documents = separator = None
    if source == "local" and lm:
        documents, separator = options.get("documents", "paragraph"), options.get("separator")
    elif source == "tinystories":
        from pipeline.sources.tinystories import SEPARATOR

        documents, separator = "separator", SEPARATOR
    metrics: dict = {"source": source, "task": meta.get("task"), "documents": documents,
                     "separator": separator, "splits": {}, "warnings": []}
    columns = ["target"] if lm else ["source", "target"]
    for split, st in stats.items():
        record = {"rows": st.rows, **{f"{c}_chars": percentiles(st.lengths[c]) for c in columns}}
        if lm:
            record["documents_with_line_breaks"] = st.line_breaks
        metrics["splits"][split] = record
        if lm and documents == "paragraph" and st.rows and st.line_breaks / st.rows >= LINE_BREAK_WARNING:
            warning = (f"{split}: {st.line_breaks:,} of {st.rows:,} documents "
                       f"({st.line_breaks / st.rows:.0%}) hold a line break; if your file ends "
                       f"documents (stories) at a single newline and paragraphs at blank lines, "
                       f"documents: paragraph joins the end of one to the start of the next: use "
                       f"documents: separator (e.g. <|endoftext|>) or line (one document a line); "
                       f"docs/datasets-and-presets.md, Which documents mode fits a text file")
            metrics["warnings"].append(warning)
            log.warning("download: %s", warning)
    return metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True)
    parser.add_argument("--local-root", default="data/local",
                        help="the folder dvc.yaml tracks for data.source: local")
    parser.add_argument("--metrics", help="where to write the rows and document lengths per split "
                                          "(data/metrics/download.json)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # "downloading ... / using cached ..."
    try:
        params = load_params(args.params)
        data = params.data
        options = data.synthetic.model_dump() if data.source == "synthetic" else dict(data.model_extra or {}).get(data.source, {})
        if isinstance(options, dict):
            check_source_paths(data.source, options, Path(args.local_root))
        cache = Path(data.cache_dir).expanduser() if data.cache_dir else default_cache_dir()
        metrics = download(data.source, options, cache, Path(args.out))
        if args.metrics:
            atomic_write_json(args.metrics, metrics)
    except (ParamsError, ValueError, OSError) as exc:
        raise stage_error("download", exc) from None
    for split, record in metrics["splits"].items():
        chars = record["target_chars"]
        log.info("download: %s: %s rows; %s characters p50 %s, p99 %s, max %s", split,
                 f"{record['rows']:,}", "text" if metrics["task"] == "language_modeling" else "target",
                 chars["p50"], chars["p99"], chars["max"])


if __name__ == "__main__":
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
