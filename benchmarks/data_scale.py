"""The data stages at corpus sizes users bring: wall time, MB/s and peak memory per stage, per size.

Run: python -m benchmarks.data_scale [--sizes 400,2000] [--text FILE] [--keep] [--seed 0]
Prints one JSON object to stdout (progress lines of the stages go to stderr).

For each size N (MB = 10^6 bytes) a scratch project gets a seeded N-MB TinyStories-like corpus
(synthetic stories, or --text's documents in shuffled order) and presets/tinystories_cpu.yaml with
one story a row; the four data stages run as dvc.yaml's cmds run them, each a child process. The
figures: docs/tests-and-benchmarks.md#data-stages-at-scale; peak_tree_rss_mb, sampled every 0.1 s
over the process tree, counts pages shared after fork once per process.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("download", "filter", "train_bpe", "encode")
SEPARATOR = "<|endoftext|>"
MB = 10 ** 6

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "br", "ch", "fl", "gr", "pl", "sh", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ee", "oo", "ou", "y"]
_CODAS = ["", "", "n", "t", "d", "s", "ll", "ck", "ng", "p", "m", "r"]


def vocabulary(rng: np.random.Generator, n: int = 20000) -> list[str]:
    """n distinct seeded words of one to three syllables (enough for a 10k-piece BPE)."""
    words: dict[str, None] = {}
    while len(words) < n:
        word = "".join(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                       + _CODAS[rng.integers(len(_CODAS))] for _ in range(rng.integers(1, 4)))
        words[word] = None
    return sorted(words, key=len)  # the frequent words (drawn first) are the short ones, as in text


def sentence_pool(rng: np.random.Generator, n: int = 50000) -> list[str]:
    """n seeded sentences of 4 to 15 words, words drawn with Zipf-like frequencies as in text."""
    words = vocabulary(rng)
    weights = 1.0 / np.arange(1, len(words) + 1)
    picks = iter(rng.choice(len(words), size=n * 15, p=weights / weights.sum()))
    out = []
    for length, end in zip(rng.integers(4, 16, size=n), rng.random(n)):
        text = " ".join(words[next(picks)] for _ in range(length))
        out.append(text[0].upper() + text[1:] + ("!" if end < 0.1 else "?" if end < 0.15 else "."))
    return out


def _synthetic_stories(rng: np.random.Generator, block: int = 1000):
    """Stories of 2 to 5 paragraphs of 2 to 5 sentences, paragraphs split by blank lines."""
    pool = sentence_pool(rng)
    while True:  # numbers drawn a block of stories at a time (a 2 GB corpus is 2M stories)
        paragraphs = rng.integers(2, 6, size=block)
        sentences = rng.integers(2, 6, size=int(paragraphs.sum()))
        picks = iter(rng.integers(len(pool), size=int(sentences.sum())).tolist())
        lengths = iter(sentences.tolist())
        for n_paragraphs in paragraphs.tolist():
            yield "\n\n".join(" ".join(pool[next(picks)] for _ in range(next(lengths)))
                               for _ in range(n_paragraphs))


def _file_stories(rng: np.random.Generator, text: str):
    docs = [d.strip() for d in (text.split(SEPARATOR) if SEPARATOR in text else text.split("\n\n"))]
    docs = [d for d in docs if d]
    if not docs:
        raise ValueError("--text: no documents in the file")
    while True:
        for i in rng.permutation(len(docs)):
            yield docs[i]


def write_corpus(path: Path, n_bytes: int, seed: int, text: str | None = None) -> int:
    """Stories separated by SEPARATOR lines until the file has at least n_bytes; its size."""
    rng = np.random.default_rng(seed)
    stories = _synthetic_stories(rng) if text is None else _file_stories(rng, text)
    written = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        while written < n_bytes:
            chunk = "".join(f"{story}\n{SEPARATOR}\n" for story, _ in zip(stories, range(1000)))
            f.write(chunk)
            written += len(chunk.encode("utf-8"))
    return written


def io_floor(path: Path) -> float:
    """Seconds to read `path` and split it into lines in plain Python."""
    start = time.perf_counter()
    n = 0
    with open(path, encoding="utf-8") as f:
        for _ in f:
            n += 1
    return time.perf_counter() - start


def project_params(vocab_size: int) -> dict:
    params = yaml.safe_load((ROOT / "presets" / "tinystories_cpu.yaml").read_text())
    params["data"] = {"source": "local", "local": {
        "task": "language_modeling", "paths": {"train": "data/local/corpus.txt"},
        "documents": "separator", "separator": SEPARATOR}}
    params["train_bpe"]["vocab_size"] = vocab_size
    return params


def stage_commands() -> dict[str, list[str]]:
    """dvc.yaml's cmd of each data stage, `python` being this interpreter."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    commands = {}
    for name in STAGES:
        argv = shlex.split(stages[name]["cmd"])
        commands[name] = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
    return commands


