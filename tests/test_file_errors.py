"""A damaged or wrong input file: one line naming the file and what is wrong, a non-zero exit,
and the stage's output neither created nor changed (issue #15)."""
from __future__ import annotations

import dataclasses
import importlib
import json
import random
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from model import ModelConfig, build_model
from pipeline.training.batching import lm_token_file, read_manifest
from pipeline.training.checkpoint import find_latest, save

TRAIN = {"threads": 1, "batch_tokens": 2048, "context": 32, "batch_size": 4, "device": "cpu"}
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"


def fails(module: str, argv: list[str], *parts: str) -> str:
    """Run a stage's main(); it must exit with one line, `<stage>: ...`, containing `parts`."""
    with pytest.raises(SystemExit) as info:
        importlib.import_module(f"pipeline.{module}").main(argv)
    message = info.value.code
    assert isinstance(message, str), message  # a string exit code: status 1, the line on stderr
    assert message.startswith(f"{module}: ") and "\n" not in message, message
    for part in parts:
        assert part in message, message
    return message


def params(tmp_path: Path, text: str) -> str:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return str(path)


# -- 1. the local source: binary files where text is expected ----------------------------------
def download(tmp_path: Path, options: dict) -> list[str]:
    text = json.dumps({"data": {"source": "local", "local": options}})  # JSON is YAML
    return ["--params", params(tmp_path, text), "--out", str(tmp_path / "raw"),
            "--local-root", str(tmp_path)]


@pytest.mark.parametrize("name, body, task", [
    ("train.jsonl", random.Random(0).randbytes(5000), "summarization"),
    ("train.txt", PNG, "language_modeling"),  # a picture renamed
    ("train.csv", b"source,target\n" + bytes(range(256)), "summarization"),
    ("train.json", b"\xff\xfe[\x00{\x00", "summarization"),  # UTF-16 text
])
def test_a_binary_local_file_is_named_with_the_bad_byte(tmp_path, name, body, task):
    path = tmp_path / name
    path.write_bytes(body)
    fails("download", download(tmp_path, {"task": task, "paths": {"train": str(path)}}),
          f"{path}: not UTF-8 text (byte 0x")
    assert not (tmp_path / "raw").exists()


