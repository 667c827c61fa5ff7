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
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipeline.params import TrainParams
from pipeline.train import build, run
from pipeline.training import trainer
from pipeline.training.batching import lm_batches, lm_collate, lm_stream, lm_token_file, load_split, read_manifest
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


def test_every_variant_gets_the_same_token_budget(tiny_shards):
    shards = tiny_shards / "shards"
    out = {}
    for name, model in {"base": {}, "dec": {"arch": "decoder_only"}, "nopos": {"positional": "none"}}.items():
        out[name] = run(shards, name, 0, resolved(model), "x", tiny_shards / f"r-{name}", tiny_shards / f"c-{name}")
    tokens = {m["tokens_trained"] for m in out.values()}
    assert len(tokens) == 1 and tokens.pop() >= 3000
    assert len({m["steps"] for m in out.values()}) == 1


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
    machine's auto): the same weights and curves (model/norm.py, and MKL's STRICT mode pinned by
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


def lm_shards(path: Path, vocab: int = 60) -> Path:
    """A tiny language-modelling shard set: two train shards, documents of 0..40 tokens."""
    rng = np.random.default_rng(0)
    path.mkdir(parents=True)
    splits = {}
    for split, sizes in {"train": (40, 35), "validation": (15,)}.items():
        files = []
        for i, n in enumerate(sizes):
            docs = [rng.integers(4, vocab, rng.integers(0, 41)).tolist() for _ in range(n)]
            pq.write_table(pa.table({"src_ids": pa.array([[]] * n, pa.list_(pa.int32())),
                                     "tgt_ids": pa.array(docs, pa.list_(pa.int32()))}), path / f"{split}-{i:05d}.parquet")
            files.append(f"{split}-{i:05d}.parquet")
        splits[split] = {"files": files, "examples": sum(sizes), "src_tokens": 0, "tgt_tokens": 0}
    (path / "manifest.json").write_text(json.dumps({
        "task": "language_modeling", "vocab_size": vocab, "pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3,
        "tokenizer_sha256": "test", "splits": splits}))
    return path


def test_lm_token_file_is_the_document_stream_memory_mapped_and_cached(tmp_path):
    shards = lm_shards(tmp_path / "shards")
    manifest = read_manifest(shards)
    stream = lm_token_file(shards, manifest, "train", tmp_path / "cache")
    assert isinstance(stream, np.memmap) and stream.dtype == np.uint16
    assert np.array_equal(stream, lm_stream(load_split(shards, manifest, "train"), eos_id=3))
    built = sorted((tmp_path / "cache").glob("train-*.tokens"))
    assert len(built) == 1 and (tmp_path / "cache" / ".gitignore").read_text() == "*\n"
    stamp = built[0].stat().st_mtime_ns
    assert np.array_equal(lm_token_file(shards, manifest, "train", tmp_path / "cache"), stream)
    assert built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt
    pq.write_table(pa.table({"src_ids": pa.array([[]], pa.list_(pa.int32())),
                             "tgt_ids": pa.array([[5, 6, 7]], pa.list_(pa.int32()))}), shards / "train-00001.parquet")
    changed = lm_token_file(shards, manifest, "train", tmp_path / "cache")  # re-encoded shard: a new file
    assert len(list((tmp_path / "cache").glob("train-*.tokens"))) == 2 and changed[-4:].tolist() == [5, 6, 7, 3]


