"""Editing params.yaml as the README shows breaks no test: the tests of the default study read
what was committed (tests/committed.py), not whatever the workspace's params.yaml holds.

In a scratch copy of the project (tests/committed.py's scratch_copy), params.yaml gets a new
ablation and a shorter seed list, as README's "Edit params and rerun" adds them, and every test
that reads the default study's params runs there and passes.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.committed import ROOT, add_ablation, scratch_copy

TESTS = ROOT / "tests"
# Every test file that reads the default study through tests/committed.py, run in full but for
# its slow tests: the tests of the default study's params and of its committed reports.
PARAMS_TESTS = sorted(f"tests/{p.name}" for p in TESTS.glob("test_*.py")
                      if "tests.committed import" in p.read_text(encoding="utf-8") and p.name != Path(__file__).name)


def test_the_tests_that_failed_on_an_edited_params_yaml_are_among_them():
    assert {"tests/test_params.py", "tests/test_dvc_compare.py", "tests/test_docs.py"} <= set(PARAMS_TESTS)


def test_no_test_reads_the_workspaces_params_yaml():
    """A test of the default study reads tests/committed.py's DEFAULT_PARAMS or committed(); one
    about params.yaml files writes its own (tmp_path)."""
    workspace = re.compile(r"""ROOT\s*/\s*["']params\.yaml["']""")
    readers = [p.name for p in TESTS.glob("*.py") if workspace.search(p.read_text(encoding="utf-8"))]
    assert not readers, f"{readers} read the workspace's params.yaml: read tests/committed.py's DEFAULT_PARAMS"


def edit_as_the_readme_shows(text: str) -> str:
    """A new ablation after the others (`gelu_ffn: {model: {ffn: gelu}}`) and seeds [0, 1]."""
    text, n = re.subn(r"^seeds: \[0, 1, 2\]$", "seeds: [0, 1]", text, flags=re.M)
    assert n == 1, "params.yaml has no `seeds: [0, 1, 2]` line"
    return add_ablation(text, "  gelu_ffn: {model: {ffn: gelu}}")


@pytest.mark.slow
def test_the_params_tests_pass_with_params_yaml_edited_as_the_readme_shows(tmp_path):
    project = scratch_copy(tmp_path / "project")
    params = project / "params.yaml"
    params.write_text(edit_as_the_readme_shows(params.read_text()))
    edited = yaml.safe_load(params.read_text())
    assert edited["seeds"] == [0, 1] and edited["ablations"]["gelu_ffn"] == {"model": {"ffn": "gelu"}}
    assert list(edited["ablations"])[-1] == "gelu_ffn" and len(edited["ablations"]) >= 3
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                          *PARAMS_TESTS], cwd=project, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
