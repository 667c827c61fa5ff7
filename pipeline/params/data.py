"""The data stages' sections: `data` (the source), `filter`, `train_bpe` and `encode`."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.params.section import Section, unknown_key

# Every dataset source; each real one keeps its options under `data.<name>` (pipeline/sources).
SOURCE_NAMES = ("synthetic", "cnn_dailymail", "tiny_shakespeare", "tinystories", "iwslt2017", "multi30k", "local")


def default_cache_dir() -> Path:
    """`$ABLATION_LAB_CACHE`, else `~/.cache/ablation-lab`: per-user state outside the repository
    (downloads, the CPU's measured peak)."""
    env = os.environ.get("ABLATION_LAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ablation-lab"


def check_local_paths(paths: object, root: Path, key: str = "data.local.paths") -> None:
    """Every path named under `data.local.paths` (strings, lists, {source, target} maps) lies in `root`."""
    if isinstance(paths, dict):
        for name, value in paths.items():
            check_local_paths(value, root, f"{key}.{name}")
    elif isinstance(paths, list):
        for value in paths:
            check_local_paths(value, root, key)
    elif isinstance(paths, str):
        inside = os.path.abspath(os.path.expanduser(paths))
        if os.path.commonpath([inside, os.path.abspath(root)]) != os.path.abspath(root):
            raise ValueError(f"{key}: {paths} is outside {root}/, where DVC tracks local data; move "
                             f"or link it there (an edit elsewhere would not rerun the pipeline)")


def check_source_paths(source: str, options: dict, root: Path) -> None:
    """The files a source reads in place (local's paths, iwslt2017's local_dir) lie in `root`."""
    if source == "local":
        check_local_paths(options.get("paths"), root)
    elif source == "iwslt2017" and options.get("local_dir") is not None:
        check_local_paths(options["local_dir"], root, "data.iwslt2017.local_dir")


class SyntheticParams(Section):
    n_examples: int = Field(4000, gt=0)  # articles generated before filtering
    seed: int = 1234  # the generator's own seed: the dataset is fixed across training seeds


class DataParams(BaseModel):
    # Extra keys are allowed here, but only source names: data.<source> holds that source's options (its own schema).
    model_config = ConfigDict(extra="allow")
    source: Literal[SOURCE_NAMES] = "synthetic"
    cache_dir: str | None = None  # where real downloads are cached (default ~/.cache/ablation-lab)
    synthetic: SyntheticParams = SyntheticParams()

    @model_validator(mode="after")
    def _extras_are_sources(self) -> "DataParams":
        for key in self.model_extra or {}:
            if key not in SOURCE_NAMES:
                raise ValueError(unknown_key(f"data.{key}", key, [*type(self).model_fields, *SOURCE_NAMES]))
        return self


class FilterParams(Section):
    # The unit of the four limits: pre-tokens (words and punctuation; cheap, before any subword model) or
    # characters of the text (no tokenizer exists yet at this stage, so not its tokens).
    length_unit: Literal["pretokens", "chars"] = "pretokens"
    min_source_tokens: int = Field(0, ge=0)
    max_source_tokens: int | None = Field(1024, gt=0)  # None (null): no upper limit on this side
    min_target_tokens: int = Field(1, ge=0)
    max_target_tokens: int | None = Field(256, gt=0)  # None (null): no upper limit on this side
    subsample: float = Field(1.0, gt=0, le=1)  # fraction kept after the length filter
    val_fraction: float = Field(0.1, ge=0, lt=1)  # only used where the source has no such split
    test_fraction: float = Field(0.1, ge=0, lt=1)
    seed: int = 0

    @model_validator(mode="after")
    def _room_for_training(self) -> "FilterParams":
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(f"filter.val_fraction + filter.test_fraction = "
                             f"{self.val_fraction + self.test_fraction:g} leaves nothing to train on (must be < 1)")
        return self


class TrainBpeParams(Section):
    model_type: Literal["bpe", "char", "unigram"] = "bpe"
    vocab_size: int = Field(1000, gt=4)
    character_coverage: float = Field(1.0, gt=0, le=1)
    input_sentence_size: int = Field(1_000_000, gt=0)  # sentences sampled for training the tokenizer
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3


class EncodeParams(Section):
    shard_examples: int = Field(50_000, gt=0)  # rows per parquet shard
    max_source_tokens: int | None = Field(None, gt=0)  # keep each source's first N tokens; None: all
    max_target_tokens: int | None = Field(None, gt=0)  # keep each target's first N tokens; None: all
