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
    assert stats["splits"]["validation"] == {"raw": 0, "dropped_length": 0, "dropped_subsample": 0,
                                             "kept_length": 0, "kept_subsample": 0, "kept_share": None,
                                             "kept": 8, "from_train": 8}
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
                                        "kept_length": len(raw), "kept_subsample": len(raw), "kept_share": 1.0,
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


# -- limits in characters, one side only, the seeded half, the kept share (issue #48) ------------
def test_filter_counts_characters_of_the_article():
    """CNN/DailyMail seed study 000's data code keeps `len(article) <= 1640`: characters."""
    articles = ["é" * 1640, "a" * 1641, "word " * 328]  # 1640 characters (non-ASCII: characters, not bytes)
    raw = {split: pd.DataFrame({"source": articles, "target": ["t"] * 3}) for split in ("train", "validation", "test")}
    kept, stats = filter_splits(raw, FilterParams(length_unit="chars", max_source_tokens=1640,
                                                  max_target_tokens=None))
    assert kept["train"].source.tolist() == [articles[0], articles[2]]
    assert stats["splits"]["train"]["dropped_length"] == 1 and stats["length_unit"] == "chars"
    # the same articles in pre-tokens: 1 and 328 words and the 1-word 1641 'a's all pass
    kept, _ = filter_splits(raw, FilterParams(max_source_tokens=1640, max_target_tokens=None))
    assert len(kept["train"]) == 3


def test_a_side_without_a_maximum_is_not_limited():
    raw = {"train": pd.DataFrame({"source": ["a " * 5, "a " * 50] * 50, "target": ["b " * 500] * 100})}
    cfg = FilterParams(max_source_tokens=10, max_target_tokens=None)
    kept, stats = filter_splits(raw, cfg)
    assert stats["splits"]["train"]["dropped_length"] == 50  # the long sources only; the 500-word targets pass
    assert stats["limits"]["max_target_tokens"] is None
    assert all(count_tokens(t) == 500 for split in kept.values() for t in split.target)
    # the minimum still holds on the unlimited side, and both sides may be unlimited
    raw["train"].loc[0, "target"] = ""
    _, stats = filter_splits(raw, FilterParams(max_source_tokens=None, max_target_tokens=None))
    assert stats["splits"]["train"]["dropped_length"] == 1  # min_target_tokens = 1


def test_the_random_half_is_seeded_and_keeps_about_half_of_each_split():
    raw = {split: pd.DataFrame({"source": [f"{split} {i}" for i in range(2000)], "target": ["t"] * 2000})
           for split in ("train", "validation", "test")}
    cfg = FilterParams(subsample=0.5, seed=42)
    a, stats = filter_splits(raw, cfg)
    b, _ = filter_splits(raw, cfg)
    c, _ = filter_splits(raw, FilterParams(subsample=0.5, seed=43))
    assert all(a[s].equals(b[s]) for s in a) and not a["train"].equals(c["train"])
    for split in ("train", "validation", "test"):
        assert 900 < len(a[split]) < 1100  # ~half, within 4.5 standard deviations
        assert stats["splits"][split]["kept_subsample"] == len(a[split])
        assert set(a[split].source) <= set(raw[split].source)


def test_the_kept_share_is_written_per_split(tmp_path):
    from pipeline.filter import main
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n in (("train", 400), ("validation", 100), ("test", 100)):
        pd.DataFrame({"source": ["x" * (i % 4 * 600) + "y" for i in range(n)],  # 1, 601, 1201, 1801 chars
                      "target": ["t"] * n}).to_parquet(raw / f"{split}.parquet")
    params = tmp_path / "params.yaml"
    params.write_text("filter:\n  length_unit: chars\n  max_source_tokens: 1640\n  max_target_tokens: null\n"
                      "  subsample: 0.5\n  seed: 42\n")
    main(["--params", str(params), "--raw", str(raw), "--out", str(tmp_path / "out"),
          "--metrics", str(tmp_path / "filter.json")])
    splits = json.loads((tmp_path / "filter.json").read_text())["splits"]
    for split, n in (("train", 400), ("validation", 100), ("test", 100)):
        s = splits[split]
        rows = len(pd.read_parquet(tmp_path / "out" / f"{split}.parquet"))
        assert s["raw"] == n and s["kept_length"] == 3 * n // 4  # the 1801-character quarter is dropped
        assert s["kept_subsample"] == s["kept"] == rows and s["kept_share"] == pytest.approx(rows / n)
        assert s["raw"] == s["dropped_length"] + s["dropped_subsample"] + s["kept"]


def test_a_bad_length_unit_is_one_line_naming_the_key(tmp_path):
    from pipeline.params import ParamsError, load_params
    params = tmp_path / "params.yaml"
    params.write_text("filter:\n  length_unit: bpe\n")
    with pytest.raises(ParamsError) as info:
        load_params(params)
    message = str(info.value)
    assert "filter.length_unit" in message and "'pretokens' or 'chars'" in message and "\n" not in message
    params.write_text("filter:\n  max_source_tokens: 0\n")  # off is null, not 0
    with pytest.raises(ParamsError, match=r"filter\.max_source_tokens: .*greater than 0"):
        load_params(params)


