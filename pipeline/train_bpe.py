"""Stage `train_bpe`: a SentencePiece model trained on the filtered training split.

    python -m pipeline.train_bpe --data data/filtered --out data/tokenizer

Source and target share one vocabulary (so the model may share embeddings). `model_type: char`
gives the character-level tokenizer some seed studies used; `bpe` is the default.
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pandas as pd
import sentencepiece as spm

from pipeline.atomic import atomic_path
from pipeline.params import ParamsError, TrainBpeParams, load_params, stage_error


def write_corpus(train_parquet: Path, corpus: Path) -> int:
    """One sentence per line: sources and targets, newlines flattened."""
    frame = pd.read_parquet(train_parquet)
    n = 0
    with corpus.open("w", encoding="utf-8") as fh:
        for column in ("source", "target"):
            for text in frame[column]:
                text = " ".join(str(text).split())
                if text:
                    fh.write(text + "\n")
                    n += 1
    return n


def train_tokenizer(train_parquet: Path, out_dir: Path, cfg: TrainBpeParams) -> None:
    spm.set_random_generator_seed(0)  # same corpus + params -> same tokenizer
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        corpus = tmp / "corpus.txt"
        if write_corpus(train_parquet, corpus) == 0:
            raise ValueError(f"{train_parquet}: no text to train the tokenizer on")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(tmp / "spm"), model_type=cfg.model_type,
            vocab_size=cfg.vocab_size, character_coverage=cfg.character_coverage,
            input_sentence_size=cfg.input_sentence_size, shuffle_input_sentence=True,
            pad_id=cfg.pad_id, unk_id=cfg.unk_id, bos_id=cfg.bos_id, eos_id=cfg.eos_id,
            # A char model's vocabulary is what the corpus has; don't fail when it is smaller.
            hard_vocab_limit=cfg.model_type != "char", max_sentence_length=1 << 16,
            num_threads=2, minloglevel=2,
        )
        corpus.unlink()


def load_tokenizer(directory: Path) -> spm.SentencePieceProcessor:
    """The stage's SentencePiece model; a missing or damaged file is a ValueError naming it."""
    model_file = Path(directory) / "spm.model"
    if not model_file.is_file():
        raise ValueError(f"{model_file}: no tokenizer here (run the train_bpe stage first)")
    try:
        return spm.SentencePieceProcessor(model_file=str(model_file))
    except (RuntimeError, OSError) as exc:
        raise ValueError(f"{model_file}: not a readable SentencePiece model ({str(exc).splitlines()[0]})") from exc


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        cfg = load_params(args.params).train_bpe
        train_tokenizer(Path(args.data) / "train.parquet", Path(args.out), cfg)
    except (ParamsError, ValueError, OSError, RuntimeError) as exc:
        raise stage_error("train_bpe", exc) from None


if __name__ == "__main__":
    main()
