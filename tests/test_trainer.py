"""The training engine: fair budgets, determinism, exact resume after SIGKILL, the NaN guard."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.params import TrainParams
from pipeline.train import build, run
from pipeline.training import trainer
from pipeline.training.batching import load_split, read_manifest
from pipeline.training.optim import lr_factor, param_groups

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
              "dropout": 0.1}


def tiny_train(**over) -> dict:
    cfg = TrainParams(budget_tokens=3000, batch_tokens=600, eval_every=5, eval_examples=16, log_every=2,
                      checkpoint_every=4, warmup_steps=2, device="cpu",
                      threads=1).model_dump()  # >1 thread on a busy 2-core machine is ~20x slower
    cfg.update(over)
    return cfg


def resolved(model=None, **train_over) -> dict:
    from pipeline.params import model_fields

    return {"model": {**model_fields(), **TINY_MODEL, **(model or {})}, "train": tiny_train(**train_over)}


@pytest.fixture(autouse=True)
def no_mlflow(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_TRACKING", "0")

@pytest.mark.slow
def test_every_variant_gets_the_same_token_budget(tiny_shards):
    shards = tiny_shards / "shards"
    out = {}
    for name, model in {"base": {}, "dec": {"arch": "decoder_only"}, "nopos": {"positional": "none"}}.items():
        out[name] = run(shards, name, 0, resolved(model), "x", tiny_shards / f"r-{name}", tiny_shards / f"c-{name}")
    tokens = {m["tokens_trained"] for m in out.values()}
    assert len(tokens) == 1 and tokens.pop() >= 3000
    assert len({m["steps"] for m in out.values()}) == 1


@pytest.mark.slow
def test_same_seed_same_metrics_different_seed_different(tiny_shards):
    shards = tiny_shards / "shards"
    a = run(shards, "v", 1, resolved(), "x", tiny_shards / "a", tiny_shards / "ca")
    b = run(shards, "v", 1, resolved(), "x", tiny_shards / "b", tiny_shards / "cb")
    c = run(shards, "v", 2, resolved(), "x", tiny_shards / "c", tiny_shards / "cc")
    assert a["val_loss"] == b["val_loss"] and a["train_loss"] == b["train_loss"]
    assert (tiny_shards / "a" / "train_curve.csv").read_text() == (tiny_shards / "b" / "train_curve.csv").read_text()
    assert a["val_loss"] != c["val_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("arch,norm,heads,impl", [("encoder_decoder", "layernorm", None, "sdpa"),
                                                   ("decoder_only", "layernorm", None, "sdpa"),
                                                   ("decoder_only", "rmsnorm", None, "sdpa"),
                                                   ("encoder_decoder", "rmsnorm", 1, "manual")])
def test_the_thread_count_does_not_change_a_single_bit(tiny_shards, monkeypatch, arch, norm, heads, impl):
    """1, 2 or 3 CPU threads (the grid's share beside another run, a serial `dvc repro`, a bigger
    machine's auto): the same weights and curves (model/exact.py, and MKL's STRICT mode pinned by
    pipeline/cpu_numerics.py; one head and the written-out attention: model/attention.py). Where torch's own LayerNorm depends on the thread count on this CPU
    (measured here, a fact of torch), putting it back must make the same runs differ: what this
    test would catch."""
    import model.layers

    def weights(threads: int, tag: str) -> tuple:
        name = f"{arch}-{norm}-{heads}-{impl}-{tag}-{threads}"
        model = {"arch": arch, "norm": norm, "dropout": 0.1, "attention_impl": impl, **({"n_heads": heads} if heads else {})}
        run(tiny_shards / "shards", "v", 0, resolved(model, threads=threads), "x", tiny_shards / name,
            tiny_shards / f"c-{name}")
        out = tiny_shards / name
        state = torch.load(out / "model.pt", weights_only=True)["state_dict"]
        return tuple(t.numpy().tobytes() for t in state.values()), (out / "train_curve.csv").read_text()

    try:
        assert weights(1, "ours") == weights(2, "ours") == weights(3, "ours")
        if norm == "layernorm" and torchs_layernorm_depends_on_threads():
            monkeypatch.setattr(model.layers, "LayerNorm", torch.nn.LayerNorm)
            assert weights(1, "torch") != weights(2, "torch")
    finally:
        torch.set_num_threads(1)


def torchs_layernorm_depends_on_threads() -> bool:
    """Whether torch's CPU LayerNorm gives other weight gradients at 1 and 2 threads here."""
    x, dy = torch.randn(64, 256, 128), torch.randn(64, 256, 128)
    seen = set()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        norm = torch.nn.LayerNorm(128)
        norm(x).backward(dy)
        seen.add(norm.weight.grad.numpy().tobytes())
    torch.set_num_threads(1)
    return len(seen) > 1


