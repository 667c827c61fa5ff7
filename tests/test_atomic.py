"""Atomic outputs: a failed write leaves the previous output whole and no temporary files."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch

from pipeline.io.atomic import DiskFull, atomic_path, atomic_write_json, atomic_write_text, disk_full
from pipeline.training.checkpoint import save_torch


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


# -- a full disk -----------------------------------------------------------------------------------
def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as write(2) says it: no file named


def test_a_full_disk_names_the_output_its_size_and_the_free_space(tmp_path, monkeypatch):
    out = tmp_path / "params.checked"
    atomic_write_text(out, "earlier\n")
    monkeypatch.setattr(Path, "write_bytes", no_space)
    with pytest.raises(DiskFull) as info:
        atomic_write_text(out, "0123456789")
    message = str(info.value)
    assert message.startswith(f"{out}: no space left on the device (needs 10 B, ") and "free there" in message
    assert "train.keep_checkpoints" in message and "train.checkpoint_every" in message and "\n" not in message
    assert out.read_text() == "earlier\n" and sorted(p.name for p in tmp_path.iterdir()) == ["params.checked"]


def test_a_file_named_inside_a_directory_output_is_named_under_the_output(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(DiskFull) as info:
        with atomic_path(out) as tmp:
            tmp.mkdir()
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.pt"))
    assert info.value.path == out / "model.pt" and not out.exists() and not list(tmp_path.iterdir())


def test_other_errors_pass_through_untouched(tmp_path):
    with pytest.raises(PermissionError):
        with atomic_path(tmp_path / "x") as tmp:
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp))
    assert disk_full(ValueError("no")) is None and disk_full(RuntimeError("unexpected pos 1 vs 2")) is None


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_torch_save_on_a_full_disk_becomes_one_line(tmp_path):
    # /dev/full fails every write with ENOSPC: a full disk, from the kernel, through torch's writers.
    state = {"weights": torch.zeros(100_000), "step": 3}
    old = tmp_path / "step-00000001.pt"
    torch.save({"step": 1}, old)
    with pytest.raises(DiskFull) as info:  # torch.save(path): torch's C++ writer drops errno
        with atomic_path(tmp_path / "step-00000002.pt") as tmp:
            tmp.symlink_to("/dev/full")
            torch.save(state, tmp)
    assert str(info.value).startswith(f"{tmp_path / 'step-00000002.pt'}: torch could not write it ([enforce fail")
    with pytest.raises(DiskFull) as info:  # save_torch: through a Python file, so errno survives
        with atomic_path(tmp_path / "step-00000002.pt") as tmp:
            tmp.symlink_to("/dev/full")
            save_torch(state, tmp)
    assert str(info.value).startswith(f"{tmp_path / 'step-00000002.pt'}: no space left on the device "
                                      f"(needs 400.0 kB, ")
    assert torch.load(old)["step"] == 1 and sorted(p.name for p in tmp_path.iterdir()) == [old.name]
