"""The report's check of the t-model (pipeline/reporting/assumption.py): late plateau exits named and
drawn, the interval without them beside the verdict's, and a calm study said to be calm."""
from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.reporting.assumption import assumption_blocks, plateau_exits
from pipeline.reporting.inputs import Run
from pipeline.reporting.plots import variant_colors
from pipeline.reporting.render import to_markdown

PLATEAU = 4.0


def curve(exit_tokens: float, final: float) -> pd.DataFrame:
    """A loss that sits on the plateau, then falls to `final` from `exit_tokens` on."""
    tokens = np.arange(0, 200_001, 5_000, dtype=float)
    loss = np.where(tokens < exit_tokens, PLATEAU - 0.1, final + (PLATEAU - final) * np.exp(-(tokens - exit_tokens) / 8e3))
    return pd.DataFrame({"tokens": tokens, "train_loss": loss})


def study(late: dict[tuple[str, int], float]) -> dict:
    """Two variants x 12 seeds; `late` gives some runs a late exit (tokens) and a worse loss."""
    rng = np.random.default_rng(3)
    runs = {}
    for v, shift in (("baseline", 0.0), ("single_head", 0.02)):
        for s in range(12):
            exit_at = late.get((v, s), 60_000 + rng.normal(0, 3_000))
            final = 1.5 + shift + rng.normal(0, 0.01) + (0.4 if (v, s) in late else 0.0)
            runs[(v, s)] = Run(v, s, eval={"val_loss": final + 0.05, "unigram_val_loss": PLATEAU},
                               train_curve=curve(exit_at, final))
    return runs


def section(runs, tmp_path) -> str:
    variants = ["baseline", "single_head"]
    blocks = assumption_blocks(runs, variants, list(range(12)), "baseline", "val_loss", PLATEAU, 0.95,
                               tmp_path, variant_colors(variants))
    return to_markdown("t", blocks)


def test_late_exits_are_named_drawn_and_the_interval_without_them_is_shown(tmp_path):
    runs = study({("single_head", 4): 100_000, ("single_head", 9): 110_000})
    exits, level, late = plateau_exits(runs, PLATEAU)
    assert late == {("single_head", 4), ("single_head", 9)} and PLATEAU > level["single_head"] > 1.5
    text = section(runs, tmp_path)
    assert "| single_head | 12 |" in text and "| 4, 9 |" in text and "doubtful" in text
    assert "without seeds 4, 9" in text and (tmp_path / "plateau_exits.png").stat().st_size > 0


def test_a_calm_study_is_said_to_be_calm(tmp_path):
    text = section(study({}), tmp_path)
    assert "No ablation shows a skew" in text and "| none | none |" in text
