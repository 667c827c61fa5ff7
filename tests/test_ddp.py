"""The train stage under torchrun: 2 CPU ranks with the Gloo backend, the real CLI path.

W ranks with grad_accum A must train exactly like one process with grad_accum A x W (same plan,
same token-weighted gradients), only rank 0 writes, and every rank resumes from rank 0's checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from pipeline.train import run
from test_trainer import TINY_MODEL, resolved, tiny_train

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]  # two ranks: two processes


@pytest.fixture(autouse=True)
def no_mlflow(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")


def torchrun(tmp_path: Path, shards: Path, name: str, model: dict, ckpt: str | None = None,
             **train_over) -> subprocess.CompletedProcess:
    params = tmp_path / f"params-{name}.yaml"
    params.write_text(yaml.safe_dump({"model": {**TINY_MODEL, **model}, "train": tiny_train(**train_over),
                                      "seeds": [0], "ablations": {"baseline": {}}}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "pipeline.train", "--params", str(params), "--shards", str(shards), "--variant", "baseline",
           "--seed", "0", "--out", str(tmp_path / name), "--checkpoints", str(tmp_path / (ckpt or f"ckpt-{name}"))]
    env = {**os.environ, "ABLATION_LAB_TRACKING": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]


def test_two_ranks_train_like_one_process_with_double_accumulation(tiny_shards, tmp_path):
    shards = tiny_shards / "shards"
    # No dropout: the ranks' dropout masks differ from the single process's by design.
    single = run(shards, "baseline", 0, resolved({"dropout": 0.0}, grad_accum=2), "x", tmp_path / "single",
                 tmp_path / "ckpt-single")
    done = torchrun(tmp_path, shards, "ddp", {"dropout": 0.0}, grad_accum=1)
    ddp = json.loads((tmp_path / "ddp" / "train.json").read_text())
    assert ddp["world_size"] == 2
    assert (ddp["steps"], ddp["tokens_trained"]) == (single["steps"], single["tokens_trained"])
    assert ddp["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=1e-5)
    assert ddp["padding_ratio"] == pytest.approx(single["padding_ratio"])  # both ranks' batches counted
    tokens = [line.split(",")[:2] for line in (tmp_path / "ddp" / "train_curve.csv").read_text().splitlines()]
    assert tokens == [line.split(",")[:2] for line in (tmp_path / "single" / "train_curve.csv").read_text().splitlines()]
    a, b = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)
    # Rank 0 alone logs and writes: one plan line, one summary, no stray temp files.
    out = done.stdout + done.stderr
    assert out.count("training ") == 1 and out.count("baseline-0: val_loss") == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_every_rank_resumes_from_rank_zeros_checkpoint(tiny_shards, tmp_path):
    """With dropout on, an exact match needs each rank's own RNG state back, not rank 0's."""
    shards = tiny_shards / "shards"
    train = {"budget_steps": 12, "checkpoint_every": 5, "keep_checkpoints": 1}
    torchrun(tmp_path, shards, "whole", {"dropout": 0.1}, **train)
    ckpt = tmp_path / "ckpt-whole"
    assert [p.name for p in ckpt.iterdir()] == ["step-00000010.pt"]
    shutil.copytree(ckpt, tmp_path / "ckpt-again")
    done = torchrun(tmp_path, shards, "again", {"dropout": 0.1}, ckpt="ckpt-again", **train)
    assert "resumed from step 10" in done.stdout
    whole = json.loads((tmp_path / "whole" / "train.json").read_text())
    again = json.loads((tmp_path / "again" / "train.json").read_text())
    for key in ("train_loss", "val_loss", "tokens_trained", "steps", "padding_ratio"):
        assert whole[key] == again[key], key
    for name in ("train_curve.csv", "val_curve.csv"):
        assert (tmp_path / "whole" / name).read_text() == (tmp_path / "again" / name).read_text()
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "again")
    assert all(torch.equal(a[k], b[k]) for k in a)
