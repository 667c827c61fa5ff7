"""download (synthetic) -> filter -> train_bpe -> encode, each on tiny data."""
from __future__ import annotations

import json
import re

import pandas as pd
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from pipeline.encode import encode
from pipeline.filter import filter_splits
from pipeline.filtering.lengths import count_tokens
from pipeline.params import FilterParams
from pipeline.sources.synthetic import generate


def test_synthetic_is_deterministic_and_seeded():
    a, b, c = generate(50, 1), generate(50, 1), generate(50, 2)
    assert a.equals(b)
    assert not a.equals(c)


def test_synthetic_summary_copies_facts_in_article_order():
    for source, target in generate(200, 3).itertuples(index=False):
        facts = [f.strip() for f in target.rstrip(" .").split(";")]
        position = -1
        for fact in facts:
            name, verb, num, obj = fact.split()
            # The fact's words appear in one article sentence, after the previous fact's sentence.
            match = re.search(rf"{name} {verb} {num} {obj}", source[position + 1:])
            assert match, (fact, source)
            position += 1 + match.start()


def test_synthetic_lengths_vary_beyond_the_default_filter():
    lengths = generate(500, 0).source.map(count_tokens)
    assert lengths.min() < 40 and lengths.max() > 80  # the default filter keeps <= 80


def test_filter_drops_long_examples_and_carves_splits():
    raw = {"train": pd.DataFrame({"source": ["a b c"] * 80 + ["word " * 50] * 20, "target": ["x y"] * 100})}
    kept, stats = filter_splits(raw, FilterParams(max_source_tokens=10, val_fraction=0.1, test_fraction=0.2))
    train = stats["splits"]["train"]
    assert train["dropped_length"] == 20 and train["dropped_subsample"] == 0
    assert len(kept["validation"]) == 8 and len(kept["test"]) == 16 and len(kept["train"]) == 56
    assert train["to_validation"] == 8 and train["to_test"] == 16 and train["kept"] == 56
    assert train["raw"] == train["dropped_length"] + train["kept"] + train["to_validation"] + train["to_test"]
    assert stats["splits"]["validation"] == {"raw": 0, "dropped_length": 0, "dropped_subsample": 0, "kept": 8,
                                             "from_train": 8}
    assert all(count_tokens(s) <= 10 for split in kept.values() for s in split.source)
    assert stats["length_percentiles"]["source"]["raw"]["max"] == 50
    assert stats["length_percentiles"]["source"]["kept"]["max"] == 3


def test_filter_subsample_is_seeded():
    raw = {"train": pd.DataFrame({"source": [f"s {i}" for i in range(1000)], "target": ["t"] * 1000})}
    a, _ = filter_splits(raw, FilterParams(subsample=0.5, seed=1))
    b, _ = filter_splits(raw, FilterParams(subsample=0.5, seed=1))
    assert a["train"].equals(b["train"])
    assert 350 < sum(len(f) for f in a.values()) < 650


def test_filter_errors_when_a_split_ends_empty():
    raw = {"train": pd.DataFrame({"source": ["word " * 50] * 10, "target": ["t"] * 10})}
    with pytest.raises(ValueError, match="empty after filtering"):
        filter_splits(raw, FilterParams(max_source_tokens=5))


def test_tokenizer_has_the_configured_special_ids(tiny_shards):
    sp = spm.SentencePieceProcessor(model_file=str(tiny_shards / "tokenizer" / "spm.model"))
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    assert sp.get_piece_size() == 150
    text = "Kavor sold 12 lamps in Orlen ."
    assert sp.decode(sp.encode(text)) == text


