"""docs/adding-a-switch.md is true of the code as it is: its Python snippets are copied from the
code, its diff stat is the commit's, what it says of qk_norm's parameters holds, and every command
in its ```bash blocks runs (slow: in a scratch copy of the project, its params.yaml edited as the
page's yaml block shows)."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from model import ModelConfig, build_model
from pipeline.params import load_params
from tests.committed import ROOT, add_ablation, scratch_copy

PAGE = ROOT / "docs" / "adding-a-switch.md"
TEXT = PAGE.read_text(encoding="utf-8")
SOURCES = [*ROOT.glob("model/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("pipeline/**/*.py"), *ROOT.glob("tests/*.py")]


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", TEXT, flags=re.M | re.S)


def commands() -> list[str]:
    """Each command line of the page's bash blocks (comments after a command stay: bash drops them)."""
    lines = [line for block in fenced("bash") for line in block.splitlines()]
    assert not any(line.rstrip().endswith("\\") for line in lines), "one command a line, no continuations"
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_every_python_snippet_is_the_code_as_it_is():
    texts = [p.read_text(encoding="utf-8") for p in SOURCES]
    snippets = fenced("python")
    assert len(snippets) >= 6
    for snippet in snippets:
        assert any(snippet in text for text in texts), f"not in the code as it is:\n{snippet}"


def test_the_diff_stat_is_the_commits():
    commit, stat = re.search(r"`git show --stat (\w+)`\):\n\n```text\n(.*?)```", TEXT, flags=re.S).groups()
    shown = subprocess.run(["git", "show", "--stat", "--format=", commit], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {commit} is not in this checkout's history")
    assert shown.stdout.strip("\n") == stat.strip("\n")
    files = re.findall(r"^ (\S+)\s+\|", stat, flags=re.M)
    assert files == ["docs/pipeline-and-params.md", "model/attention.py", "model/config.py"]


def test_qk_norms_gains_are_counted_as_attention_as_the_page_says():
    assert "`qk_norm`'s gains are in the report's **attention** column" in TEXT
    cfg = ModelConfig(vocab_size=50, d_model=16, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=32)
    off, on = (build_model(dataclasses.replace(cfg, qk_norm=q)).param_counts() for q in (False, True))
    attentions = 3  # encoder self, decoder self and cross
    assert on["attention"] - off["attention"] == attentions * 2 * cfg.head_dim
    assert {k: on[k] for k in ("embeddings", "ffn", "norms", "other")} == \
        {k: off[k] for k in ("embeddings", "ffn", "norms", "other")}


def test_the_page_runs_its_commands_from_the_project_root_with_no_setup():
    assert commands() and all(not c.startswith(("cd ", "source ", "bash run.sh", "dvc ")) for c in commands())


@pytest.mark.slow
def test_every_command_on_the_page_runs(tmp_path):
    project = scratch_copy(tmp_path / "project")
    params = project / "params.yaml"
    text = params.read_text(encoding="utf-8")
    added = [line for block in fenced("yaml") for line in block.splitlines()
             if re.fullmatch(r"  \w+: \{.*\}", line) and line.split(":")[0].strip() not in load_params(params).ablations]
    assert added == ["  qk_norm: {model: {qk_norm: true}}"]
    for line in added:  # the page's edit, as a reader makes it
        text = add_ablation(text, line)
    params.write_text(text, encoding="utf-8")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    said = {}
    for command in commands():
        run = subprocess.run(["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, f"{command}\n{run.stdout[-4000:]}\n{run.stderr[-3000:]}"
        said[command.split("#")[0].strip()] = run.stdout
    assert "| qk_norm |" in said["python -m pipeline.plan"]
    own = re.search(r"For `qk_norm` that is (\d+) tests of its own", TEXT).group(1)
    assert f"\n{own} passed" in said["python -m pytest -q tests/test_model_every_switch.py -k qk_norm"]
    # Rewriting the table and the recorded bits from the code as it is changed neither.
    changed = subprocess.run(["git", "status", "--porcelain", "--", "docs", "tests"], cwd=project,
                             capture_output=True, text=True, check=True).stdout
    assert changed == ""
