"""Tiny Shakespeare (language modelling): the 1.1 MB `input.txt` of karpathy/char-rnn.

Documents: the file is a sequence of speeches ("SPEAKER:\\nlines...") separated by blank lines.
Each speech is one document (`doc_chars: 0`), or consecutive speeches are packed into documents
of at most `doc_chars` characters (a single longer speech stays whole), which wastes less padding
on the many one-line speeches.
Splits: contiguous, in text order: the first (1 - validation_fraction - test_fraction) of the
documents are train, the next validation_fraction validation, the last test_fraction test.
Contiguous rather than shuffled so that neighbouring lines of one scene do not land on both sides
of the train/test boundary.
`split_unit: characters` cuts the text itself instead, as nanoGPT's prepare.py does: the first
(1 - validation_fraction - test_fraction) of the characters are train, and so on; each split is
then one document, the text exactly as written (blank lines included). nanoGPT has no test split:
`test_fraction: 0` makes test the validation text again, and meta.json's notes say so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.sources.common import NeededFile, RemoteFiles, UrlOptions, needed_file, parse_options, write_raw
from pipeline.sources.plain_text import split_paragraphs

NAME = "tiny_shakespeare"
task = "language_modeling"

BASE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare"


class Options(UrlOptions):  # a GitHub raw file: a plain URL (pipeline/sources/http.py)
    base_url: str = BASE_URL
    file: str = "input.txt"
    doc_chars: int = Field(0, ge=0)  # 0: one speech per document; N: pack speeches up to N chars
    split_unit: Literal["documents", "characters"] = "documents"
    validation_fraction: float = Field(0.05, gt=0, lt=1)
    test_fraction: float = Field(0.05, ge=0, lt=1)  # 0: only with split_unit characters

    @model_validator(mode="after")
    def _train_left(self) -> "Options":
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError("validation_fraction + test_fraction must be < 1")
        if self.test_fraction == 0 and self.split_unit != "characters":
            raise ValueError("test_fraction 0 (test = validation) needs split_unit: characters")
        return self


def pack(speeches: list[str], doc_chars: int) -> list[str]:
    """Greedily join consecutive speeches (blank line between) while the result fits doc_chars."""
    if doc_chars == 0:
        return list(speeches)
    docs: list[str] = []
    for speech in speeches:
        if docs and len(docs[-1]) + 2 + len(speech) <= doc_chars:
            docs[-1] += "\n\n" + speech
        else:
            docs.append(speech)
    return docs


def split_contiguous(docs: list[str], validation_fraction: float, test_fraction: float
                     ) -> dict[str, list[str]]:
    n_val, n_test = round(len(docs) * validation_fraction), round(len(docs) * test_fraction)
    n_train = len(docs) - n_val - n_test
    if min(n_train, n_val, n_test) < 1:
        raise ValueError(f"{NAME}: {len(docs)} documents are too few for the split fractions "
                         f"(train {n_train}, validation {n_val}, test {n_test}); lower doc_chars")
    return {"train": docs[:n_train], "validation": docs[n_train:n_train + n_val],
            "test": docs[n_train + n_val:]}


def split_characters(text: str, validation_fraction: float, test_fraction: float
                     ) -> tuple[dict[str, list[str]], list[str]]:
    """nanoGPT's split: train = text[:int(n * train_fraction)], then validation, then test."""
    n = len(text)
    n_train = int(n * (1 - validation_fraction - test_fraction))
    n_val = int(n * validation_fraction) if test_fraction else n - n_train
    splits = {"train": [text[:n_train]], "validation": [text[n_train:n_train + n_val]]}
    if test_fraction:
        splits["test"] = [text[n_train + n_val:]]
        return splits, []
    splits["test"] = splits["validation"]
    return splits, [f"{NAME}: no separate test text (test_fraction 0, as nanoGPT): the test split "
                    f"is the validation text, the last {n - n_train:,} of {n:,} characters"]


def needed_files(opts: Options, cache_dir: Path) -> list[NeededFile]:
    return [needed_file(opts.base_url, opts.file, cache_dir)]  # one file for all three splits


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> dict:
    opts = parse_options(Options, options, NAME)
    files = RemoteFiles(NAME, needed_files(opts, cache_dir), opts)
    path, record = files.get(files.needed[0])
    text = path.read_text(encoding="utf-8")
    if opts.split_unit == "characters":
        splits, notes = split_characters(text, opts.validation_fraction, opts.test_fraction)
    else:
        docs, notes = pack(split_paragraphs(text), opts.doc_chars), []
        splits = split_contiguous(docs, opts.validation_fraction, opts.test_fraction)
    rows = {s: {"source": [""] * len(d[:opts.max_rows]), "target": d[:opts.max_rows]}
            for s, d in splits.items()}
    return write_raw(out_dir, rows, {"source": NAME, "task": task, "files": [record],
                                     "options": opts.model_dump(), "notes": notes})