def test_encode_shards_roundtrip_and_manifest(tiny_shards):
    manifest = json.loads((tiny_shards / "shards" / "manifest.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(tiny_shards / "tokenizer" / "spm.model"))
    filtered = pd.read_parquet(tiny_shards / "filtered" / "train.parquet")
    files = manifest["splits"]["train"]["files"]
    assert len(files) == -(-len(filtered) // 100)  # 100 rows per shard
    table = pq.read_table([tiny_shards / "shards" / f for f in files][0])
    assert sp.decode(table.column("src_ids")[0].as_py()) == filtered.source[0]
    assert manifest["splits"]["train"]["examples"] == len(filtered)
    assert manifest["vocab_size"] == 150 and len(manifest["tokenizer_sha256"]) == 64


def test_encode_keeps_the_lead_of_long_sources(tiny_shards, tmp_path):
    full = json.loads((tiny_shards / "shards" / "manifest.json").read_text())
    manifest = encode(tiny_shards / "filtered", tiny_shards / "tokenizer", tmp_path / "shards",
                      shard_examples=100, max_source_tokens=8)
    table = pq.read_table([tmp_path / "shards" / f for f in manifest["splits"]["train"]["files"]])
    whole = pq.read_table([tiny_shards / "shards" / f for f in full["splits"]["train"]["files"]])
    cut, ids = table.column("src_ids").to_pylist(), whole.column("src_ids").to_pylist()
    assert all(c == i[:8] for c, i in zip(cut, ids))
    assert table.column("src_text").to_pylist() == whole.column("src_text").to_pylist()
    assert table.column("tgt_ids").to_pylist() == whole.column("tgt_ids").to_pylist()
    assert manifest["max_source_tokens"] == 8 and full["max_source_tokens"] is None
    assert manifest["splits"]["train"]["truncated_sources"] == sum(len(i) > 8 for i in ids) > 0


def test_unigram_plateau_is_the_validation_cross_entropy_of_train_frequencies(tiny_shards):
    import math
    from collections import Counter

    manifest = json.loads((tiny_shards / "shards" / "manifest.json").read_text())

    def target_tokens(split):
        files = [tiny_shards / "shards" / f for f in manifest["splits"][split]["files"]]
        rows = pq.read_table(files).column("tgt_ids").to_pylist()
        return [t for ids in rows for t in ids + [manifest["eos_id"]]]  # the loss counts eos

    train, val = Counter(target_tokens("train")), target_tokens("validation")
    total, vocab = sum(train.values()), manifest["vocab_size"]
    expected = -sum(math.log((train[t] + 1) / (total + vocab)) for t in val) / len(val)
    assert manifest["unigram_val_loss"] == pytest.approx(expected, rel=1e-9)
    assert 0 < expected < math.log(vocab)  # frequencies beat a uniform guess


def test_filter_in_characters_for_character_level_studies():
    raw = {"train": pd.DataFrame({"source": ["short one", "a" * 70] * 50, "target": ["kurz", "b" * 10] * 50})}
    kept, stats = filter_splits(raw, FilterParams(length_unit="chars", max_source_tokens=64, max_target_tokens=64,
                                                  val_fraction=0.1, test_fraction=0.1))
    assert all(len(s) <= 64 for split in kept.values() for s in split.source)
    assert stats["splits"]["train"]["dropped_length"] == 50 and stats["length_unit"] == "chars"
    assert stats["length_percentiles"]["source"]["raw"]["max"] == 70
    assert stats["length_percentiles"]["source"]["kept"]["max"] == len("short one")


def stories_as_paragraph_rows(n_stories: int = 40) -> pd.DataFrame:
    """Rows as the `local` source writes them with documents: paragraph: each story is cut into
    3 to 5 paragraph rows, in story order."""
    rows = [f"Story {s} paragraph {p}: Tom walked home." for s in range(n_stories) for p in range(3 + s % 3)]
    return pd.DataFrame({"source": [""] * len(rows), "target": rows})


def test_language_modeling_carves_the_tail_of_train_in_document_order():
    raw = stories_as_paragraph_rows()
    cfg = FilterParams(val_fraction=0.1, test_fraction=0.1)
    kept, stats = filter_splits({"train": raw}, cfg, task="language_modeling")
    n_val, n_test = len(kept["validation"]), len(kept["test"])
    assert n_val == n_test == round(len(raw) * 0.1) and stats["carve"] == "contiguous_tail"
    assert kept["validation"].equals(raw.iloc[-(n_val + n_test):-n_test].reset_index(drop=True))
    assert kept["test"].equals(raw.iloc[-n_test:].reset_index(drop=True))
    assert kept["train"].equals(raw.iloc[:-(n_val + n_test)])
    story = {split: {t.split(" paragraph")[0] for t in frame.target} for split, frame in kept.items()}
    texts = {split: set(frame.target) for split, frame in kept.items()}
    assert not texts["train"] & texts["validation"] and not texts["validation"] & texts["test"]
    assert not texts["train"] & texts["test"]
    # a story meets another split only at a boundary: at most one story is shared per boundary
    assert len(story["train"] & story["validation"]) <= 1 and not story["train"] & story["test"]
    assert len(story["validation"] & story["test"]) <= 1
    # the seq2seq default is still the seeded shuffle, which scatters stories across the splits
    shuffled, stats = filter_splits({"train": raw}, cfg)
    assert stats["carve"] == "shuffled"
    assert len({t.split(" paragraph")[0] for t in shuffled["test"].target} & story["train"]) > 1


def test_language_modeling_carves_only_the_missing_split():
    raw = stories_as_paragraph_rows(10)
    val = pd.DataFrame({"source": [""], "target": ["held out"]})
    kept, stats = filter_splits({"train": raw, "validation": val}, FilterParams(test_fraction=0.2),
                                task="language_modeling")
    n = round(len(raw) * 0.2)
    assert kept["test"].equals(raw.iloc[-n:].reset_index(drop=True)) and kept["validation"].equals(val)
    assert stats["splits"]["train"] == {"raw": len(raw), "dropped_length": 0, "dropped_subsample": 0,
                                        "kept": len(raw) - n, "to_test": n}


def test_filter_stage_reads_the_task_from_meta_json(tmp_path):
    from pipeline.filter import main
    raw = tmp_path / "raw"
    raw.mkdir()
    frame = stories_as_paragraph_rows(20)
    frame.to_parquet(raw / "train.parquet")
    (raw / "meta.json").write_text(json.dumps({"source": "local", "task": "language_modeling"}))
    params = tmp_path / "params.yaml"
    params.write_text("filter:\n  val_fraction: 0.1\n  test_fraction: 0.1\n")
    main(["--params", str(params), "--raw", str(raw), "--out", str(tmp_path / "out"),
          "--metrics", str(tmp_path / "filter.json")])
    test = pd.read_parquet(tmp_path / "out" / "test.parquet")
    assert test.target.tolist() == frame.target.tolist()[-len(test):]
    assert json.loads((tmp_path / "filter.json").read_text())["carve"] == "contiguous_tail"