def _tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and its descendants (from /proc; 0 for a process gone meanwhile)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(children.get(p, []))
    return total


def run_stage(command: list[str], cwd: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=cwd, env=env)
    peak_tree, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not done.wait(0.1):
            peak_tree = max(peak_tree, _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"data_scale: {' '.join(command)} exited with {proc.returncode}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "peak_tree_rss_mb": round(peak_tree / 2 ** 20, 1)}


def run_size(size_mb: int, base: Path, seed: int, text: str | None, vocab_size: int) -> dict:
    project = base / f"{size_mb}mb"
    (project / "data" / "local").mkdir(parents=True)
    corpus = project / "data" / "local" / "corpus.txt"
    n_bytes = write_corpus(corpus, size_mb * MB, seed, text)
    (project / "params.yaml").write_text(yaml.safe_dump(project_params(vocab_size), sort_keys=False))
    floor = io_floor(corpus)
    out = {"corpus_mb": round(n_bytes / MB, 1), "io_floor_s": round(floor, 2), "stages": {}}
    for name, command in stage_commands().items():
        print(f"data_scale: {size_mb} MB: {name}", file=sys.stderr, flush=True)
        result = run_stage(command, project)
        result["MB_per_s"] = round(n_bytes / MB / result["wall_s"], 1)
        result["floor_ratio"] = round(result["wall_s"] / floor, 2)
        out["stages"][name] = result
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="400,2000", help="corpus sizes in MB, comma-separated")
    p.add_argument("--text", type=Path, help="build the corpus from this file's documents")
    p.add_argument("--keep", action="store_true", help="keep the scratch projects (their path is printed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=10000)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    text = args.text.read_text(encoding="utf-8") if args.text else None
    base = Path(tempfile.mkdtemp(prefix="data_scale."))
    try:
        runs = {str(size): run_size(size, base, args.seed, text, args.vocab_size) for size in sizes}
    finally:
        if args.keep:
            print(f"data_scale: scratch projects kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    small, large = runs[str(min(sizes))], runs[str(max(sizes))]
    result = {
        "config": {"sizes_mb": sizes, "text": str(args.text) if args.text else None, "seed": args.seed,
                   "vocab_size": args.vocab_size, "cpus": os.cpu_count(), "machine": platform.machine()},
        "sizes": runs,
        # ~1 for a stage that streams.
        "peak_rss_growth": {name: round(large["stages"][name]["peak_rss_mb"] / small["stages"][name]["peak_rss_mb"], 3)
                            for name in STAGES},
        "peak_tree_rss_growth": {  # None where the smaller run ended before the first sample
            name: (round(large["stages"][name]["peak_tree_rss_mb"] / small["stages"][name]["peak_tree_rss_mb"], 3)
                   if small["stages"][name]["peak_tree_rss_mb"] else None) for name in STAGES},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
