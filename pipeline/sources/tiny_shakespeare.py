"""Tiny Shakespeare (language modelling): the 1.1 MB `input.txt` of karpathy/char-rnn.

Documents: the file is a sequence of speeches ("SPEAKER:\\nlines...") separated by blank lines.
Each speech is one document (`doc_chars: 0`), or consecutive speeches are packed into documents
of at most `doc_chars` characters (a single longer speech stays whole), which wastes less padding
on the many one-line speeches.
Splits: contiguous, in text order: the first (1 - validation_fraction - test_fraction) of the
documents are train, the next validation_fraction validation, the last test_fraction test.
Contiguous rather than shuffled so that neighbouring lines of one scene do not land on both sides
of the train/test boundary.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from pipeline.sources import RemoteOptions, check_pins, download, parse_options, write_raw
from pipeline.sources.formats import split_paragraphs

NAME = "tiny_shakespeare"
task = "language_modeling"

BASE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare"


class Options(RemoteOptions):
    base_url: str = BASE_URL
    file: str = "input.txt"
    doc_chars: int = Field(0, ge=0)  # 0: one speech per document; N: pack speeches up to N chars
    validation_fraction: float = Field(0.05, gt=0, lt=1)
    test_fraction: float = Field(0.05, gt=0, lt=1)

    @model_validator(mode="after")
    def _train_left(self) -> "Options":
        if self.validation_fraction + self.test_fraction >= 1:
            raise ValueError("validation_fraction + test_fraction must be < 1")
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


def fetch(options: dict, cache_dir: Path, out_dir: Path) -> None:
    opts = parse_options(Options, options, NAME)
    check_pins(opts, [opts.file], NAME)
    path, record = download(opts.base_url, opts.file, cache_dir, opts)
    docs = pack(split_paragraphs(path.read_text(encoding="utf-8")), opts.doc_chars)
    splits = split_contiguous(docs, opts.validation_fraction, opts.test_fraction)
    rows = {s: {"source": [""] * len(d[:opts.max_rows]), "target": d[:opts.max_rows]}
            for s, d in splits.items()}
    write_raw(out_dir, rows, {"source": NAME, "task": task, "files": [record],
                              "options": opts.model_dump()})
