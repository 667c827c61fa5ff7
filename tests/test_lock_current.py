"""The committed dvc.lock records the code as committed: every dependency outside data/, and every one
in data/ that git tracks (data/local), hashes as the lock says. Otherwise a clone's `dvc status` calls
stages changed that are not, and `dvc repro` reruns them (stop 79 found pipeline/training's hash stale
by one edit; stop 81 data/local's, recorded with a 1.1 MB file a workspace held there). Checked by DVC
itself, in a copy of what git tracks."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT


def tracked(path: str) -> list[str]:
    """The files under `path` that git tracks."""
    return subprocess.run(["git", "ls-files", "--", path], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.split()


def code_deps(lock: dict) -> set[str]:
    return {d["path"] for stage in lock["stages"].values() for d in stage.get("deps", [])
            if not d["path"].startswith("data/")}


def committed_deps(lock: dict) -> set[str]:
    """The code deps and the data/ deps that git tracks and no stage writes into: what a clone has
    before any stage runs."""
    outs = {o["path"] for stage in lock["stages"].values() for o in stage.get("outs", [])}
    data = {d["path"] for stage in lock["stages"].values() for d in stage.get("deps", [])
            if d["path"].startswith("data/")}
    return code_deps(lock) | {path for path in data if tracked(path)
                              and not any(o == path or o.startswith(path + "/") for o in outs)}


def stale_code(project, deps: set[str]) -> set[tuple[str, str]]:
    """(stage, path) for each of `deps` DVC finds changed in `project` (stages named as in the lock)."""
    from dvc.repo import Repo

    with Repo(str(project)) as repo:
        status = repo.status()
    return {(stage.split(":")[-1], path) for stage, changes in status.items() for change in changes
            if isinstance(change, dict) for path in change.get("changed deps", {}) if path in deps}


@pytest.mark.slow
def test_the_committed_lock_hashes_the_code_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text(encoding="utf-8"))
    for name in ("dvc.yaml", "dvc.lock", "params.yaml", ".dvcignore"):
        shutil.copy(ROOT / name, tmp_path / name)
    deps = committed_deps(lock)
    assert "data/local" in deps
    for path in sorted({file for dep in deps for file in tracked(dep)}):  # as a clone has them
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True).close()
    assert stale_code(tmp_path, deps) == set()
    # The control: a code file edited by one byte is found in every stage that reads it.
    edited = tmp_path / "pipeline" / "training" / "optim.py"
    edited.write_text(edited.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    stages = {stage for stage, entry in lock["stages"].items()
              if any(d["path"] == "pipeline/training" for d in entry.get("deps", []))}
    assert {stage for stage, _ in stale_code(tmp_path, deps)} == stages and stages
    (tmp_path / "data" / "local" / "extra.txt").write_text("a file a workspace holds\n")  # and data/local's
    assert ("download", "data/local") in stale_code(tmp_path, deps)


def test_the_committed_lock_records_each_code_files_size_as_it_is():
    """DVC decides by the hash alone, so a size left stale by a hand-updated hash passes the test above
    unseen (pipeline/cpu_numerics.py's was, by 358 bytes): the lock should say what the file is."""
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text(encoding="utf-8"))
    recorded = {(d["path"], d["size"]) for stage in lock["stages"].values() for d in stage.get("deps", [])
                if d["path"] in code_deps(lock) and (ROOT / d["path"]).is_file() and "size" in d}
    assert len(recorded) > 10
    assert {(path, size) for path, size in recorded if (ROOT / path).stat().st_size != size} == set()
