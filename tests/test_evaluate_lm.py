"""The evaluate stage: language-modelling measures, continuations, and every architecture on every task."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import sentencepiece as spm
import torch
import torch.nn.functional as F

from model import ModelConfig, build_model
from model.config import ARCHS
from pipeline.encode import encode
from pipeline.evaluate import continue_prompts, evaluate, lm_nats, lm_stream, pick_next
from pipeline.params import EvaluateParams, TrainBpeParams
from pipeline.scoring.metrics import task_metrics
from pipeline.sources.plain_text import split_paragraphs
from pipeline.train_bpe import train_tokenizer
from pipeline.training.batching import load_split, read_manifest

FIXTURES = Path(__file__).parent / "fixtures" / "sources"
CFG = EvaluateParams(max_examples=4, max_new_tokens=12, n_samples=2, batch_size=4)
CONTEXT = 40


@pytest.fixture(scope="module")
def lm_shards(tmp_path_factory) -> Path:
    """Character-level shards of Tiny Shakespeare speeches (plus one non-ASCII document)."""
    base = tmp_path_factory.mktemp("lm")
    non_ascii = "Ça va, Ünal? Très bien."  # in train too, so its characters are in the vocabulary
    speeches = [non_ascii] + split_paragraphs((FIXTURES / "tiny_shakespeare_input.txt").read_text()) * 3
    speeches.insert(len(speeches) - 2, non_ascii)
    (base / "filtered").mkdir()
    for split, docs in {"train": speeches[:-6], "validation": speeches[-6:-3], "test": speeches[-3:]}.items():
        pd.DataFrame({"source": [""] * len(docs), "target": docs}).to_parquet(
            base / "filtered" / f"{split}.parquet", index=False)
    (base / "filtered" / "meta.json").write_text(json.dumps({"source": "t", "task": "language_modeling"}))
    train_tokenizer(base / "filtered" / "train.parquet", base / "tokenizer",
                    TrainBpeParams(model_type="char", vocab_size=200))
    encode(base / "filtered", base / "tokenizer", base / "shards", shard_examples=100)
    return base


def make_model(manifest: dict, arch: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=manifest["vocab_size"], d_model=32, n_heads=4, n_encoder_layers=1,
                      n_decoder_layers=2, d_ff=64, dropout=0.0, arch=arch, positional="rope",
                      pad_id=manifest["pad_id"], bos_id=manifest["bos_id"], eos_id=manifest["eos_id"])
    return build_model(cfg).eval()


def save_run(model, run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    torch.save({"model_config": dataclasses.asdict(model.cfg), "state_dict": model.state_dict()},
               run_dir / "model.pt")
    (run_dir / "train.json").write_text(json.dumps({"variant": model.cfg.arch, "seed": 0,
                                                    "mlflow_run_id": None}))
    return run_dir


def test_lm_nats_scores_every_token_once_whatever_the_window(lm_shards):
    manifest = read_manifest(lm_shards / "shards")
    docs = load_split(lm_shards / "shards", manifest, "test").tgt
    model, eos = make_model(manifest, "decoder_only"), manifest["eos_id"]
    stream = torch.from_numpy(lm_stream(docs, eos))
    assert len(stream) == 1 + sum(len(d) + 1 for d in docs) and stream[0] == eos

    def chunked(window: int) -> float:  # the windows written out one by one, unbatched
        total = 0.0
        for s in range(0, len(stream) - 1, window):
            piece = stream[s:s + window + 1][None]
            logits, _ = model(None, piece[:, :-1])
            total += F.cross_entropy(logits[0].double(), piece[0, 1:], reduction="sum").item()
        return total

    for window in (len(stream), 7):  # one window for everything; many, the last one short
        nats, n = lm_nats(model, docs, eos, window, batch_size=3, device=torch.device("cpu"))
        assert n == len(stream) - 1
        assert nats == pytest.approx(chunked(window), rel=1e-5)


def test_bits_per_char_and_byte_of_a_uniform_model(lm_shards, tmp_path):
    """All-zero weights give uniform logits: exactly ln V nats per predicted token."""
    shards = lm_shards / "shards"
    manifest = read_manifest(shards)
    model = make_model(manifest, "decoder_only")
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    run = save_run(model, tmp_path / "run")
    ev = evaluate(shards, lm_shards / "tokenizer", run, tmp_path / "eval", CFG, 1024, CONTEXT, 4)
    docs = load_split(shards, manifest, "test").tgt
    sp = spm.SentencePieceProcessor(model_file=str(lm_shards / "tokenizer" / "spm.model"))
    texts = [sp.decode(d.tolist()) + "\n" for d in docs]
    tokens, ln_v = sum(len(d) + 1 for d in docs), math.log(manifest["vocab_size"])
    assert ev["test_loss"] == pytest.approx(ln_v)
    assert ev["bits_per_token"] == pytest.approx(ln_v / math.log(2))
    assert ev["bits_per_char"] == pytest.approx(tokens * ln_v / math.log(2) / sum(map(len, texts)))
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    assert n_bytes > sum(map(len, texts))  # the test split holds the non-ASCII document
    assert ev["bits_per_byte"] == pytest.approx(tokens * ln_v / math.log(2) / n_bytes)


@pytest.mark.parametrize("arch", ["decoder_only", "prefix_lm"])
def test_continuations_equal_greedy_decoding_by_full_recomputation(lm_shards, arch):
    manifest = read_manifest(lm_shards / "shards")
    model, eos = make_model(manifest, arch, seed=3), manifest["eos_id"]
    docs = load_split(lm_shards / "shards", manifest, "train").tgt[:3]
    prompts = torch.tensor(np.stack([lm_stream([d[:6]], eos)[:-1] for d in docs]))
    got = continue_prompts(model, prompts, 10, pick_next(CFG, torch.Generator()), eos)
    for row, prompt in zip(got, prompts):
        seq, want = prompt[None], []
        for _ in range(10):  # the causal forward the LM was trained with, recomputed every step
            token = int(model(None, seq)[0][0, -1].argmax())
            if token == eos:
                break
            want.append(token)
            seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
        assert row == want


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    logits = torch.randn(6, 50)
    sample = CFG.model_copy(update={"decode": "sample", "temperature": 0.7, "top_p": 0.9})
    draws = [pick_next(sample, torch.Generator().manual_seed(5))(logits) for _ in range(2)]
    assert torch.equal(draws[0], draws[1])
    top1 = CFG.model_copy(update={"decode": "sample", "top_k": 1})
    assert torch.equal(pick_next(top1, torch.Generator())(logits), logits.argmax(-1))
    with pytest.raises(ValueError, match="evaluate.decode: beam is not supported"):
        pick_next(CFG.model_copy(update={"decode": "beam"}), torch.Generator())


def test_translation_metrics_are_sacrebleu_scores():
    refs = ["Das Haus ist groß.", "Der Hund läuft durch den Schnee."]
    perfect = task_metrics("translation", refs, refs)
    wrong = task_metrics("translation", refs, ["Ja.", "Nein."])
    assert perfect == {"bleu": pytest.approx(100.0), "chrf": pytest.approx(100.0)}
    assert wrong["bleu"] < 10 and wrong["chrf"] < perfect["chrf"]


def seq2seq_shards(tiny_shards: Path, task: str, tmp_path: Path) -> Path:
    """The synthetic shards, relabelled as `task` (the data format is the same for both)."""
    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards / "shards", shards)
    manifest = read_manifest(shards)
    (shards / "manifest.json").write_text(json.dumps({**manifest, "task": task}))
    return shards


TASK_METRICS = {"summarization": ("rouge1", "rouge2", "rougeL"), "translation": ("bleu", "chrf"),
                "language_modeling": ("bits_per_char", "bits_per_byte")}
# An encoder-decoder needs a source, which language modelling does not have.
CASES = [(task, arch) for task in TASK_METRICS for arch in ARCHS
         if not (task == "language_modeling" and arch == "encoder_decoder")]


@pytest.mark.parametrize("task, arch", CASES)
def test_every_architecture_evaluates_on_every_task(tiny_shards, lm_shards, tmp_path, task, arch):
    if task == "language_modeling":
        shards, tokenizer = lm_shards / "shards", lm_shards / "tokenizer"
    else:
        shards, tokenizer = seq2seq_shards(tiny_shards, task, tmp_path), tiny_shards / "tokenizer"
    run = save_run(make_model(read_manifest(shards), arch), tmp_path / "run")
    evaluate(shards, tokenizer, run, tmp_path / "eval", CFG.model_copy(update={"decode": "sample"}),
             1024, CONTEXT, 4)
    ev = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert ev["task"] == task and all(isinstance(ev[m], float) for m in TASK_METRICS[task])
    assert math.isfinite(ev["test_loss"]) and ev["n_decoded"] >= 1
    samples = json.loads((tmp_path / "eval" / "samples.json").read_text())
    assert len(samples) == CFG.n_samples and all(s["source"] and s["reference"] for s in samples)
    attention = json.loads((tmp_path / "eval" / "attention.json").read_text())
    self_map = np.array(attention["maps"]["decoder.self"])
    assert self_map.shape == (len(attention["tgt_tokens"]),) * 2
    assert np.allclose(np.triu(self_map, 1), 0)  # causal
    # Rows are whole distributions, except a single-stack seq2seq model's target->target block
    # (the rest of each row attends to the source).
    whole = task == "language_modeling" or arch == "encoder_decoder"
    assert np.allclose(self_map.sum(-1), 1, atol=1e-4) if whole else (self_map.sum(-1) < 1 + 1e-4).all()


@pytest.mark.parametrize("task", ["language_modeling", "summarization"])
def test_a_kept_runs_last_step_model_is_scored_on_the_validation_split_too(tiny_shards, lm_shards, tmp_path, task):
    """train.keep = best writes last.pt beside model.pt: evaluate scores it as it scores model.pt
    (val_loss_last equals the val_loss of that model evaluated as the kept one)."""
    from pipeline.training.checkpoint import LAST_MODEL

    if task == "language_modeling":
        shards, tokenizer = lm_shards / "shards", lm_shards / "tokenizer"
    else:
        shards, tokenizer = seq2seq_shards(tiny_shards, task, tmp_path), tiny_shards / "tokenizer"
    arch = "decoder_only" if task == "language_modeling" else "encoder_decoder"
    kept, last = make_model(read_manifest(shards), arch, seed=0), make_model(read_manifest(shards), arch, seed=1)
    run = save_run(kept, tmp_path / "run")
    torch.save({"model_config": dataclasses.asdict(last.cfg), "state_dict": last.state_dict()}, run / LAST_MODEL)
    evaluate(shards, tokenizer, run, tmp_path / "eval", CFG, 1024, CONTEXT, 4)
    both = json.loads((tmp_path / "eval" / "eval.json").read_text())
    alone = save_run(last, tmp_path / "last")
    evaluate(shards, tokenizer, alone, tmp_path / "eval_last", CFG, 1024, CONTEXT, 4)
    last_only = json.loads((tmp_path / "eval_last" / "eval.json").read_text())
    assert both["val_loss_last"] == pytest.approx(last_only["val_loss"], rel=1e-9)
    assert both["val_loss"] != pytest.approx(both["val_loss_last"])  # two different models
    assert "val_loss_last" not in last_only  # only where train kept an earlier step