def test_the_default_filter_output_is_byte_identical_to_before(tmp_path):
    """The default params (pre-tokens, both limits set, no subsample) and a seeded subsample give
    the same files as the filter before the character unit, null limits and the kept share were
    added: sha256 of the outputs that code wrote for this fixture (pyarrow as pinned)."""
    import hashlib

    from pipeline.filter import filter_files
    from pipeline.sources.synthetic import generate
    (tmp_path / "raw").mkdir()
    generate(300, 7).to_parquet(tmp_path / "raw" / "train.parquet")
    before = {
        "default": ("33fe6d13e89601b408ed3c10ec5a1135fc7df2b9d939f8e6d03d8b03ebab7fc5",
                    "ef35bc70607f1ce76b738395c98d8b95f38470f2a4689b3458d1d4c7184489c8",
                    "dd2dead16abab8a339c11aa4b89bf40a2fa7fc72d5ca75246d79b99e8ea3c8b2"),
        "subsample": ("6398c882bf80267799f0c91972f9d8b915524ee3eb5d0dc8f873c87e071cb971",
                      "55bb56d8bd1b2b361b136b4035527670395751ec80db0f65b80a317862681941",
                      "a007c507e8720034ada802bda6c9274c7b3d68d6e67bc512a3bd02f83b0f50bc"),
    }
    configs = {"default": FilterParams(max_source_tokens=80, max_target_tokens=48),
               "subsample": FilterParams(max_source_tokens=80, max_target_tokens=48, subsample=0.5, seed=42)}
    for name, cfg in configs.items():
        stats = filter_files(tmp_path / "raw", tmp_path / name, cfg)
        got = tuple(hashlib.sha256((tmp_path / name / f"{split}.parquet").read_bytes()).hexdigest()
                    for split in ("train", "validation", "test"))
        assert got == before[name], name
        assert stats["limits"] == cfg.model_dump() and set(stats["limits"]) == set(FilterParams.model_fields)
    # the default params.yaml's filter section sets no new key: its DVC params hash is unchanged
    assert set(FilterParams.model_fields) == {"length_unit", "min_source_tokens", "max_source_tokens",
                                              "min_target_tokens", "max_target_tokens", "subsample",
                                              "val_fraction", "test_fraction", "seed"}


def test_encode_cuts_targets_when_asked(tiny_shards, tmp_path):
    full = json.loads((tiny_shards / "shards" / "manifest.json").read_text())
    manifest = encode(tiny_shards / "filtered", tiny_shards / "tokenizer", tmp_path / "shards",
                      shard_examples=100, max_source_tokens=8, max_target_tokens=6)
    table = pq.read_table([tmp_path / "shards" / f for f in manifest["splits"]["train"]["files"]])
    whole = pq.read_table([tiny_shards / "shards" / f for f in full["splits"]["train"]["files"]])
    cut, ids = table.column("tgt_ids").to_pylist(), whole.column("tgt_ids").to_pylist()
    assert all(c == i[:6] for c, i in zip(cut, ids))
    assert table.column("tgt_text").to_pylist() == whole.column("tgt_text").to_pylist()  # references whole
    assert manifest["max_target_tokens"] == 6 and manifest["splits"]["train"]["truncated_targets"] == \
        sum(len(i) > 6 for i in ids) > 0
    # unset, the manifest is as before the option existed
    assert "max_target_tokens" not in full and "truncated_targets" not in full["splits"]["train"]


def test_the_planner_takes_an_unlimited_side_from_the_encode_cap_or_max_len():
    from pathlib import Path

    from pipeline.params import load_params
    from pipeline.planning.estimate import lengths
    params = load_params(Path(__file__).resolve().parents[1] / "presets" / "cnn_dailymail.yaml")
    assert params.filter.max_target_tokens is None and params.encode.max_target_tokens == 512
    assert lengths(params, None, False, 0, max_len=513)[2:4] == (512, 513)  # the caps; + bos/eos
    params.encode.max_source_tokens = params.encode.max_target_tokens = None
    params.filter.max_source_tokens = None
    assert lengths(params, None, False, 0, max_len=513)[2:4] == (513, 514)  # nothing bounds them: max_len


def test_the_report_shows_the_kept_share_per_split():
    from pathlib import Path

    from pipeline.reporting.data_tables import data_blocks
    from pipeline.reporting.render import Table
    raw = {"train": pd.DataFrame({"source": ["x" * 10, "x" * 2000] * 100, "target": ["t"] * 200})}
    _, stats = filter_splits(raw, FilterParams(length_unit="chars", max_source_tokens=1640, max_target_tokens=None,
                                               subsample=0.5, seed=42))
    table = next(b for b in data_blocks(stats, Path("filter.json")) if isinstance(b, Table))
    rows = {row[0]: dict(zip(table.headers, row)) for row in table.rows}
    train = stats["splits"]["train"]
    assert rows["train"]["kept %"] == f"{train['kept_subsample'] / 200:.1%}" and rows["train"]["dropped %"] == "50.0%"
    assert rows["validation"]["kept %"] == "—"  # carved from train: no examples of its own
    # a filter.json written before kept_share existed: the same share from its counts
    old = {"splits": {"train": {k: v for k, v in train.items() if not k.startswith("kept_")}}}
    table = next(b for b in data_blocks(old, Path("filter.json")) if isinstance(b, Table))
    assert table.rows[0][table.headers.index("kept %")] == rows["train"]["kept %"]
