"""docs/pipeline-and-params.md's Layout against the tree, as the switch table is held to
model/config.py: every path a row names exists; every top-level file and folder, every module and
room of pipeline/ and every module of model/ has a row of its own; and a room's row names each of
its modules in backticks and no other bare name, so that a module added, moved or deleted fails
here until the map follows. Its run.sh list is run.sh's. Reads files, well under a second."""
from __future__ import annotations

import re
from pathlib import Path

from tests.tiny_project import ROOT

PAGE = ROOT / "docs" / "pipeline-and-params.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$", re.M)
NAME = re.compile(r"`(\w+)`")  # a bare module name; `python -m x`, `a.py` or `a/` are not


def rows(text: str) -> list[tuple[str, str]]:
    """(path, what) of every table row of the Layout section whose first cell is a path."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return ROW.findall(section)


def made_by_a_run(root: Path) -> set[str]:
    """The names .gitignore gives (.venv, mlflow.db, ...): a row may name one before a run makes it,
    and none needs a row."""
    lines = (root / ".gitignore").read_text().splitlines()
    return {line.strip().strip("/") for line in lines if line.strip() and not line.startswith("#") and "*" not in line}


def rooms(root: Path) -> dict[str, Path]:
    """`pipeline/x/` -> its folder, for every subpackage of pipeline/ and model/."""
    return {f"{d.relative_to(root).as_posix()}/": d for package in ("pipeline", "model")
            for d in sorted((root / package).rglob("*")) if (d / "__init__.py").is_file()}


def wanted(root: Path) -> set[str]:
    """The paths that need a row: the top level's files and folders (hidden and git-ignored ones
    aside), and every module and room of pipeline/ and model/."""
    ignored = made_by_a_run(root)
    top = {p.name + "/" * p.is_dir() for p in root.iterdir() if not p.name.startswith(".") and p.name not in ignored}
    modules = {p.relative_to(root).as_posix() for package in ("pipeline", "model") for p in (root / package).glob("*.py")}
    return top | set(rooms(root)) | modules


def problems(root: Path, text: str) -> list[str]:
    """What is wrong with the map `text` of the tree at `root`, one line each; none when it holds."""
    found, seen = [], set()
    ignored, folders = made_by_a_run(root), rooms(root)
    for path, what in rows(text):
        if path in seen:
            found.append(f"{path}: two rows")
        seen.add(path)
        if not (root / path).exists() and path.strip("/").split("/")[0] not in ignored:
            found.append(f"{path}: no such file or folder")
        if path in folders:
            modules = {p.stem for p in folders[path].glob("*.py")} - {"__init__"}
            named = set(NAME.findall(what))
            found += [f"{path}: its row does not name `{m}`" for m in sorted(modules - named)]
            found += [f"{path}: its row names `{m}`, which is not a module of it" for m in sorted(named - modules)]
    found += [f"{path}: no row" for path in sorted(wanted(root) - seen)]
    return found


def test_the_layout_map_is_the_tree():
    text = PAGE.read_text(encoding="utf-8")
    assert len(rows(text)) >= 50  # the tables are read (not skipped by a format change)
    assert problems(ROOT, text) == []


def test_a_stale_map_is_found(tmp_path):
    (tmp_path / ".gitignore").write_text("# made by a run\nmlflow.db\n.venv\n*.pyc\n")
    for path in ("run.sh", "pipeline/__init__.py", "pipeline/train.py", "pipeline/room/__init__.py",
                 "pipeline/room/a.py", "pipeline/room/b.py", "model/__init__.py", "model/config.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "mlflow.db").write_text("")
    (tmp_path / ".ci").mkdir()
    text = ("# x\n\n## Layout\n\n| path | what |\n|---|---|\n| `run.sh` | every command |\n"
            "| `pipeline/` | the stages |\n| `pipeline/__init__.py` | nothing |\n| `pipeline/train.py` | stage `train` |\n"
            "| `pipeline/room/` | `a` (one), `b` (two): `python -m pipeline.room` |\n| `model/` | pure torch |\n"
            "| `model/__init__.py` | names |\n| `model/config.py` | switches |\n| `mlflow.db` | a run's |\n\n## Next\n\n"
            "| `gone.py` | not in the Layout |\n")
    assert problems(tmp_path, text) == []
    assert problems(tmp_path, text.replace("| `model/config.py` | switches |\n", "")) == ["model/config.py: no row"]
    assert problems(tmp_path, text.replace("`pipeline/train.py`", "`pipeline/trian.py`")) == \
        ["pipeline/trian.py: no such file or folder", "pipeline/train.py: no row"]
    assert problems(tmp_path, text.replace("`b` (two)", "`c` (two)")) == \
        ["pipeline/room/: its row does not name `b`", "pipeline/room/: its row names `c`, which is not a module of it"]
    (tmp_path / "pipeline" / "new").mkdir()
    (tmp_path / "pipeline" / "new" / "__init__.py").write_text("")
    (tmp_path / "presets").mkdir()
    assert problems(tmp_path, text) == ["pipeline/new/: no row", "presets/: no row"]
    assert problems(tmp_path, text.replace("| `mlflow.db` | a run's |\n", "| `mlflow.db` | a run's |\n" * 2)) == \
        ["mlflow.db: two rows", "pipeline/new/: no row", "presets/: no row"]


def test_the_run_sh_list_is_run_shs():
    usage = re.search(r"usage: bash run\.sh \[([^\]]+)\]", (ROOT / "run.sh").read_text()).group(1)
    listed = re.search(r"^bash run\.sh \[([^\]]+)\]", PAGE.read_text(encoding="utf-8"), re.M).group(1)
    assert [c.split()[0] for c in listed.split("|")] == usage.split("|")