def test_non_finite_loss_stops_with_the_step(tiny_shards):
    with pytest.raises(trainer.NonFiniteLoss, match=r"step \d+; no checkpoint was written before it"):
        run(tiny_shards / "shards", "v", 0, resolved(lr=1e30, clip_grad_norm=None, warmup_steps=0, schedule="constant"),
            "x", tiny_shards / "nan", tiny_shards / "cnan")
    assert not (tiny_shards / "nan").exists()  # no half-written output


def test_non_finite_loss_keeps_the_last_good_checkpoint(tiny_shards, tmp_path, monkeypatch):
    """The loss turns NaN after step 6: the step-4 checkpoint stays, and nothing later is written."""

    def poisoned(model):
        forward, calls = model.forward, {"n": 0}

        def wrapped(*args, **kwargs):
            logits, loss = forward(*args, **kwargs)
            calls["n"] += model.training  # count training micro-batches only
            return logits, (loss * float("nan") if calls["n"] > 6 else loss)
        model.forward = wrapped
        return model

    original_train = trainer.train
    monkeypatch.setattr(trainer, "train", lambda model, *a, **k: original_train(poisoned(model), *a, **k))
    ckpt = tmp_path / "ckpt"
    with pytest.raises(trainer.NonFiniteLoss, match=r"step 7; the checkpoint of step 4 in .*ckpt is the last good"):
        run(tiny_shards / "shards", "v", 0, resolved(log_every=1, budget_steps=12), "x", tmp_path / "out", ckpt)
    saved = [p.name for p in ckpt.glob("step-*.pt")]
    assert saved == ["step-00000004.pt"]
    state = torch.load(ckpt / saved[0], weights_only=True)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (tmp_path / "out").exists()


def test_a_budget_of_absurdly_many_passes_is_refused_before_planning(tiny_shards, tmp_path):
    with pytest.raises(ValueError, match=r"^train.budget_tokens: 100000000000 is [\d,]+ passes over the training data"):
        run(tiny_shards / "shards", "v", 0, resolved(budget_tokens=10**11), "x", tmp_path / "out", tmp_path / "c")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_checkpoints_of_other_settings_are_never_resumed_and_are_cleared(tiny_shards, tmp_path, capsys):
    """A finished run with other settings leaves higher step numbers behind; the new run must neither
    resume from them nor lose its own checkpoints to them when the last K are kept."""
    shards, ckpt = tiny_shards / "shards", tmp_path / "ckpt"
    run(shards, "v", 0, resolved(budget_steps=20, keep_checkpoints=2), "x", tmp_path / "old", ckpt)
    assert [p.name for p in sorted(ckpt.glob("step-*.pt"))] == ["step-00000012.pt", "step-00000016.pt"]
    capsys.readouterr()
    new = resolved(budget_steps=10, keep_checkpoints=2, lr=2e-3)
    metrics = run(shards, "v", 0, new, "x", tmp_path / "new", ckpt)
    out = capsys.readouterr().out
    assert "resumed" not in out and "made with other settings or code" in out
    assert not metrics["resumed"]
    assert [p.name for p in sorted(ckpt.glob("step-*.pt"))] == ["step-00000004.pt", "step-00000008.pt"]
    fresh = run(shards, "v", 0, new, "x", tmp_path / "fresh", tmp_path / "ckpt-fresh")
    assert metrics["val_loss"] == fresh["val_loss"]


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


def test_decay_embeddings_decays_every_matrix(tiny_shards):
    # nanoGPT's rule: embedding tables are decayed too; norms and biases still are not.
    manifest = read_manifest(tiny_shards / "shards")
    _, model = build(resolved()["model"], manifest)
    decay, no_decay = param_groups(model, 0.1, decay_embeddings=True)
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("embed" in names[id(p)] for p in decay["params"])
    assert all(p.ndim == 2 for p in decay["params"])
    assert all(p.ndim < 2 for p in no_decay["params"])


