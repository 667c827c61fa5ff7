"""How the report writes a number: one place, so every table, the verdict and the docs' study
table agree. A value that is absent is MISSING ("—"), never zero."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from pipeline.reporting.stats import Summary, higher_is_better

MISSING = "—"


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return MISSING
    # Large values (perplexity of an untrained model, token counts) read better without exponent.
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def fmt_sci(x: float | None) -> str:
    """FLOP counts: three significant digits and an exponent (4.21e+11)."""
    return MISSING if x is None else f"{x:.3g}"


def fmt_int(x: float | None) -> str:
    return MISSING if x is None else f"{round(x):,}"


def fmt_range(values: Sequence[float]) -> str:
    """Integer counts over seeds as they are: one value when all agree, else "min–max"."""
    if not values:
        return MISSING
    low, high = fmt_int(min(values)), fmt_int(max(values))
    return low if low == high else f"{low}–{high}"


def fmt_p(p: float | None) -> str:
    return MISSING if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def fmt_summary(s: Summary) -> str:
    if s.mean is None:
        return MISSING
    if s.half_width is None:
        return f"{fmt(s.mean)} ({s.note})"
    note = f"n={s.n}" + (f", {s.note}" if s.note else "")
    return f"{fmt(s.mean)} ± {fmt(s.half_width, 2)} ({note})"


def fmt_raw(record: Mapping | None, key: str) -> str:
    """A value as written in the file (NaN/inf shown as such), MISSING if absent."""
    value = None if record is None else record.get(key)
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else fmt(value)


def arrow(metric: str) -> str:
    return "↑" if higher_is_better(metric) else "↓"
