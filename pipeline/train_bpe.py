"""Stage `train_bpe`: a SentencePiece model trained on the filtered training split.

    python -m pipeline.train_bpe --data data/filtered --out data/tokenizer

Source and target share one vocabulary (so the model may share embeddings). `model_type: char`
gives the character-level tokenizer some seed studies used; `bpe` is the default.

The text's own characters are kept: SentencePiece's default NFKC normalisation and whitespace
collapsing are off, and "\n" is a token of its own, so a character model of Tiny Shakespeare sees
line breaks (as nanoGPT's does) and decoding gives back the text, sentence breaks included.
`tokenizer.json` records this; the report quotes it. The model is trained from an in-memory
iterator and written from memory, so it embeds no temporary path: the same corpus and params give
a byte-identical `spm.model` (and unchanged hashes downstream).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import sentencepiece as spm

from pipeline.io.atomic import atomic_path
from pipeline.io.progress import Progress
from pipeline.params import ParamsError, TrainBpeParams, load_params, stage_error


NEWLINE = "\n"
BATCH_ROWS = 4096  # texts read at a time
# What the tokenizer does to text before splitting it; written to tokenizer.json for the report.
NORMALIZATION = {
    "rule": "identity",  # no NFKC: the dataset's characters are the model's characters
    "whitespace": "kept as written (no collapsing or stripping)",
    "newline": "kept: '\\n' is a token of its own",
    "unknown": "characters outside the vocabulary become <unk> in the model's input; references "
               "and character counts are taken from the raw text",
}


def corpus_lines(train_parquet: Path) -> Iterator[str]:
    """Training sentences: every non-empty line of sources, then of targets. SentencePiece learns
    pieces within a line; the newline itself is the user-defined newline token.

    Read a record batch at a time: SentencePiece keeps its own sample of `input_sentence_size`
    sentences (a reservoir sample, with shuffle_input_sentence), so the stage never holds more."""
    with pq.ParquetFile(train_parquet, buffer_size=1 << 20, pre_buffer=False) as file:  # streamed
        rows = file.metadata.num_rows
        with Progress("train_bpe: reading sentences", total=2 * rows, unit="rows") as progress:
            n = 0
            for column in ("source", "target"):
                for batch in file.iter_batches(batch_size=BATCH_ROWS, columns=[column]):
                    for text in batch.column(0).to_pylist():
                        for line in str(text).split(NEWLINE):
                            if line.strip():
                                n += 1
                                yield line
                    progress.update(batch.num_rows)
            if progress.now() - progress.start >= progress.every_s:  # a long read: say what comes next
                # (SentencePiece's training reports nothing at this log level)
                print(f"train_bpe: {n:,} sentences read; SentencePiece trains on its sample of them",
                      file=sys.stderr, flush=True)


def train_tokenizer(train_parquet: Path, out_dir: Path, cfg: TrainBpeParams) -> None:
    spm.set_random_generator_seed(0)  # same corpus + params -> same tokenizer
    lines = corpus_lines(train_parquet)
    first = next(lines, None)
    if first is None:
        raise ValueError(f"{train_parquet}: no text to train the tokenizer on")
    model = io.BytesIO()
    try:
        _train(itertools.chain([first], lines), model, cfg)
    except RuntimeError as exc:
        raise vocab_error(exc, cfg) from exc
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        (tmp / "spm.model").write_bytes(model.getvalue())
        (tmp / "tokenizer.json").write_text(json.dumps(
            {"model_type": cfg.model_type, "normalization": NORMALIZATION}, indent=2) + "\n")


def vocab_error(exc: RuntimeError, cfg: TrainBpeParams) -> Exception:
    """SentencePiece's vocabulary-size errors, said in params.yaml's terms (others unchanged)."""
    text = str(exc)
    if low := re.search(r"smaller than required_chars\. \d+ vs (\d+)", text):
        return ParamsError(f"train_bpe.vocab_size: {cfg.vocab_size} is below the {low[1]} pieces this corpus "
                           "needs (its characters and the special tokens); raise it, or lower "
                           "train_bpe.character_coverage")
    if high := re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", text):
        return ParamsError(f"train_bpe.vocab_size: {cfg.vocab_size} is above the {high[1]} pieces "
                           f"{cfg.model_type} can find in this corpus; lower it")
    return exc


def _train(sentences: Iterator[str], model: io.BytesIO, cfg: TrainBpeParams) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences, model_writer=model, model_type=cfg.model_type,
        vocab_size=cfg.vocab_size, character_coverage=cfg.character_coverage,
        input_sentence_size=cfg.input_sentence_size, shuffle_input_sentence=True,
        pad_id=cfg.pad_id, unk_id=cfg.unk_id, bos_id=cfg.bos_id, eos_id=cfg.eos_id,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        # BPE: a word starting a text gets the same "▁word" piece as mid-text (so a name is the same
        # token in article and summary, and can be copied); characters: no extra leading token.
        add_dummy_prefix=cfg.model_type != "char", user_defined_symbols=[NEWLINE],
        allow_whitespace_only_pieces=True,
        # A char model's vocabulary is what the corpus has; don't fail when it is smaller.
        hard_vocab_limit=cfg.model_type != "char", max_sentence_length=1 << 16,
        num_threads=2, minloglevel=2,
    )


def describe_normalization(directory: Path) -> str:
    """One line for the report: what the tokenizer in `directory` does to the text."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        return "not recorded (tokenizer made by an older version)"
    norm = json.loads(path.read_text()).get("normalization", {})
    return "; ".join(f"{k}: {v}" for k, v in norm.items())


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
    from pipeline.warm.exit import run_main

    run_main(main)  # exits at once: no teardown of the imported modules (pipeline/warm/exit.py)