def write_params(path: Path) -> None:
    import yaml

    params = {"model": TINY_MODEL, "train": {**tiny_train(budget_steps=120, checkpoint_every=10, eval_every=20),
                                             "betas": [0.9, 0.98]},
              "seeds": [0], "ablations": {"baseline": {}}}
    path.write_text(yaml.safe_dump(params))


@pytest.mark.multiprocess
@pytest.mark.kill
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
    for key in ("train_loss", "val_loss", "tokens_trained", "steps", "batch_shape_mean"):
        assert whole[key] == again[key], key
    for name in ("train_curve.csv", "val_curve.csv"):
        assert (tmp_path / "whole" / name).read_text() == (tmp_path / "killed" / name).read_text()
    w = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)["state_dict"]
    k = torch.load(tmp_path / "killed" / "model.pt", weights_only=True)["state_dict"]
    assert w.keys() == k.keys() and all(torch.equal(w[n], k[n]) for n in w)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_progress_bar_shows_loss_lr_throughput_and_eta():
    assert trainer._progress(10, 0, io.StringIO()) is None  # a pipe or file gets log lines instead
    screen = FakeTerminal()
    bar = trainer._progress(10, 0, screen)
    time.sleep(0.05)
    trainer._report(bar, print, 4, 10, 1.2345, 3e-4, 5120.0, 9.0, 4)
    bar.close()
    last = screen.getvalue().split("\r")[-1]
    assert "4/10" in last and "loss=1.2345" in last and "lr=3.00e-04" in last and "tok_s=5,120" in last
    assert re.search(r"<\d\d:\d\d", last), last  # tqdm's remaining time, computed from the rate


@pytest.mark.slow
def test_compiled_bf16_training_on_cpu_matches_eager_in_two_compilations(tiny_shards, tmp_path):
    """train.compile and train.precision: bf16 on CPU: torch.compile (inductor) over length-bucketed
    batches of changing shape compiles at most twice (symbolic shapes, plus batches of one example,
    which torch specialises), breaks no graph, and trains as eager bf16 does, to bf16's precision."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    shards, model = tiny_shards / "shards", {"dropout": 0.0}  # compiled dropout draws other masks than eager
    manifest = read_manifest(shards)
    data = trainer.Data(manifest["task"], load_split(shards, manifest, "train"), None,
                        {k: manifest[k] for k in ("pad_id", "bos_id", "eos_id")}, tiny_train()["batch_tokens"], 1, 2, 0)
    assert len({tuple(t.shape) for idx in data.epoch(0) for t in data.batch(idx)}) > 8  # shapes vary

    eager = run(shards, "v", 0, resolved(model, precision="bf16"), "x", tmp_path / "eager", tmp_path / "c-eager")
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = run(shards, "v", 0, resolved(model, precision="bf16", compile=True), "x", tmp_path / "compiled",
                       tmp_path / "c-compiled")
        assert 1 <= counters["stats"]["unique_graphs"] <= 2 and counters["frames"]["ok"] <= 2
        assert not counters["graph_break"]
    finally:
        torch._dynamo.reset()
    info = json.loads((tmp_path / "compiled" / "train.json").read_text())
    assert (info["precision"], info["compile"], info["fused_adamw"], info["gpu"]) == ("bf16", True, True, None)
    assert eager["steps"] == compiled["steps"] > 10
    curves = [np.loadtxt(tmp_path / run_dir / "train_curve.csv", delimiter=",", skiprows=1)[:, 2]
              for run_dir in ("eager", "compiled")]
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-2)  # bf16 keeps 8 bits of mantissa
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-2)


def test_the_default_precision_on_cpu_is_fp32_and_bf16_changes_the_numbers(tiny_shards, tmp_path):
    shards = tiny_shards / "shards"
    fp32 = run(shards, "v", 0, resolved(budget_tokens=600), "x", tmp_path / "a", tmp_path / "ca")
    assert (fp32["precision"], fp32["compile"], fp32["fused_adamw"]) == ("fp32", False, False)
    bf16 = run(shards, "v", 0, resolved(budget_tokens=600, precision="bf16"), "x", tmp_path / "b", tmp_path / "cb")
    assert bf16["precision"] == "bf16" and bf16["train_loss"] != fp32["train_loss"]  # autocast ran
    assert bf16["train_loss"] == pytest.approx(fp32["train_loss"], rel=2e-2)
