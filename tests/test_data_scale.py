"""benchmarks/data_scale.py's corpus: seeded, at least the size asked, stories as TinyStories'."""
from __future__ import annotations

import pytest

from benchmarks.data_scale import SEPARATOR, write_corpus


@pytest.mark.slow
def test_corpus_is_seeded_sized_and_shaped(tmp_path):
    a, b, c = (tmp_path / name for name in ("a.txt", "b.txt", "c.txt"))
    size = write_corpus(a, 200_000, seed=1)
    assert size == a.stat().st_size >= 200_000
    write_corpus(b, 200_000, seed=1)
    write_corpus(c, 200_000, seed=2)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    stories = a.read_text().split(f"\n{SEPARATOR}\n")
    assert stories[-1] == "" and all(story.count("\n\n") >= 1 for story in stories[:-1])


def test_corpus_from_a_file_repeats_its_documents_shuffled(tmp_path):
    text = f"One day.\n{SEPARATOR}\nTwo days.\n{SEPARATOR}\nThree days.\n"
    write_corpus(tmp_path / "x.txt", 300, seed=0, text=text)
    stories = (tmp_path / "x.txt").read_text().split(f"\n{SEPARATOR}\n")[:-1]
    assert set(stories) == {"One day.", "Two days.", "Three days."} and len(stories) >= 3 * 10
    assert stories[:3] != stories[3:6] or stories[3:6] != stories[6:9]  # reshuffled each round
