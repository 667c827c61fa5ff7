"""The committed default study, whatever the workspace's params.yaml holds now.

params.yaml is the one file a user edits (README, "Edit params and rerun"), so a test about the
default study, its committed reports or the README's pictures reads what was committed instead:
DEFAULT_PARAMS, the synthetic preset that `python -m pipeline.preset synthetic` writes to
params.yaml, which tests/test_params.py holds equal to the committed params.yaml (`committed`).
tests/test_edited_params.py runs those tests in a scratch copy whose params.yaml is edited as the
README shows.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PARAMS = ROOT / "presets" / "synthetic.yaml"


def default_params() -> dict:
    """The default study's params (presets/synthetic.yaml) as plain YAML."""
    return yaml.safe_load(DEFAULT_PARAMS.read_text(encoding="utf-8"))


def committed(path: str) -> str:
    """The text of `path` (relative to the project) at HEAD, `git show HEAD:<path>`; in a copy that
    is not a git checkout, the file as it is (then as it shipped)."""
    try:
        shown = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:  # no git at all
        return (ROOT / path).read_text(encoding="utf-8")
    if shown.returncode == 0:
        return shown.stdout
    if "not a git repository" in shown.stderr:
        return (ROOT / path).read_text(encoding="utf-8")
    raise RuntimeError(f"git show HEAD:{path}: {shown.stderr.strip()}")


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def scratch_copy(dest: Path) -> Path:
    """The working tree's files (tracked, and new ones git does not ignore) copied to `dest`, with
    params.yaml as committed, made a git repository of one commit: the project as a fresh clone of
    this tree has it, so a test can edit its params.yaml or run its commands there."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():  # a file deleted in the working tree is gone
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    (dest / "params.yaml").write_text(committed("params.yaml"), encoding="utf-8")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "scratch copy"]):
        subprocess.run(["git", *args], cwd=dest, env=env, check=True, capture_output=True)
    return dest


def add_ablation(text: str, line: str) -> str:
    """params.yaml's text with `line` (`  name: {model: {...}}`) after its last ablation, where the
    README's "Edit params and rerun" adds one."""
    block = re.search(r"^ablations:\n(?:  .*\n)+", text, flags=re.M)
    assert block, "params.yaml has no ablations: section"
    return text[:block.end()] + line.rstrip("\n") + "\n" + text[block.end():]
