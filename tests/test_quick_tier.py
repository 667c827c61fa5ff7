"""The quick tier (`pytest --quick`, `bash run.sh test quick`) can fail: with a stage function broken
on purpose, the tier's own tests of that stage fail. Which quick tests call each stage function:
docs/tests-and-benchmarks.md."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import QUICK
from pipeline import filter as filter_stage

TESTS = Path(__file__).resolve().parent


class Outcomes:
    """A plugin for an inner run: the node ids of the tests that failed, and of those that ran."""

    def __init__(self):
        self.failed: set[str] = set()
        self.ran: set[str] = set()

    def pytest_runtest_logreport(self, report):
        self.ran.add(report.nodeid)
        if report.failed:
            self.failed.add(report.nodeid)


def run_tier(files: list[Path], basetemp: Path) -> tuple[int, Outcomes]:
    """The quick tier's tests in `files`, run in this process (as pytest's own pytester does), so a
    function patched here is the one they call."""
    outcomes = Outcomes()
    code = pytest.main([*map(str, files), "-q", "-p", "no:cacheprovider", "-m", QUICK, f"--basetemp={basetemp}"],
                       plugins=[outcomes])
    return code, outcomes


def ignores_the_maximum(n: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    """The filter's length rule with a bug: the upper limit forgotten (every long example kept)."""
    return lo <= n


@pytest.mark.slow
def test_a_broken_filter_fails_the_quick_tiers_data_stage_tests(tmp_path, monkeypatch):
    files = [TESTS / "test_data_stages.py"]
    code, control = run_tier(files, tmp_path / "control")
    assert code == pytest.ExitCode.OK and len(control.ran) > 20, sorted(control.failed)
    monkeypatch.setattr(filter_stage, "_within", ignores_the_maximum)
    code, broken = run_tier(files, tmp_path / "broken")
    assert code == pytest.ExitCode.TESTS_FAILED
    names = {nodeid.split("::")[-1] for nodeid in broken.failed}
    assert {"test_filter_drops_long_examples_and_carves_splits", "test_a_side_without_a_maximum_is_not_limited",
            "test_the_default_filter_output_is_byte_identical_to_before"} <= names, sorted(names)
