"""Real text read and scored as the dataset has it: newlines, raw references, ROUGE-Lsum, degeneracy."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sentencepiece as spm
import torch
import yaml
from scipy import stats as sps

from model import ModelConfig, build_model
from pipeline.params.data import check_local_paths
from pipeline.encode import encode
from pipeline.evaluate import evaluate
from pipeline.params import EvaluateParams, TrainBpeParams
from pipeline.report import render_report
from pipeline.reporting.study import Study, read_inputs
from pipeline.scoring.metrics import sentences, task_metrics
from pipeline.scoring.output_checks import flags, output_stats
from pipeline.train_bpe import file_sha256, train_tokenizer
from pipeline.training.batching import load_texts, read_manifest
from tests.fixtures.report.fake_runs import make_project

ROOT = Path(__file__).resolve().parents[1]
SPEECHES = ["First Citizen:\nBefore we proceed any further, hear me speak.",
            "All:\nSpeak,  speak.\n  Resolved.", "Second Citizen:\nOne word, good citizens."] * 20


def filtered(base: Path, splits: dict[str, tuple[list[str], list[str]]], task: str) -> Path:
    out = base / "filtered"
    out.mkdir(parents=True)
    for split, (src, tgt) in splits.items():
        pd.DataFrame({"source": src, "target": tgt}).to_parquet(out / f"{split}.parquet", index=False)
    (out / "meta.json").write_text(json.dumps({"source": "t", "task": task}))
    return out


@pytest.mark.parametrize("model_type, vocab", [("char", 200), ("bpe", 120)])
def test_tokenizer_keeps_newlines_and_spaces(tmp_path, model_type, vocab):
    data = filtered(tmp_path, {"train": ([""] * len(SPEECHES), SPEECHES)}, "language_modeling")
    train_tokenizer(data / "train.parquet", tmp_path / "tok", TrainBpeParams(model_type=model_type,
                                                                             vocab_size=vocab))
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "tok" / "spm.model"))
    for text in SPEECHES[:3] + ["Speak\n\nspeak  speak"]:
        assert sp.decode(sp.encode(text)) == text
    assert sp.piece_to_id("\n") != sp.unk_id()
    norm = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["normalization"]
    assert norm["rule"] == "identity" and "newline" in norm


def test_same_corpus_and_params_give_a_byte_identical_tokenizer(tmp_path):
    data = filtered(tmp_path, {"train": ([""] * len(SPEECHES), SPEECHES)}, "language_modeling")
    for name in ("a", "b"):
        train_tokenizer(data / "train.parquet", tmp_path / name, TrainBpeParams(vocab_size=120))
    assert file_sha256(tmp_path / "a" / "spm.model") == file_sha256(tmp_path / "b" / "spm.model")


def tiny_model(manifest: dict, arch: str = "encoder_decoder", zero: bool = False):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=manifest["vocab_size"], d_model=16, n_heads=2, n_encoder_layers=1,
                      n_decoder_layers=1, d_ff=32, dropout=0.0, arch=arch,
                      pad_id=manifest["pad_id"], bos_id=manifest["bos_id"], eos_id=manifest["eos_id"])
    model = build_model(cfg).eval()
    if zero:  # uniform logits: the same output for every input
        for p in model.parameters():
            torch.nn.init.zeros_(p)
    return model


def save_run(model, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()},
               run_dir / "model.pt")
    (run_dir / "train.json").write_text(json.dumps({"variant": "v", "seed": 0, "mlflow_run_id": None}))
    return run_dir


@pytest.fixture(scope="module")
def oov_shards(tmp_path_factory) -> Path:
    """Summaries whose test references hold a character ("Ω") the training text never has."""
    base = tmp_path_factory.mktemp("oov")
    articles = [f"Article {i} says that item {i} costs {i} coins ." for i in range(40)]
    summaries = [f"Item {i} costs {i} coins .\nIt is sold ." for i in range(40)]
    test_refs = [f"Ω item {i} costs {i} coins ." for i in range(6)]
    data = filtered(base, {"train": (articles, summaries), "validation": (articles[:4], summaries[:4]),
                           "test": (articles[:6], test_refs)}, "summarization")
    train_tokenizer(data / "train.parquet", base / "tokenizer", TrainBpeParams(vocab_size=80))
    encode(data, base / "tokenizer", base / "shards", shard_examples=16)
    return base


def test_references_and_sources_are_the_raw_dataset_text(oov_shards, tmp_path):
    manifest = read_manifest(oov_shards / "shards")
    src, tgt = load_texts(oov_shards / "shards", manifest, "test")
    assert tgt[0] == "Ω item 0 costs 0 coins ." and src[0].startswith("Article 0")
    run = save_run(tiny_model(manifest), tmp_path / "run")
    cfg = EvaluateParams(max_examples=6, max_new_tokens=8, n_samples=6, batch_size=3)
    evaluate(oov_shards / "shards", oov_shards / "tokenizer", run, tmp_path / "eval", cfg, 512, 32, 4)
    samples = json.loads((tmp_path / "eval" / "samples.json").read_text())
    assert [s["reference"] for s in samples] == tgt[:6]  # not " ⁇  item 0 ..."
    ev = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert "identity" in ev["normalization"] and "rougeLsum" in ev


def test_rouge_lsum_is_summary_level_over_sentences():
    ref = "Radcliffe turns 18 on Monday .\nHe gains access to a fortune ."
    pred = "He gains access to a fortune . Radcliffe turns 18 on Monday ."
    assert sentences(pred) == "He gains access to a fortune .\nRadcliffe turns 18 on Monday ."
    scores = task_metrics("summarization", [ref], [pred])
    # One LCS over the whole text only matches one sentence; per sentence, both match.
    assert scores["rougeLsum"] == pytest.approx(1.0) and scores["rougeL"] < 0.7


def test_degenerate_outputs_are_flagged_and_real_ones_are_not():
    dots = [". . . ."] * 8
    assert any("same text" in f for f in flags(output_stats(dots), 8))
    loops = [f"the cat {w} the cat {w} the cat {w} the cat {w}" for w in "abcdefgh"]
    assert any("3-grams repeat" in f for f in flags(output_stats(loops), 8))
    assert flags(output_stats(["e"] * 3 + ["f"]), 4)  # 75% identical
    real = ["Kavomir sold 12 lamps in Orlen .", "A dog runs through the snow .",
            "Zwei Männer stehen am Herd .", "The council voted to close the bridge .",
            "Rain is expected on Sunday ."]
    assert flags(output_stats(real), len(real)) == []
    assert flags(output_stats(dots[:3]), 3) == []  # too few outputs to judge


def test_a_constant_model_is_flagged_in_eval_json(oov_shards, tmp_path):
    manifest = read_manifest(oov_shards / "shards")
    run = save_run(tiny_model(manifest, zero=True), tmp_path / "run")
    cfg = EvaluateParams(max_examples=6, max_new_tokens=8, n_samples=2, batch_size=3)
    evaluate(oov_shards / "shards", oov_shards / "tokenizer", run, tmp_path / "eval", cfg, 512, 32, 4)
    ev = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert ev["outputs"]["identical_share"] == 1.0 and ev["degenerate"]


@pytest.mark.slow
def test_report_marks_metrics_of_degenerate_runs(tmp_path):
    p = make_project(tmp_path)
    path = p.evals / "no_ffn-1" / "eval.json"
    ev = json.loads(path.read_text())
    path.write_text(json.dumps({**ev, "degenerate": ["100% of outputs are the same text"],
                                "outputs": output_stats(["."] * 5)}))
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline")),
                  tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| no_ffn | ") and "(n=" in line)
    cells = row.strip("|").split(" | ")
    assert "⚠" in cells[-1] and "⚠" not in cells[1]  # the ROUGE cell, not val_loss
    assert "no_ffn: degenerate outputs" in md and "seed 1: 100% of outputs are the same text" in md
    assert "| no_ffn | 1 |" in md  # the output-checks table row


def test_local_paths_must_live_where_dvc_tracks_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "local").mkdir(parents=True)
    check_local_paths({"train": "data/local/a.txt", "test": {"source": "data/local/t.en",
                                                             "target": "data/local/t.de"}},
                      Path("data/local"))
    with pytest.raises(ValueError, match=r"^data.local.paths.validation: /elsewhere/v.txt is outside"):
        check_local_paths({"train": ["data/local/a.txt"], "validation": "/elsewhere/v.txt"},
                          Path("data/local"))


@pytest.mark.repro
@pytest.mark.slow
def test_editing_a_local_file_makes_dvc_rerun_download(tmp_path):
    project = tmp_path / "p"
    (project / "data" / "local").mkdir(parents=True)
    (project / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    for code in ("pipeline", "model"):  # model/: check_params validates the model settings
        os.symlink(ROOT / code, project / code)
    corpus = project / "data" / "local" / "stories.txt"
    corpus.write_text("One story.\n\nAnother story.\n\nA third.\n")
    (project / "params.yaml").write_text(json.dumps({
        "data": {"source": "local", "local": {"task": "language_modeling",
                                              "paths": {"train": "data/local/stories.txt"}}},
        "seeds": [0], "ablations": {"baseline": {}}, "lr_sweep": [], "scales": {}, "knockout": {"seeds": []},
        "decide": {"runs": {}},
        "report": {"baseline": "baseline"}}))  # dvc.yaml reads it for every knockout@<seed>, on or off
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    def dvc(*args: str) -> str:
        out = subprocess.run(["dvc", *args], cwd=project, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    dvc("init", "-q")
    dvc("repro", "download")
    assert "download" not in json.loads(dvc("status", "download", "--json"))
    corpus.write_text("One story, edited.\n\nAnother story.\n\nA third.\n")
    assert "download" in json.loads(dvc("status", "download", "--json"))


@pytest.mark.slow
def test_report_compares_the_baseline_with_a_stated_reference(tmp_path):
    p = make_project(tmp_path)
    values = np.array([p.eval_values[("baseline", s)]["val_loss"] for s in p.seeds])
    ref = values + np.array([0.5, 0.45, 0.56])  # a reference measured on three runs of its own

    def reference_lines(reference: dict) -> list[str]:
        render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline",
                                        reference=reference)), tmp_path / "r")
        md = (tmp_path / "r" / "report.md").read_text()
        start = md.index("## Reference")
        return md[start:md.index("##", start + 3)].splitlines()

    lines = reference_lines({"metric": "val_loss", "value": float(values.mean() + 0.5), "source": "a paper"})
    assert any("at or better than the reference by 0.5; not tested: the reference gives no spread" in x for x in lines)
    lines = reference_lines({"metric": "val_loss", "value": float(ref.mean()), "std": float(ref.std(ddof=1)),
                             "n": 3, "source": "a paper", "description": "whole split"})
    assert any(x.startswith("Reference (a paper): val_loss = ") and "Measured: whole split." in x for x in lines)
    test = sps.ttest_ind(values, ref, equal_var=False)
    low, high = test.confidence_interval(0.95)
    line = next(x for x in lines if x.startswith("baseline, val_loss: "))  # our same quantity: whole split
    assert f"Difference baseline − reference: {values.mean() - ref.mean():.3g}, 95% CI [{low:.3g}, {high:.3g}]" in line
    p_text = "<0.001" if test.pvalue < 0.001 else f"{test.pvalue:.3f}"
    assert f"Welch t-test p = {p_text}" in line and line.endswith(": better.")


@pytest.mark.slow
def test_the_report_stage_leaves_committed_study_reports_alone(tmp_path):
    p = make_project(tmp_path)
    study = tmp_path / "reports" / "studies" / "x" / "report.md"
    study.parent.mkdir(parents=True)
    study.write_text("a committed study")
    render_report(read_inputs(Study(p.runs, p.evals, p.filter_metrics, p.variants, p.seeds, "baseline")),
                  tmp_path / "reports")
    assert study.read_text() == "a committed study" and (tmp_path / "reports" / "report.md").exists()
    assert [c.name for c in (tmp_path / "reports").iterdir() if c.name.startswith(".")] == []
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["report"]
    outs = [next(iter(o)) if isinstance(o, dict) else o for o in stage["outs"]]
    assert all(o.startswith("reports/") and not o.startswith("reports/studies") for o in outs)
