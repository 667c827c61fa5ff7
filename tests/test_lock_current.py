"""The committed dvc.lock records the code as committed: every dependency outside data/ hashes as the
lock says. Otherwise a clone's `dvc status` calls stages changed that are not, and `dvc repro` reruns
them (stop 79 found pipeline/training's hash stale by one edit). Checked by DVC itself, in a copy."""
from __future__ import annotations

import shutil

import pytest
import yaml

from tests.conftest import ROOT


def code_deps(lock: dict) -> set[str]:
    return {d["path"] for stage in lock["stages"].values() for d in stage.get("deps", [])
            if not d["path"].startswith("data/")}


def stale_code(project) -> set[tuple[str, str]]:
    """(stage, path) for each code dependency DVC finds changed in `project` (stages named as in the lock)."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        status = repo.status()
    return {(stage.split(":")[-1], path) for stage, changes in status.items() for change in changes
            if isinstance(change, dict) for path in change.get("changed deps", {}) if not path.startswith("data/")}


@pytest.mark.slow
def test_the_committed_lock_hashes_the_code_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text(encoding="utf-8"))
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, tmp_path / name)
    for path in sorted(code_deps(lock)):  # a folder and a file in it may both be deps
        source = ROOT / path
        if source.is_dir():
            shutil.copytree(source, tmp_path / path, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        else:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, tmp_path / path)
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True).close()
    assert stale_code(tmp_path) == set()
    # The control: a code file edited by one byte is found in every stage that reads it.
    edited = tmp_path / "pipeline" / "training" / "optim.py"
    edited.write_text(edited.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    stages = {stage for stage, entry in lock["stages"].items()
              if any(d["path"] == "pipeline/training" for d in entry.get("deps", []))}
    assert {stage for stage, _ in stale_code(tmp_path)} == stages and stages


def test_the_committed_lock_records_each_code_files_size_as_it_is():
    """DVC decides by the hash alone, so a size left stale by a hand-updated hash passes the test above
    unseen (pipeline/cpu_numerics.py's was, by 358 bytes): the lock should say what the file is."""
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text(encoding="utf-8"))
    recorded = {(d["path"], d["size"]) for stage in lock["stages"].values() for d in stage.get("deps", [])
                if d["path"] in code_deps(lock) and (ROOT / d["path"]).is_file() and "size" in d}
    assert len(recorded) > 10
    assert {(path, size) for path, size in recorded if (ROOT / path).stat().st_size != size} == set()
