"""The record of a seeds-until-decided study, reports/decisions.json: what each comparison decided at
which look, and the seeds the next round runs. rounds.step makes it; the report stage writes it,
to_json giving the file key for key; the rounds loop and the studies table read it (from_json,
older records too: written before the per-seed values, the shape check and the fingerprint, those
read as None and stay out of their JSON).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.deciding.rule import Decision, Plan


@dataclass(frozen=True)
class Shape:
    """Whether a comparison's paired differences look like the t-model's normal draws (rounds.shape)."""

    n: int
    skew: float | None  # adjusted sample skewness; None below 3 seeds or with no spread
    skew_se: float | None  # its standard error under normality
    far_out: list[int]  # seeds far out by the robust rule
    doubtful: bool


@dataclass(frozen=True)
class Comparison:
    """One ablation against the baseline: the looks it took, where it stands, what it runs next."""

    looks: list[Decision]  # in order; a decided comparison's last one decided it
    state: str  # the last look's verdict; "continue" before the first
    next_look: int | None  # the seed count of its next look; None once decided or undecided
    needs: list[int]  # the seeds of that look it has not run
    runs: int  # its seeds run, in the study's seed order
    values: dict[int, float] | None  # seed -> metric, what anyone recomputes every look from
    diffs: list[float] | None  # variant - baseline, seed by seed in the seed order
    shape: Shape | None

    def to_json(self) -> dict:
        out = {"looks": [look.to_json() for look in self.looks], "state": self.state, "next_look": self.next_look,
               "needs": self.needs, "runs": self.runs}
        if self.values is not None:
            out.update(values=_str_keys(self.values), diffs=self.diffs, shape=asdict(self.shape))
        return out

    @classmethod
    def from_json(cls, d: dict) -> Comparison:
        shape = d.get("shape")
        return cls([Decision(**look) for look in d["looks"]], d["state"], d["next_look"], d["needs"], d["runs"],
                   _int_keys(d.get("values")), d.get("diffs"), None if shape is None else Shape(**shape))


@dataclass(frozen=True)
class Baseline:
    name: str
    runs: int
    needs: list[int]  # the seeds the open comparisons' next looks need that it has not run
    values: dict[int, float] | None

    def to_json(self) -> dict:
        out = {"name": self.name, "runs": self.runs, "needs": self.needs}
        if self.values is not None:
            out["values"] = _str_keys(self.values)
        return out


@dataclass(frozen=True)
class Record:
    plan: Plan
    higher_is_better: bool  # the metric's direction
    seed_order: list[int]  # the seeds in the order the looks use them (rounds.seed_order)
    baseline: Baseline
    variants: dict[str, Comparison]  # by name, sorted
    metric: str
    fingerprint: str | None  # the plan the looks were taken under, hashed (rounds.plan_fingerprint)

    @property
    def done(self) -> bool:
        return all(v.state != "continue" for v in self.variants.values())

    @property
    def runs_spent(self) -> int:
        """Runs the study has made so far (the baseline's and every variant's)."""
        return self.baseline.runs + sum(v.runs for v in self.variants.values())

    @property
    def fixed_design_runs(self) -> int:
        """Runs of the fixed design it replaces: every variant and the baseline at the budget."""
        return (len(self.variants) + 1) * self.plan.budget

    def next_runs(self) -> list[tuple[str, int]]:
        """(variant, seed) of every run the next round adds, the baseline's first."""
        return ([(self.baseline.name, s) for s in self.baseline.needs]
                + [(name, s) for name, v in sorted(self.variants.items()) for s in v.needs])

    def to_json(self) -> dict:
        out = {"plan": self.plan.to_json(), "higher_is_better": self.higher_is_better, "seed_order": self.seed_order,
               "baseline": self.baseline.to_json(), "variants": {k: v.to_json() for k, v in self.variants.items()},
               "done": self.done, "metric": self.metric}
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return {**out, "runs_spent": self.runs_spent, "fixed_design_runs": self.fixed_design_runs}

    @classmethod
    def from_json(cls, d: dict) -> Record:
        b = d["baseline"]
        p = d["plan"]  # an older record's has no method or boundary
        plan = Plan(tuple(p["looks"]), p["alpha"], p["margin"], p["comparisons"], p.get("method", "t"),
                    p.get("boundary", "bonferroni"), p.get("rho", 1.0))
        return cls(plan, d["higher_is_better"], d["seed_order"],
                   Baseline(b["name"], b["runs"], b["needs"], _int_keys(b.get("values"))),
                   {k: Comparison.from_json(v) for k, v in d["variants"].items()}, d["metric"], d.get("fingerprint"))


def read(path: Path) -> Record | None:
    """The record in `path`; None where the report stage ran with decide off ({"off": true})."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return None if data.get("off") else Record.from_json(data)


def _str_keys(values: dict[int, float]) -> dict[str, float]:
    return {str(s): x for s, x in values.items()}


def _int_keys(values: dict[str, float] | None) -> dict[int, float] | None:
    return None if values is None else {int(s): x for s, x in values.items()}
