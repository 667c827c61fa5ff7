"""benchmarks/test_suite.py reads pytest's own summary line, with or without pytest-xdist."""
import pytest

from benchmarks.test_suite import from_junit, summary


def test_the_summary_line_gives_the_counts_and_pytests_total():
    serial = "....\n========== 2838 passed, 207 deselected in 214.85s (0:03:34) ==========\n"
    assert summary(serial) == {"counts": {"passed": 2838, "deselected": 207}, "pytest_s": 214.85}
    assert summary("[gw0] ...\n2066 passed in 111.37s (0:01:51)\n") == {"counts": {"passed": 2066}, "pytest_s": 111.37}
    full = "3029 passed, 10 skipped, 6 xfailed in 2182.10s (0:36:22)"
    assert summary(full)["counts"] == {"passed": 3029, "skipped": 10, "xfailed": 6}


def test_output_without_a_summary_is_an_error_that_shows_the_output():
    with pytest.raises(SystemExit, match="(?s)no pytest summary line.*ImportError"):
        summary("ImportError while loading conftest")


def test_a_ci_run_is_read_from_its_junit_xml(tmp_path):
    xml = tmp_path / "ci-junit.xml"
    xml.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5" time="12.5" '
        'timestamp="2026-11-30T03:03:09"><testcase classname="tests.test_a" name="ok" time="1"/>'
        '<testcase classname="tests.test_screenshots" name="shot" time="2"/>'
        '<testcase classname="tests.test_a" name="gpu" time="0"><skipped type="pytest.skip" message="needs CUDA"/></testcase>'
        '<testcase classname="tests.test_a" name="gap" time="0"><skipped type="pytest.xfail" message="named gap"/></testcase>'
        '<testcase classname="tests.test_a" name="bad" time="0"><failure message="assert"/></testcase>'
        '</testsuite></testsuites>')
    run = from_junit(xml, "abc1234")
    assert run["counts"] == {"passed": 2, "skipped": 1, "xfailed": 1, "failed": 1}
    assert (run["pytest_s"], run["browser_passed"], run["commit"]) == (12.5, 1, "abc1234")


def test_a_trial_records_the_share_of_cpu_time_stolen_meanwhile(tmp_path, monkeypatch):
    """The steal share is the difference of /proc/stat's steal ticks over the difference of all its
    ticks, read before and after the command (here a fake /proc/stat, 40 of 400 ticks stolen)."""
    import benchmarks.test_suite as ts

    lines = iter(["cpu  100 0 0 800 0 0 0 100 0 0\n", "cpu  260 0 0 1000 0 0 0 140 0 0\n"])
    monkeypatch.setattr(ts, "cpu_ticks", lambda: ts.ticks_of(next(lines)))
    command = ["echo", "3 passed in 0.01s"]
    assert ts.timed(command, tmp_path)["steal_share"] == 0.1
    assert ts.ticks_of("cpu  1 2\n") is None  # a line it cannot read: no share, not a wrong one
