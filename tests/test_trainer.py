"""The training engine: fair budgets, determinism, exact resume after SIGKILL, the NaN guard."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pipeline import trainer
from pipeline.batching import load_split, read_manifest
from pipeline.optim import lr_factor, param_groups
from pipeline.params import TrainParams
from pipeline.train import build, run

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
              "dropout": 0.1}


def tiny_train(**over) -> dict:
    cfg = TrainParams(budget_tokens=3000, batch_tokens=600, eval_every=5, eval_examples=16, log_every=2,
                      checkpoint_every=4, warmup_steps=2, device="cpu").model_dump()
    cfg.update(over)
    return cfg


def resolved(model=None, **train_over) -> dict:
    from pipeline.params import model_fields

    return {"model": {**model_fields(), **TINY_MODEL, **(model or {})}, "train": tiny_train(**train_over)}


@pytest.fixture(autouse=True)
def no_mlflow(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")


def test_every_variant_gets_the_same_token_budget(tiny_shards):
    shards = tiny_shards / "shards"
    out = {}
    for name, model in {"base": {}, "dec": {"arch": "decoder_only"}, "nopos": {"positional": "none"}}.items():
        out[name] = run(shards, name, 0, resolved(model), "x", tiny_shards / f"r-{name}", tiny_shards / f"c-{name}")
    tokens = {m["tokens_trained"] for m in out.values()}
    assert len(tokens) == 1 and tokens.pop() >= 3000
    assert len({m["steps"] for m in out.values()}) == 1


def test_same_seed_same_metrics_different_seed_different(tiny_shards):
    shards = tiny_shards / "shards"
    a = run(shards, "v", 1, resolved(), "x", tiny_shards / "a", tiny_shards / "ca")
    b = run(shards, "v", 1, resolved(), "x", tiny_shards / "b", tiny_shards / "cb")
    c = run(shards, "v", 2, resolved(), "x", tiny_shards / "c", tiny_shards / "cc")
    assert a["val_loss"] == b["val_loss"] and a["train_loss"] == b["train_loss"]
    assert (tiny_shards / "a" / "train_curve.csv").read_text() == (tiny_shards / "b" / "train_curve.csv").read_text()
    assert a["val_loss"] != c["val_loss"]


def test_outputs_and_checkpoints_load_with_weights_only(tiny_shards):
    out, ckpt = tiny_shards / "o", tiny_shards / "co"
    metrics = run(tiny_shards / "shards", "v", 0, resolved(keep_checkpoints=2), "x", out, ckpt)
    state = torch.load(out / "model.pt", weights_only=True)
    assert state["model_config"]["d_model"] == 32
    saved = sorted(ckpt.iterdir())
    assert len(saved) == 2  # only the last K are kept
    torch.load(saved[-1], weights_only=True)
    info = json.loads((out / "train.json").read_text())
    assert info["params_total"] == info["params_by_component"]["total"] > 0
    assert info["mfu"] is None or 0 < info["mfu"] < 1
    assert 0 <= info["padding_ratio"] < 0.5
    rows = (out / "val_curve.csv").read_text().splitlines()
    assert rows[0] == "step,tokens,val_loss" and len(rows) - 1 == -(-metrics["steps"] // 5)


def test_non_finite_loss_stops_with_the_step(tiny_shards):
    with pytest.raises(trainer.NonFiniteLoss, match=r"step \d+"):
        run(tiny_shards / "shards", "v", 0, resolved(lr=1e30, clip_grad_norm=None, warmup_steps=0, schedule="constant"),
            "x", tiny_shards / "nan", tiny_shards / "cnan")
    assert not (tiny_shards / "nan").exists()  # no half-written output


def test_schedules():
    assert lr_factor(0, "cosine", 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, "cosine", 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(100, "cosine", 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(55, "linear", 10, 100, 0.0) == pytest.approx(0.5)
    assert lr_factor(39, "inverse_sqrt", 10, 100, 0.0) == pytest.approx(0.5)
    assert lr_factor(50, "constant", 10, 100, 0.0) == 1.0


def test_no_weight_decay_on_norms_biases_and_embeddings(tiny_shards):
    manifest = read_manifest(tiny_shards / "shards")
    _, model = build(resolved()["model"], manifest)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim == 2 and "embed" not in names[id(p)] for p in decay["params"])
    assert any("norm" in names[id(p)] for p in no_decay["params"])
    assert no_decay["weight_decay"] == 0.0


def write_params(path: Path) -> None:
    import yaml

    params = {"model": TINY_MODEL, "train": {**tiny_train(budget_steps=120, checkpoint_every=10, eval_every=20),
                                             "betas": [0.9, 0.98]},
              "seeds": [0], "ablations": {"baseline": {}}}
    path.write_text(yaml.safe_dump(params))


@pytest.mark.slow
def test_sigkill_midway_then_rerun_equals_uninterrupted(tiny_shards, tmp_path):
    params = tmp_path / "params.yaml"
    write_params(params)
    env = {**os.environ, "ABLATION_LAB_TRACKING": "0"}

    def cmd(name):
        return [sys.executable, "-m", "pipeline.train", "--params", str(params), "--shards",
                str(tiny_shards / "shards"), "--variant", "baseline", "--seed", "0",
                "--out", str(tmp_path / name), "--checkpoints", str(tmp_path / f"ckpt-{name}")]

    subprocess.run(cmd("whole"), check=True, cwd=ROOT, env=env, capture_output=True)
    proc = subprocess.Popen(cmd("killed"), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt = tmp_path / "ckpt-killed"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.is_dir() and any(p.name >= "step-00000030.pt" for p in ckpt.glob("step-*.pt")):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    assert proc.wait() == -signal.SIGKILL, "training finished before it could be killed"
    assert not (tmp_path / "killed").exists()
    resumed = subprocess.run(cmd("killed"), check=True, cwd=ROOT, env=env, capture_output=True, text=True)
    assert "resumed from step" in resumed.stdout
    whole = json.loads((tmp_path / "whole" / "train.json").read_text())
    again = json.loads((tmp_path / "killed" / "train.json").read_text())
    for key in ("train_loss", "val_loss", "tokens_trained", "steps"):
        assert whole[key] == again[key], key
    for name in ("train_curve.csv", "val_curve.csv"):
        assert (tmp_path / "whole" / name).read_text() == (tmp_path / "killed" / name).read_text()
    w = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)["state_dict"]
    k = torch.load(tmp_path / "killed" / "model.pt", weights_only=True)["state_dict"]
    assert w.keys() == k.keys() and all(torch.equal(w[n], k[n]) for n in w)
