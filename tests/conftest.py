"""Shared fixtures: tiny versions of the real pipeline's data, made on the fly in tmp dirs."""
from __future__ import annotations

import ast
import os
import re
import subprocess
from pathlib import Path

import pytest

import pipeline  # noqa: F401  (first: pins the CPU kernels' code path before torch is imported)

ROOT = Path(__file__).resolve().parents[1]
# torch and the stages are imported where a process runs tests (pytest_configure, the fixtures), not
# at this module's import: pytest-xdist's controller imports this module too, before it starts its
# workers, and runs no test (torch, pandas, pyarrow, sentencepiece: ~3 s of the quick tier's start).


@pytest.fixture
def torch_fused_kernel():
    """CPU attention on torch's fused kernel, as cfg says, not the written-out formula that
    cpu_numerics.engage routes it to: for the tests that compare the two."""
    from model import exact

    routed = "cpu" in exact.WRITTEN_OUT_ON
    exact.WRITTEN_OUT_ON.discard("cpu")
    yield
    if routed:
        exact.WRITTEN_OUT_ON.add("cpu")


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Test tensors are tiny: thread hand-offs cost more than the maths on a 2-core machine.
    Stages started as subprocesses set their own thread count from params (train.threads)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Stages (and the subprocesses tests start) cache into a temporary folder, not the user's home."""
    old = os.environ.get("ABLATION_LAB_CACHE")
    os.environ["ABLATION_LAB_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        del os.environ["ABLATION_LAB_CACHE"]
    else:
        os.environ["ABLATION_LAB_CACHE"] = old


@pytest.fixture(autouse=True, scope="session")
def _private_hub(tmp_path_factory):
    """The Hugging Face Hub's client (the hub sources' downloads) caches into a temporary HF_HOME,
    with no token and its endpoint a closed port on 127.0.0.1: a test that forgets to point
    HF_ENDPOINT at its own server fails at once instead of reaching the hub. Imported here, after
    the environment is set, so the client's import-time constants are these too."""
    from tests.fixtures.sources.server import closed_port_url

    names = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN",
             "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
             "HF_HUB_DISABLE_TELEMETRY")
    old = {name: os.environ.pop(name, None) for name in names}
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf_home"))
    os.environ["HF_ENDPOINT"] = closed_port_url("").rstrip("/")
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"  # no user-agent probing (it asks the endpoint)
    import huggingface_hub.constants  # noqa: F401
    yield
    for name, value in old.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


@pytest.fixture(autouse=True, scope="session")
def _cold_stages():
    """A `dvc repro` a test runs starts no warm server of its own (pipeline/warm/auto.py): dozens of
    small studies would each import torch and the rest once more beside the suite. The warm path
    is tested where it is the subject: tests/test_warm_auto.py (plain `dvc repro`, against cold)
    and tests/test_warm.py (the launcher's)."""
    old = os.environ.get("ABLATION_LAB_WARM")
    os.environ["ABLATION_LAB_WARM"] = "0"
    yield
    if old is None:
        del os.environ["ABLATION_LAB_WARM"]
    else:
        os.environ["ABLATION_LAB_WARM"] = old


# The quick tier (`pytest --quick`; `bash run.sh test quick` on a pytest-xdist worker a core): every
# test but these, each worker in its own process.
OUT_OF_QUICK = ("slow", "multiprocess", "repro", "kill", "browser", "gpu")
QUICK = f"not ({' or '.join(OUT_OF_QUICK)})"
# What a test in it may not start (by executable name; os.fork too): our code or a tool of the study
# in another process. A test that does is marked `multiprocess` (or `repro`, `kill`, `browser`).
# Other tools the code under test calls now and then (git for a commit id, g++, fc-list) pass.
NOT_IN_QUICK = re.compile(r"(python[\d.]*|bash|sh|dash|dvc|torchrun|mlflow|chromium.*|google-chrome)")


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help=f"the quick tier: only tests that are `{QUICK}`; a test in it that starts a "
                          "Python, shell, DVC or browser process, or forks, fails, naming the marker it needs")


