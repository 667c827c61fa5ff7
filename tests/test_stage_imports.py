"""Each stage pays only for what it uses: the libraries a stage's process loads beyond its work, and
that the lighter ways in give the same results (benchmarks/stage_overhead.py measures the seconds)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.training.batching import load_split, load_texts, read_manifest
from tests.tiny_project import ROOT, tiny_params

pytestmark = pytest.mark.multiprocess  # each test imports in a fresh Python process

REFERENCES = ["The cats were running home.\nThey liked the fish.", "A dog barked loudly at the mailman today."]
PREDICTIONS = ["the cat ran home. they like fishes", "dogs bark at mailmen"]
# Libraries of other stages: the report's (pandas, matplotlib, scipy, MLflow) and nltk's whole
# package with scikit-learn, which rouge-score's stemmer does not need; and torch's compiler front
# end, which an eager run never uses (torch.optim's optimizers import it: ~1.5 s a train stage).
NOT_IN_A_RUN_STAGE = {"mlflow", "pandas", "matplotlib", "scipy", "sklearn", "nltk", "pyarrow.dataset", "torch._dynamo"}

ATEXIT = """
import atexit, json, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted(sys.modules))))
"""


def run_python(code: str, cwd: Path = ROOT) -> tuple[str, set[str]]:
    """stdout of `python -c code` in a fresh process, and the modules it had loaded when it exited."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", ATEXIT + code], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out, _, modules = proc.stdout.rpartition("MODULES ")
    return out, set(json.loads(modules))


def test_rouge_loads_the_porter_stemmer_not_nltk_whole():
    score = f"""
from pipeline.scoring.metrics import task_metrics
print(repr(task_metrics("summarization", {REFERENCES!r}, {PREDICTIONS!r})))
"""
    light, modules = run_python(score)
    assert "nltk.stem.porter" in modules and not modules & {"sklearn", "scipy", "nltk"}
    plain, modules = run_python("import nltk\n" + score)  # nltk already loaded: the plain import
    assert "sklearn" in modules and light == plain and "rouge1" in light
    # The bare packages are gone afterwards: a later `import nltk` gets the whole package.
    out, _ = run_python(score + "import nltk\nprint(hasattr(nltk, 'sent_tokenize'))")
    assert out.strip().endswith("True")


def test_shards_are_read_without_pandas_and_equal_pyarrows_own_conversion(tiny_shards):
    shards = tiny_shards / "shards"
    out, modules = run_python(f"""
from pathlib import Path
from pipeline.training.batching import load_split, load_texts, read_manifest
shards = Path({str(shards)!r})
manifest = read_manifest(shards)
for split in ("train", "validation", "test"):
    load_split(shards, manifest, split)
load_texts(shards, manifest, "test")
""")
    assert not modules & {"pandas", "pyarrow.dataset"}
    manifest = read_manifest(shards)
    for split in ("train", "validation", "test"):
        got, want = load_split(shards, manifest, split), ([], [])
        for name in manifest["splits"][split]["files"]:
            table = pq.read_table(shards / name, columns=["src_ids", "tgt_ids"])
            for column, rows in zip(("src_ids", "tgt_ids"), want):
                col = table.column(column).combine_chunks()
                values, offsets = col.values.to_numpy(zero_copy_only=False), col.offsets.to_numpy()
                rows.extend(values[offsets[i]:offsets[i + 1]] for i in range(len(col)))
        for have, expected in zip((got.src, got.tgt), want):
            assert len(have) == len(expected) > 0
            assert all(a.dtype == b.dtype and np.array_equal(a, b) and not a.flags.writeable
                       for a, b in zip(have, expected))
    assert load_texts(shards, manifest, "test", limit=5)[1] == \
        pq.read_table(shards / manifest["splits"]["test"]["files"][0]).column("tgt_text").to_pylist()[:5]


@pytest.mark.slow
def test_train_evaluate_and_knockout_processes_load_no_other_stages_libraries(tiny_shards, tmp_path):
    """The three stages a study runs once per run (or seed), as dvc.yaml runs them, each in its own
    process: none loads the report's libraries, MLflow (the report mirrors; live tracking is off)
    or nltk whole."""
    params = tiny_params(seeds=[0], knockout={"seeds": [0], "max_examples": 2})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    common = ["--params", str(tmp_path / "params.yaml"), "--shards", str(tiny_shards / "shards")]
    run = str(tmp_path / "runs" / "baseline-0")
    stages = {
        "train": [*common, "--variant", "baseline", "--seed", "0", "--out", run, "--checkpoints", str(tmp_path / "ckpt")],
        "evaluate": [*common, "--tokenizer", str(tiny_shards / "tokenizer"), "--run", run, "--out", str(tmp_path / "ev")],
        "knockout": [*common, "--tokenizer", str(tiny_shards / "tokenizer"), "--seed", "0", "--run", run,
                     "--out", str(tmp_path / "ko")],
    }
    for stage, argv in stages.items():
        _, modules = run_python(f"import runpy, sys\nsys.argv = {['x', *argv]!r}\n"
                                f"runpy.run_module('pipeline.{stage}', run_name='__main__')", cwd=tmp_path)
        assert "torch" in modules and "pipeline.training.batching" in modules  # it ran: it loaded its work
        assert not modules & NOT_IN_A_RUN_STAGE, f"{stage} loaded {sorted(modules & NOT_IN_A_RUN_STAGE)}"
    assert "rouge1" in json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert "rouge1" in json.loads((tmp_path / "ko" / "knockout.json").read_text())["base"]


def test_check_params_validates_the_model_and_knockouts_without_torch(tmp_path):
    """The first stage of every `dvc repro` checks the model and knockout sections from their
    configs alone (model/config.py, model/knockout_plan.py): no torch, ~1 s sooner to a typo's
    error. A knock-out part the baseline lacks is still an error naming its key."""
    params = tiny_params(seeds=[0], knockout={"seeds": [0]})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "local").mkdir()
    argv = ["x", "--params", str(tmp_path / "params.yaml"), "--out", str(tmp_path / "checked"),
            "--local-root", str(tmp_path / "local")]
    _, modules = run_python(f"import runpy, sys\nsys.argv = {argv!r}\n"
                            f"runpy.run_module('pipeline.check_params', run_name='__main__')", cwd=tmp_path)
    assert (tmp_path / "checked").exists() and "model.knockout_plan" in modules
    assert "torch" not in modules, sorted(m for m in modules if m.startswith("torch"))[:5]
    params["ablations"]["baseline"] = {"model": {"residual": False}}
    params["knockout"]["parts"] = ["residual"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "pipeline.check_params", *argv[1:]], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1 and "knockout.parts" in proc.stderr, proc.stderr
