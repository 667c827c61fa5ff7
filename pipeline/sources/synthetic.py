"""The embedded default dataset: seeded synthetic article -> summary pairs.

Why this task: an article is a shuffle of *fact* sentences ("Kavomir sold 12 lamps in Orlen .")
and *filler* sentences. The summary lists every fact as "<name> <verb> <number> <object>", in
article order, dropping places and fillers. Names are made up per article from syllables, so the
model has to copy them through attention rather than memorise them. Binding a name to its number
and keeping the facts in order both need to know *where* each token is: without positional
information the encoder sees a bag of tokens, so the "no positional encoding" ablation is worse for
a real reason, not by construction of the metric.

Articles vary in length (1..6 facts, 0..4 fillers), so some exceed the filter's limit.
"""
from __future__ import annotations

import random

import pandas as pd

SYLLABLES = ("ka", "ro", "mi", "ta", "ven", "dor", "li", "sa", "mur", "el", "qua", "zen", "bo", "ri",
             "tel", "nu", "fa", "gor", "pi", "xa", "lu", "des", "or", "wen")
VERBS = ("bought", "sold", "found", "lost", "painted", "built", "carried", "counted", "hid", "mended")
OBJECTS = ("apples", "boats", "lamps", "books", "coins", "chairs", "kites", "drums", "maps", "bells",
           "ropes", "jars")
PLACES = ("Orlen", "Bastow", "Kemmer", "the harbour", "the old mill", "Vasty", "the market",
          "Drumlin", "the north gate")
ADJECTIVES = ("quiet", "grey", "busy", "cold", "bright", "strange", "long", "windy")
NOUNS = ("morning", "council", "river", "road", "festival", "season", "crowd", "weather")
FILLERS = (
    "The {adj} {noun} was {adj2} that day .",
    "Nobody talked about the {noun} until the {adj} evening .",
    "Everyone agreed the {noun} felt {adj} .",
    "Later , the {noun} grew {adj2} again .",
    "It was a {adj} week for the {noun} .",
)
FACTS = (
    "{name} {verb} {num} {obj} in {place} .",
    "In {place} , {name} {verb} {num} {obj} .",
    "At dawn {name} {verb} {num} {obj} near {place} .",
)


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def make_example(rng: random.Random) -> tuple[str, str]:
    n_facts, n_fillers = rng.randint(1, 6), rng.randint(0, 4)
    names = []
    while len(names) < min(n_facts, 4):  # a few people per article, some appear twice
        name = _name(rng)
        if name not in names:
            names.append(name)
    facts = []
    for _ in range(n_facts):
        facts.append(dict(name=rng.choice(names), verb=rng.choice(VERBS), num=rng.randint(2, 99),
                          obj=rng.choice(OBJECTS), place=rng.choice(PLACES)))
    # Interleave facts and fillers at random, keeping the facts' relative order (the summary's).
    kinds = ["fact"] * n_facts + ["filler"] * n_fillers
    rng.shuffle(kinds)
    sentences, fact_iter = [], iter(facts)
    for kind in kinds:
        if kind == "fact":
            sentences.append(rng.choice(FACTS).format(**next(fact_iter)))
        else:
            sentences.append(rng.choice(FILLERS).format(adj=rng.choice(ADJECTIVES), noun=rng.choice(NOUNS),
                                                        adj2=rng.choice(ADJECTIVES)))
    summary = " ; ".join(f"{f['name']} {f['verb']} {f['num']} {f['obj']}" for f in facts) + " ."
    return " ".join(sentences), summary


def generate(n_examples: int, seed: int) -> pd.DataFrame:
    """`n_examples` (source, target) pairs; the same arguments always give the same frame."""
    if n_examples <= 0:
        raise ValueError(f"data.synthetic.n_examples must be positive, got {n_examples}")
    rng = random.Random(seed)
    rows = [make_example(rng) for _ in range(n_examples)]
    return pd.DataFrame(rows, columns=["source", "target"])
