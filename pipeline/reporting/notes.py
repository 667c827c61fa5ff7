"""The data as this run saw it (generated), and the preset author's notes (quoted, checked against it).

A preset's report.notes describe the data the preset ships with; a user who points data.local
elsewhere keeps the notes but not that data. So the report states the facts it can read from the
stage files (source, document options, examples kept per split, tokenizer, a digest of the input
data) and prints the notes as the author's text, flagged when they were written for other data
(report.notes_data_digest differs from this run's digest).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from pipeline.reporting.formatting import MISSING, fmt_int
from pipeline.reporting.render import Block, Paragraph

DOC_OPTIONS = ("documents", "separator", "split_unit", "direction")  # the options that decide what an example is
FLAG = "⚠"


def data_digest(meta: Mapping | None) -> str | None:
    """16 hex digits identifying the input data: sha256 over the input files' sha256 (raw meta.json
    `files`), or over source and options for data generated without files (synthetic). The same
    data gives the same digest on any machine and whatever the pipeline's code."""
    if not meta:
        return None
    files = meta.get("files")
    if isinstance(files, list) and files and all(isinstance(f, dict) and f.get("sha256") for f in files):
        what = sorted(str(f["sha256"]) for f in files)
    else:
        what = {k: meta.get(k) for k in ("source", "options", "n_examples", "seed")}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def data_facts(raw_meta: Mapping | None, filter_metrics: Mapping | None, manifest: Mapping | None) -> str:
    """One generated sentence: source, task, document options, examples kept, tokenizer, digest."""
    meta = raw_meta or {}
    options = meta.get("options") if isinstance(meta.get("options"), dict) else {}
    doc = [f"{k} {options[k]}" for k in DOC_OPTIONS if options.get(k) is not None]
    splits = (filter_metrics or {}).get("splits")
    kept = ", ".join(f"{name} {fmt_int(c.get('kept'))}" for name, c in splits.items()
                     if isinstance(c, dict) and isinstance(c.get("kept"), (int, float))) if isinstance(splits, dict) else ""
    tok = manifest or {}
    tokenizer = (f"{fmt_int(tok['vocab_size'])} tokens ({tok.get('normalization', 'normalization not recorded')})"
                 if isinstance(tok.get("vocab_size"), (int, float)) else MISSING)
    return (f"Data as run (generated from data/raw/meta.json, filter.json and the shards' manifest): source "
            f"{meta.get('source') or MISSING}, task {meta.get('task') or MISSING}"
            + (f", {'; '.join(doc)}" if doc else "")
            + f"; examples kept: {kept or MISSING}; tokenizer: {tokenizer}; data digest {data_digest(raw_meta) or MISSING}.")


def notes_blocks(notes: Sequence[str], written_for: str | None, raw_meta: Mapping | None,
                 filter_metrics: Mapping | None, manifest: Mapping | None) -> list[Block]:
    """The generated data line, then each note marked as the preset author's (flagged if stale)."""
    blocks: list[Block] = [Paragraph(data_facts(raw_meta, filter_metrics, manifest))]
    if not notes:
        return blocks
    digest = data_digest(raw_meta)
    if written_for is None:
        status = "not checked against this run's data (report.notes_data_digest unset)"
    elif digest is None:
        status = f"written for data {written_for}; this run's data digest is unknown (no data/raw/meta.json)"
    elif written_for == digest:
        status = f"written for this run's data (digest {digest})"
    else:
        status = (f"{FLAG} written for other data (digest {written_for}; this run's is {digest}): "
                  "they may not describe this run; the line above does")
    blocks.append(Paragraph(f"Preset author's notes (params.yaml report.notes, quoted, not generated; {status}):"))
    stale = f"{FLAG} " if written_for not in (None, digest) else ""
    return blocks + [Paragraph(f"{stale}“{n}”") for n in notes]
