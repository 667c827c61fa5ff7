"""Checks for degenerate generated text: outputs that make a metric meaningless.

A model that writes ". . . ." for every article, or "eeee" for every sentence, gets a table of
near-zero scores that reads like "a bad model" when it is really "no model at all". These numbers
say which it is; `flags` turns them into the warnings the report prints next to the task metric.

- distinct_1 / distinct_2: unique word uni/bigrams over all outputs ÷ all of them (Li et al. 2016).
- identical_share: share of outputs equal to the most common output.
- repetition_rate: per output, the share of its word 3-grams that repeat an earlier 3-gram of the
  same output (a loop "the cat the cat the cat" scores high), averaged over outputs with any 3-gram.
- empty_share: outputs with no visible character.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

# Thresholds of a flag: far outside what a working model does even at a few hundred steps.
MAX_IDENTICAL = 0.5
MIN_DISTINCT_2 = 0.1
MAX_REPETITION = 0.5
MAX_EMPTY = 0.5
MIN_OUTPUTS = 4  # fewer outputs say too little to flag anything


def _ngrams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def output_stats(outputs: Sequence[str]) -> dict[str, float]:
    if not outputs:
        return {}
    words = [o.split() for o in outputs]
    stats: dict[str, float] = {}
    for n in (1, 2):
        grams = [g for w in words for g in _ngrams(w, n)]
        stats[f"distinct_{n}"] = len(set(grams)) / len(grams) if grams else 0.0
    stats["identical_share"] = Counter(o.strip() for o in outputs).most_common(1)[0][1] / len(outputs)
    rates = []
    for w in words:
        grams = _ngrams(w, 3)
        if grams:
            rates.append(1 - len(set(grams)) / len(grams))
    stats["repetition_rate"] = sum(rates) / len(rates) if rates else 0.0
    stats["empty_share"] = sum(not o.strip() for o in outputs) / len(outputs)
    return stats


def flags(stats: dict[str, float], n_outputs: int) -> list[str]:
    """Plain-language reasons why the outputs look degenerate; [] when they look like text."""
    if n_outputs < MIN_OUTPUTS or not stats:
        return []
    out = []
    if stats["identical_share"] >= MAX_IDENTICAL:
        out.append(f"{stats['identical_share']:.0%} of outputs are the same text")
    if stats["empty_share"] >= MAX_EMPTY:
        out.append(f"{stats['empty_share']:.0%} of outputs are empty")
    elif stats["distinct_2"] < MIN_DISTINCT_2:
        out.append(f"distinct-2 is {stats['distinct_2']:.2f} (almost no varied word pairs)")
    if stats["repetition_rate"] >= MAX_REPETITION:
        out.append(f"{stats['repetition_rate']:.0%} of word 3-grams repeat within an output")
    return out