def test_a_binary_side_of_a_parallel_pair_is_named(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_bytes(b"eins\n" + random.Random(1).randbytes(100))
    pair = {"source": str(tmp_path / "a.en"), "target": str(tmp_path / "a.de")}
    fails("download", download(tmp_path, {"task": "translation", "paths": {"train": pair}}),
          f"{tmp_path / 'a.de'}: not UTF-8 text (byte 0x")
    assert not (tmp_path / "raw").exists()


def test_a_corrupt_local_parquet_file_is_named(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame({"source": ["some words"] * 500, "target": ["more"] * 500}).to_parquet(path)
    damage(path, "source")
    fails("download", download(tmp_path, {"task": "summarization", "paths": {"train": str(path)}}),
          f"{path}: corrupt parquet file (")
    assert not (tmp_path / "raw").exists()


# -- 2. shards -----------------------------------------------------------------------------------
def damage(path: Path, column: str) -> None:
    """Overwrite bytes inside one column's data, as a bad disk or an interrupted copy would."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns)
                 if meta.column(i).path_in_schema.split(".")[0] == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    middle = start + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle:middle + 64] = random.Random(2).randbytes(64)
    path.write_bytes(bytes(data))


@pytest.fixture
def shards(tiny_shards, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_shards / "shards", tmp_path / "shards"))


@pytest.fixture
def run_dir(tiny_shards, tmp_path) -> Path:
    """A run directory as the train stage writes it, with an untrained tiny model."""
    manifest = read_manifest(tiny_shards / "shards")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=manifest["vocab_size"], d_model=16, n_heads=2, n_encoder_layers=1,
                      n_decoder_layers=1, d_ff=32, dropout=0.0, pad_id=manifest["pad_id"],
                      bos_id=manifest["bos_id"], eos_id=manifest["eos_id"])
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model_config": dataclasses.asdict(cfg), "state_dict": build_model(cfg).state_dict()},
               run / "model.pt")
    (run / "train.json").write_text(json.dumps({"variant": "baseline", "seed": 0}))
    (run / "config.json").write_text(json.dumps({"variant": "baseline", "seed": 0, "train": TRAIN}))
    return run


def evaluate_fails(tiny_shards, tmp_path, shards: Path, run: Path, *parts: str) -> str:
    """The evaluate stage fails as `fails` says, and an earlier output is left as it was."""
    out = tmp_path / "eval"
    out.mkdir(exist_ok=True)
    (out / "eval.json").write_text("earlier")
    argv = ["--params", params(tmp_path, "evaluate: {max_examples: 2, max_new_tokens: 2}\n"),
            "--shards", str(shards), "--tokenizer", str(tiny_shards / "tokenizer"),
            "--run", str(run), "--out", str(out)]
    message = fails("evaluate", argv, *parts)
    assert [p.name for p in out.iterdir()] == ["eval.json"] and (out / "eval.json").read_text() == "earlier"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".eval.")]  # no temporary left
    return message


def test_evaluate_names_a_corrupt_shard(tiny_shards, tmp_path, shards, run_dir):
    damage(shards / "test-00000.parquet", "tgt_text")
    evaluate_fails(tiny_shards, tmp_path, shards, run_dir,
                   f"{shards / 'test-00000.parquet'}: corrupt or unreadable parquet shard (",
                   "dvc repro --force encode")


def test_evaluate_names_a_truncated_shard(tiny_shards, tmp_path, shards, run_dir):
    path = shards / "validation-00000.parquet"
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    evaluate_fails(tiny_shards, tmp_path, shards, run_dir, f"{path}: corrupt or unreadable parquet shard")


def test_train_names_a_corrupt_shard(tmp_path, shards):
    damage(shards / "train-00001.parquet", "tgt_ids")
    argv = ["--params", params(tmp_path, "train: {budget_steps: 1, threads: 1}\n"), "--shards", str(shards),
            "--variant", "baseline", "--seed", "0", "--out", str(tmp_path / "run"),
            "--checkpoints", str(tmp_path / "ckpt")]
    fails("train", argv, f"{shards / 'train-00001.parquet'}: corrupt or unreadable parquet shard (")
    assert not (tmp_path / "run").exists()


def test_the_language_model_token_cache_names_a_corrupt_shard(tmp_path, shards):
    damage(shards / "train-00000.parquet", "tgt_ids")
    with pytest.raises(ValueError, match="train-00000.parquet: corrupt or unreadable parquet shard"):
        lm_token_file(shards, read_manifest(shards), "train", tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.tokens"))


# -- 3. the run's config.json and train.json -----------------------------------------------------

@pytest.mark.parametrize("name, text, part", [
    ("config.json", "{not json", "not valid JSON"),
    ("config.json", "[]", "expected a JSON object, got list"),
    ("config.json", json.dumps({"evaluate": "train"}), "no key 'train'"),
    ("config.json", json.dumps({"train": "train"}), "train is 'train', not an object"),
    ("config.json", json.dumps({"train": {**TRAIN, "context": None}}), "train.context: Input should"),
    ("config.json", json.dumps({"train": {k: v for k, v in TRAIN.items() if k != "batch_tokens"}}),
     "no key 'train.batch_tokens'"),
    ("config.json", json.dumps({"train": {**TRAIN, "batch_tokens": "big"}}), "train.batch_tokens: Input should"),
    ("config.json", json.dumps({"train": {**TRAIN, "device": "tpu"}}), "train.device: Input should"),
    ("train.json", json.dumps({"seed": 0}), "no key 'variant'"),
])
def test_evaluate_names_the_run_file_and_key(tiny_shards, tmp_path, run_dir, name, text, part):
    (run_dir / name).write_text(text)
    evaluate_fails(tiny_shards, tmp_path, tiny_shards / "shards", run_dir, f"{run_dir / name}: ", part)


# -- 4. model.pt and checkpoints -----------------------------------------------------------------
@pytest.mark.parametrize("cut", [0.5, 0.0])
def test_evaluate_names_a_truncated_model_file(tiny_shards, tmp_path, run_dir, cut):
    path = run_dir / "model.pt"
    path.write_bytes(path.read_bytes()[:int(path.stat().st_size * cut)])
    evaluate_fails(tiny_shards, tmp_path, tiny_shards / "shards", run_dir,
                   f"{path}: truncated or not a PyTorch file")


def test_evaluate_names_a_model_file_the_train_stage_did_not_write(tiny_shards, tmp_path, run_dir):
    torch.save({"weights": torch.zeros(2)}, run_dir / "model.pt")
    evaluate_fails(tiny_shards, tmp_path, tiny_shards / "shards", run_dir,
                   f"{run_dir / 'model.pt'}: unreadable model file (no key 'model_config')")


def test_resume_skips_a_truncated_checkpoint_and_names_it(tmp_path, capsys):
    older = save(tmp_path, 1, {"config_hash": "h", "step": 1}, keep=2)
    newer = save(tmp_path, 2, {"config_hash": "h", "step": 2}, keep=2)
    newer.write_bytes(newer.read_bytes()[:newer.stat().st_size // 2])
    path, state = find_latest(tmp_path, "h")
    assert (path, state["step"]) == (older, 1)
    assert f"skipping unreadable checkpoint {newer}" in capsys.readouterr().out


# -- 5. filter: nothing left ---------------------------------------------------------------------
def raw_dir(tmp_path: Path, splits: dict[str, int]) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in splits.items():
        pd.DataFrame({"source": ["a b c d"] * n, "target": ["x y"] * n}).to_parquet(raw / f"{split}.parquet")
    return raw


@pytest.mark.parametrize("splits, text, parts, loosen", [
    ({"train": 50}, "filter: {max_source_tokens: 2}",
     ["split 'train' is empty after filtering: all 50 examples are outside the length limits "
      "(source 0-2, target 1-256 pretokens)"], True),
    ({"train": 5}, "filter: {val_fraction: 0.05}",
     ["split 'validation' is empty", "filter.val_fraction = 0.05 of the 5 training examples"], False),
    ({"train": 50, "validation": 0}, "",
     ["split 'validation' is empty after filtering: the raw split has no examples"], False),
    ({"train": 50}, "filter: {subsample: 0.001}", ["filter.subsample = 0.001"], False),
])
def test_filter_says_once_what_emptied_a_split(tmp_path, splits, text, parts, loosen):
    raw = raw_dir(tmp_path, splits)
    argv = ["--params", params(tmp_path, text + "\n"), "--raw", str(raw), "--out", str(tmp_path / "f"),
            "--metrics", str(tmp_path / "m.json")]
    message = fails("filter", argv, *parts)
    assert not message.startswith("filter: filter:")
    assert ("loosen" in message) == loosen
    assert not (tmp_path / "f").exists() and not (tmp_path / "m.json").exists()
