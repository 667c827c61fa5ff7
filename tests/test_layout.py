"""The layout's promises: no import circle in the project, and each dvc.yaml stage depends on exactly
the code it runs, so an edit reruns the stages it can change and no others."""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from tests.tiny_project import ROOT, copy_project, sh

PACKAGES = ("model", "pipeline", "scripts", "benchmarks")
# A room a stage loads only part of by design: download imports the one source data.source names.
PICKED_BY_PARAMS = {"pipeline/sources"}
# Files of a room that only some of its stages load. model/knockout.py (evaluation-time hooks) and
# knockout_plan.py (what can be knocked out) are in the model room as the one place for the model,
# so editing them also reruns the training stages, whose `model` dep covers them: a known cost,
# paid only when the knock-out code changes.
LOADED_BY_SOME = {"model/knockout.py", "model/knockout_plan.py"}


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `name` imports anywhere in its file (function-level imports included):
    `from a import b` is module a.b when that exists, else a (whose name b is)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    graph = import_graph()
    assert graph["pipeline.report"] >= {"pipeline.reporting.tables", "pipeline.reporting.sweeps"}  # the walk sees them
    assert "model.generate" in graph["model.transformer"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_module_imports_from_its_own_package_init():
    # The package's __init__ may load its modules (the sources registry does, by name at run time,
    # which the graph above cannot see), so a module that took names from it would close a circle.
    modules = module_files()
    for name, targets in import_graph().items():
        if modules[name].name != "__init__.py":
            own = name.rpartition(".")[0]
            assert own not in targets, f"{name} imports names from its own package {own}"


def test_pipeline_top_level_is_the_stages_and_at_most_six_others():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    modules = {p.stem for p in (ROOT / "pipeline").glob("*.py")} - {"__init__", "__main__"}
    run = {cmd_module(stage["cmd"]) for stage in stages.values()}
    # Besides the stages: the user's tools (plan, preset), the pinning and the MLflow mirror every
    # model-running stage shares, and the two rooms every stage loads (params/, io/). The engines'
    # rooms (sources/, training/, ...) are loaded only by what lists them.
    assert run <= modules and modules - run == {"plan", "preset", "cpu_numerics", "tracking"}
    shared_rooms = {"params", "io"}
    assert all((ROOT / "pipeline" / room / "__init__.py").is_file() for room in shared_rooms)
    assert len(modules - run) + len(shared_rooms) <= 6


def test_the_entry_point_knows_exactly_the_stages_dvc_yaml_runs():
    # `python -m pipeline <stage>` refuses a name outside STAGES, and the warm server imports each
    # one ahead: a stage added to dvc.yaml but not there would fail, one left there is imported for nothing.
    from pipeline.warm.shim import STAGES

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert STAGES == {cmd_module(stage["cmd"]) for stage in stages.values()}


def cmd_module(cmd: str) -> str:
    words = cmd.split()
    return words[words.index("-m") + 2]  # `python -m pipeline <stage>`


def code_deps(stage: dict) -> set[str]:
    return {d for d in stage["deps"] if d.split("/")[0] in ("pipeline", "model")}


def has_code(path: Path) -> bool:
    """False for a file that is only a docstring (a package's __init__): it cannot change a result."""
    body = ast.parse(path.read_text()).body
    return not (len(body) <= 1 and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body))


# Stages off in tiny_repo (knockout@0 runs, finds its seed not selected and writes only its marker,
# before the imports of a real run); tests/test_knockout.py runs them on and checks them.
OFF_IN_TINY_REPO = {"knockout", "knockout_more"}  # knockout_more: the same module, per added run


def loaded_files(imports: Path) -> dict[str, set[str]]:
    """Stage module -> project files its processes loaded (tests.tiny_project.record_imports)."""
    loaded: dict[str, set[str]] = {}
    for log in imports.glob("*.json"):
        record = json.loads(log.read_text())
        if record["argv"][0].endswith(".py") and "/pipeline/" in record["argv"][0]:
            module = Path(record["argv"][0]).stem
            loaded.setdefault(module, set()).update(record["files"])
    return loaded


# Where a stage runs and how its process ends, not what it computes: every `python -m pipeline
# <stage>` passes through them to be served warm or run cold (pipeline/warm/auto.py) and ends
# through pipeline/warm/exit.py, and either way the outputs are the same (tests/test_warm_auto.py), so
# an edit to them must not rerun the study.
WHERE_NOT_WHAT = {"pipeline/__init__.py", "pipeline/__main__.py", "pipeline/warm/auto.py", "pipeline/warm/shim.py",
                  "pipeline/warm/exit.py"}
# Loaded by every stage (pipeline/__init__.py pins torch's CPU code path with it): it decides the
# bits of every stage that runs a model (they load model/transformer.py), and nothing elsewhere.
PINNING = "pipeline/cpu_numerics.py"


def check_stage_deps(name: str, stage: dict, loaded: set[str], project: Path) -> None:
    """The stage's deps cover every file it loaded, and list no file or room it did not load."""
    where = WHERE_NOT_WHAT | (set() if "model/transformer.py" in loaded else {PINNING})
    files = {f for f in loaded if has_code(project / f)} - where
    deps = code_deps(stage)
    covered = {f for f in files if any(f == d or f.startswith(d + "/") for d in deps)}
    assert covered == files, f"{name}: runs {sorted(files - covered)}, not in its deps"
    for dep in deps:
        if (ROOT / dep).is_dir():
            room = {str(p.relative_to(ROOT)) for p in (ROOT / dep).rglob("*.py") if has_code(p)} - LOADED_BY_SOME
            used = room & files
            assert used, f"{name}: depends on {dep}/ and loads nothing from it"
            if dep not in PICKED_BY_PARAMS:
                assert used == room, f"{name}: depends on {dep}/ and does not load {sorted(room - used)}"
        else:
            assert dep in files, f"{name}: depends on {dep} and does not load it"


@pytest.mark.repro
@pytest.mark.slow
def test_each_stage_depends_on_exactly_the_code_it_runs(tiny_repo):
    # tiny_repo ran every stage with an import hook: what each stage's process loaded is what it
    # runs. Its deps must cover every loaded file, and list no file or room it did not load.
    loaded = loaded_files(tiny_repo.parent / "imports")
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(loaded) - OFF_IN_TINY_REPO == {cmd_module(s["cmd"]) for s in stages.values()} - OFF_IN_TINY_REPO
    for name, stage in stages.items():
        if name not in OFF_IN_TINY_REPO:
            check_stage_deps(name, stage, loaded[cmd_module(stage["cmd"])], tiny_repo)


@pytest.mark.repro
@pytest.mark.slow
def test_a_reporting_edit_reruns_the_report_and_a_training_edit_no_data_stage(tiny_repo, tmp_path):
    project = tmp_path / "project"
    env = {**copy_project(tiny_repo, project), "ABLATION_LAB_TRACKING": "0"}
    with open(project / "pipeline" / "reporting" / "tables.py", "a") as f:
        f.write("# an edit\n")
    assert set(json.loads(sh(["dvc", "status", "--json"], project, env).stdout)) == {"report"}
    sh(["git", "checkout", "--", "pipeline"], project, env)
    with open(project / "pipeline" / "training" / "optim.py", "a") as f:
        f.write("# an edit\n")
    # `dvc status` lists the stages whose own deps changed; the report follows once they rerun.
    stale = set(json.loads(sh(["dvc", "status", "--json"], project, env).stdout))
    assert stale == {f"{s}@{v}-0" for s in ("train", "evaluate") for v in ("baseline", "no_positional")} | {"knockout@0"}
