"""The report's Data section: what the download and filter stages did to the examples (rows per
split, what was dropped or moved, length percentiles), read from data/metrics/*.json."""
from __future__ import annotations

from pathlib import Path

from pipeline.reporting.formatting import MISSING, fmt, fmt_int
from pipeline.reporting.inputs import number
from pipeline.reporting.render import Block, Heading, Paragraph, Table


def data_blocks(filter_metrics: dict | None, path: Path) -> list[Block]:
    """Examples per split (raw, dropped, moved, kept, the share kept) and length percentiles, from
    the filter stage."""
    blocks: list[Block] = [Heading("Data")]
    if filter_metrics is None:
        return blocks + [Paragraph(f"Filter metrics not available: {path} is missing.")]
    splits = filter_metrics.get("splits") if isinstance(filter_metrics.get("splits"), dict) else {}
    rows = []
    for split, counts in splits.items():
        raw, kept = number(counts, "raw"), number(counts, "kept")
        by_length, by_sample = number(counts, "dropped_length"), number(counts, "dropped_subsample")
        share = by_length / raw if by_length is not None and raw else None
        # The share of the split's own examples the limits and the subsample kept (before any carve):
        # filter.json's kept_share, or from the counts for a filter.json written before it had one.
        kept_share = number(counts, "kept_share")
        if kept_share is None and raw and by_length is not None and by_sample is not None:
            kept_share = (raw - by_length - by_sample) / raw
        moved = [f"{'+' if key == 'from_train' else '−'}{fmt_int(number(counts, key))} {label}"
                 for key, label in (("from_train", "from train"), ("to_validation", "to validation"),
                                    ("to_test", "to test")) if number(counts, key)]
        rows.append([split, fmt_int(raw), fmt_int(by_length), MISSING if share is None else f"{share:.1%}",
                     fmt_int(by_sample), ", ".join(moved) or "none", fmt_int(kept),
                     MISSING if kept_share is None else f"{kept_share:.1%}"])
    notes = [str(n) for n in filter_metrics.get("source_notes") or []]
    carve = {"contiguous_tail": "validation/test carved from the end of train, in document order "
                                "(no document on both sides)",
             "shuffled": "validation/test carved from train by a seeded shuffle"}.get(filter_metrics.get("carve"))
    share_note = ("kept %: the share of the split's own raw examples within the length limits and "
                  "drawn by the subsample (before validation/test are carved from train)")
    blocks.append(Table(["split", "raw", "dropped by length", "dropped %", "dropped by subsample", "moved",
                         "kept", "kept %"], rows or [[MISSING] * 8], f"Examples through the filter stage ({path})",
                        ([carve] if carve else []) + [share_note] + notes))
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

