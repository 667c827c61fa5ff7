"""The report's figures drawn side by side in forked children (pipeline/reporting/drawing.py): the
same PNGs as drawn in one process, and a figure that fails stops the stage with one line naming it."""
from __future__ import annotations

import errno

import pytest
from matplotlib.figure import Figure

from pipeline.io.atomic import DiskFull
from pipeline.reporting import drawing
from tests.fixtures.report.fake_runs import make_project
from tests.test_report import render

pytestmark = pytest.mark.multiprocess  # forks a child per figure


def figures(out):
    return {f.name: f.read_bytes() for f in sorted((out / "figures").iterdir())}


def test_forked_drawing_writes_the_same_figures_as_drawing_here(tmp_path):
    p = make_project(tmp_path)
    here = figures(render(p, tmp_path / "here"))
    with drawing.forking():
        forked = figures(render(p, tmp_path / "forked"))
    assert len(here) >= 3 and forked == here


def failing_savefig(monkeypatch, error: Exception, name: str) -> None:
    real = Figure.savefig

    def savefig(self, path, *args, **kwargs):
        if str(path).endswith(name):
            raise error
        return real(self, path, *args, **kwargs)
    monkeypatch.setattr(Figure, "savefig", savefig)  # the children are forked after: they have it too


def test_a_figure_that_fails_in_its_child_is_named_and_the_old_report_stays(tmp_path, monkeypatch, capfd):
    p = make_project(tmp_path)
    out = render(p, tmp_path / "reports")
    before = (out / "report.md").read_text()
    failing_savefig(monkeypatch, ValueError("no room for the legend"), "curves.png")
    with drawing.forking(), pytest.raises(drawing.DrawingError, match=r"could not draw curves\.png"):
        render(p, out)
    assert "no room for the legend" in capfd.readouterr().err  # the child's traceback
    assert (out / "report.md").read_text() == before
    assert not list(out.glob(".report-build.*"))


def test_a_full_disk_in_a_child_is_the_stage_s_full_disk(tmp_path, monkeypatch):
    p = make_project(tmp_path)
    failing_savefig(monkeypatch, OSError(errno.ENOSPC, "No space left on device"), "deltas.png")
    with drawing.forking(), pytest.raises(DiskFull):
        render(p, tmp_path / "reports")
    assert not (tmp_path / "reports" / "report.md").exists()
