"""The train stage around the loop: FLOP budgets, diverged sweep runs, the outputs it writes and
what they record (FLOPs per token, the machine's load), language models from the token files."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.train import run
from pipeline.training import trainer
from pipeline.training.batching import load_split, read_manifest
from tests.test_batching import lm_shards
from tests.test_trainer import resolved, tiny_train


@pytest.fixture(autouse=True)
def no_mlflow(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")


@pytest.mark.slow
def test_a_flop_budget_gives_a_variant_cheaper_per_token_more_tokens(tiny_shards, tmp_path):
    shards = tiny_shards / "shards"
    out = {name: run(shards, name, 0, resolved(model, budget_flops=2e9), "x", tmp_path / f"r-{name}", tmp_path / f"c-{name}")
           for name, model in {"base": {}, "wide_ffn": {"d_ff": 256}}.items()}
    base, wide = out["base"], out["wide_ffn"]
    assert wide["flops_per_token"] > 1.5 * base["flops_per_token"]
    assert base["tokens_trained"] > 1.5 * wide["tokens_trained"]
    for m in out.values():  # each trains to the budget, give or take its last step's tokens
        assert m["tokens_trained"] >= int(2e9 // m["flops_per_token"])
        assert 2e9 <= m["flops_trained"] < 2e9 + 600 * m["flops_per_token"]


def test_a_diverging_sweep_rate_is_recorded_and_evaluated_as_diverged(tiny_shards, tmp_path):
    from pipeline.evaluate import evaluate
    from pipeline.params import EvaluateParams

    settings = resolved(lr=1e30, clip_grad_norm=None, warmup_steps=0, schedule="constant")
    with pytest.raises(trainer.NonFiniteLoss):  # a main run that diverges stops the pipeline
        run(tiny_shards / "shards", "v", 0, settings, "x", tmp_path / "main", tmp_path / "c-main")
    info = run(tiny_shards / "shards", "v", 0, settings, "x", tmp_path / "lr", tmp_path / "c-lr", point={"lr": 1e30})
    assert info["diverged"].startswith("non-finite")
    written = json.loads((tmp_path / "lr" / "train.json").read_text())
    assert written["lr"] == 1e30 and written["diverged"].startswith("non-finite") and not (tmp_path / "lr" / "model.pt").exists()
    ev = evaluate(tiny_shards / "shards", tiny_shards / "tokenizer", tmp_path / "lr", tmp_path / "eval", EvaluateParams(),
                  600, 64, 8)
    assert ev["diverged"] == written["diverged"] and "val_loss" not in ev
    assert json.loads((tmp_path / "eval" / "eval.json").read_text()) == ev


def test_outputs_and_checkpoints_load_with_weights_only(tiny_shards, capsys):
    out, ckpt = tiny_shards / "o", tiny_shards / "co"
    metrics = run(tiny_shards / "shards", "v", 0, resolved(keep_checkpoints=2), "x", out, ckpt)
    # Not a terminal: plain progress lines, each with the ETA.
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == -(-metrics["steps"] // 2)
    assert all(re.search(r"loss [\d.]+ lr \S+ tokens/s [\d,]+ ETA \d+:\d\d:\d\d$", line) for line in lines)
    state = torch.load(out / "model.pt", weights_only=True)
    assert state["model_config"]["d_model"] == 32
    saved = sorted(ckpt.iterdir())
    assert len(saved) == 2  # only the last K are kept
    torch.load(saved[-1], weights_only=True)
    info = json.loads((out / "train.json").read_text())
    assert info["params_total"] == info["params_by_component"]["total"] > 0
    assert info["mfu"] is None or 0 < info["mfu"] < 1
    assert info["threads"] == torch.get_num_threads() >= 1
    assert 0 <= info["padding_ratio"] < 0.5
    assert 0 <= info["load"]["others_cpu_share"] <= 1
    assert info["batch_shape_mean"] == pytest.approx(planned_mean_batch(tiny_shards / "shards", metrics["steps"]))
    rows = (out / "val_curve.csv").read_text().splitlines()
    assert rows[0] == "step,tokens,val_loss" and len(rows) - 1 == -(-metrics["steps"] // 5)


def planned_mean_batch(shards: Path, steps: int) -> list[float]:
    """Rows, source and target length (padded, target + BOS) of the first `steps` batches of the
    train stage's plan at tiny_train's settings, averaged."""
    manifest = read_manifest(shards)
    split = load_split(shards, manifest, "train")
    cfg = tiny_train()
    data = trainer.Data(task=manifest["task"], train=split, val=None, batch_tokens=cfg["batch_tokens"],
                        ids={k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")},
                        batch_size=cfg["batch_size"], context=cfg["context"], seed=0)
    shapes, epoch = [], 0
    while len(shapes) < steps:
        shapes += [(len(idx), max(1, max(len(split.src[i]) for i in idx)), max(len(split.tgt[i]) for i in idx) + 1)
                   for idx in data.epoch(epoch)]
        epoch += 1
    return np.mean(shapes[:steps], axis=0).tolist()


def test_a_run_too_short_to_checkpoint_still_creates_its_checkpoint_directory(tiny_shards, tmp_path):
    """The directory is a DVC output of the train stage: DVC fails a stage whose output is missing."""
    ckpt = tmp_path / "ckpt"
    run(tiny_shards / "shards", "v", 0, resolved(budget_steps=3, checkpoint_every=100), "x", tmp_path / "out", ckpt)
    assert ckpt.is_dir() and not list(ckpt.glob("step-*.pt"))


def test_language_modelling_trains_from_the_token_files(tmp_path):
    shards = lm_shards(tmp_path / "shards")
    cfg = resolved({"arch": "decoder_only"}, context=16, batch_size=4, budget_tokens=640, eval_examples=8)
    metrics = run(shards, "lm", 0, cfg, "x", tmp_path / "out", tmp_path / "ckpt" / "lm-0")
    assert metrics["tokens_trained"] == metrics["steps"] * 4 * 16 >= 640
    assert np.isfinite(metrics["val_loss"]) and metrics["padding_ratio"] == 0.0
    assert metrics["batch_shape_mean"] == [4, 0, 16]  # rows x context, no source
    assert list((tmp_path / "ckpt" / ".token-cache").glob("*.tokens"))  # next to the checkpoints, shared by runs


def test_keep_best_writes_the_kept_model_and_the_last_steps_beside_it(tmp_path):
    """train.keep = best: model.pt holds the best in-loop estimate's weights, last.pt the last
    step's, and train.json says which step was kept (a high rate on a tiny stream overfits)."""
    from pipeline.training.checkpoint import LAST_MODEL

    shards = lm_shards(tmp_path / "shards")
    settings = resolved({"arch": "decoder_only", "dropout": 0.0, "n_decoder_layers": 1},
                        keep="best", eval_windows="random", budget_tokens=16 * 8 * 40, batch_size=8, context=16,
                        lr=5e-2, eval_every=4, warmup_steps=0)
    info = run(shards, "v", 0, settings, "x", tmp_path / "out", tmp_path / "ck")
    assert (info["keep"], info["eval_windows"]) == ("best", "random")
    rows = [line.split(",") for line in (tmp_path / "out" / "val_curve.csv").read_text().splitlines()[1:]]
    best = min(rows, key=lambda r: float(r[2]))
    assert info["kept_step"] == int(best[0]) and info["val_estimate_best"] == pytest.approx(float(best[2]))
    written = json.loads((tmp_path / "out" / "train.json").read_text())
    assert written["kept_step"] == info["kept_step"] and "last_state" not in written
    kept = torch.load(tmp_path / "out" / "model.pt", weights_only=True)["state_dict"]
    assert info["kept_step"] < info["steps"]  # this run's best is before its end (seeded: it always is)
    last = torch.load(tmp_path / "out" / LAST_MODEL, weights_only=True)["state_dict"]
    assert any(not torch.equal(kept[k], last[k]) for k in kept)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_flops_per_target_token_matches_the_6n_formula(arch, positional):
    """With source length = target length, both architectures reduce to the PaLM count:
    6 x (non-embedding weights + output projection) + 12 x layers x d_model x keys per query."""
    from model import ModelConfig, build_model
    from pipeline.train import flops_per_target_token

    cfg = ModelConfig(vocab_size=97, d_model=32, n_heads=2, n_encoder_layers=2, n_decoder_layers=3, d_ff=64,
                      arch=arch, positional=positional)
    model = build_model(cfg)
    counts = model.param_counts()
    weights = counts["total"] - counts["embeddings"]  # token and learned position tables are lookups
    head = 6 * 32 * 97
    if arch == "encoder_decoder":  # encoder on S=10 source tokens, decoder self (10) + cross (10) keys
        expected = 6 * weights + 12 * 32 * (2 * 10 + 3 * 20) + head
    else:  # one 20-token sequence per 10 target tokens: the stack runs twice per target token
        expected = 2 * (6 * weights + 12 * 3 * 32 * 20) + head
    assert flops_per_target_token(model, cfg, 10.0, 10.0) == pytest.approx(expected)
    lm = flops_per_target_token(model, cfg, 0.0, 64.0)  # language modelling: context 64, no source
    if arch == "decoder_only":
        assert lm == pytest.approx(6 * weights + 12 * 3 * 32 * 64 + head)


def test_others_cpu_share_is_the_machines_busy_time_less_this_process():
    from pipeline.train import cpu_seconds, others_cpu_share

    cores = os.cpu_count()
    # 10 s of wall: the machine was busy 14 s, this process 4 s of it: others had 10 of cores x 10 s.
    assert others_cpu_share((100.0, 1.0), (114.0, 5.0), 10.0) == pytest.approx(round(10 / (10 * cores), 4))
    assert others_cpu_share((100.0, 1.0), (104.0, 5.0), 10.0) == 0.0  # alone
    assert others_cpu_share(None, (1.0, 1.0), 10.0) is None
    start = cpu_seconds()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # spin: this process's own CPU time grows, not others'
        pass
    end = cpu_seconds()
    assert start is not None and end[1] - start[1] >= 0.2 and end[0] - start[0] >= 0.15
