"""Stage `filter`: keep examples within the token-length limits, subsample, split.

    python -m pipeline.filter --raw data/raw --out data/filtered --metrics data/metrics/filter.json

Lengths are counted with a cheap pre-tokenizer (words and punctuation marks), before any subword
model exists, so the limits bound the BPE length only roughly (BPE is usually longer); or, with
`filter.length_unit: chars`, in characters (character-level studies).
Sources without a validation or test split get one carved from train: with a seeded shuffle, or
for language modelling (meta.json's task) from the end of train in document order, validation
then test, so that neighbouring paragraphs of one text only meet at the split boundaries (a
shuffle would put the rest of a training story into the test set).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.atomic import atomic_path, atomic_write_json
from pipeline.params import FilterParams, ParamsError, load_params, stage_error

SPLITS = ("train", "validation", "test")
_PRETOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    return len(_PRETOKEN.findall(text))


def length_counter(unit: str):
    return len if unit == "chars" else count_tokens


def percentiles(lengths: np.ndarray) -> dict[str, float]:
    if lengths.size == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    q = np.percentile(lengths, [50, 90, 99])
    return {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": float(lengths.max())}


def read_raw(raw_dir: Path) -> dict[str, pd.DataFrame]:
    frames = {}
    for split in SPLITS:
        path = raw_dir / f"{split}.parquet"
        if path.exists():
            frame = pd.read_parquet(path)
            missing = {"source", "target"} - set(frame.columns)
            if missing:
                raise ValueError(f"{path}: missing column(s) {', '.join(sorted(missing))}")
            frames[split] = frame[["source", "target"]].fillna("")
    if "train" not in frames:
        raise ValueError(f"{raw_dir}: no train.parquet")
    return frames


def filter_splits(frames: dict[str, pd.DataFrame], cfg: FilterParams,
                  task: str | None = None) -> tuple[dict[str, pd.DataFrame], dict]:
    """Length filter + subsample per split, then carve missing validation/test splits from train:
    shuffled, or for task language_modeling the contiguous tail of train (never shuffled).

    Per split the stats add up: raw = dropped_length + dropped_subsample + kept + moved to other
    splits. Length percentiles are given for the raw examples and for the kept ones.
    """
    rng = np.random.default_rng(cfg.seed)
    count = length_counter(cfg.length_unit)
    kept, stats = {}, {"splits": {}, "length_unit": cfg.length_unit}
    lengths = {(side, stage): [] for side in ("source", "target") for stage in ("raw", "kept")}
    for split, frame in frames.items():
        src_len = frame["source"].map(count).to_numpy()
        tgt_len = frame["target"].map(count).to_numpy()
        ok = (cfg.min_source_tokens <= src_len) & (src_len <= cfg.max_source_tokens) & \
            (cfg.min_target_tokens <= tgt_len) & (tgt_len <= cfg.max_target_tokens)
        keep = ok.copy()
        if cfg.subsample < 1.0:
            keep[ok] = rng.random(int(ok.sum())) < cfg.subsample
        kept[split] = frame[keep].reset_index(drop=True)
        # Carving below only moves rows between splits, so these are the kept rows' lengths too.
        for side, n in (("source", src_len), ("target", tgt_len)):
            lengths[side, "raw"].append(n)
            lengths[side, "kept"].append(n[keep])
        stats["splits"][split] = {"raw": len(ok), "dropped_length": int((~ok).sum()),
                                  "dropped_subsample": int(ok.sum() - keep.sum()), "kept": int(keep.sum())}
    missing = [s for s in ("validation", "test") if s not in kept]
    if missing:
        fractions = {"validation": cfg.val_fraction, "test": cfg.test_fraction}
        sizes = {split: int(round(len(kept["train"]) * fractions[split])) for split in missing}
        if task == "language_modeling":
            # The tail in document order: a story cut into paragraph rows straddles at most the
            # train/validation and validation/test boundaries.
            train = kept["train"]
            start = max(0, len(train) - sum(sizes.values()))
            rest, stats["carve"] = train.iloc[:start], "contiguous_tail"
        else:
            train = kept["train"].iloc[rng.permutation(len(kept["train"]))].reset_index(drop=True)
            start = 0
            rest, stats["carve"] = train.iloc[sum(sizes.values()):], "shuffled"
        for split in missing:
            n = sizes[split]
            kept[split] = train.iloc[start:start + n].reset_index(drop=True)
            stats["splits"][split] = {"raw": 0, "dropped_length": 0, "dropped_subsample": 0, "kept": n,
                                      "from_train": n}
            stats["splits"]["train"][f"to_{split}"] = n
            start += n
        kept["train"] = rest.reset_index(drop=True)
        stats["splits"]["train"]["kept"] = len(kept["train"])
    for split in SPLITS:
        if kept.get(split) is None or kept[split].empty:
            raise ValueError(f"split {split!r} is empty after filtering: {_why_empty(split, stats['splits'], cfg)}")
    stats["length_percentiles"] = {
        side: {stage: percentiles(np.concatenate(lengths[side, stage])) for stage in ("raw", "kept")}
        for side in ("source", "target")}
    stats["limits"] = cfg.model_dump()
    return kept, stats


def _why_empty(split: str, splits: dict, cfg: FilterParams) -> str:
    """What emptied `split` and the setting to change: the length limits are blamed only when they
    removed examples (raising them cannot fill a split that had no rows to begin with)."""
    train = splits["train"]
    carved = train.get("to_validation", 0) + train.get("to_test", 0)
    limits = (f"source {cfg.min_source_tokens}-{cfg.max_source_tokens}, target {cfg.min_target_tokens}-"
              f"{cfg.max_target_tokens} {cfg.length_unit}")
    s = splits[split]
    if "from_train" in s:  # carved from train, which is not empty (it is checked first)
        fraction = "val_fraction" if split == "validation" else "test_fraction"
        why = (f"filter.{fraction} = {getattr(cfg, fraction)} of the {train['kept'] + carved} training "
               f"examples left rounds to none; raise it or give the source more examples")
        removed = [f"the length limits ({limits}) removed {train['dropped_length']} of {train['raw']}"
                   ] if train["dropped_length"] else []
        if train["dropped_subsample"]:
            removed.append(f"filter.subsample = {cfg.subsample} removed {train['dropped_subsample']}")
        return why + (f" ({'; '.join(removed)})" if removed else "")
    if s["raw"] == 0:
        return "the raw split has no examples"
    if s["dropped_length"] == s["raw"]:
        return f"all {s['raw']} examples are outside the length limits ({limits}); loosen the filter limits"
    if s["kept"] + (carved if split == "train" else 0) == 0:
        return (f"filter.subsample = {cfg.subsample} kept none of the {s['raw'] - s['dropped_length']} "
                f"examples within the length limits; raise it")
    return (f"filter.val_fraction + filter.test_fraction took all {carved} examples for validation and "
            f"test; lower them")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--raw", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    try:
        cfg = load_params(args.params).filter
        raw = Path(args.raw)
        meta = raw / "meta.json"
        info = json.loads(meta.read_text(encoding="utf-8")) if meta.exists() else {}
        kept, stats = filter_splits(read_raw(raw), cfg, info.get("task"))
        # What the source said about its splits (e.g. "test is the validation text"): the report
        # reads it from here, next to the split counts it qualifies.
        stats["source_notes"] = list(info.get("notes", []))
        with atomic_path(args.out) as tmp:
            tmp.mkdir(parents=True)
            for split, frame in kept.items():
                frame.to_parquet(tmp / f"{split}.parquet", index=False)
            if (raw / "meta.json").exists():
                shutil.copy(raw / "meta.json", tmp / "meta.json")
        atomic_write_json(args.metrics, stats)
    except (ParamsError, ValueError, OSError) as exc:
        raise stage_error("filter", exc) from None


if __name__ == "__main__":
    main()
