"""A copy of the project with tiny params, for tests that run the real `dvc repro` on it."""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = {
    "data": {"source": "synthetic", "synthetic": {"n_examples": 240, "seed": 1}},
    "filter": {"max_source_tokens": 100, "max_target_tokens": 40, "val_fraction": 0.1, "test_fraction": 0.1},
    "train_bpe": {"vocab_size": 120},
    "encode": {"shard_examples": 100},
    "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
    "train": {"budget_tokens": 1500, "batch_tokens": 800, "eval_every": 5, "eval_examples": 16,
              "log_every": 2, "checkpoint_every": 5, "warmup_steps": 2, "device": "cpu", "threads": 1},
    "evaluate": {"max_examples": 8, "max_new_tokens": 20, "n_samples": 2},
    "report": {"baseline": "baseline"},
    "seeds": [0, 1],
    "ablations": {"baseline": {}, "no_positional": {"model": {"positional": "none"}}},
    "lr_sweep": [],
    "scales": {},
    "knockout": {"seeds": []},
    "decide": {"runs": {}},
}


def tiny_params(**changes) -> dict:
    """TINY with top-level sections replaced, e.g. tiny_params(seeds=[0])."""
    return {**copy.deepcopy(TINY), **copy.deepcopy(changes)}


def make_project(project: Path, params: dict, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Copy the code and dvc.yaml into `project` (a git + DVC repository), write `params`; return
    the environment to run `dvc` in it (this interpreter's tools, MLflow in the project)."""
    project.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("model", "pipeline", *extra):
        shutil.copytree(ROOT / name, project / name, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", project)
    (project / "data" / "local").mkdir(parents=True)  # the download stage's dep, as git has it
    for name in (".gitignore", "README.md"):
        shutil.copy(ROOT / "data" / "local" / name, project / "data" / "local")
    write_params(project, params)
    env = project_env(project)
    sh(["git", "init", "-q"], project, env)
    sh(["dvc", "init", "-q"], project, env)
    sh(["dvc", "config", "core.analytics", "false"], project, env)
    return env


def project_env(project: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "MLFLOW_TRACKING_URI": f"sqlite:///{project / 'mlflow.db'}", "ABLATION_LAB_TRACKING": "1",
            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t"}


def copy_project(source: Path, project: Path) -> dict[str, str]:
    """A copy of a project made by `make_project` (its git history and DVC cache included)."""
    shutil.copytree(source, project, symlinks=True)
    return project_env(project)


def write_params(project: Path, params: dict) -> None:
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def sh(args, cwd, env, ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, f"{args}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


# Loaded by every Python process that has its folder on PYTHONPATH: at exit it writes which files
# under the working directory (the project) the process had imported, and its command line.
_IMPORT_HOOK = """
import atexit, json, os, sys

def _record():
    root = os.getcwd() + os.sep
    paths = {os.path.abspath(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    files = sorted(os.path.relpath(p, root) for p in paths if p.startswith(root) and os.path.isfile(p))
    with open(os.path.join(os.environ["IMPORT_LOG_DIR"], f"{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.argv, "files": files}, f)

atexit.register(_record)
"""


def record_imports(log_dir: Path) -> dict[str, str]:
    """Environment under which each Python process writes log_dir/<pid>.json: its argv and the
    project files it loaded (for the dvc.yaml deps check in test_layout)."""
    hook = log_dir / "hook"
    hook.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(_IMPORT_HOOK)
    return {"PYTHONPATH": str(hook), "IMPORT_LOG_DIR": str(log_dir)}


def ran_stages(log: str) -> set[str]:
    """The stages a `dvc repro` log says it ran."""
    return {line.split("'")[1] for line in log.splitlines() if line.startswith("Running stage")}