def _marked_out_of_quick(path: Path) -> bool:
    """Whether the module's own `pytestmark` names a marker the quick tier leaves out (then every
    test in it is): read from its source, so the tier does not import it."""
    source = path.read_text(encoding="utf-8")
    if "pytestmark" not in source:
        return False
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            names = {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
            return bool(names & set(OUT_OF_QUICK))
    return False


def pytest_ignore_collect(collection_path, config):
    """Under --quick, a module marked out of the tier as a whole is not even imported: its imports
    (MLflow, a browser driver, torch._dynamo) cost every worker seconds for tests it would deselect."""
    if config.getoption("quick") and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return _marked_out_of_quick(collection_path) or None  # None: pytest's own rules decide
    return None


def pytest_configure(config):
    controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")
    if not controller:  # pytest-xdist's controller starts the workers and runs no test
        from pipeline import cpu_numerics

        cpu_numerics.engage()  # the suite runs models on the kernels the stages run them on
    if not config.getoption("quick"):
        return
    asked = config.option.markexpr
    config.option.markexpr = f"({QUICK}) and ({asked})" if asked else QUICK
    if controller:
        return  # each worker is guarded

    def refuse(what: str):
        raise RuntimeError(f"the quick tier starts no other process, and this test started {what}: "
                           "mark it multiprocess (or repro, kill, browser) in its file")

    execute_child = subprocess.Popen._execute_child

    def guarded(self, args, executable, *rest, **kwargs):
        if isinstance(args, (str, bytes)):  # a command line (shell=True): its first word
            first = (os.fsdecode(args).split() or [""])[0]
        else:
            first = os.fsdecode(args if isinstance(args, os.PathLike) else args[0])
        program = os.fsdecode(executable) if executable else first
        if NOT_IN_QUICK.fullmatch(os.path.basename(program)):
            refuse(f"`{program}`")
        return execute_child(self, args, executable, *rest, **kwargs)

    def fork():
        refuse("a fork")

    subprocess.Popen._execute_child = guarded
    os.fork = fork  # multiprocessing's fork context too; the process ends with the session


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory) -> Path:
    """raw -> filtered -> tokenizer -> shards for 300 synthetic examples (built once per session)."""
    from pipeline.download import write_synthetic
    from pipeline.encode import encode
    from pipeline.filter import filter_files
    from pipeline.params import FilterParams, TrainBpeParams
    from pipeline.train_bpe import train_tokenizer

    base = tmp_path_factory.mktemp("tiny")
    write_synthetic(base / "raw", n_examples=300, seed=7)
    filter_files(base / "raw", base / "filtered", FilterParams(max_source_tokens=100, max_target_tokens=40))
    train_tokenizer(base / "filtered" / "train.parquet", base / "tokenizer", TrainBpeParams(vocab_size=150))
    encode(base / "filtered", base / "tokenizer", base / "shards", shard_examples=100)
    return base


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory) -> Path:
    """A tiny project after `dvc repro` (one seed, two variants), committed to git, MLflow off.
    Tests that edit it take a copy (tests.tiny_project.copy_project). Every stage process records
    the project files it loaded in ../imports/ (tests.tiny_project.record_imports)."""
    from tests.tiny_project import make_project, record_imports, sh, tiny_params

    project = tmp_path_factory.mktemp("tiny_repo") / "project"
    env = {**make_project(project, tiny_params(seeds=[0])), "ABLATION_LAB_TRACKING": "0"}
    (project / ".gitignore").write_text("mlflow.db\nmlflow.db.lock\nmlruns/\ndata/checkpoints/\n")
    sh(["dvc", "repro"], project, {**env, **record_imports(project.parent / "imports")})
    sh(["git", "add", "-A"], project, env)
    sh(["git", "commit", "-qm", "tiny study"], project, env)
    return project
