"""The report's note on `evaluate.max_loss_tokens`: whether val/test loss was scored on a subset of
its split, and on how much, read from each run's eval.json (`loss_tokens`, written by evaluate).
Nothing is said when no run was capped (the default: every token of both splits)."""
from __future__ import annotations

from collections.abc import Mapping

from pipeline.reporting.render import Block, Paragraph

SPLITS = ("val", "test")


def _budgets(runs: Mapping) -> list[dict]:
    """The runs' `loss_tokens` records, those with per-split integer counts (older eval.json: none)."""
    out = []
    for run in runs.values():
        budget = (run.eval or {}).get("loss_tokens")
        if isinstance(budget, dict) and all(
                isinstance(budget.get(s), dict) and all(type(budget[s].get(k)) is int for k in ("scored", "total"))
                for s in SPLITS):
            out.append(budget)
    return out


def _span(values: list[int], fmt: str = "{:,}") -> str:
    low, high = min(values), max(values)
    return fmt.format(low) if low == high else f"{fmt.format(low)}–{fmt.format(high)}"


def loss_budget_blocks(runs: Mapping) -> list[Block]:
    """One paragraph when any run's loss was capped: the cap, and per split the tokens scored out of
    the split's (a range when runs differ, e.g. variants with different train.context)."""
    budgets = _budgets(runs)
    capped = [b for b in budgets if any(b[s].get("capped") for s in SPLITS)]
    if not capped:
        return []
    caps = sorted({b.get("max_loss_tokens") for b in capped if type(b.get("max_loss_tokens")) is int})
    parts = []
    for s in SPLITS:
        scored, total = [b[s]["scored"] for b in capped], [b[s]["total"] for b in capped]
        share = [100 * b[s]["scored"] / max(b[s]["total"], 1) for b in capped]
        parts.append(f"{s}_loss on {_span(scored)} of {_span(total)} target tokens ({_span(share, '{:.1f}')}%)")
    which = "every run" if len(capped) == len(budgets) else f"{len(capped)} of {len(budgets)} runs"
    cap = f" = {', '.join(f'{c:,}' for c in caps)}" if caps else ""
    return [Paragraph(
        f"Loss scoring capped (evaluate.max_loss_tokens{cap}) in {which}: {'; '.join(parts)}. "
        "The tokens scored are evenly spaced windows (language modelling) or examples across each split, "
        "chosen from the split alone, so every seed and variant with the same train.context scores the same "
        "ones and the paired comparisons stay paired; bits_per_char and bits_per_byte take the test subset's "
        "mean loss as the whole split's.")]
