"""benchmarks/plan_memory's plan side runs on today's planner (its call once fell behind plan()'s
signature, and the benchmark broke unseen)."""
from __future__ import annotations

from benchmarks.plan_memory import planned
from tests.tiny_project import ROOT


def test_the_benchmark_reads_the_plan_of_each_preset_it_measures():
    for name in ("tinystories_cpu", "tiny_shakespeare_cpu", "nanogpt_shakespeare_char"):
        memory = planned(ROOT / "presets" / f"{name}.yaml")
        assert memory["total"] > 0 and memory["batch"]
