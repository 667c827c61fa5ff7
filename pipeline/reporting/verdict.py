"""The report's first lines: one verdict per ablation on the primary metric, then the Δ figure.

A reader gets the answer before the tables that support it. Every number is the Δ table's own
(Results, computed from eval.json), so the verdict and the table cannot disagree.
"""
from __future__ import annotations

from collections.abc import Sequence

from pipeline.reporting.formatting import MISSING, arrow, fmt, fmt_p
from pipeline.reporting.render import Block, Heading, Paragraph
from pipeline.reporting.results import Results


def verdict_line(variant: str, baseline: str, results: Results) -> str:
    """`no_ffn: val_loss ↓ Δ +0.60 (95% CI [0.55, 0.65], 3 seeds, p 0.002): worse than baseline.`"""
    m = results.primary
    d = results.deltas[variant][m]
    if d.mean is None:
        return f"{variant}: {m} {arrow(m)} Δ {MISSING} ({d.verdict})."
    ci = (f"95% CI [{fmt(d.mean - d.half_width, 3)}, {fmt(d.mean + d.half_width, 3)}]"
          if d.half_width is not None else "no interval")
    words = d.verdict
    if words in ("better", "worse"):
        words = f"{words} than {baseline}"
    return (f"{variant}: {m} {arrow(m)} Δ {d.mean:+.3g} ({ci}, {d.n} paired seed{'s' * (d.n != 1)}, "
            f"p {fmt_p(d.p_value)}): {words}.")


def verdict_blocks(results: Results, variants: Sequence[str], baseline: str) -> list[Block]:
    """One line per non-baseline variant on the primary metric (paired by seed, uncorrected test)."""
    lines = [verdict_line(v, baseline, results) for v in variants if v in results.deltas]
    if not lines:
        return [Heading("Verdict"), Paragraph(f"Only the baseline ({baseline}) was trained: nothing to compare.")]
    return [Heading("Verdict"),
            Paragraph(f"Each variant − {baseline} on the primary metric {results.primary}, paired by seed "
                      "(details in Results):"),
            *[Paragraph(line) for line in lines]]
