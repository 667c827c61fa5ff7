"""reports/fingerprint.json: what a rerun of the study must reproduce bit for bit.

The sha256 of every trained model.pt (main runs), and how the CPU kernels ran (train.json
cpu_numerics). dvc.lock cannot say it alone: it hashes each run's folder as a whole, and that
folder's train.json holds clocks (wall time, tokens/s, start and end), so its hash differs on
every rerun even when the weights are the same bits. `python -m scripts.reproduced` compares a
study's fingerprint and metrics.json with the committed ones.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(runs_dir: Path, variants: Sequence[str], seeds: Sequence[int], trains: Mapping) -> dict:
    """{"models": {run: sha256 of model.pt}, "cpu_numerics": {run: pinned or not}} for every main run
    that has a model; `trains` maps (variant, seed) to its train.json (or None)."""
    models, numerics = {}, {}
    for v in variants:
        for s in seeds:
            path = Path(runs_dir) / f"{v}-{s}" / "model.pt"
            if path.is_file():
                models[f"{v}-{s}"] = sha256(path)
            described = (trains.get((v, s)) or {}).get("cpu_numerics")
            if described is not None:
                numerics[f"{v}-{s}"] = label(described)
    return {"models": models, "cpu_numerics": numerics}


def label(described: dict) -> str:
    """One run's train.json cpu_numerics in a few words: equal labels, the same kernels."""
    if not described.get("pinned"):
        return f"not pinned ({described.get('machine')}, ATen {described.get('aten_capability')})"
    products = described.get("matmul")
    return f"pinned (AVX2; products: {products})" if products else "pinned (AVX2; products: MKL)"
