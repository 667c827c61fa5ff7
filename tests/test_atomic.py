"""Atomic outputs: a failed write leaves the previous output whole and no temporary files."""
from __future__ import annotations

import pytest

from pipeline.atomic import atomic_path, atomic_write_json


def test_directory_is_replaced_whole_and_a_failure_keeps_the_old_one(tmp_path):
    out = tmp_path / "out"
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("stage failed midway")
    assert (out / "a.txt").read_text() == "first"
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # nothing of the old output survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or set-aside copies


def test_failed_file_write_leaves_nothing(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_json(tmp_path / "m.json", {"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_temporaries_left_by_a_killed_write_are_removed_by_the_next_write(tmp_path):
    out = tmp_path / "figures"
    (tmp_path / ".figures.abc123.tmp").mkdir()  # SIGKILL during a directory write
    (tmp_path / ".figures.def456.tmp.old").mkdir()  # ... or during the swap
    (tmp_path / ".figures-other.x.tmp").write_text("not ours")
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "a.png").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".figures-other.x.tmp", "figures"]
