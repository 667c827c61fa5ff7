"""Resumable checkpoints: written atomically, the last K kept, loaded with weights_only=True.

A checkpoint holds everything a run needs to continue bit-for-bit: model, optimizer, schedule,
RNG states (python, numpy, torch, CUDA; one set per rank under DDP), data position and step, and
the curve rows so far. Under DDP only rank 0 writes it and every rank resumes from it. It also
holds a hash of the run's configuration and code: a checkpoint left by a run with other settings
or other code (params.yaml or the training code edited since) is never resumed from.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.io.atomic import FULL, DiskFull, atomic_path, free_bytes
from pipeline.training.device import all_reduce, broadcast

_NAME = re.compile(r"step-(\d{8})\.pt$")
# A run's last step's weights, beside model.pt, when train.keep = best kept an earlier step.
LAST_MODEL = "last.pt"


def config_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rng_state() -> dict:
    """RNG states as plain lists and tensors, so weights_only loading accepts them."""
    np_state = np.random.get_state()
    state = {
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoints(directory: Path) -> list[Path]:
    """Checkpoint files in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.search(p.name))


def save(directory: Path, step: int, state: dict, keep: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:08d}.pt"
    with atomic_path(path) as tmp:
        save_torch(state, tmp)
    for old in checkpoints(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def save_torch(obj: Any, path: Path) -> None:
    """torch.save through a Python file: a full disk then raises OSError(ENOSPC), where torch's own
    file writer says only "unexpected pos 268800 vs 268688", and it becomes DiskFull with the bytes
    the tensors need (pipeline.io.atomic)."""
    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
    except OSError as exc:
        if exc.errno not in FULL:
            raise
        raise DiskFull(path, tensor_bytes(obj), free_bytes(path)) from exc


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in `obj` (nested dicts, lists, tuples): what a torch.save of it
    needs at least (the pickled structure around them adds a little)."""
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def find_latest(directory: Path, expected_hash: str) -> tuple[Path, dict] | None:
    """(path, state) of the newest readable checkpoint made with the same configuration, or None.

    Checkpoints of other settings are skipped, not trusted: after a params or code edit the old
    run's files may carry higher step numbers than the new run's own.
    """
    for path in reversed(checkpoints(directory)):
        try:
            state = load(path)
        except Exception as exc:  # noqa: BLE001 - a damaged file: fall back to the one before
            print(f"warning: skipping unreadable checkpoint {path} ({exc})")
            continue
        if state.get("config_hash") == expected_hash:
            return path, state
    return None


def discard_stale(directory: Path) -> None:
    """Remove the checkpoints a fresh run cannot resume from (other settings, other code).

    Called when no checkpoint matched: left in place, they would outrank the new run's own
    checkpoints when the last K are kept, and an interrupted new run could not resume.
    """
    stale = checkpoints(directory)
    if stale:
        print(f"note: {len(stale)} checkpoint(s) in {directory} were made with other settings or code; "
              "starting afresh")
    for path in stale:
        path.unlink(missing_ok=True)


def source_hash(paths: list[Path]) -> str:
    """Hash of the code that decides a run's result, so that a run never resumes across a code edit."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_for_ranks(directory: Path, expected_hash: str, device: torch.device) -> dict | None:
    """`find_latest` for a (possibly distributed) run: rank 0 picks the file, every rank loads it.

    Every rank learns together whether some rank could not read it (no shared filesystem), so
    they all stop with the same error instead of some waiting forever on the others.
    """
    import torch.distributed as dist

    main = not dist.is_initialized() or dist.get_rank() == 0
    found = find_latest(directory, expected_hash) if main else None
    if main and found is None:
        discard_stale(directory)
    path = broadcast(str(found[0]) if found else None)
    if path is None:
        return None
    state = found[1] if found else None
    if state is None:
        try:
            state = load(Path(path))
        except Exception:  # noqa: BLE001 - reported below, on every rank at once
            state = None
    if all_reduce([0.0 if state is None else 1.0], device, "min")[0] < 1:
        raise ValueError(f"{path}: not readable on every rank (the checkpoint directory must be on a "
                         "filesystem that all nodes share)")
    return state