def test_building_the_token_cache_leaves_a_concurrent_builders_temporary_alone(tmp_path):
    """Runs side by side (the grid on a GPU) build the same cache file at once: one must not delete
    the temporary another is still writing (seen on an H200: a run failed renaming it); a
    temporary nobody has touched for STALE_TEMP_S was left by a killed builder and goes."""
    from pipeline.training.batching import STALE_TEMP_S

    shards, cache = lm_shards(tmp_path / "shards"), tmp_path / "cache"
    manifest = read_manifest(shards)
    built = Path(lm_token_file(shards, manifest, "train", cache).filename)
    built.unlink()
    writing, killed = cache / f".{built.name}.abc123.tmp", cache / f".{built.name}.old999.tmp"
    writing.write_bytes(b"half")
    killed.write_bytes(b"half")
    old = killed.stat().st_mtime - 2 * STALE_TEMP_S
    os.utime(killed, (old, old))
    stream = lm_token_file(shards, manifest, "train", cache)
    assert np.array_equal(stream, lm_stream(load_split(shards, manifest, "train"), eos_id=3))
    assert writing.read_bytes() == b"half" and not killed.exists()


def test_lm_windows_are_contiguous_disjoint_and_deterministic(tmp_path):
    shards = lm_shards(tmp_path / "shards")
    stream = lm_token_file(shards, read_manifest(shards), "train", tmp_path / "cache")
    context, batch_size = 16, 4
    plan = lm_batches(len(stream), context, batch_size, seed=1, epoch=0)
    again = lm_batches(len(stream), context, batch_size, seed=1, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(plan, again))
    assert not all(np.array_equal(a, b) for a, b in zip(plan, lm_batches(len(stream), context, batch_size, 1, 1)))
    starts = np.concatenate(plan)
    assert len(set(starts.tolist())) == len(starts) and all(s % context == 0 for s in starts)  # disjoint windows
    assert starts.max() + context + 1 <= len(stream)
    _, tgt_in, tgt_out = lm_collate(stream, plan[0], context)
    for row, start in enumerate(plan[0]):
        assert tgt_in[row].tolist() == stream[start:start + context].tolist()
        assert tgt_out[row].tolist() == stream[start + 1:start + context + 1].tolist()


def test_random_lm_windows_start_anywhere_deterministically_and_stay_in_the_stream():
    stream_len, context, batch_size = 1000, 16, 4
    plan = lm_batches(stream_len, context, batch_size, seed=3, epoch=0, windows="random")
    starts = np.concatenate(plan)
    assert len(plan) == ((stream_len - 1) // context) // batch_size  # as many windows as the grid
    assert starts.min() >= 0 and starts.max() + context + 1 <= stream_len
    assert (starts % context != 0).any()  # off the grid
    again = lm_batches(stream_len, context, batch_size, seed=3, epoch=0, windows="random")
    assert all(np.array_equal(a, b) for a, b in zip(plan, again))
    other = np.concatenate(lm_batches(stream_len, context, batch_size, seed=3, epoch=1, windows="random"))
    assert not np.array_equal(starts, other)


def test_language_modelling_trains_from_the_token_files(tmp_path):
    shards = lm_shards(tmp_path / "shards")
    cfg = resolved({"arch": "decoder_only"}, context=16, batch_size=4, budget_tokens=640, eval_examples=8)
    metrics = run(shards, "lm", 0, cfg, "x", tmp_path / "out", tmp_path / "ckpt" / "lm-0")
    assert metrics["tokens_trained"] == metrics["steps"] * 4 * 16 >= 640
    assert np.isfinite(metrics["val_loss"]) and metrics["padding_ratio"] == 0.0
    assert metrics["batch_shape_mean"] == [4, 0, 16]  # rows x context, no source
    assert list((tmp_path / "ckpt" / ".token-cache").glob("*.tokens"))  # next to the checkpoints, shared by runs


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


def test_a_run_too_short_to_checkpoint_still_creates_its_checkpoint_directory(tiny_shards, tmp_path):
    """The directory is a DVC output of the train stage: DVC fails a stage whose output is missing."""
    ckpt = tmp_path / "ckpt"
    run(tiny_shards / "shards", "v", 0, resolved(budget_steps=3, checkpoint_every=100), "x", tmp_path / "out", ckpt)
    assert ckpt.is_dir() and not list(ckpt.glob("step-*.pt"))




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
